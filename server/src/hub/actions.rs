//! What an alert does besides notify (`[actions.RULE]`): once its grace period passed with
//! nobody acknowledging it, the rule stops the run or saves
//! a checkpoint, through the same commands a person sends (`commands.rs`), signed
//! `rule:NAME`. And the notices of a run's ending (`[endings]`), with, for a stopped run,
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
        let hub = self.me.clone();
        let run = run.clone();
        let rule = rule.to_string();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs_f64(action.grace_s)).await;
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
        self.notifier.send_to(notice, kinds);
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
