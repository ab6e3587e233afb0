//! Rules made in the page, per project: a metric (exact, or a pattern with `*`), a condition
//! (above or below a value, NaN/Inf, a spike against the rolling median, no improvement for
//! N steps, no new point for N seconds on the hub's clock), how many points in a row, which channels, and what it does (`RuleAction`).
//!
//! Stored by the hub (`store::rules`), judged beside the built-in rules on every record of
//! the project's runs, and previewed on a run's history with the very same judging
//! ([`preview`]), so the preview shows where the rule would have fired.

use super::actions::{RuleAction, BUILTIN_RULES};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// A rule as the page makes it (and the API takes it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PageRule {
    /// Its name, in alerts as `custom:NAME`.
    pub name: String,
    /// A metric's name, or a pattern where `*` stands for any run of characters.
    pub metric: String,
    pub when: When,
    /// Points in a row the condition must hold before it fires (1: at once).
    #[serde(default = "one")]
    pub consecutive: u32,
    /// The channel kinds it notifies (`webhook`, `slack`...); every channel when empty.
    #[serde(default)]
    pub channels: Vec<String>,
    /// What it does besides notify, after a grace period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<RuleAction>,
}

fn one() -> u32 {
    1
}

/// The condition.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum When {
    Above(f64),
    Below(f64),
    NonFinite,
    /// The value is `factor` times the median of the `window` points before it (or above
    /// it by that factor in absolute terms for values near zero).
    Spike {
        factor: f64,
        window: u32,
    },
    /// The best value so far (lowest for `min`, highest for `max`) is `steps` steps old.
    NoImprovement {
        steps: i64,
        mode: Mode,
    },
    /// No point of the metric arrived for `seconds` (on the hub's clock, judged by its
    /// status clock: a training that hangs or died still fires it).
    Stale {
        seconds: f64,
    },
    /// One of the hub's built-in rules (`divergence`, `non_finite`...), judged as the hub
    /// judges it for every run: the page rule gives its alerts on this project's runs the
    /// rule's channels and action (in place of the operator's `[actions.NAME]`). Its metric
    /// is `*` (the built-in reads its own) and it fires as the built-in does.
    Builtin(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    Min,
    Max,
}

/// Rules a project may have, at most.
pub const PROJECT_RULES: usize = 100;

impl PageRule {
    /// Refuses a rule that could not be judged sensibly, by what is wrong.
    pub fn check(&self) -> Result<(), String> {
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 64
            && self
                .name
                .chars()
                .all(|c| c.is_alphanumeric() || " _-.".contains(c));
        if !name_ok {
            return Err("a rule's name is 1 to 64 letters, digits, spaces, _ - or .".into());
        }
        if self.metric.is_empty() || self.metric.len() > 256 || self.metric.contains('\0') {
            return Err("a rule's metric is 1 to 256 bytes".into());
        }
        if !(1..=10_000).contains(&self.consecutive) {
            return Err("consecutive must be 1 to 10000".into());
        }
        match self.when {
            When::Above(v) | When::Below(v) if !v.is_finite() => {
                return Err("a threshold must be a finite number".into())
            }
            When::Spike { factor, window }
                if !(factor > 1.0 && factor.is_finite() && (3..=10_000).contains(&window)) =>
            {
                return Err(
                    "a spike needs a factor above 1 and a window of 3 to 10000 points".into(),
                )
            }
            When::NoImprovement { steps, .. } if !(1..=100_000_000).contains(&steps) => {
                return Err("no improvement needs 1 to 100000000 steps".into())
            }
            When::Stale { seconds } if !(1.0..=7.0 * 86_400.0).contains(&seconds) => {
                return Err("stale needs 1 second to a week".into())
            }
            When::Builtin(ref rule) if !BUILTIN_RULES.contains(&rule.as_str()) => {
                return Err(format!(
                    "no built-in rule {rule:?} (one of {})",
                    BUILTIN_RULES.join(", ")
                ))
            }
            When::Builtin(_) if self.metric != "*" || self.consecutive != 1 => return Err(
                "a built-in rule reads its own metrics and streaks: metric \"*\", consecutive 1"
                    .into(),
            ),
            _ => {}
        }
        if let Some(a) = &self.action {
            if !(0.0..=7.0 * 86_400.0).contains(&a.grace_s) {
                return Err("grace_s must be 0 to a week in seconds".into());
            }
        }
        Ok(())
    }

    /// Whether the rule reads metric `name` (a built-in one reads none here: the hub's
    /// built-in rules judge every run anyway).
    pub fn reads(&self, name: &str) -> bool {
        !matches!(self.when, When::Builtin(_)) && glob(&self.metric, name)
    }

    /// The built-in rule this page rule sets channels and an action for.
    pub fn builtin(&self) -> Option<&str> {
        match &self.when {
            When::Builtin(rule) => Some(rule),
            _ => None,
        }
    }

    /// The alert's rule name for metric `name`: `custom:NAME`, with the metric when the rule
    /// names a pattern (each matching metric fires and resolves on its own).
    pub fn alert_name(&self, metric: &str) -> String {
        if self.metric.contains('*') {
            format!("custom:{}/{metric}", self.name)
        } else {
            format!("custom:{}", self.name)
        }
    }

    /// What the condition says, for messages.
    pub fn describe(&self) -> String {
        let what = match &self.when {
            When::Above(v) => format!("above {v}"),
            When::Below(v) => format!("below {v}"),
            When::NonFinite => "NaN or infinite".into(),
            When::Spike { factor, window } => {
                format!("{factor}x the median of the {window} points before")
            }
            When::NoImprovement { steps, mode } => format!(
                "no new {} for {steps} steps",
                if *mode == Mode::Min {
                    "minimum"
                } else {
                    "maximum"
                }
            ),
            When::Stale { seconds } => format!("without a new point for {seconds} s"),
            When::Builtin(rule) => format!("when the built-in rule {rule} fires"),
        };
        if self.consecutive > 1 {
            format!("{what}, {} points in a row", self.consecutive)
        } else {
            what
        }
    }
}

/// `*` matches any run of characters; everything else itself.
fn glob(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == name;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !name.starts_with(first) || name.len() < first.len() + last.len() || !name.ends_with(last) {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    true
}

/// One rule's state on one metric of one run.
#[derive(Default, Debug)]
pub struct State {
    streak: u32,
    active: bool,
    window: VecDeque<f64>,
    best: Option<(f64, i64)>,
    /// A stale rule's: the step and the hub's time of the metric's last point.
    last_point: Option<(i64, f64)>,
}

impl State {
    /// A stale rule's point arrived at `now` (hub clock): `Resolved` if it was firing.
    pub fn arrived(&mut self, step: i64, now: f64) -> Option<Said> {
        self.last_point = Some((step, now));
        std::mem::take(&mut self.active).then_some(Said::Resolved)
    }

    /// A stale rule on the hub's clock: fires once when the last point is `seconds` old.
    pub fn silent(&mut self, rule: &PageRule, metric: &str, now: f64) -> Option<(i64, Said)> {
        let When::Stale { seconds } = rule.when else {
            return None;
        };
        let (step, at) = self.last_point?;
        if self.active || now - at < seconds {
            return None;
        }
        self.active = true;
        let message = format!(
            "{metric} has had no new point for {:.0} s (since step {step})",
            now - at
        );
        Some((
            step,
            Said::Fired {
                value: now - at,
                message,
            },
        ))
    }
}

/// What judging a point said.
#[derive(Clone, Debug, PartialEq)]
pub enum Said {
    Fired { value: f64, message: String },
    Resolved,
}

/// Judges one point of a metric the rule reads.
pub fn judge(rule: &PageRule, metric: &str, st: &mut State, step: i64, value: f64) -> Option<Said> {
    let holds = match &rule.when {
        When::Above(t) => value > *t,
        When::Below(t) => value < *t,
        When::NonFinite => !value.is_finite(),
        When::Spike { factor, window } => {
            let holds = if st.window.len() >= 3 && value.is_finite() {
                let mut sorted: Vec<f64> = st.window.iter().copied().collect();
                sorted.sort_by(f64::total_cmp);
                let median = sorted[sorted.len() / 2];
                value.abs() > factor * median.abs() && (value - median).abs() > 1e-12
            } else {
                false
            };
            if value.is_finite() {
                st.window.push_back(value);
                while st.window.len() > *window as usize {
                    st.window.pop_front();
                }
            }
            holds
        }
        // Judged on the hub's clock ([`State::arrived`], [`State::silent`]), not per point.
        When::Stale { .. } => return None,
        // Judged by the built-in rule itself (`alerts::RunRules`).
        When::Builtin(_) => return None,
        When::NoImprovement { steps, mode } => {
            if value.is_finite() {
                let better = match (st.best, mode) {
                    (None, _) => true,
                    (Some((b, _)), Mode::Min) => value < b,
                    (Some((b, _)), Mode::Max) => value > b,
                };
                if better {
                    st.best = Some((value, step));
                }
            }
            st.best.is_some_and(|(_, at)| step - at >= *steps)
        }
    };
    if holds {
        st.streak = st.streak.saturating_add(1);
        if !st.active && st.streak >= rule.consecutive {
            st.active = true;
            return Some(Said::Fired {
                value,
                message: format!(
                    "{metric} is {} at step {step} (value {value})",
                    rule.describe()
                ),
            });
        }
    } else {
        st.streak = 0;
        if st.active {
            st.active = false;
            return Some(Said::Resolved);
        }
    }
    None
}

/// The steps where `rule` would have fired on these points of one metric `(step, value,
/// wall time)`, in order; a stale rule at the last step before each silence as long as its
/// threshold (the points' own times stand in for the hub's clock).
pub fn preview(
    rule: &PageRule,
    metric: &str,
    points: impl IntoIterator<Item = (i64, f64, f64)>,
) -> Vec<i64> {
    if let When::Stale { seconds } = rule.when {
        let mut last: Option<(i64, f64)> = None;
        let mut fired = Vec::new();
        for (step, _, at) in points {
            if let Some((s, t)) = last {
                if at - t >= seconds {
                    fired.push(s);
                }
            }
            last = Some((step, at));
        }
        return fired;
    }
    let mut st = State::default();
    points
        .into_iter()
        .filter_map(|(step, v, _)| match judge(rule, metric, &mut st, step, v) {
            Some(Said::Fired { .. }) => Some(step),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(when: When, consecutive: u32) -> PageRule {
        PageRule {
            name: "r".into(),
            metric: "*/loss".into(),
            when,
            consecutive,
            channels: vec![],
            action: None,
        }
    }

    /// Points one second apart.
    fn timed(points: impl IntoIterator<Item = (i64, f64)>) -> Vec<(i64, f64, f64)> {
        points.into_iter().map(|(s, v)| (s, v, s as f64)).collect()
    }

    #[test]
    fn patterns_match_as_globs() {
        assert!(glob("*/loss", "train/loss") && glob("*/loss", "/loss"));
        assert!(!glob("*/loss", "train/loss_scale"));
        assert!(glob("loss", "loss") && !glob("loss", "val_loss"));
        assert!(glob("grad*norm*", "grad_norm/layer.0") && !glob("grad*norm", "grad"));
        assert!(glob("a*b*c", "aXbYc") && !glob("a*b*c", "aXcYb"));
    }

    #[test]
    fn each_condition_fires_once_and_resolves() {
        let r = rule(When::Above(2.0), 3);
        let pts = [
            (0, 1.0),
            (1, 3.0),
            (2, 3.0),
            (3, 3.0),
            (4, 3.0),
            (5, 1.0),
            (6, 3.0),
            (7, 3.0),
            (8, 3.0),
        ];
        assert_eq!(preview(&r, "a/loss", timed(pts)), vec![3, 8]);
        let r = rule(When::NonFinite, 1);
        assert_eq!(
            preview(
                &r,
                "a/loss",
                timed([
                    (0, 1.0),
                    (1, f64::NAN),
                    (2, f64::INFINITY),
                    (3, 1.0),
                    (4, f64::NAN)
                ])
            ),
            vec![1, 4]
        );
        let r = rule(
            When::Spike {
                factor: 3.0,
                window: 5,
            },
            1,
        );
        let pts = (0..20).map(|s| {
            (
                s,
                if s == 12 {
                    50.0
                } else {
                    1.0 + (s % 3) as f64 * 0.1
                },
            )
        });
        assert_eq!(preview(&r, "a/loss", timed(pts)), vec![12]);
        let r = rule(
            When::NoImprovement {
                steps: 5,
                mode: Mode::Min,
            },
            1,
        );
        let pts = (0..20).map(|s| (s, if s < 8 { 10.0 - s as f64 } else { 5.0 }));
        assert_eq!(preview(&r, "a/loss", timed(pts)), vec![12]);
        // Stale: the silences as long as its threshold, at the step before each.
        let stale = rule(When::Stale { seconds: 30.0 }, 1);
        let pts = [
            (0, 1.0, 0.0),
            (1, 1.0, 10.0),
            (2, 1.0, 45.0),
            (3, 1.0, 50.0),
            (4, 1.0, 90.0),
        ];
        assert_eq!(preview(&stale, "a/loss", pts), vec![1, 3]);
        let mut st = State::default();
        assert_eq!(
            st.silent(&stale, "a/loss", 100.0),
            None,
            "nothing seen, nothing stale"
        );
        assert_eq!(st.arrived(7, 100.0), None);
        assert_eq!(st.silent(&stale, "a/loss", 120.0), None);
        assert!(matches!(
            st.silent(&stale, "a/loss", 131.0),
            Some((7, Said::Fired { .. }))
        ));
        assert_eq!(st.silent(&stale, "a/loss", 200.0), None, "fires once");
        assert_eq!(st.arrived(8, 201.0), Some(Said::Resolved));
        assert!(r.check().is_ok());
        assert!(rule(When::Above(f64::NAN), 1).check().is_err());
        assert!(rule(
            When::Spike {
                factor: 0.5,
                window: 5
            },
            1
        )
        .check()
        .is_err());
        let builtin = PageRule {
            metric: "*".into(),
            ..rule(When::Builtin("divergence".into()), 1)
        };
        assert!(builtin.check().is_ok() && builtin.builtin() == Some("divergence"));
        assert!(
            !builtin.reads("loss"),
            "judged by the built-in, not per point"
        );
        assert!(rule(When::Builtin("divergence".into()), 1).check().is_err());
        assert!(PageRule {
            when: When::Builtin("diverge".into()),
            ..builtin.clone()
        }
        .check()
        .unwrap_err()
        .contains("no built-in rule"));
        assert!(PageRule {
            name: "bad/name".into(),
            ..r.clone()
        }
        .check()
        .is_err());
    }
}
