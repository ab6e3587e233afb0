//! What an alert may do besides notify (`[actions.RULE]` in the alerts file): stop the run
//! or save a checkpoint, after a grace period in which someone may acknowledge the alert;
//! and which endings of a run are notified (`[endings]`). Both are off unless configured.

use serde::Deserialize;
use std::collections::BTreeMap;

/// What a rule's alert does once its grace period passed unacknowledged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Act {
    /// Stop the training (a checkpoint first, unless `checkpoint = false`).
    Stop,
    /// Save a checkpoint, and let it run.
    Checkpoint,
}

/// `[actions.RULE]`: `act = "stop"`, `grace_s = 600`, `checkpoint = true`.
#[derive(Clone, Debug, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct RuleAction {
    pub act: Act,
    /// Seconds between the alert's notice and the act; acknowledging the alert within them
    /// calls the act off.
    #[serde(default)]
    pub grace_s: f64,
    /// With `stop`: save a checkpoint first (where the training can).
    #[serde(default = "yes")]
    pub checkpoint: bool,
}

fn yes() -> bool {
    true
}

/// `[endings]`: notices when a run ends, opt-in. Failures are always told (the `run_failed`
/// alert); these add the other endings.
#[derive(Clone, Debug, Default, Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Endings {
    /// Which: `finished`, `stopped`, `killed` (and `failed`, which then is told here too,
    /// besides its alert).
    pub statuses: Vec<String>,
    /// Only runs of these projects; every project when empty.
    pub projects: Vec<String>,
    /// Only these channels, by name (`name` in a channel's table) or kind (`webhook`,
    /// `slack`, `email`...); every channel when empty.
    pub channels: Vec<String>,
}

impl Endings {
    /// Whether a run of `project` that ended `status` is told, and on which channel kinds
    /// (empty: all).
    pub fn tells(&self, project: &str, status: &str) -> Option<&[String]> {
        let wanted = self.statuses.iter().any(|s| s == status)
            && (self.projects.is_empty() || self.projects.iter().any(|p| p == project));
        wanted.then_some(self.channels.as_slice())
    }
}

/// The built-in rules: those an action may name, and a page rule may pick.
pub const BUILTIN_RULES: &[&str] = &[
    "non_finite",
    "loss_spike",
    "divergence",
    "grad_explosion",
    "lr_schedule",
    "throughput",
    "stalled_data",
    "memory",
    "straggler",
    "stale",
];

const ENDINGS: &[&str] = &["finished", "failed", "killed", "stopped"];

/// Refuses actions on unknown rules, negative or unbounded grace periods, and endings that
/// do not exist, by name.
pub fn check(actions: &BTreeMap<String, RuleAction>, endings: &Endings) -> Result<(), String> {
    for (rule, a) in actions {
        if !BUILTIN_RULES.contains(&rule.as_str()) {
            return Err(format!(
                "[actions.{rule}]: no such rule (one of {})",
                BUILTIN_RULES.join(", ")
            ));
        }
        if !(0.0..=7.0 * 86_400.0).contains(&a.grace_s) {
            return Err(format!(
                "[actions.{rule}]: grace_s must be 0 to a week in seconds, not {}",
                a.grace_s
            ));
        }
    }
    for s in &endings.statuses {
        if !ENDINGS.contains(&s.as_str()) {
            return Err(format!(
                "[endings]: unknown status {s:?} (one of {})",
                ENDINGS.join(", ")
            ));
        }
    }
    // Its channels (names or kinds) are checked against the configured ones where those are
    // known (`AlertsConfig::load`).
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_and_endings_are_checked_by_name() {
        let parse = |text: &str| -> (BTreeMap<String, RuleAction>, Endings) {
            #[derive(Deserialize)]
            struct F {
                #[serde(default)]
                actions: BTreeMap<String, RuleAction>,
                #[serde(default)]
                endings: Endings,
            }
            let f: F = toml::from_str(text).unwrap();
            (f.actions, f.endings)
        };
        let (a, e) = parse("[actions.divergence]\nact = \"stop\"\ngrace_s = 600\n[endings]\nstatuses = [\"stopped\"]\n");
        assert!(check(&a, &e).is_ok());
        assert!(a["divergence"].checkpoint && a["divergence"].act == Act::Stop);
        assert_eq!(e.tells("p", "stopped"), Some(&[][..]));
        assert_eq!(e.tells("p", "finished"), None);
        let (a, e) = parse("[actions.diverge]\nact = \"stop\"\n");
        assert!(check(&a, &e).unwrap_err().contains("no such rule"));
        let (a, e) = parse("[actions.memory]\nact = \"checkpoint\"\ngrace_s = -1\n");
        assert!(check(&a, &e).unwrap_err().contains("grace_s"));
        let (a, e) = parse("[endings]\nstatuses = [\"done\"]\n");
        assert!(check(&a, &e).unwrap_err().contains("unknown status"));
        let (a, e) = parse(
            "[endings]\nstatuses = [\"killed\"]\nprojects = [\"llm\"]\nchannels = [\"slack\"]\n",
        );
        assert!(check(&a, &e).is_ok());
        assert_eq!(e.tells("llm", "killed"), Some(&["slack".to_string()][..]));
        assert_eq!(e.tells("cv", "killed"), None);
    }
}
