//! The hub's in-memory view of every run and the fan-out of what happens to them.
//!
//! Each run has one bounded `broadcast` channel of [`LiveEvent`]s, published only after the
//! store committed what they carry; the run list has one more for [`RunUpdate`]s. Publishing
//! never waits for a viewer: a viewer that falls behind sees `Lagged` and catches up from
//! the store (see `viewer.rs`). Run status (running / stale / finished / failed / killed) is
//! judged here, on the hub's clock, by [`Hub::tick`].

use crate::store::{RunKey, RunTail, Store, StoreError};
use axum::body::Bytes;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use stepstream_protocol::{
    unix_now, Batch, MetricDef, MetricId, RunId, RunIdentity, RunList, RunStatus, RunSummary,
    RunUpdate, StatusChange, StepRecord, ToViewer,
};
use tokio::sync::broadcast;

/// Live events per run a viewer may fall behind before it is resynchronised from storage.
const LIVE_CAPACITY: usize = 512;
const UPDATES_CAPACITY: usize = 1024;
/// Records per batch the hub accepts.
pub const MAX_BATCH_RECORDS: usize = 100_000;
/// Metrics per run the hub accepts.
pub const MAX_METRICS: usize = 4096;

/// How run status is judged.
#[derive(Clone, Debug)]
pub struct StatusPolicy {
    /// A running run that sent nothing (not even a heartbeat) for this long is stale.
    pub stale_after: Duration,
    /// A stale run that stays silent this long (counted from its last sign of life) is marked
    /// failed: its process is presumed dead. `None` keeps it stale.
    pub fail_after: Option<Duration>,
}

/// Something that happened to one run, as its subscribers receive it.
#[derive(Clone, Debug)]
pub enum LiveEvent {
    Batch {
        seq: u64,
        records: Arc<[StepRecord]>,
        /// The [`ToViewer::Live`] frame of the whole batch, encoded once for every viewer
        /// that takes all metrics.
        frame: Bytes,
    },
    Metrics(Vec<MetricDef>),
    Status(StatusChange),
    Alert(stepstream_protocol::Alert),
}

/// Why the hub refused something a collector sent.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("metric id {id} is already defined as {existing:?}, not {new:?}")]
    MetricRedefined {
        id: u32,
        existing: String,
        new: String,
    },
    #[error("batch {seq} uses metric id {id}, which was never defined")]
    UndefinedMetric { seq: u64, id: u32 },
    #[error("batch {got} arrived after batch {last}: sequence numbers must not skip")]
    SequenceGap { got: u64, last: u64 },
    #[error("{0}")]
    Limit(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What became of a batch.
#[derive(Debug, PartialEq, Eq)]
pub enum Appended {
    Stored,
    /// Already stored earlier (a resend after a lost ack); nothing changed.
    Duplicate,
}

pub struct RunState {
    pub identity: RunIdentity,
    pub status: RunStatus,
    pub status_message: Option<String>,
    /// Hub clock, unix seconds, of the last frame from the run's collector.
    pub last_activity: f64,
    pub tail: RunTail,
    /// Sorted by id.
    pub metrics: Vec<MetricDef>,
    /// Changed since the last run-list update was published.
    dirty: bool,
    /// The alert rules' state for this run.
    rules: crate::alerts::RunRules,
}

impl RunState {
    /// The run's collector was heard from: a stale run is running again. Returns whether it
    /// was stale, and the stale alert's resolution, judged under the same lock as the status
    /// flip so it cannot race the tick.
    fn heard_from(
        &mut self,
        rules: &crate::alerts::Rules,
        now: f64,
    ) -> (bool, Option<crate::alerts::Event>) {
        self.last_activity = now;
        let revived = self.status == RunStatus::Stale;
        if !revived {
            return (false, None);
        }
        self.status = RunStatus::Running;
        self.status_message = None;
        let step = self.tail.last_step.unwrap_or(0);
        (true, self.rules.stale(rules, false, step, "", now))
    }

    pub fn metric_name(&self, id: MetricId) -> Option<&str> {
        self.metrics
            .binary_search_by_key(&id, |m| m.id)
            .ok()
            .map(|i| self.metrics[i].name.as_str())
    }

    pub fn summary(&self) -> RunSummary {
        let id = &self.identity;
        RunSummary {
            run_id: id.run_id.clone(),
            project: id.project.clone(),
            name: id.name.clone(),
            host: id.host.clone(),
            rank: id.rank,
            world_size: id.world_size,
            job: id.job.clone(),
            framework: id.framework.clone(),
            started_at: id.started_at,
            status: self.status,
            status_message: self.status_message.clone(),
            last_step: self.tail.last_step,
            last_point_at: self.tail.last_point_at,
            last_values: self
                .tail
                .last_values
                .iter()
                .filter_map(|(&m, &v)| Some((self.metric_name(m)?.to_string(), v)))
                .collect(),
            records: self.tail.records,
        }
    }
}

/// One run: its store key, its live channel and its state.
pub struct Run {
    pub key: RunKey,
    pub live: broadcast::Sender<LiveEvent>,
    /// Serialises ingest for the run, so two connections for one run (a reconnect racing a
    /// half-open old socket) cannot interleave a check and a write.
    ingest: tokio::sync::Mutex<()>,
    state: Mutex<RunState>,
}

impl Run {
    pub fn state<T>(&self, f: impl FnOnce(&RunState) -> T) -> T {
        f(&self.state.lock().expect("run state"))
    }

    fn state_mut<T>(&self, f: impl FnOnce(&mut RunState) -> T) -> T {
        f(&mut self.state.lock().expect("run state"))
    }
}

pub struct Hub {
    pub store: Store,
    policy: StatusPolicy,
    rules: crate::alerts::Rules,
    notifier: crate::notify::Notifier,
    runs: RwLock<HashMap<RunId, Arc<Run>>>,
    updates: broadcast::Sender<Bytes>,
}

fn encode(msg: ToViewer) -> Bytes {
    Bytes::from(msg.encode())
}

impl Hub {
    /// Builds the hub over an opened store and the runs it held.
    pub fn new(
        store: Store,
        stored: Vec<crate::store::StoredRun>,
        policy: StatusPolicy,
        alerts: &crate::notify::AlertsConfig,
    ) -> Arc<Hub> {
        let runs = stored
            .into_iter()
            .map(|s| {
                let rules = crate::alerts::RunRules::new(&s.identity.config_json);
                let run = Run {
                    key: s.key,
                    live: broadcast::channel(LIVE_CAPACITY).0,
                    ingest: tokio::sync::Mutex::new(()),
                    state: Mutex::new(RunState {
                        identity: s.identity,
                        status: s.status,
                        status_message: s.status_message,
                        last_activity: s.last_activity,
                        rules,
                        tail: s.tail,
                        metrics: s.metrics,
                        dirty: false,
                    }),
                };
                (run.state(|st| st.identity.run_id.clone()), Arc::new(run))
            })
            .collect();
        Arc::new(Hub {
            store,
            policy,
            rules: alerts.rules.clone(),
            notifier: crate::notify::Notifier::start(alerts),
            runs: RwLock::new(runs),
            updates: broadcast::channel(UPDATES_CAPACITY).0,
        })
    }

    pub fn run(&self, id: &RunId) -> Option<Arc<Run>> {
        self.runs.read().expect("runs").get(id).cloned()
    }

    pub fn runs(&self) -> Vec<Arc<Run>> {
        let mut runs: Vec<_> = self.runs.read().expect("runs").values().cloned().collect();
        runs.sort_by_key(|r| r.key);
        runs
    }

    pub fn run_list(&self) -> RunList {
        RunList {
            runs: self
                .runs()
                .iter()
                .map(|r| r.state(RunState::summary))
                .collect(),
            now: unix_now(),
        }
    }

    /// Run-list updates, as encoded [`ToViewer`] frames.
    pub fn subscribe_updates(&self) -> broadcast::Receiver<Bytes> {
        self.updates.subscribe()
    }

    fn publish_update(&self, run: &Run) {
        let summary = run.state_mut(|st| {
            st.dirty = false;
            st.summary()
        });
        let _ = self.updates.send(encode(ToViewer::RunUpdate(RunUpdate {
            run: summary,
            now: unix_now(),
        })));
    }

    fn publish_status(&self, run: &Run, change: StatusChange) {
        let _ = run.live.send(LiveEvent::Status(change));
        self.publish_update(run);
    }

    /// A collector said hello: creates the run or brings it back to running.
    pub async fn open_run(&self, identity: RunIdentity) -> Result<Arc<Run>, StoreError> {
        let now = unix_now();
        let key = self.store.upsert_run(identity.clone(), now).await?;
        let existing = self.run(&identity.run_id);
        let run = match existing {
            Some(run) => {
                let (was, resolved) = run.state_mut(|st| {
                    let was = st.status;
                    // A resumed run keeps the start time it was archived under.
                    let started_at = st.identity.started_at;
                    st.identity = identity.clone();
                    st.identity.started_at = started_at;
                    st.status = RunStatus::Running;
                    st.status_message = None;
                    st.last_activity = now;
                    let step = st.tail.last_step.unwrap_or(0);
                    (was, st.rules.stale(&self.rules, false, step, "", now))
                });
                if let Some(e) = resolved {
                    self.raise(&run, e).await;
                }
                if was != RunStatus::Running {
                    tracing::info!(run = %identity.run_id, from = was.as_str(), "run is running again");
                }
                run
            }
            None => {
                tracing::info!(run = %identity.run_id, project = %identity.project, name = %identity.name, "new run");
                let run = Arc::new(Run {
                    key,
                    live: broadcast::channel(LIVE_CAPACITY).0,
                    ingest: tokio::sync::Mutex::new(()),
                    state: Mutex::new(RunState {
                        identity: identity.clone(),
                        status: RunStatus::Running,
                        status_message: None,
                        last_activity: now,
                        tail: RunTail::default(),
                        metrics: Vec::new(),
                        dirty: true,
                        rules: crate::alerts::RunRules::new(&identity.config_json),
                    }),
                });
                self.runs
                    .write()
                    .expect("runs")
                    .entry(identity.run_id.clone())
                    .or_insert(run)
                    .clone()
            }
        };
        self.publish_status(
            &run,
            StatusChange {
                run_id: identity.run_id,
                status: RunStatus::Running,
                message: None,
                at: now,
            },
        );
        Ok(run)
    }

    pub async fn define_metrics(&self, run: &Run, defs: Vec<MetricDef>) -> Result<(), IngestError> {
        let _guard = run.ingest.lock().await;
        let fresh = run.state(|st| -> Result<Vec<MetricDef>, IngestError> {
            let mut fresh: Vec<MetricDef> = Vec::new();
            for d in defs {
                let known = st
                    .metric_name(d.id)
                    .or_else(|| fresh.iter().find(|f| f.id == d.id).map(|f| f.name.as_str()));
                match known {
                    Some(name) if name == d.name => {}
                    Some(name) => {
                        return Err(IngestError::MetricRedefined {
                            id: d.id.0,
                            existing: name.to_string(),
                            new: d.name,
                        })
                    }
                    None => fresh.push(d),
                }
            }
            if st.metrics.len() + fresh.len() > MAX_METRICS {
                return Err(IngestError::Limit(format!(
                    "a run may define at most {MAX_METRICS} metrics"
                )));
            }
            Ok(fresh)
        })?;
        if fresh.is_empty() {
            return Ok(());
        }
        self.store.define_metrics(run.key, fresh.clone()).await?;
        run.state_mut(|st| {
            st.metrics.extend(fresh.iter().cloned());
            st.metrics.sort_by_key(|m| m.id);
            st.last_activity = unix_now();
        });
        let _ = run.live.send(LiveEvent::Metrics(fresh));
        Ok(())
    }

    /// Stores a batch (unless it is a resend of one already stored), then publishes it.
    pub async fn append(&self, run: &Run, batch: Batch) -> Result<Appended, IngestError> {
        if batch.records.len() > MAX_BATCH_RECORDS {
            return Err(IngestError::Limit(format!(
                "batch {} holds {} records; the limit is {MAX_BATCH_RECORDS}",
                batch.seq,
                batch.records.len()
            )));
        }
        let _guard = run.ingest.lock().await;
        let (last, tail, run_id) = run.state(|st| -> Result<_, IngestError> {
            let last = st.tail.last_seq;
            if batch.seq <= last {
                return Ok((last, None, st.identity.run_id.clone()));
            }
            if batch.seq != last + 1 {
                return Err(IngestError::SequenceGap {
                    got: batch.seq,
                    last,
                });
            }
            for r in &batch.records {
                for &(id, _) in &r.values {
                    if st.metric_name(id).is_none() {
                        return Err(IngestError::UndefinedMetric {
                            seq: batch.seq,
                            id: id.0,
                        });
                    }
                }
            }
            Ok((
                last,
                Some(st.tail.after(batch.seq, &batch.records)),
                st.identity.run_id.clone(),
            ))
        })?;
        let Some(tail) = tail else {
            tracing::debug!(run = %run_id, seq = batch.seq, last, "duplicate batch ignored");
            return Ok(Appended::Duplicate);
        };
        let seq = batch.seq;
        let records: Arc<[StepRecord]> = batch.records.into();
        self.store
            .append_batch(run.key, seq, records.clone(), tail.clone())
            .await?;
        let now = unix_now();
        let (revived, resolved) = run.state_mut(|st| {
            st.tail = tail;
            st.last_activity = now;
            st.dirty = true;
            st.heard_from(&self.rules, now)
        });
        let frame = encode(ToViewer::Live(stepstream_protocol::Live {
            run_id: run_id.clone(),
            seq,
            records: records.to_vec(),
        }));
        let _ = run.live.send(LiveEvent::Batch {
            seq,
            records: records.clone(),
            frame,
        });
        if revived {
            self.revived(run, run_id, now, resolved).await;
        }
        let others = self.other_ranks_step_times(run);
        let events = run.state_mut(|st| {
            let RunState { rules, metrics, .. } = st;
            let mut events = Vec::new();
            for r in records.iter() {
                let values: Vec<(&str, f64)> = r
                    .values
                    .iter()
                    .filter_map(|&(id, v)| {
                        let i = metrics.binary_search_by_key(&id, |m| m.id).ok()?;
                        Some((metrics[i].name.as_str(), v))
                    })
                    .collect();
                let mut findings = rules.findings(&self.rules, r.step, &values);
                // Always fed, so each rank's smoothed step time exists for the others.
                let others = others.as_deref().unwrap_or(&[]);
                findings.extend(rules.straggler(&self.rules, &values, others));
                events.extend(rules.events(&self.rules, r.step, findings, now));
            }
            events
        });
        for e in events {
            self.raise(run, e).await;
        }
        Ok(Appended::Stored)
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
                        .then_some(st.rules.step_time_ema)
                        .flatten()
                })
            })
            .collect();
        (!others.is_empty()).then_some(others)
    }

    /// Stores an alert event, shows it to the run's viewers and notifies the channels.
    async fn raise(&self, run: &Run, event: crate::alerts::Event) {
        use crate::alerts::Event;
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
        let (run_id, project, name) = run.state(|st| {
            (
                st.identity.run_id.clone(),
                st.identity.project.clone(),
                st.identity.name.clone(),
            )
        });
        let alert = stepstream_protocol::Alert {
            run_id: run_id.clone(),
            rule: rule.to_string(),
            fired,
            step,
            value,
            message: message.clone(),
            at: unix_now(),
        };
        if fired {
            tracing::warn!(run = %run_id, rule, step, %message, "alert");
        } else {
            tracing::info!(run = %run_id, rule, step, "alert resolved");
        }
        if let Err(e) = self.store.add_alert(run.key, alert.clone()).await {
            tracing::error!(error = %e, "could not store an alert");
        }
        let _ = run.live.send(LiveEvent::Alert(alert.clone()));
        self.notifier.send(crate::notify::Notice {
            link: self
                .notifier
                .public_url
                .as_ref()
                .map(|u| format!("{}/?run={run_id}", u.trim_end_matches('/'))),
            run_id: run_id.to_string(),
            project,
            run_name: name,
            rule: alert.rule,
            state: if fired { "fired" } else { "resolved" },
            step,
            value,
            message,
            at: alert.at,
        });
    }

    async fn revived(
        &self,
        run: &Run,
        run_id: RunId,
        now: f64,
        resolved: Option<crate::alerts::Event>,
    ) {
        tracing::info!(run = %run_id, "stale run is sending again");
        if let Some(e) = resolved {
            self.raise(run, e).await;
        }
        if let Err(e) = self
            .store
            .set_status(run.key, RunStatus::Running, None, now)
            .await
        {
            tracing::warn!(error = %e, "could not store a status change");
        }
        self.publish_status(
            run,
            StatusChange {
                run_id,
                status: RunStatus::Running,
                message: None,
                at: now,
            },
        );
    }

    /// The collector is alive (a heartbeat, or any frame).
    pub async fn heartbeat(&self, run: &Run) {
        let now = unix_now();
        let (revived, run_id, resolved) = run.state_mut(|st| {
            let (revived, resolved) = st.heard_from(&self.rules, now);
            (revived, st.identity.run_id.clone(), resolved)
        });
        self.store.touch(run.key, now);
        if revived {
            self.revived(run, run_id, now, resolved).await;
        }
    }

    /// Ends a run with the status its collector reported.
    pub async fn finish(
        &self,
        run: &Run,
        status: RunStatus,
        message: Option<String>,
    ) -> Result<(), StoreError> {
        let now = unix_now();
        self.store
            .set_status(run.key, status, message.clone(), now)
            .await?;
        let run_id = run.state_mut(|st| {
            st.status = status;
            st.status_message = message.clone();
            st.last_activity = now;
            st.identity.run_id.clone()
        });
        tracing::info!(run = %run_id, status = status.as_str(), "run ended");
        self.publish_status(
            run,
            StatusChange {
                run_id,
                status,
                message,
                at: now,
            },
        );
        Ok(())
    }

    /// Judges staleness and publishes the run-list updates gathered since the last tick.
    pub async fn tick(&self) {
        let now = unix_now();
        for run in self.runs() {
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
                if let Err(e) = self
                    .store
                    .set_status(run.key, status, Some(message.clone()), now)
                    .await
                {
                    tracing::warn!(error = %e, "could not store a status change");
                }
                if let Some(e) = alert {
                    self.raise(&run, e).await;
                }
                self.publish_status(
                    &run,
                    StatusChange {
                        run_id,
                        status,
                        message: Some(message),
                        at: now,
                    },
                );
            } else if run.state(|st| st.dirty) {
                self.publish_update(&run);
            }
        }
    }
}
