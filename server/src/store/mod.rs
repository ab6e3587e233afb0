//! Durable storage of runs, metric names and every step record, behind one interface with
//! two engines: SQLite (one file, one hub: the default) and PostgreSQL (shared by the hubs of
//! a cluster). Both keep the same semantics: a batch is reported stored only after its
//! transaction committed, which is what lets the hub acknowledge it; `(run, seq)` is the
//! primary key, so a resent batch is refused by the key; each batch row carries its step
//! range, indexed, so a range read costs what the range holds.
//!
//! Writes go through one writer thread per hub ([`command`]: group commit, the same loop
//! for both engines); reads run on the blocking pool, at most 16 at once ([`reads`]: every
//! read written once, over each engine's SQL).
//!
//! * `command` — the write commands and the group-commit loop.
//! * `reads` — the read pool and the reads, over a per-engine `Dialect`.
//! * `sqlite` — the SQLite engine (schema, migrations, writer, its reads' SQL).
//! * `postgres` — the PostgreSQL engine (the same, plus the judges' leases).
//! * `blob` — the records' blob format, shared by both, independent of the wire format.
//! * `items` — console lines and samples as stored, beside the records.
//! * `commands` — commands for a run's training (stop, checkpoint, note) and their states,
//!   and alerts acknowledged or muted.

mod blob;
mod command;
mod items;
mod pack;
mod postgres;
mod reads;
mod sqlite;
pub mod summary;

pub use sqlite::backup::{backup, restore, Copied};

pub use blob::{decode_records, encode_records, visit_values};
use command::Command;
pub use items::{image_of, sample_bytes, ItemQuery, StoredItem};
pub use reads::Part;
use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use stepstream_protocol::{MetricDef, MetricId, RunId, RunIdentity, RunStatus, StepRecord};
use tokio::sync::{mpsc, oneshot};

/// The database's row id of a run.
pub type RunKey = i64;

/// A run's writer (a collector process) silent this long no longer holds it: another may
/// take it over (the old connection is presumed half-open). Three missed heartbeats at the
/// default 5 s. The claim is the store's, in both engines (`UpsertRun`), so one rule holds
/// however many hubs there are.
pub const WRITER_SILENCE_S: f64 = 15.0;

/// Why a resume naming another project than the stored run's was refused (the hub checked
/// the token against the hello's project).
fn other_project(run_id: &RunId, stored: &str, asked: &str) -> String {
    format!(
        "run {run_id} belongs to project {stored:?}, not {asked:?}: a resume cannot move a run \
         to another project"
    )
}

/// Why a claim of a run held by another live writer was refused.
fn held_by_another(run_id: &RunId) -> String {
    format!(
        "run {run_id} is being written by another collector (use another run id, or stop the \
         other writer)"
    )
}

/// Why a run may not be deleted now, from its stored status: a run that has not ended may
/// still be written (a stale run's collector may come back).
fn undeletable(run_id: &str, status: &str) -> Option<String> {
    matches!(status, "running" | "stale").then(|| {
        format!(
            "run {run_id} is {status}: only a run that ended may be deleted (stop it, or wait \
             until the hub marks it failed)"
        )
    })
}

/// What deleting a run removes: every table that holds rows of it, keyed by `run_key`,
/// before its `runs` row (the engines add their own: SQLite's `recent`, PostgreSQL's
/// `judges`).
const RUN_TABLES: [&str; 7] = [
    "batches",
    "summaries",
    "items",
    "alerts",
    "metrics",
    "commands",
    "alert_acks",
];

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database refused or cannot be reached (disk full, I/O error, a lost
    /// connection...). Each engine turns its own error into words in its files: only they
    /// name the engine crates, and no caller matches on the engine.
    #[error("{engine} error: {message}")]
    Database {
        /// `SQLite` or `PostgreSQL`.
        engine: &'static str,
        message: String,
    },
    /// A stored blob does not decode: the file was damaged or written by another version.
    #[error("corrupt record blob for run {run_key} batch {seq}")]
    Corrupt { run_key: RunKey, seq: u64 },
    /// Another collector, through another hub, holds the run.
    #[error("{0}")]
    Conflict(String),
    /// The writer thread has stopped (it only stops when the database failed to open).
    #[error("the database writer has stopped")]
    WriterGone,
    #[error("cannot create the database folder {path}: {source}")]
    CreateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the database task failed: {0}")]
    Join(String),
    #[error("{0}")]
    Schema(String),
    /// A batch whose predecessor is not stored (it failed, or was never sent): storing it
    /// would leave a hole in the run.
    #[error("batch {seq} of run {run_key} follows a batch the store does not hold (it holds through {stored})")]
    Gap {
        run_key: RunKey,
        seq: u64,
        stored: u64,
    },
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// A write the writer thread has queued: [`Written::committed`] waits for its commit, which
/// may be a commit interval away, so who need not wait (the alert judge) hands it on.
#[must_use = "a write's outcome is known only once committed"]
pub struct Written<T = ()>(oneshot::Receiver<Result<T>>);

impl<T> Written<T> {
    /// The outcome of the transaction that held the write.
    pub async fn committed(self) -> Result<T> {
        self.0.await.map_err(|_| StoreError::WriterGone)?
    }
}

/// What the store keeps of a run besides its records; loaded at start-up.
#[derive(Clone, Debug)]
pub struct StoredRun {
    pub key: RunKey,
    pub identity: RunIdentity,
    pub status: RunStatus,
    pub status_message: Option<String>,
    pub last_activity: f64,
    pub tail: RunTail,
    pub metrics: Vec<MetricDef>,
    /// Bytes of the samples stored for the run (what `run_sample_bytes` bounds).
    pub sample_bytes: u64,
}

/// The running summary of a run's records, kept in the `runs` row and updated in the same
/// transaction as the batch it summarises, so it can never disagree with the records.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunTail {
    pub last_seq: u64,
    pub last_step: Option<i64>,
    pub last_point_at: Option<f64>,
    pub records: u64,
    pub last_values: BTreeMap<MetricId, f64>,
}

impl RunTail {
    /// The summary after `records` are appended under `seq`.
    pub fn after(&self, seq: u64, records: &[StepRecord]) -> RunTail {
        let mut next = self.clone();
        next.last_seq = seq;
        next.records += records.len() as u64;
        for (i, r) in records.iter().enumerate() {
            next.last_step = Some(r.step);
            next.last_point_at = Some(r.wall_time);
            // A record whose successor carries the same metrics leaves no last value (the
            // usual case: every step logs the same set), so its map updates are skipped.
            let overwritten = records.get(i + 1).is_some_and(|n| {
                n.values.len() == r.values.len()
                    && n.values.iter().zip(&r.values).all(|(a, b)| a.0 == b.0)
            });
            if overwritten {
                continue;
            }
            for &(id, v) in &r.values {
                next.last_values.insert(id, v);
            }
        }
        next
    }
}

/// What [`Store::submit_batch`] stores of a batch: its records, its items, and the cap on
/// the run's console lines.
pub struct StoredBatch {
    pub records: Arc<[StepRecord]>,
    pub items: Arc<[stepstream_protocol::Item]>,
    /// Console lines the run keeps, at most (the oldest beyond are dropped).
    pub console_cap: u64,
}

/// Where the store lives: `--db PATH` or `--store postgres://...`.
#[derive(Clone, Debug)]
pub enum Location {
    Sqlite { path: PathBuf, fsync: bool },
    Postgres { url: String },
}

/// Handle to the database; cheap to clone.
#[derive(Clone)]
pub struct Store {
    writer: mpsc::Sender<Command>,
    /// Cuts the writer's commit interval short for a command someone waits on.
    waiting: Arc<command::Waiting>,
    reads: Reads,
    /// Transactions the writer committed.
    commits: Arc<AtomicU64>,
    /// The writer's last transaction failed.
    failing: Arc<AtomicBool>,
}

#[derive(Clone)]
enum Reads {
    Sqlite(reads::Reads<sqlite::Sqlite>),
    Postgres(reads::Reads<postgres::Postgres>),
}

/// Calls the same read on whichever engine holds the data.
macro_rules! read {
    ($self:ident . $method:ident ( $($arg:expr),* )) => {
        match &$self.reads {
            Reads::Sqlite(r) => r.$method($($arg),*).await,
            Reads::Postgres(r) => r.$method($($arg),*).await,
        }
    };
}

mod commands;
pub use commands::{Acked, StoredRule};

impl Store {
    /// Opens (or creates) the SQLite database and returns the runs it holds; each command
    /// is committed as soon as the writer takes it.
    pub fn open(path: &Path, fsync_every_commit: bool) -> Result<(Store, Vec<StoredRun>)> {
        Store::open_at(
            &Location::Sqlite {
                path: path.to_path_buf(),
                fsync: fsync_every_commit,
            },
            Duration::ZERO,
        )
    }

    /// Opens the store at `location`, bringing its schema up to date, and returns its runs.
    /// Blocks (a PostgreSQL connection is made before serving): call it off the runtime.
    /// A transaction starts at most once per `commit_interval` (see [`command`]).
    pub fn open_at(
        location: &Location,
        commit_interval: Duration,
    ) -> Result<(Store, Vec<StoredRun>)> {
        let commits = Arc::new(AtomicU64::new(0));
        let failing = Arc::new(AtomicBool::new(false));
        let waiting = Arc::new(command::Waiting::default());
        let settings = command::Writer {
            interval: commit_interval,
            commits: commits.clone(),
            waiting: waiting.clone(),
            failing: failing.clone(),
        };
        let (writer, reads, runs) = match location {
            Location::Sqlite { path, fsync } => {
                let (writer, reads, runs) = sqlite::open(path, *fsync, settings)?;
                (writer, Reads::Sqlite(reads), runs)
            }
            Location::Postgres { url } => {
                let (writer, reads, runs) = postgres::open(url, settings)?;
                (writer, Reads::Postgres(reads), runs)
            }
        };
        let store = Store {
            writer,
            waiting,
            reads,
            commits,
            failing,
        };
        Ok((store, runs))
    }

    /// Transactions committed since the store was opened.
    /// Whether the database takes writes: false while the writer's last transaction failed
    /// (it is retried with the next command; PostgreSQL's connection is made again).
    pub fn writable(&self) -> bool {
        !self.failing.load(Ordering::Relaxed) && !self.writer.is_closed()
    }

    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    /// Whether several hubs may share this store (PostgreSQL).
    pub fn shared(&self) -> bool {
        matches!(self.reads, Reads::Postgres(_))
    }

    /// Bytes the store takes: SQLite's files, or the PostgreSQL database's size.
    pub async fn size(&self) -> u64 {
        match &self.reads {
            Reads::Sqlite(r) => r.size_on_disk(),
            Reads::Postgres(r) => r.size().await.unwrap_or(0),
        }
    }

    async fn call<T>(&self, make: impl FnOnce(oneshot::Sender<Result<T>>) -> Command) -> Result<T> {
        self.hand(make)
            .await?
            .0
            .await
            .map_err(|_| StoreError::WriterGone)?
    }

    /// Queues a command for the writer thread (waiting only for room in its queue); the
    /// answer comes with the command's commit. Commands are applied in the order handed.
    async fn hand<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T>>) -> Command,
    ) -> Result<Written<T>> {
        let (reply, answer) = oneshot::channel();
        self.writer
            .send(make(reply))
            .await
            .map_err(|_| StoreError::WriterGone)?;
        self.waiting.wake();
        Ok(Written(answer))
    }

    /// Creates the run, or refreshes its identity and marks it running again, for the
    /// collector process `writer`. Refused ([`StoreError::Conflict`]) while another writer
    /// holds it and was heard from within [`WRITER_SILENCE_S`], or when the run is another
    /// project's.
    pub async fn upsert_run(&self, identity: RunIdentity, writer: u64, at: f64) -> Result<RunKey> {
        self.call(|reply| Command::UpsertRun {
            identity,
            writer,
            at,
            reply,
        })
        .await
    }

    /// Packs the run's batches after its last pack, its tail included (`pack`), at most
    /// `pack::PACKS_PER_COMMAND` packs; answers whether batches are left for another call.
    pub async fn pack(&self, key: RunKey) -> Result<bool> {
        self.call(|reply| Command::Pack { key, reply }).await
    }

    /// Deletes a run that ended and everything stored of it (its batches, console lines,
    /// samples, alerts, commands); answers whether it was stored. Refused
    /// ([`StoreError::Conflict`]) while the store says it is running or stale. On SQLite the
    /// freed pages go back to the file system (incremental vacuum).
    pub async fn delete_run(&self, key: RunKey) -> Result<bool> {
        self.call(|reply| Command::DeleteRun { key, reply }).await
    }

    /// Packs these runs' batches on a task of its own, one command after another; then
    /// summarises the store's packs that have none (made before summaries existed), in one
    /// walk over them.
    pub fn pack_in_background(&self, keys: Vec<RunKey>) {
        let store = self.clone();
        tokio::spawn(async move {
            for key in keys {
                loop {
                    match store.pack(key).await {
                        Ok(true) => continue,
                        Ok(false) => break,
                        Err(e) => {
                            tracing::warn!(run_key = key, error = %e, "packing a run's batches failed");
                            break;
                        }
                    }
                }
            }
            let mut after = Some((0, 0));
            while let Some(at) = after {
                after = match store.summarize(at).await {
                    Ok(next) => next,
                    Err(e) => {
                        tracing::warn!(error = %e, "summarising packs made before summaries failed");
                        None
                    }
                };
            }
        });
    }

    /// Summarises up to `summary::SUMMARIZE_PER_COMMAND` packs without summaries after
    /// `after` (run key, sequence number); answers where to go on from, `None` when done.
    pub async fn summarize(&self, after: (RunKey, u64)) -> Result<Option<(RunKey, u64)>> {
        self.call(|reply| Command::Summarize { after, reply }).await
    }

    pub async fn define_metrics(&self, key: RunKey, metrics: Vec<MetricDef>) -> Result<()> {
        self.call(|reply| Command::DefineMetrics {
            key,
            metrics,
            reply,
        })
        .await
    }

    /// Stores one batch and the run's new tail; returns once committed, with whether it was
    /// inserted (`false`: a batch of that sequence number was stored before, and nothing
    /// changed).
    /// Hands a batch to the writer; its answer (`true`: inserted, `false`: that `(run, seq)`
    /// was already stored) comes once its transaction ends. The writer refuses a batch
    /// whose predecessor the store does not hold ([`StoreError::Gap`]), so a run's batches
    /// may be submitted before the earlier ones commit: if one fails, so do the ones after.
    pub async fn submit_batch(
        &self,
        key: RunKey,
        seq: u64,
        batch: StoredBatch,
        tail: RunTail,
    ) -> Result<oneshot::Receiver<Result<bool>>> {
        let (reply, answer) = oneshot::channel();
        self.writer
            .send(Command::AppendBatch {
                key,
                seq,
                records: batch.records,
                items: batch.items,
                console_cap: batch.console_cap,
                tail,
                reply,
            })
            .await
            .map_err(|_| StoreError::WriterGone)?;
        Ok(answer)
    }

    pub async fn append_batch(
        &self,
        key: RunKey,
        seq: u64,
        records: Arc<[StepRecord]>,
        tail: RunTail,
    ) -> Result<bool> {
        let batch = StoredBatch {
            records,
            items: Arc::new([]),
            console_cap: u64::MAX,
        };
        self.submit_batch(key, seq, batch, tail)
            .await?
            .await
            .map_err(|_| StoreError::WriterGone)?
    }

    /// Someone waits for the batches already handed over (a connection that must settle
    /// them before defining a metric or finishing): the writer commits without waiting out
    /// its interval.
    pub fn hurry(&self) {
        self.waiting.wake();
    }

    /// Hands a status change to the writer; see [`Written`].
    pub async fn set_status(
        &self,
        key: RunKey,
        status: RunStatus,
        message: Option<String>,
        at: f64,
    ) -> Result<Written> {
        self.hand(|reply| Command::SetStatus {
            key,
            status,
            message,
            at,
            reply,
        })
        .await
    }

    /// Hands an alert event to the writer; see [`Written`].
    pub async fn add_alert(
        &self,
        key: RunKey,
        alert: stepstream_protocol::Alert,
    ) -> Result<Written> {
        self.hand(|reply| Command::AddAlert { key, alert, reply })
            .await
    }

    /// Records that the run was heard from; best effort (it only matters after a restart,
    /// and to the writer claim of a shared store).
    pub fn touch(&self, key: RunKey, at: f64) {
        let _ = self.writer.try_send(Command::Touch { key, at });
    }

    /// The collector `writer` left the run cleanly: another may take it at once.
    pub fn release_writer(&self, key: RunKey, writer: u64) {
        let _ = self.writer.try_send(Command::ReleaseWriter { key, writer });
    }

    /// Every run as stored now.
    pub async fn load_runs(&self) -> Result<Vec<StoredRun>> {
        read!(self.load_runs())
    }

    /// The run as stored now (its identity, status, tail and metrics).
    pub async fn load_run(&self, run_id: RunId) -> Result<Option<StoredRun>> {
        read!(self.load_run(run_id))
    }

    /// The run's alerts, oldest first.
    pub async fn alerts(
        &self,
        key: RunKey,
        run_id: RunId,
    ) -> Result<Vec<stepstream_protocol::Alert>> {
        read!(self.alerts(key, run_id))
    }

    /// Calls `f` with `state` and each stored batch of the run with
    /// `after_seq < seq <= through_seq`, in sequence order, until it returns `Break`; then
    /// returns the state. Runs on the blocking pool.
    pub async fn scan<S: Send + 'static>(
        &self,
        key: RunKey,
        after_seq: u64,
        through_seq: u64,
        state: S,
        f: impl FnMut(&mut S, u64, &[StepRecord]) -> ControlFlow<()> + Send + 'static,
    ) -> Result<S> {
        read!(self.scan(key, after_seq, through_seq, state, f))
    }

    /// Like [`Store::scan`], value by value (`f(state, step, wall_time, metric, value)`),
    /// without building records: for reading whole long runs.
    pub async fn scan_values<S: Send + 'static>(
        &self,
        key: RunKey,
        after_seq: u64,
        through_seq: u64,
        state: S,
        f: impl FnMut(&mut S, i64, f64, MetricId, f64) + Send + 'static,
    ) -> Result<S> {
        read!(self.scan_values(key, after_seq, through_seq, state, f))
    }

    /// The run's data over the steps `range` through `through_seq`, in sequence order, as
    /// [`Part`]s: the summaries at `width` (one of `summary::WIDTHS`) of the packs that lie
    /// inside the range, the records of everything else (steps outside the range included:
    /// the caller filters). Runs on the blocking pool.
    pub async fn scan_summarized<S: Send + 'static>(
        &self,
        key: RunKey,
        width: i64,
        range: (i64, i64),
        through_seq: u64,
        state: S,
        f: impl FnMut(&mut S, Part<'_>) + Send + 'static,
    ) -> Result<S> {
        read!(self.scan_summarized(key, width, range, through_seq, state, f))
    }

    /// One stored batch's records, if that batch is stored.
    pub async fn batch(&self, key: RunKey, seq: u64) -> Result<Option<Vec<StepRecord>>> {
        self.scan(
            key,
            seq.saturating_sub(1),
            seq,
            None,
            |found, _, records| {
                *found = Some(records.to_vec());
                ControlFlow::Break(())
            },
        )
        .await
    }

    /// The lowest and highest steps stored for the run (steps may go down: a resumed run,
    /// a rotated log, so the last record's step is not the highest).
    pub async fn step_bounds(&self, key: RunKey) -> Result<Option<(i64, i64)>> {
        read!(self.step_bounds(key))
    }

    /// Like [`Store::scan`], but only the batches that may hold a step in `lo..=hi`, found
    /// through the step index: the cost grows with the range, not with the run. Batches come
    /// in sequence order; `f` still sees whole batches and must skip steps outside the range.
    pub async fn scan_steps<S: Send + 'static>(
        &self,
        key: RunKey,
        range: (i64, i64),
        through_seq: u64,
        state: S,
        f: impl FnMut(&mut S, u64, &[StepRecord]) -> ControlFlow<()> + Send + 'static,
    ) -> Result<S> {
        read!(self.scan_steps(key, range, through_seq, state, f))
    }

    /// Calls `f` with `state` and each of the run's items that `query` asks for, in its
    /// order, until it returns `Break`; then returns the state. Runs on the blocking pool.
    pub async fn items<S: Send + 'static>(
        &self,
        key: RunKey,
        query: ItemQuery,
        state: S,
        f: impl FnMut(&mut S, StoredItem) -> ControlFlow<()> + Send + 'static,
    ) -> Result<S> {
        read!(self.items(key, query, state, f))
    }

    /// Console lines the run sent in all, and how many the store keeps (the oldest beyond
    /// the hub's `console_lines` limit were dropped).
    pub async fn console_counts(&self, key: RunKey) -> Result<(u64, u64)> {
        read!(self.console_counts(key))
    }

    /// The run's hyper-parameter config, as stored.
    pub async fn config(&self, key: RunKey) -> Result<Option<String>> {
        read!(self.config(key))
    }

    /// For hub `hub` of a cluster: renews its sign of life (its leases hold while it is
    /// seen within `ttl` seconds), takes the runs without a judge or whose judge went
    /// silent, and returns the runs it judges now. `None` for a store only one hub uses:
    /// that hub judges every run.
    pub async fn judge_leases(&self, hub: u64, ttl: f64) -> Result<Option<Vec<RunKey>>> {
        match &self.reads {
            Reads::Sqlite(_) => Ok(None),
            Reads::Postgres(r) => r.judge_leases(hub, ttl).await.map(Some),
        }
    }

    /// For hub `hub` of a cluster: takes the run's judge lease, whoever holds it (the run's
    /// collector just connected to this hub, so its heartbeats arrive here).
    pub async fn take_lease(&self, hub: u64, key: RunKey) -> Result<()> {
        match &self.reads {
            Reads::Sqlite(_) => Ok(()),
            Reads::Postgres(r) => r.take_lease(hub, key).await,
        }
    }
}

/// Decodes stored batches one after another into one reused buffer.
struct Batches {
    key: RunKey,
    records: Vec<StepRecord>,
    /// The batches wanted: `after < seq <= through`.
    after: u64,
    through: u64,
    /// A step range read: of a pack's batches, only those with a step in it are wanted.
    steps: Option<(i64, i64)>,
}

impl Batches {
    fn new(key: RunKey, (after, through): (u64, u64), steps: Option<(i64, i64)>) -> Batches {
        Batches {
            key,
            records: Vec::new(),
            after,
            through,
            steps,
        }
    }

    /// Hands the row's batches that are wanted to `f`, each with its records; a blob that
    /// does not decode is [`StoreError::Corrupt`].
    fn visit<S>(
        &mut self,
        seq: u64,
        blob: &[u8],
        state: &mut S,
        f: &mut impl FnMut(&mut S, u64, &[StepRecord]) -> ControlFlow<()>,
    ) -> Result<ControlFlow<()>> {
        let corrupt = StoreError::Corrupt {
            run_key: self.key,
            seq,
        };
        let wanted = self.after + 1..=self.through;
        if pack::is_pack(blob) {
            let pack = pack::decode_pack(blob).ok_or(corrupt)?;
            let touches = |records: &[StepRecord]| {
                self.steps
                    .is_none_or(|(lo, hi)| records.iter().any(|r| (lo..=hi).contains(&r.step)))
            };
            for (seq, records) in pack
                .batches()
                .filter(|(s, r)| wanted.contains(s) && touches(r))
            {
                if f(state, seq, records).is_break() {
                    return Ok(ControlFlow::Break(()));
                }
            }
            return Ok(ControlFlow::Continue(()));
        }
        if !wanted.contains(&seq) {
            return Ok(ControlFlow::Continue(()));
        }
        self.records.clear();
        decode_records(blob, &mut self.records).ok_or(corrupt)?;
        Ok(f(state, seq, &self.records))
    }
}

/// A run identity for tests: `id` in `project`, the rest fixed.
#[cfg(test)]
pub(crate) fn test_identity(id: &str, project: &str) -> RunIdentity {
    RunIdentity {
        run_id: RunId::new(id).unwrap(),
        project: project.into(),
        name: "n".into(),
        config_json: "{}".into(),
        host: "h".into(),
        rank: 0,
        world_size: 1,
        job: String::new(),
        framework: String::new(),
        started_at: 1.0,
    }
}

#[cfg(test)]
mod tests;
