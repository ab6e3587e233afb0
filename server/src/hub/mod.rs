//! The hub's in-memory view of every run and the fan-out of what happens to them.
//!
//! Each run has one bounded `broadcast` channel of [`LiveEvent`]s, published only after the
//! store committed what they carry; the run list has one more: a [`RunUpdate`] when a run's
//! status changes, and once a second one `RunUpdates` frame with every run whose summary
//! changed (a thousand live runs are one frame, not a thousand). Publishing never waits for
//! a viewer: a viewer that falls behind sees `Lagged` and catches up from the store (see
//! `viewer.rs`).
//!
//! * `append` — a collector's batches: checked, handed to the store, settled after its commit.
//! * `run` — one run's state, and which collector writes it.
//! * `judge` — run status (running / stale / finished / failed / killed) on the hub's
//!   clock, and the alert rules, on their own task.
//! * `peer` — the hub as one of a cluster: telling the other hubs, applying what they
//!   tell, and the judge leases that make one hub judge each run.

mod actions;
mod announce;
mod append;
pub mod commands;
mod delete;
mod judge;
pub mod pace;
mod peer;
pub mod retention;
pub mod rules;
mod run;

use crate::limits::HubLimits;
use crate::store::{RunTail, Store, StoreError};
pub use append::{Appended, InFlight, Submitted};
use axum::body::Bytes;
pub use delete::DeleteError;
use judge::Job;
pub use peer::follow;
pub use run::{LiveEvent, Run, RunState};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;
use stepstream_protocol::{
    unix_now, MetricDef, MetricId, RunId, RunIdentity, RunStatus, RunSummary, RunUpdate,
    StatusChange, StepRecord, ToViewer,
};
use tokio::sync::{broadcast, mpsc};

/// Live events per run a viewer may fall behind before it is resynchronised from storage.
const LIVE_CAPACITY: usize = 512;
const UPDATES_CAPACITY: usize = 1024;

/// How run status is judged.
#[derive(Clone, Debug)]
pub struct StatusPolicy {
    /// A running run that sent nothing (not even a heartbeat) for this long is stale.
    pub stale_after: Duration,
    /// A stale run that stays silent this long (counted from its last sign of life) is marked
    /// failed: its process is presumed dead. `None` keeps it stale.
    pub fail_after: Option<Duration>,
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
    #[error("{0}")]
    Conflict(String),
    /// Never allowed, whoever retries: a resume naming another project than the stored run's.
    #[error("{0}")]
    Forbidden(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

pub struct Hub {
    pub store: Store,
    pub limits: HubLimits,
    policy: StatusPolicy,
    rules: crate::alerts::Rules,
    /// What alerts do besides notify, by rule (`[actions.RULE]`).
    actions: std::collections::BTreeMap<String, crate::alerts::actions::RuleAction>,
    /// Which endings of a run are notified (`[endings]`).
    endings: crate::alerts::actions::Endings,
    notifier: crate::notify::Notifier,
    /// The alerts file's rules, actions and endings as TOML (no secrets), for the page.
    pub operator_toml: String,
    /// Each project's rules made in the page (`rules.rs`).
    page_rules: RwLock<HashMap<String, rules::ProjectRules>>,
    /// This hub, for the tasks it starts (a rule action waiting out its grace period).
    me: std::sync::Weak<Hub>,
    runs: RwLock<HashMap<RunId, Arc<Run>>>,
    updates: broadcast::Sender<Bytes>,
    judge: mpsc::Sender<Job>,
    /// Alerts and status changes waiting for their commit to be told (`announce.rs`).
    announcer: mpsc::Sender<announce::Announcement>,
    /// Jobs the judge could not take (it was a whole channel behind).
    pub unjudged: AtomicU64,
    /// The other hubs, when this one is part of a cluster (see [`Hub::join`]).
    cluster: OnceLock<Arc<crate::cluster::Cluster>>,
    /// The runs this hub judges: `None` alone (all of them), else those it holds a lease on.
    judging: Mutex<Option<HashSet<crate::store::RunKey>>>,
    /// When the leases were last renewed (hub clock).
    leases_at: Mutex<f64>,
    /// When changed runs' summaries were last published (hub clock).
    swept_at: Mutex<f64>,
    /// Bytes of samples of every run this hub knows (stored, or reserved in flight): what
    /// `hub_sample_bytes` bounds.
    sample_bytes: AtomicU64,
    /// The linger collectors are asked for (`pace.rs`).
    pub pace: pace::Pace,
    /// Which ended runs the hub deletes on its own (`retention.rs`), and when it last
    /// looked (hub clock); set while a look is under way.
    retention: OnceLock<retention::Retention>,
    retained_at: Mutex<f64>,
    retaining: std::sync::atomic::AtomicBool,
}

fn encode(msg: ToViewer) -> Bytes {
    Bytes::from(msg.encode())
}

impl Hub {
    /// Builds the hub over an opened store and the runs it held, and starts its judge.
    pub fn new(
        store: Store,
        stored: Vec<crate::store::StoredRun>,
        policy: StatusPolicy,
        alerts: &crate::notify::AlertsConfig,
        limits: HubLimits,
    ) -> Arc<Hub> {
        let (hub, jobs) = Hub::unjudged(store, stored, policy, alerts, limits);
        tokio::spawn(judge::judge_loop(Arc::downgrade(&hub), jobs));
        hub
    }

    /// The hub without its judge task; the receiver gets the judge's jobs.
    fn unjudged(
        store: Store,
        stored: Vec<crate::store::StoredRun>,
        policy: StatusPolicy,
        alerts: &crate::notify::AlertsConfig,
        limits: HubLimits,
    ) -> (Arc<Hub>, mpsc::Receiver<Job>) {
        let samples: u64 = stored.iter().map(|s| s.sample_bytes).sum();
        let runs = stored
            .into_iter()
            .map(|s| {
                let mut state = RunState::new(s.identity, s.tail, s.metrics);
                state.sample_bytes = s.sample_bytes;
                state.status = s.status;
                state.status_message = s.status_message;
                state.last_activity = s.last_activity;
                state.dirty = false;
                let run = Run::new(s.key, state);
                (run.state(|st| st.identity.run_id.clone()), Arc::new(run))
            })
            .collect();
        let (judge, jobs) = mpsc::channel(judge::JUDGE_CAPACITY);
        let (announcer, announcements) = mpsc::channel(announce::ANNOUNCER_CAPACITY);
        let hub = Arc::new_cyclic(|me| Hub {
            store,
            limits,
            policy,
            rules: alerts.rules.clone(),
            actions: alerts.actions.clone(),
            endings: alerts.endings.clone(),
            notifier: crate::notify::Notifier::start(alerts),
            me: me.clone(),
            page_rules: RwLock::new(HashMap::new()),
            operator_toml: alerts.operator_toml(),
            runs: RwLock::new(runs),
            updates: broadcast::channel(UPDATES_CAPACITY).0,
            judge,
            announcer,
            unjudged: AtomicU64::new(0),
            cluster: OnceLock::new(),
            judging: Mutex::new(None),
            leases_at: Mutex::new(0.0),
            swept_at: Mutex::new(0.0),
            sample_bytes: AtomicU64::new(samples),
            pace: pace::Pace::default(),
            retention: OnceLock::new(),
            retained_at: Mutex::new(0.0),
            retaining: Default::default(),
        });
        tokio::spawn(announce::announce_loop(Arc::downgrade(&hub), announcements));
        (hub, jobs)
    }

    /// Makes this hub one of a cluster: it tells the others what it commits and judges only
    /// the runs it holds a lease on.
    pub fn join(&self, cluster: Arc<crate::cluster::Cluster>) {
        self.share_store();
        let _ = self.cluster.set(cluster);
    }

    /// Treats the store as shared with other hubs: runs it does not know are looked up there,
    /// and it judges only runs it holds a lease on.
    fn share_store(&self) {
        *self.judging.lock().unwrap_or_else(|e| e.into_inner()) = Some(HashSet::new());
    }

    pub fn run(&self, id: &RunId) -> Option<Arc<Run>> {
        self.runs
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
    }

    pub fn runs(&self) -> Vec<Arc<Run>> {
        let mut runs: Vec<_> = self
            .runs
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        runs.sort_by_key(|r| r.key);
        runs
    }

    /// Every run's summary with its headline values (the full last values are in the API),
    /// for a viewer's run list.
    pub fn run_list(&self) -> Vec<RunSummary> {
        self.runs()
            .iter()
            .map(|r| r.state(RunState::headline))
            .collect()
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

    /// Whether a new run of `project` fits the run limits; the error names the limit.
    fn room_for_run(&self, project: &str) -> Result<(), IngestError> {
        let runs = self.runs.read().unwrap_or_else(|e| e.into_inner());
        if runs.len() >= self.limits.runs {
            return Err(IngestError::Limit(format!(
                "the hub holds {} runs, its limit (limit runs)",
                runs.len()
            )));
        }
        let in_project = runs
            .values()
            .filter(|r| r.state(|st| st.identity.project == project))
            .count();
        if in_project >= self.limits.runs_per_project {
            return Err(IngestError::Limit(format!(
                "project {project:?} has {in_project} runs, its limit (limit runs_per_project)"
            )));
        }
        Ok(())
    }

    /// A collector said hello on connection `connection` of writer `writer`: creates the run
    /// or brings it back to running, and makes that connection its writer. A second live
    /// writer (another process) is refused; the same writer takes over from its own stale
    /// connection.
    pub async fn open_run(
        &self,
        identity: RunIdentity,
        writer: u64,
        connection: u64,
    ) -> Result<Arc<Run>, IngestError> {
        self.limits
            .wire
            .check_identity(&identity)
            .map_err(IngestError::Limit)?;
        if self.clustered() {
            // Another hub may have written this run last: start from the shared store.
            self.refresh(&identity.run_id).await;
        }
        let now = unix_now();
        let existing = self.run(&identity.run_id);
        if let Some(run) = &existing {
            // The token was checked against the hello's project: that must be the stored
            // run's, or a token of one project could write into (and move) another's run.
            let stored = run.state(|st| st.identity.project.clone());
            if stored != identity.project {
                return Err(IngestError::Forbidden(format!(
                    "run {} belongs to project {stored:?}, not {:?}: a resume cannot move a \
                     run to another project",
                    identity.run_id, identity.project
                )));
            }
            // Whether another live writer holds it is the store's to say (`upsert_run`).
        } else {
            self.room_for_run(&identity.project)?;
        }
        let key = match self.store.upsert_run(identity.clone(), writer, now).await {
            Ok(key) => key,
            Err(StoreError::Conflict(why)) => return Err(IngestError::Conflict(why)),
            Err(e) => return Err(e.into()),
        };
        // The collector's heartbeats arrive here: this hub judges the run.
        self.take_lease(key).await;
        // A run deleted meanwhile (its key is gone) is a new run now.
        let existing = existing.filter(|r| r.key == key);
        let run = match existing {
            Some(run) => {
                let (was, resolved) = run.state_mut(|st| {
                    let was = st.status;
                    // A resumed run keeps the start time it was archived under, and its
                    // name and config: a resume never rewrites what readers of the project
                    // already saw (the store keeps them too).
                    let old = std::mem::replace(&mut st.identity, identity.clone());
                    st.identity.started_at = old.started_at;
                    st.identity.name = old.name;
                    st.identity.config_json = old.config_json;
                    st.status = RunStatus::Running;
                    st.status_message = None;
                    st.last_activity = now;
                    st.writer = Some((writer, connection));
                    let step = st.tail.last_step.unwrap_or(0);
                    (was, st.rules.stale(&self.rules, false, step, "", now))
                });
                if let Some(event) = resolved {
                    self.judge(Job::Event {
                        run: run.clone(),
                        event,
                    });
                }
                if was != RunStatus::Running {
                    tracing::info!(run = %identity.run_id, from = was.as_str(), "run is running again");
                }
                run
            }
            None => {
                tracing::info!(run = %identity.run_id, project = %identity.project, name = %identity.name, "new run");
                let mut state = RunState::new(identity.clone(), RunTail::default(), Vec::new());
                state.last_activity = now;
                let run = Arc::new(Run::new(key, state));
                let run = {
                    let mut runs = self.runs.write().unwrap_or_else(|e| e.into_inner());
                    match runs.get(&identity.run_id) {
                        Some(known) if known.key == key => known.clone(),
                        // Unknown, or a deleted run of the same id whose key is gone.
                        _ => {
                            runs.insert(identity.run_id.clone(), run.clone());
                            run
                        }
                    }
                };
                // Two first hellos for one new id raced: the loser is a second writer.
                let mine = run.state_mut(|st| match st.writer {
                    Some((w, _)) if w != writer => false,
                    _ => {
                        st.writer = Some((writer, connection));
                        true
                    }
                });
                if !mine {
                    return Err(IngestError::Conflict(format!(
                        "run {} is being written by another collector",
                        identity.run_id
                    )));
                }
                run
            }
        };
        let change = StatusChange {
            run_id: identity.run_id,
            status: RunStatus::Running,
            message: None,
            at: now,
        };
        // Stored (the upsert above committed): told through the announcer, after whatever
        // it was told before, as every status change of this hub is.
        self.announce_and_wait(&run, announce::News::Status(change))
            .await;
        Ok(run)
    }

    /// Adds metric definitions. Checks the count first, then each name and id in one pass.
    pub async fn define_metrics(&self, run: &Run, defs: Vec<MetricDef>) -> Result<(), IngestError> {
        let limits = &self.limits.wire;
        let _guard = run.ingest.lock().await;
        let defined = run.state(|st| st.metrics.len());
        if defs.len() > limits.run_metrics as usize {
            return Err(IngestError::Limit(format!(
                "{} metric definitions at once; a run may define at most {} (limit run_metrics)",
                defs.len(),
                limits.run_metrics
            )));
        }
        for d in &defs {
            limits
                .check_name("metric name", &d.name)
                .map_err(IngestError::Limit)?;
        }
        let mut seen: HashMap<MetricId, &str> = HashMap::with_capacity(defs.len());
        let fresh = run.state(|st| -> Result<Vec<MetricDef>, IngestError> {
            // A name has one id: a second id for a known name would split its series.
            let mut names: HashMap<&str, MetricId> =
                st.metrics.iter().map(|m| (m.name.as_str(), m.id)).collect();
            let mut fresh = Vec::new();
            for d in &defs {
                let known = st.metric_name(d.id).or_else(|| seen.get(&d.id).copied());
                match known {
                    Some(name) if name == d.name => {}
                    Some(name) => {
                        return Err(IngestError::MetricRedefined {
                            id: d.id.0,
                            existing: name.to_string(),
                            new: d.name.clone(),
                        })
                    }
                    None => {
                        if let Some(&other) = names.get(d.name.as_str()) {
                            return Err(IngestError::MetricRedefined {
                                id: d.id.0,
                                existing: format!("(metric {:?} has id {})", d.name, other.0),
                                new: d.name.clone(),
                            });
                        }
                        names.insert(&d.name, d.id);
                        seen.insert(d.id, &d.name);
                        fresh.push(d.clone());
                    }
                }
            }
            Ok(fresh)
        })?;
        if fresh.is_empty() {
            return Ok(());
        }
        if defined + fresh.len() > limits.run_metrics as usize {
            return Err(IngestError::Limit(format!(
                "the run has {defined} metrics and defines {} more; the limit is {} (limit \
                 run_metrics)",
                fresh.len(),
                limits.run_metrics
            )));
        }
        self.store.define_metrics(run.key, fresh.clone()).await?;
        let run_id = run.state_mut(|st| {
            st.metrics.extend(fresh.iter().cloned());
            st.metrics.sort_by_key(|m| m.id);
            st.last_activity = unix_now();
            st.identity.run_id.clone()
        });
        self.tell_metrics(&run_id, &fresh);
        let _ = run.live.send(LiveEvent::Metrics(fresh));
        Ok(())
    }

    /// A collector connection ended: its claim on the run ends too, in memory and in the
    /// store, so another process may resume the run at once.
    pub fn release_writer(&self, run: &Run, connection: u64) {
        if let Some(writer) = run.release_writer(connection) {
            self.store.release_writer(run.key, writer);
        }
    }

    /// The collector is alive (a heartbeat, or any frame).
    pub fn heartbeat(&self, run: &Arc<Run>) {
        let now = unix_now();
        let (revived, resolved) = run.state_mut(|st| heard_from(st, &self.rules, now));
        self.store.touch(run.key, now);
        if revived {
            self.judge(Job::Revived {
                run: run.clone(),
                now,
                resolved,
            });
        }
    }

    /// Records that the hub lost acknowledged data of a run: an alert every viewer of the run
    /// sees and every channel is told of.
    pub fn note_loss(&self, run: &Arc<Run>, message: String) {
        let step = run.state(|st| st.tail.last_step.unwrap_or(0));
        self.judge(Job::Event {
            run: run.clone(),
            event: crate::alerts::Event::Fired {
                rule: "data_loss",
                step,
                value: f64::NAN,
                message,
            },
        });
    }

    /// Ends a run with the status its collector reported.
    pub async fn finish(
        &self,
        run: &Arc<Run>,
        status: RunStatus,
        message: Option<String>,
    ) -> Result<(), StoreError> {
        let now = unix_now();
        let mut message = message;
        if status == RunStatus::Stopped {
            // What stopping early saved, where the run's config says how long it would go.
            if let Some(note) = actions::saved_note(run) {
                message.get_or_insert_with(String::new).push_str(&note);
            }
        }
        if let Some(m) = message.as_mut() {
            truncate(m, self.limits.wire.name_bytes as usize * 8);
            // A failure's message may hold line feeds (a traceback), but never a NUL: PostgreSQL
            // refuses one, and the commit holding it would fail.
            if m.contains('\0') {
                *m = m.replace('\0', "\u{fffd}");
            }
        }
        self.store
            .set_status(run.key, status, message.clone(), now)
            .await?
            .committed()
            .await?;
        let run_id = run.state_mut(|st| {
            st.status = status;
            st.status_message = message.clone();
            st.last_activity = now;
            st.identity.run_id.clone()
        });
        tracing::info!(run = %run_id, status = status.as_str(), "run ended");
        let change = StatusChange {
            run_id,
            status,
            message,
            at: now,
        };
        // Through the announcer, after any status change the clock made before.
        self.announce(run, None, announce::News::Status(change.clone()))
            .await;
        self.expire_commands(run, status).await;
        self.tell_ending(run, status, change.message.as_deref());
        self.retain_soon();
        if status == RunStatus::Failed {
            self.failed(run, change.message.unwrap_or_default()).await;
        }
        Ok(())
    }

    /// A run failed: an alert (`run_failed`) on every channel, with the failure's message and
    /// the last lines of the run's console.
    async fn failed(&self, run: &Arc<Run>, why: String) {
        let step = run.state(|st| st.tail.last_step.unwrap_or(0));
        let query = crate::store::ItemQuery::console((i64::MIN, i64::MAX), true);
        let last = self
            .store
            .items(
                run.key,
                query,
                Vec::new(),
                |lines: &mut Vec<String>, item| {
                    let mut text = item.body;
                    truncate(&mut text, FAILED_LINE_BYTES);
                    lines.push(text);
                    if lines.len() < FAILED_LINES {
                        std::ops::ControlFlow::Continue(())
                    } else {
                        std::ops::ControlFlow::Break(())
                    }
                },
            )
            .await
            .unwrap_or_default();
        let mut message = if why.is_empty() {
            "the run failed".to_string()
        } else {
            why
        };
        if !last.is_empty() {
            message.push_str("\nlast lines of its console:");
            for line in last.iter().rev() {
                message.push_str("\n  ");
                message.push_str(line);
            }
        }
        self.judge(Job::Event {
            run: run.clone(),
            event: crate::alerts::Event::Fired {
                rule: "run_failed",
                step,
                value: f64::NAN,
                message,
            },
        });
    }
}

/// Console lines a failed run's notice carries, at most, and bytes of each.
const FAILED_LINES: usize = 8;
const FAILED_LINE_BYTES: usize = 300;

/// Sends a stored batch to the run's viewers: encoded once for every viewer that takes the
/// whole batch, not at all when nobody watches the run.
fn publish_batch(
    run: &Run,
    run_id: RunId,
    seq: u64,
    records: &Arc<[StepRecord]>,
    items: &[stepstream_protocol::Item],
) {
    if run.live.receiver_count() > 0 {
        let items: Arc<[stepstream_protocol::Item]> =
            items.iter().map(without_image_bytes).collect();
        let frame = encode(ToViewer::Live(stepstream_protocol::Live {
            run_id,
            seq,
            records: records.to_vec(),
            items: items.to_vec(),
        }));
        let _ = run.live.send(LiveEvent::Batch {
            seq,
            records: records.clone(),
            items,
            frame,
        });
    }
}

/// An item as a viewer's live frame carries it: an image's place, not its bytes (the page
/// reads them over HTTP, once, when it shows them).
fn without_image_bytes(item: &stepstream_protocol::Item) -> stepstream_protocol::Item {
    match &item.body {
        stepstream_protocol::ItemBody::Image(i) => stepstream_protocol::Item {
            body: stepstream_protocol::ItemBody::Image(stepstream_protocol::Image {
                data: Vec::new(),
                ..i.clone()
            }),
            ..item.clone()
        },
        _ => item.clone(),
    }
}

/// The run's collector was heard from: a stale run is running again. Returns whether it was
/// stale, and the stale alert's resolution, judged under the same lock as the status flip so
/// it cannot race the tick.
fn heard_from(
    st: &mut RunState,
    rules: &crate::alerts::Rules,
    now: f64,
) -> (bool, Option<crate::alerts::Event>) {
    st.last_activity = now;
    if st.status != RunStatus::Stale {
        return (false, None);
    }
    st.status = RunStatus::Running;
    st.status_message = None;
    let step = st.tail.last_step.unwrap_or(0);
    (true, st.rules.stale(rules, false, step, "", now))
}

/// Records equal bit for bit (NaN equals NaN of the same bits).
fn same_records(a: &[StepRecord], b: &[StepRecord]) -> bool {
    // A record's values as a set: a pack gives them back in metric id order (a metric is
    // once per record, so the set is the record).
    let values = |r: &StepRecord| {
        let mut v: Vec<(u32, u64)> = r.values.iter().map(|(i, v)| (i.0, v.to_bits())).collect();
        v.sort_unstable();
        v
    };
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.step == y.step
                && x.wall_time.to_bits() == y.wall_time.to_bits()
                && values(x) == values(y)
        })
}

/// Cuts `s` to at most `max` bytes, on a character boundary.
fn truncate(s: &mut String, max: usize) {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

#[cfg(test)]
mod tests;
