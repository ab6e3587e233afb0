//! The judge: run status on the hub's clock, and alert rules on what each run streams.
//!
//! Rules are evaluated on their own task, fed by a bounded channel, so acknowledging a batch
//! waits for storing it and nothing else: an alert's own write, its notifications and a
//! status change never sit on the acknowledgement path. When the judge falls a whole
//! channel behind, a batch goes unjudged (counted and logged), never the ingest slower.

use super::announce::News;
use super::{Hub, Run, RunState};
use crate::alerts::Event;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use stepstream_protocol::{
    unix_now, RunId, RunStatus, RunSummary, RunUpdates, StatusChange, StepRecord, ToViewer,
};
use tokio::sync::mpsc;

/// A training's alert of the same title is told at most once within this.
pub const USER_ALERT_COOLDOWN_S: f64 = 60.0;
/// Bytes of a training's alert title, at most.
const USER_ALERT_TITLE_BYTES: usize = 128;
/// Distinct titles a run may raise within the cooldown, at most.
const USER_ALERT_TITLES: usize = 100;

/// How often changed runs' summaries go to viewers (one frame for all of them).
const SWEEP_EVERY_S: f64 = 1.0;

/// Jobs the judge may fall behind by before batches go unjudged.
pub(super) const JUDGE_CAPACITY: usize = 4096;

/// Work for the judge.
pub(super) enum Job {
    /// A stored batch's records, for the alert rules.
    Records {
        run: Arc<Run>,
        records: Arc<[StepRecord]>,
        now: f64,
    },
    /// An alert event decided elsewhere (a stale alert resolved by a hello).
    Event { run: Arc<Run>, event: Event },
    /// An alert the training's code raised itself.
    User {
        run: Arc<Run>,
        alert: stepstream_protocol::UserAlert,
    },
    /// A stale run sent again: store and publish that it runs.
    Revived {
        run: Arc<Run>,
        now: f64,
        resolved: Option<Event>,
    },
}

/// Runs the judge until the hub is gone.
pub(super) async fn judge_loop(hub: Weak<Hub>, mut jobs: mpsc::Receiver<Job>) {
    while let Some(job) = jobs.recv().await {
        let Some(hub) = hub.upgrade() else {
            return;
        };
        match job {
            Job::Records { run, records, now } => hub.judge_records(&run, &records, now).await,
            Job::Event { run, event } => hub.raise(&run, event).await,
            Job::Revived { run, now, resolved } => hub.revived(&run, now, resolved).await,
            Job::User { run, alert } => hub.user_alert(&run, alert).await,
        }
    }
}

impl Hub {
    /// Hands a job to the judge without waiting; counts it when the judge is too far behind.
    pub(super) fn judge(&self, job: Job) {
        if let Err(mpsc::error::TrySendError::Full(_)) = self.judge.try_send(job) {
            let n = self.unjudged.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_power_of_two() {
                tracing::warn!(
                    unjudged = n,
                    "the alert judge is {JUDGE_CAPACITY} jobs behind; batches go unjudged"
                );
            }
        }
    }

    async fn judge_records(&self, run: &Arc<Run>, records: &[StepRecord], now: f64) {
        let others = self.other_ranks_step_times(run);
        let events = run.state_mut(|st| {
            let RunState { rules, metrics, .. } = st;
            let mut events = Vec::new();
            let mut sample = crate::alerts::Sample::default();
            for r in records {
                rules.sample(&self.rules, metrics, r, &mut sample);
                let mut judged = rules.judge(&self.rules, r.step, &sample);
                // Always fed, so each rank's smoothed step time exists for the others.
                let others = others.as_deref().unwrap_or(&[]);
                judged.merge(rules.straggler_at(&self.rules, &sample, others));
                events.extend(rules.events(&self.rules, r.step, judged, now));
            }
            events
        });
        for e in events {
            self.raise(run, e).await;
        }
        if !self.judges(run.key) {
            return;
        }
        for a in self.judge_page_rules(run, records) {
            self.raise_page(run, a).await;
        }
    }

    /// The smoothed step times of the other running ranks of this run's job, when it is one
    /// rank of several (the same job identity).
    fn other_ranks_step_times(&self, run: &Run) -> Option<Vec<f64>> {
        let job = run.state(|st| crate::alerts::job_of(&st.identity))?;
        let others: Vec<f64> = self
            .runs()
            .iter()
            .filter(|r| r.key != run.key)
            .filter_map(|r| {
                r.state(|st| {
                    let same = crate::alerts::job_of(&st.identity).is_some_and(|j| j == job);
                    (same && st.status == RunStatus::Running)
                        .then_some(st.rules.step_time_ema())
                        .flatten()
                })
            })
            .collect();
        (!others.is_empty()).then_some(others)
    }

    /// Hands an alert event to the store, to be shown to the run's viewers and notified once
    /// committed (see `announce.rs`); waits for neither.
    pub(super) async fn raise(&self, run: &Arc<Run>, event: Event) {
        let (rule, fired, step, value, message) = match event {
            Event::Fired {
                rule,
                step,
                value,
                message,
            } => (rule, true, step, value, message),
            Event::Resolved {
                rule,
                step,
                message,
            } => (rule, false, step, f64::NAN, message),
        };
        if !self.judges(run.key) {
            // Another hub of the cluster judges this run and raises its alerts.
            return;
        }
        // A page rule of the run's project may pick this built-in's channels and action.
        let project = run.state(|st| st.identity.project.clone());
        let (action, channels) = match self.builtin_rule_of(&project, rule) {
            Some(r) => (r.action.or_else(|| self.action_of(rule)), r.channels),
            None => (self.action_of(rule), Vec::new()),
        };
        self.alert_to(run, rule, action, &channels, fired, step, value, message)
            .await;
    }

    /// Raises an alert a page rule said.
    async fn raise_page(&self, run: &Arc<Run>, a: super::rules::PageAlert) {
        self.alert_to(
            run,
            &a.rule,
            a.action,
            &a.channels,
            a.fired,
            a.step,
            a.value,
            a.message,
        )
        .await;
    }

    /// Stores, tells and notifies (on the channels of these kinds; all when empty) an alert
    /// of `rule`, which starts `action` when it fires.
    #[allow(clippy::too_many_arguments)]
    async fn alert_to(
        &self,
        run: &Arc<Run>,
        rule: &str,
        action: Option<crate::alerts::actions::RuleAction>,
        channels: &[String],
        fired: bool,
        step: i64,
        value: f64,
        message: String,
    ) {
        let (run_id, project, name) = run.state(|st| {
            (
                st.identity.run_id.clone(),
                st.identity.project.clone(),
                st.identity.name.clone(),
            )
        });
        let at = unix_now();
        let mut message = message;
        if let Some(action) = action.filter(|_| fired) {
            // The alert says what its rule will do (stop, checkpoint) unless acknowledged.
            self.schedule_action(run, rule, action, at, &mut message);
        }
        let alert = stepstream_protocol::Alert {
            run_id: run_id.clone(),
            rule: rule.to_string(),
            fired,
            step,
            value,
            message: message.clone(),
            at,
        };
        if fired {
            tracing::warn!(run = %run_id, rule, step, %message, "alert");
        } else {
            tracing::info!(run = %run_id, rule, step, "alert resolved");
        }
        let written = self.store.add_alert(run.key, alert.clone()).await;
        let acks = if fired {
            self.store.acks(run.key).await.unwrap_or_default()
        } else {
            Vec::new()
        };
        // Muted (acknowledged for some hours): stored and shown, not sent.
        let muted = crate::store::Acked::mutes(&acks, rule, alert.at);
        let notice = (!muted).then(|| crate::notify::Notice {
            link: self.notifier.link(run_id.as_str()),
            run_id: run_id.to_string(),
            project,
            run_name: name,
            rule: alert.rule.clone(),
            state: if fired { "fired" } else { "resolved" },
            step,
            value,
            message,
            at: alert.at,
        });
        if muted {
            tracing::info!(run = %run_id, rule, "alert muted: not notified");
        }
        let notice = notice.map(|n| (Box::new(n), channels.to_vec()));
        self.announce(run, Some(written), News::Alert { alert, notice })
            .await;
    }

    /// An alert the run's training raised: judged (stored, told, notified) off the
    /// collector's connection.
    pub fn user_alert_from(&self, run: &Arc<Run>, alert: stepstream_protocol::UserAlert) {
        self.judge(Job::User {
            run: run.clone(),
            alert,
        });
    }

    /// An alert the training raised (`run.alert`): stored as rule `user:TITLE` and told on
    /// every channel, unless the same title was raised within [`USER_ALERT_COOLDOWN_S`] (a
    /// loop that raises every step is told once a minute).
    async fn user_alert(&self, run: &Arc<Run>, a: stepstream_protocol::UserAlert) {
        let now = unix_now();
        let mut title = a.title;
        super::truncate(&mut title, USER_ALERT_TITLE_BYTES);
        let rule = format!("user:{title}");
        let fresh = run.state_mut(|st| {
            st.user_alerts
                .retain(|_, at| now - *at < USER_ALERT_COOLDOWN_S);
            if st.user_alerts.contains_key(&rule) || st.user_alerts.len() >= USER_ALERT_TITLES {
                return false;
            }
            st.user_alerts.insert(rule.clone(), now);
            true
        });
        if !fresh {
            tracing::info!(%rule, "a training's alert within its cooldown: not told again");
            return;
        }
        let mut text = a.text;
        super::truncate(&mut text, crate::hub::commands::COMMAND_TEXT_BYTES);
        let message = format!(
            "[{}] {title}{}",
            a.level.as_str(),
            if text.is_empty() {
                String::new()
            } else {
                format!(": {text}")
            }
        );
        self.alert_to(run, &rule, None, &[], true, a.step, f64::NAN, message)
            .await;
    }

    async fn revived(&self, run: &Arc<Run>, now: f64, resolved: Option<Event>) {
        let run_id: RunId = run.state(|st| st.identity.run_id.clone());
        tracing::info!(run = %run_id, "stale run is sending again");
        if let Some(e) = resolved {
            self.raise(run, e).await;
        }
        let written = self
            .store
            .set_status(run.key, RunStatus::Running, None, now)
            .await;
        let change = StatusChange {
            run_id,
            status: RunStatus::Running,
            message: None,
            at: now,
        };
        self.announce(run, Some(written), News::Status(change))
            .await;
    }

    /// Judges staleness and publishes the run-list updates gathered since the last tick.
    pub async fn tick(&self) {
        self.pace.update();
        self.renew_leases().await;
        let now = unix_now();
        for run in self.runs() {
            if !self.judges(run.key) {
                continue;
            }
            if !run.state(|st| st.status.is_terminal()) {
                for a in self.stale_page_rules(&run, now) {
                    self.raise_page(&run, a).await;
                }
            }
            let change = run.state_mut(|st| {
                let silent = now - st.last_activity;
                let next = match st.status {
                    RunStatus::Running if silent >= self.policy.stale_after.as_secs_f64() => {
                        Some((RunStatus::Stale, format!("no data for {silent:.0} s")))
                    }
                    RunStatus::Stale => match self.policy.fail_after {
                        Some(limit) if silent >= limit.as_secs_f64() => Some((
                            RunStatus::Failed,
                            format!(
                                "no data for {silent:.0} s: the training process presumably \
                                 died"
                            ),
                        )),
                        _ => None,
                    },
                    _ => None,
                };
                next.map(|(status, message)| {
                    st.status = status;
                    st.status_message = Some(message.clone());
                    let step = st.tail.last_step.unwrap_or(0);
                    let alert = (status == RunStatus::Stale)
                        .then(|| st.rules.stale(&self.rules, true, step, &message, now))
                        .flatten();
                    (st.identity.run_id.clone(), status, message, alert)
                })
            });
            if let Some((run_id, status, message, alert)) = change {
                tracing::warn!(run = %run_id, status = status.as_str(), %message, "run status");
                let written = self
                    .store
                    .set_status(run.key, status, Some(message.clone()), now)
                    .await;
                if let Some(e) = alert {
                    self.raise(&run, e).await;
                }
                let change = StatusChange {
                    run_id,
                    status,
                    message: Some(message),
                    at: now,
                };
                self.announce(&run, Some(written), News::Status(change))
                    .await;
            }
        }
        self.sweep_updates(now);
        self.retain_due(now);
    }

    /// Publishes, at most once a second, one frame with the summary of every run that
    /// changed since the last sweep.
    fn sweep_updates(&self, now: f64) {
        {
            let mut last = self.swept_at.lock().unwrap_or_else(|e| e.into_inner());
            if now - *last < SWEEP_EVERY_S {
                return;
            }
            *last = now;
        }
        let changed: Vec<RunSummary> = self
            .runs()
            .iter()
            .filter_map(|run| {
                run.state_mut(|st| std::mem::take(&mut st.dirty).then(|| st.headline()))
            })
            .collect();
        if !changed.is_empty() {
            let _ = self
                .updates
                .send(super::encode(ToViewer::RunUpdates(RunUpdates {
                    runs: changed,
                    now,
                })));
        }
    }
}
