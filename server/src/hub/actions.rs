//! What an alert does besides notify (`[actions.RULE]`, or a page rule's action): once its
//! grace period passed with nobody acknowledging it, the rule stops the run or saves
//! a checkpoint, through the same commands a person sends (`commands.rs`), signed
//! `rule:NAME`. A pending act is kept in what the store holds (the alert, the
//! acknowledgements, the commands signed by the rule), so a restarted hub, or one taking a
//! run's judging over, schedules it again ([`Hub::resume_actions`]). And the notices of a run's ending (`[endings]`), with, for a stopped run,
//! the accelerator hours its stop saved.

use super::{Hub, Run};
use crate::alerts::actions::{Act, RuleAction};
use crate::store::Acked;
use std::sync::Arc;
use std::time::Duration;
use stepstream_protocol::{unix_now, Action, RunStatus};

impl Hub {
    /// The action `rule` carries, if configured.
    pub(super) fn action_of(&self, rule: &str) -> Option<RuleAction> {
        self.actions.get(rule).cloned()
    }

    /// The action a stored alert's rule name carries: a built-in rule's (from the page rule
    /// of the project that picks it, else `[actions.RULE]`), or the page rule it names (`custom:NAME`, `custom:NAME/METRIC`) in the run's project.
    fn action_for_alert(&self, project: &str, rule: &str) -> Option<RuleAction> {
        match rule.strip_prefix("custom:") {
            Some(rest) => {
                let name = rest.split('/').next().unwrap_or(rest);
                self.rules_of(project)
                    .iter()
                    .find(|(_, r)| r.name == name)
                    .and_then(|(_, r)| r.action.clone())
            }
            None => self
                .builtin_rule_of(project, rule)
                .and_then(|r| r.action)
                .or_else(|| self.action_of(rule)),
        }
    }

    /// Schedules again the rule actions a judge had pending on these runs (all it judges
    /// when `None`): after a restart, or when this hub takes over a run's judging. They are
    /// found in what the store holds: an alert that fired with an action configured, not
    /// acknowledged since and not yet acted on (no command signed by its rule since); what
    /// is left of its grace period is waited out, and none if it passed.
    pub async fn resume_actions(&self, keys: Option<&[crate::store::RunKey]>) {
        if self.actions.is_empty() && self.page_rules.read().map_or(true, |r| r.is_empty()) {
            return;
        }
        let runs: Vec<_> = self
            .runs()
            .into_iter()
            .filter(|r| keys.is_none_or(|k| k.contains(&r.key)))
            .filter(|r| !r.state(|st| st.status.is_terminal()) && self.judges(r.key))
            .collect();
        for run in runs {
            let (run_id, project) =
                run.state(|st| (st.identity.run_id.clone(), st.identity.project.clone()));
            let (Ok(alerts), Ok(acks), Ok(commands)) = (
                self.store.alerts(run.key, run_id.clone()).await,
                self.store.acks(run.key).await,
                self.store.commands(run.key, run_id.clone()).await,
            ) else {
                tracing::warn!(run = %run_id, "could not read a run's alerts to resume its rule actions");
                continue;
            };
            // The latest firing of each rule.
            let mut latest: std::collections::HashMap<&str, f64> = Default::default();
            for a in alerts.iter().filter(|a| a.fired) {
                latest.insert(a.rule.as_str(), a.at);
            }
            for (rule, fired_at) in latest {
                let Some(action) = self.action_for_alert(&project, rule) else {
                    continue;
                };
                let signed = format!("rule:{rule}");
                let acted = commands
                    .iter()
                    .any(|c| c.command.by == signed && c.command.issued_at >= fired_at);
                if acted || Acked::acknowledged(&acks, rule, fired_at) {
                    continue;
                }
                let left = (fired_at + action.grace_s - unix_now()).max(0.0);
                tracing::info!(run = %run_id, rule, left_s = left, "rule action resumed");
                self.act_after(&run, rule, action, fired_at, left);
            }
        }
    }

    /// Says in the alert's notice what will happen, and schedules it after the grace period.
    pub(super) fn schedule_action(
        &self,
        run: &Arc<Run>,
        rule: &str,
        action: RuleAction,
        fired_at: f64,
        message: &mut String,
    ) {
        let what = match action.act {
            Act::Stop if action.checkpoint => "save a checkpoint and stop this run",
            Act::Stop => "stop this run",
            Act::Checkpoint => "save a checkpoint of this run",
        };
        message.push_str(&format!(
            "\n(rule action: will {what} in {:.0} s unless the alert is acknowledged)",
            action.grace_s
        ));
        self.act_after(run, rule, action.clone(), fired_at, action.grace_s);
    }

    /// Acts for `rule`'s alert fired at `fired_at` once `wait_s` seconds passed.
    fn act_after(
        &self,
        run: &Arc<Run>,
        rule: &str,
        action: RuleAction,
        fired_at: f64,
        wait_s: f64,
    ) {
        let hub = self.me.clone();
        let run = run.clone();
        let rule = rule.to_string();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs_f64(wait_s)).await;
            if let Some(hub) = hub.upgrade() {
                hub.act(&run, &rule, action, fired_at).await;
            }
        });
    }

    /// The grace period of `rule`'s alert fired at `fired_at` is over: act, unless the run
    /// ended or someone acknowledged the alert since. An alert that resolved meanwhile does
    /// not call it off: a diverging loss flaps (a smoothed trend dips for a few steps), and
    /// a person, not a lull, says a run may go on.
    async fn act(&self, run: &Arc<Run>, rule: &str, action: RuleAction, fired_at: f64) {
        let (run_id, status) = run.state(|st| (st.identity.run_id.clone(), st.status));
        if status.is_terminal() {
            tracing::info!(run = %run_id, rule, "rule action called off: the run ended");
            return;
        }
        if !self.judges(run.key) {
            // Another hub judges the run now; it resumed the action when it took it over.
            return;
        }
        let signed = format!("rule:{rule}");
        let acted = match self.store.commands(run.key, run_id.clone()).await {
            Ok(c) => c
                .iter()
                .any(|c| c.command.by == signed && c.command.issued_at >= fired_at),
            Err(_) => false,
        };
        if acted {
            // Resumed after a restart as well as scheduled before it: once is enough.
            return;
        }
        match self.store.acks(run.key).await {
            Ok(acks) if Acked::acknowledged(&acks, rule, fired_at) => {
                tracing::info!(run = %run_id, rule, "rule action called off: the alert was acknowledged");
                return;
            }
            Ok(_) => {}
            Err(e) => {
                // Not knowing whether someone called it off, do nothing: a stop nobody
                // wanted is worse than one that comes late.
                tracing::warn!(run = %run_id, rule, error = %e, "rule action skipped: cannot read the acknowledgements");
                return;
            }
        }
        let order = match action.act {
            Act::Stop => Action::Stop {
                checkpoint: action.checkpoint,
            },
            Act::Checkpoint => Action::Checkpoint,
        };
        let reason = format!(
            "alert {rule} unacknowledged {:.0} s after it fired",
            unix_now() - fired_at
        );
        match self
            .command(run, order, format!("rule:{rule}"), reason)
            .await
        {
            Ok(e) => {
                tracing::warn!(run = %run_id, rule, id = e.command.id, "rule action: command queued")
            }
            Err(e) => tracing::warn!(run = %run_id, rule, error = %e, "rule action not queued"),
        }
    }

    /// Tells the channels `[endings]` names that a run ended, if it asks to.
    pub(super) fn tell_ending(&self, run: &Arc<Run>, status: RunStatus, message: Option<&str>) {
        let (project, run_id, name, step) = run.state(|st| {
            (
                st.identity.project.clone(),
                st.identity.run_id.clone(),
                st.identity.name.clone(),
                st.tail.last_step.unwrap_or(0),
            )
        });
        let Some(kinds) = self.endings.tells(&project, status.as_str()) else {
            return;
        };
        let mut text = format!("the run ended: {}", status.as_str());
        if let Some(m) = message.filter(|m| !m.is_empty()) {
            text.push_str(&format!(" ({m})"));
        }
        let notice = crate::notify::Notice {
            link: self.notifier.link(run_id.as_str()),
            run_id: run_id.to_string(),
            project,
            run_name: name,
            rule: format!("run_{}", status.as_str()),
            state: "ended",
            step,
            value: f64::NAN,
            message: text,
            at: unix_now(),
        };
        let _ = self.notifier.send_to(notice, kinds);
    }
}

/// For a run that a command stopped: what the stop saved, to add to its status message.
pub(super) fn saved_note(run: &Run) -> Option<String> {
    let (hours, left, total, per_step, devices) = run.state(saved_hours)?;
    let amount = if hours >= 0.1 {
        format!("{hours:.1} accelerator-hours")
    } else {
        format!("{:.0} accelerator-seconds", hours * 3600.0)
    };
    Some(format!(
        "; saved about {amount}: {left} of {total} steps left at {per_step:.3} s a step on \
         {devices} device(s)"
    ))
}

/// Config keys that give a run's planned number of steps.
const PLANNED_STEPS: &[&str] = &[
    "max_steps",
    "total_steps",
    "train_steps",
    "num_steps",
    "steps",
];

/// For a run that stopped early: the accelerator-hours the rest of its planned steps would
/// have taken, `(hours, steps left, planned, seconds a step, devices)`; `None` when its config
/// plans no number of steps.
fn saved_hours(st: &super::RunState) -> Option<(f64, i64, i64, f64, u32)> {
    let config: serde_json::Value = serde_json::from_str(&st.identity.config_json).ok()?;
    let planned = PLANNED_STEPS.iter().find_map(|k| {
        let v = &config[*k];
        v.as_i64().or_else(|| v.as_f64().map(|f| f as i64))
    })?;
    let last = st.tail.last_step?;
    let elapsed = st.tail.last_point_at? - st.identity.started_at;
    if last <= 0 || planned <= last || elapsed <= 0.0 {
        return None;
    }
    let per_step = elapsed / last as f64;
    let devices = st.identity.world_size.max(1);
    let left = planned - last;
    let hours = left as f64 * per_step * f64::from(devices) / 3600.0;
    Some((hours, left, planned, per_step, devices))
}
