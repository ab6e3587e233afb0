//! One run in the hub's memory: its store key, its live channel, its state, and who writes it.

use crate::store::{RunKey, RunTail};
use axum::body::Bytes;
use std::sync::{Arc, Mutex};
use stepstream_protocol::{MetricDef, MetricId, RunIdentity, RunStatus, RunSummary, StepRecord};
use tokio::sync::broadcast;

/// Something that happened to one run, as its subscribers receive it.
#[derive(Clone, Debug)]
pub enum LiveEvent {
    Batch {
        seq: u64,
        records: Arc<[StepRecord]>,
        /// Its console lines and samples as viewers get them (an image's place, not its
        /// bytes).
        items: Arc<[stepstream_protocol::Item]>,
        /// The `ToViewer::Live` frame of the whole batch, encoded once for every viewer
        /// that takes all metrics.
        frame: Bytes,
    },
    Metrics(Vec<MetricDef>),
    Status(stepstream_protocol::StatusChange),
    Alert(stepstream_protocol::Alert),
    /// A command for the run's training was queued or moved on.
    Command(stepstream_protocol::CommandEvent),
    /// The run was deleted: its followers stop (viewers are told through the run list).
    Deleted,
}

pub struct RunState {
    pub identity: RunIdentity,
    pub status: RunStatus,
    pub status_message: Option<String>,
    /// Hub clock, unix seconds, of the last frame from the run's collector.
    pub last_activity: f64,
    pub tail: RunTail,
    /// The newest batch published to viewers: the stored tail's, or above it while batches a
    /// lone hub published once checked wait for their commit.
    pub(super) published: u64,
    /// Sorted by id.
    pub metrics: Vec<MetricDef>,
    /// Changed since the last run-list update was published.
    pub(super) dirty: bool,
    /// The alert rules' state for this run.
    pub(super) rules: crate::alerts::RunRules,
    /// The collector connection writing this run: its process's writer id and a connection
    /// number; `None` when no collector is connected.
    pub(super) writer: Option<(u64, u64)>,
    /// Bytes of samples stored for the run, and those of batches in flight (reserved at
    /// submit, given back when not stored): what `run_sample_bytes` bounds.
    pub(super) sample_bytes: u64,
    /// The training's own alerts (`user:TITLE`) told within the cooldown, and when.
    pub(super) user_alerts: std::collections::HashMap<String, f64>,
    /// The page rules' state on this run.
    pub(super) custom: super::rules::CustomStates,
}

impl RunState {
    pub(super) fn new(identity: RunIdentity, tail: RunTail, metrics: Vec<MetricDef>) -> RunState {
        let rules = crate::alerts::RunRules::new(&identity.config_json);
        RunState {
            identity,
            status: RunStatus::Running,
            status_message: None,
            last_activity: 0.0,
            published: tail.last_seq,
            tail,
            metrics,
            dirty: true,
            rules,
            writer: None,
            sample_bytes: 0,
            user_alerts: Default::default(),
            custom: Default::default(),
        }
    }

    /// The alert rules firing for this run now.
    pub fn firing_alerts(&self) -> Vec<&'static str> {
        self.rules.firing()
    }

    pub fn metric_name(&self, id: MetricId) -> Option<&str> {
        stepstream_protocol::metric_index(&self.metrics, id).map(|i| self.metrics[i].name.as_str())
    }

    /// The summary a live run-list update carries: its last values only of the headline
    /// metrics (loss-like names and `lr`, at most [`HEADLINE_VALUES`]), so a thousand runs
    /// of fifty metrics do not cost every viewer a megabyte a second. The full last values
    /// are in the run list a viewer gets on connecting and in the API.
    pub fn headline(&self) -> RunSummary {
        let mut s = self.summary();
        s.last_values.retain(|(name, _)| headline(name));
        s.last_values.truncate(HEADLINE_VALUES);
        s
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

/// Last values a live run-list update carries per run, at most.
pub const HEADLINE_VALUES: usize = 4;

/// Whether a metric is one the run list shows: a loss, or the learning rate.
fn headline(name: &str) -> bool {
    name.contains("loss") || name == "lr" || name == "learning_rate"
}

/// One run: its store key, its live channel and its state.
pub struct Run {
    pub key: RunKey,
    pub live: broadcast::Sender<LiveEvent>,
    /// Serialises ingest for the run, so two connections for one run (a reconnect racing a
    /// half-open old socket) cannot interleave a check and a write.
    pub(super) ingest: tokio::sync::Mutex<()>,
    pub(super) state: Mutex<RunState>,
    /// Told whenever the stored tail moves or published batches are taken back: what a new
    /// subscriber waits on before it reads history (see [`Run::subscribe`]).
    pub(super) settled: tokio::sync::watch::Sender<()>,
    /// Told whenever a command for the run's training is queued (here or, in a cluster, on
    /// another hub): the collector's connection reads the unfinished ones and delivers what
    /// it has not.
    pub commands: tokio::sync::watch::Sender<()>,
}

impl Run {
    pub(super) fn new(key: RunKey, state: RunState) -> Run {
        Run {
            key,
            live: broadcast::channel(super::LIVE_CAPACITY).0,
            ingest: tokio::sync::Mutex::new(()),
            state: Mutex::new(state),
            settled: tokio::sync::watch::Sender::new(()),
            commands: tokio::sync::watch::Sender::new(()),
        }
    }

    /// Subscribes to the run's live events, and returns the sequence number its history is
    /// to be read through from the store: every batch through it is stored, every later one
    /// comes on the channel. A batch is published before its commit (see `append.rs`), so
    /// this waits for the commit of those published and not yet stored: a commit interval at
    /// most.
    pub async fn subscribe(&self) -> (broadcast::Receiver<LiveEvent>, u64) {
        let live = self.live.subscribe();
        let through = self.settled_through().await;
        (live, through)
    }

    /// The newest published batch once it is stored; the stored tail instead if the batches
    /// above it were taken back (their commit failed: their collector still holds them).
    /// Published batches after it are on any channel subscribed before the call.
    pub async fn settled_through(&self) -> u64 {
        let published = self.state(|st| st.published);
        let mut settled = self.settled.subscribe();
        loop {
            let (stored, now_published) = self.state(|st| (st.tail.last_seq, st.published));
            if stored >= published {
                return published;
            }
            if now_published < published || settled.changed().await.is_err() {
                return stored;
            }
        }
    }

    /// Moves the stored tail (a batch committed, or one another hub committed) and wakes the
    /// subscribers waiting for it; `f` runs under the same lock.
    pub(super) fn store_tail<T>(&self, tail: RunTail, f: impl FnOnce(&mut RunState) -> T) -> T {
        let out = self.state_mut(|st| {
            st.published = st.published.max(tail.last_seq);
            st.tail = tail;
            f(st)
        });
        self.settled.send_replace(());
        out
    }

    /// Takes back what was published above the stored tail (its commit failed); returns the
    /// batches taken back. Viewers keep what they were sent: the collector holds those batches
    /// unacknowledged and resends them, the same records under the same numbers.
    pub(super) fn take_back(&self) -> u64 {
        let taken = self.state_mut(|st| {
            let taken = st.published.saturating_sub(st.tail.last_seq);
            st.published = st.tail.last_seq;
            taken
        });
        if taken > 0 {
            self.settled.send_replace(());
        }
        taken
    }

    /// Reads the state. A panic elsewhere while the lock was held does not make the run
    /// unreadable: the state is plain data, kept consistent by each short critical section.
    pub fn state<T>(&self, f: impl FnOnce(&RunState) -> T) -> T {
        f(&self.state.lock().unwrap_or_else(|e| e.into_inner()))
    }

    pub(super) fn state_mut<T>(&self, f: impl FnOnce(&mut RunState) -> T) -> T {
        f(&mut self.state.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Takes the run's ingest lock: checking a batch against the run's tail and storing it
    /// happen under it (see [`crate::hub::Hub::submit`]).
    pub async fn lock_ingest(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.ingest.lock().await
    }

    /// Ends a collector connection's claim on the run in memory, if it still holds it;
    /// returns the writer that let go (`Hub::release_writer` tells the store too).
    pub(super) fn release_writer(&self, connection: u64) -> Option<u64> {
        self.state_mut(|st| match st.writer {
            Some((writer, c)) if c == connection => {
                st.writer = None;
                Some(writer)
            }
            _ => None,
        })
    }
}
