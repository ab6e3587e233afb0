//! Durable storage of runs, metric names and every step record, behind one interface with
//! two engines: SQLite (one file, one hub: the default) and PostgreSQL (shared by the hubs of
//! a cluster). Both keep the same semantics: a batch is reported stored only after its
//! transaction committed, which is what lets the hub acknowledge it; `(run, seq)` is the
//! primary key, so a resent batch is refused by the key; each batch row carries its step
//! range, indexed, so a range read costs what the range holds.
//!
//! Writes go through one writer thread per hub ([`command`]: group commit, the same loop
//! for both engines); reads run on the blocking pool, at most 16 at once.
//!
//! * `command` — the write commands and the group-commit loop.
//! * `sqlite` — the SQLite engine (schema, migrations, writer, reads).
//! * `postgres` — the PostgreSQL engine (the same, plus the judges' leases).
//! * `blob` — the records' blob format, shared by both, independent of the wire format.

mod blob;
mod command;
mod postgres;
mod sqlite;

pub use blob::{decode_records, encode_records, visit_values};
use command::Command;
use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use stepstream_protocol::{MetricDef, MetricId, RunId, RunIdentity, RunStatus, StepRecord};
use tokio::sync::{mpsc, oneshot};

/// The database's row id of a run.
pub type RunKey = i64;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite refused (disk full, I/O error, locked database...).
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// PostgreSQL refused or cannot be reached.
    #[error("PostgreSQL error: {0}")]
    Postgres(#[from] ::postgres::Error),
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
}

#[derive(Clone)]
enum Reads {
    Sqlite(sqlite::Reads),
    Postgres(postgres::Reads),
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
        let waiting = Arc::new(command::Waiting::default());
        let settings = command::Writer {
            interval: commit_interval,
            commits: commits.clone(),
            waiting: waiting.clone(),
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
        };
        Ok((store, runs))
    }

    /// Transactions committed since the store was opened.
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
    /// collector process `writer`. A shared store refuses the run
    /// ([`StoreError::Conflict`]) while another writer holds it and was heard from within
    /// `silence` seconds.
    pub async fn upsert_run(&self, identity: RunIdentity, writer: u64, at: f64) -> Result<RunKey> {
        self.call(|reply| Command::UpsertRun {
            identity,
            writer,
            at,
            reply,
        })
        .await
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
        records: Arc<[StepRecord]>,
        tail: RunTail,
    ) -> Result<oneshot::Receiver<Result<bool>>> {
        let (reply, answer) = oneshot::channel();
        self.writer
            .send(Command::AppendBatch {
                key,
                seq,
                records,
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
        self.submit_batch(key, seq, records, tail)
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
}

impl Batches {
    fn new(key: RunKey) -> Batches {
        Batches {
            key,
            records: Vec::new(),
        }
    }

    /// Hands the blob's records to `f`; a blob that does not decode is
    /// [`StoreError::Corrupt`].
    fn visit<S>(
        &mut self,
        seq: u64,
        blob: &[u8],
        state: &mut S,
        f: &mut impl FnMut(&mut S, u64, &[StepRecord]) -> ControlFlow<()>,
    ) -> Result<ControlFlow<()>> {
        self.records.clear();
        decode_records(blob, &mut self.records).ok_or(StoreError::Corrupt {
            run_key: self.key,
            seq,
        })?;
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
mod tests {
    use super::*;

    use blob::test_record as rec;

    /// A command someone waits on (here a new metric's definition, which holds back its
    /// run's batches) ends the writer's commit interval instead of waiting it out.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_command_someone_waits_on_cuts_the_commit_interval_short() {
        let dir = tempfile::tempdir().unwrap();
        let location = Location::Sqlite {
            path: dir.path().join("hub.db"),
            fsync: false,
        };
        let interval = Duration::from_secs(3);
        let (store, _) = Store::open_at(&location, interval).unwrap();
        let mut keys = Vec::new();
        for r in 0..8 {
            let id = test_identity(&format!("r{r}"), "p");
            keys.push(store.upsert_run(id, 1, 1.0).await.unwrap());
        }
        let append_all = |seq: u64| {
            let mut sent = tokio::task::JoinSet::new();
            for &key in &keys {
                let store = store.clone();
                let records: Arc<[StepRecord]> = vec![rec(seq as i64, 1.0)].into();
                // Each run's tail before this batch: empty, or its batch 1.
                let tail = match seq {
                    1 => RunTail::default(),
                    _ => RunTail::default().after(1, &[rec(1, 1.0)]),
                };
                sent.spawn(async move {
                    let tail = tail.after(seq, &records);
                    store.append_batch(key, seq, records, tail).await
                });
            }
            sent
        };
        // Eight runs' batches in one transaction: from then on the writer waits its interval.
        for appended in append_all(1).join_all().await {
            assert!(appended.unwrap());
        }
        let second = append_all(2);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let asked = std::time::Instant::now();
        store
            .define_metrics(
                keys[0],
                vec![MetricDef {
                    id: MetricId(0),
                    name: "loss".into(),
                }],
            )
            .await
            .unwrap();
        let waited = asked.elapsed();
        assert!(
            waited < Duration::from_secs(1),
            "a metric definition waited {waited:?} of a {interval:?} commit interval"
        );
        for appended in second.join_all().await {
            assert!(appended.unwrap());
        }
    }

    /// Batches of many runs arriving within one commit interval share a transaction; with
    /// no interval each is committed on its own as it comes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn batches_within_the_commit_interval_share_one_commit() {
        async fn commits_for_spread_appends(interval: Duration) -> u64 {
            let dir = tempfile::tempdir().unwrap();
            let location = Location::Sqlite {
                path: dir.path().join("hub.db"),
                fsync: false,
            };
            let (store, _) = Store::open_at(&location, interval).unwrap();
            let mut opened = tokio::task::JoinSet::new();
            for r in 0..40 {
                let store = store.clone();
                let id = test_identity(&format!("r{r}"), "p");
                opened.spawn(async move { store.upsert_run(id, 1, 1.0).await });
            }
            let keys: Vec<RunKey> = opened
                .join_all()
                .await
                .into_iter()
                .map(Result::unwrap)
                .collect();
            let before = store.commits();
            // One batch per run, 4 at a time, 2 ms apart: 20 ms in all, as a fleet's runs
            // send.
            let mut sent = tokio::task::JoinSet::new();
            for four in keys.chunks(4) {
                for &key in four {
                    let store = store.clone();
                    let records: Arc<[StepRecord]> = vec![rec(1, 1.0)].into();
                    sent.spawn(async move {
                        let tail = RunTail::default().after(1, &records);
                        store.append_batch(key, 1, records, tail).await
                    });
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            while let Some(appended) = sent.join_next().await {
                assert!(appended.unwrap().unwrap(), "every batch is stored");
            }
            store.commits() - before
        }
        let shared = commits_for_spread_appends(Duration::from_millis(500)).await;
        // The first commits hold what arrived before four runs were seen busy at once (one
        // run, then the rest of the first four); after that one wait takes everything.
        assert!(shared <= 4, "40 batches in 20 ms took {shared} commits");
        let alone = commits_for_spread_appends(Duration::ZERO).await;
        assert!(
            alone >= 5,
            "without an interval 40 batches took {alone} commits"
        );
    }

    /// A lone writer's batches are not held back for the interval: each commits as it
    /// comes (ten would take five seconds if each waited).
    #[tokio::test]
    async fn a_lone_writer_does_not_wait_for_the_commit_interval() {
        let dir = tempfile::tempdir().unwrap();
        let location = Location::Sqlite {
            path: dir.path().join("hub.db"),
            fsync: false,
        };
        let (store, _) = Store::open_at(&location, Duration::from_millis(500)).unwrap();
        let key = store
            .upsert_run(test_identity("r", "p"), 1, 1.0)
            .await
            .unwrap();
        let started = std::time::Instant::now();
        let mut tail = RunTail::default();
        for seq in 1..=10u64 {
            let records: Arc<[StepRecord]> = vec![rec(seq as i64, 1.0)].into();
            tail = tail.after(seq, &records);
            store
                .append_batch(key, seq, records, tail.clone())
                .await
                .unwrap();
        }
        let took = started.elapsed();
        assert!(
            took < Duration::from_millis(2500),
            "ten batches took {took:?}"
        );
    }

    /// Batches may be handed to the writer before the earlier ones commit: one whose
    /// predecessor is not stored is refused, whichever transaction it shares, so a failed
    /// batch takes the ones behind it along and the run never has a hole.
    #[tokio::test]
    async fn a_batch_whose_predecessor_is_not_stored_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let location = Location::Sqlite {
            path: dir.path().join("hub.db"),
            fsync: false,
        };
        let (store, _) = Store::open_at(&location, Duration::ZERO).unwrap();
        let key = store
            .upsert_run(test_identity("r", "p"), 1, 1.0)
            .await
            .unwrap();
        let tails = |seqs: &[u64]| {
            let mut tail = RunTail::default();
            seqs.iter()
                .map(|&seq| {
                    let records: Arc<[StepRecord]> = vec![rec(seq as i64, seq as f64)].into();
                    tail = tail.after(seq, &records);
                    (seq, records, tail.clone())
                })
                .collect::<Vec<_>>()
        };
        let all = tails(&[1, 2, 3, 4]);
        let (seq, records, tail) = all[0].clone();
        assert!(store.append_batch(key, seq, records, tail).await.unwrap());
        // 3 and 4 skip 2; 2 comes last. Handed over together, they share transactions.
        let mut answers = Vec::new();
        for i in [2, 3, 1] {
            let (seq, records, tail) = all[i].clone();
            answers.push((
                seq,
                store.submit_batch(key, seq, records, tail).await.unwrap(),
            ));
        }
        let mut outcomes = Vec::new();
        for (seq, answer) in answers {
            outcomes.push((seq, answer.await.unwrap()));
        }
        for (seq, outcome) in &outcomes[..2] {
            assert!(
                matches!(outcome, Err(StoreError::Gap { stored: 1, .. })),
                "batch {seq}: {outcome:?}"
            );
        }
        assert!(matches!(outcomes[2], (2, Ok(true))), "{:?}", outcomes[2]);
        // What is stored is 1 and 2, and the tail says so.
        let stored = store
            .scan(key, 0, 100, Vec::new(), |out, seq, _| {
                out.push(seq);
                ControlFlow::Continue(())
            })
            .await
            .unwrap();
        assert_eq!(stored, vec![1, 2]);
        drop(store);
        let (_, runs) = Store::open_at(&location, Duration::ZERO).unwrap();
        assert_eq!(runs[0].tail.last_seq, 2);
        assert_eq!(runs[0].tail.records, 2);
    }

    /// SQLite's own checkpoint waits for 65,536 WAL pages: a few hundred kilobytes of
    /// batches reach the database file only through the checkpointer, which no read or
    /// timer starts, only a commit.
    #[tokio::test]
    async fn commits_reach_the_database_file_through_the_checkpointer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hub.db");
        let (store, _) = Store::open(&path, false).unwrap();
        let key = store
            .upsert_run(test_identity("r", "p"), 1, 1.0)
            .await
            .unwrap();
        let mut tail = RunTail::default();
        for seq in 1..=40u64 {
            let records: Arc<[StepRecord]> = (0..100)
                .map(|i| StepRecord {
                    step: (seq * 100 + i) as i64,
                    wall_time: 1.0,
                    values: (0..10).map(|m| (MetricId(m), (seq * i) as f64)).collect(),
                })
                .collect::<Vec<_>>()
                .into();
            tail = tail.after(seq, &records);
            assert!(store
                .append_batch(key, seq, records, tail.clone())
                .await
                .unwrap());
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let file = || std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        while file() < 200_000 {
            assert!(
                std::time::Instant::now() < deadline,
                "the database file holds {} bytes after 10 s: nothing checkpointed",
                file()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[tokio::test]
    async fn batches_survive_reopen_and_duplicates_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hub.db");
        {
            let (store, runs) = Store::open(&path, false).unwrap();
            assert!(runs.is_empty());
            let key = store
                .upsert_run(test_identity("r1", "p"), 1, 10.0)
                .await
                .unwrap();
            store
                .define_metrics(
                    key,
                    vec![MetricDef {
                        id: MetricId(0),
                        name: "loss".into(),
                    }],
                )
                .await
                .unwrap();
            let mut tail = RunTail::default();
            for seq in 1..=3u64 {
                let records: Arc<[StepRecord]> = vec![rec(seq as i64, seq as f64)].into();
                tail = tail.after(seq, &records);
                store
                    .append_batch(key, seq, records, tail.clone())
                    .await
                    .unwrap();
            }
            // A resent batch is ignored by the primary key and leaves the tail alone.
            let again: Arc<[StepRecord]> = vec![rec(99, 99.0)].into();
            store
                .append_batch(key, 2, again.clone(), RunTail::default().after(2, &again))
                .await
                .unwrap();
        }
        let (store, runs) = Store::open(&path, false).unwrap();
        assert_eq!(runs.len(), 1);
        let run = &runs[0];
        assert_eq!(run.tail.last_seq, 3);
        assert_eq!(run.tail.records, 3);
        assert_eq!(run.tail.last_values[&MetricId(0)], 3.0);
        assert_eq!(run.metrics.len(), 1);
        let steps = store
            .scan(run.key, 0, 3, Vec::new(), |steps, _, recs| {
                steps.extend(recs.iter().map(|r| r.step));
                ControlFlow::Continue(())
            })
            .await
            .unwrap();
        assert_eq!(steps, vec![1, 2, 3]);
        assert_eq!(store.step_bounds(run.key).await.unwrap(), Some((1, 3)));
    }

    /// `after` skips the map updates of a record its successor overwrites; the last values
    /// must still be every metric's last value in the batch, whatever sets of metrics the
    /// records carry.
    #[test]
    fn a_tail_holds_each_metrics_last_value_in_the_batch() {
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let mut tail = RunTail::default();
        let mut want: BTreeMap<MetricId, f64> = BTreeMap::new();
        for seq in 1..=300u64 {
            let records: Vec<StepRecord> = (0..next(6))
                .map(|i| {
                    // Mostly the same set step after step, sometimes another.
                    let set = if next(4) == 0 { next(3) } else { 0 };
                    let values: Vec<(MetricId, f64)> = (0..4u32)
                        .filter(|id| (id + set as u32) % 3 != 0 || set == 0)
                        .map(|id| (MetricId(id), (seq * 10 + i) as f64 + f64::from(id) / 10.0))
                        .collect();
                    StepRecord {
                        step: seq as i64,
                        wall_time: 0.0,
                        values,
                    }
                })
                .collect();
            for r in &records {
                want.extend(r.values.iter().copied());
            }
            tail = tail.after(seq, &records);
            assert_eq!(tail.last_values, want, "batch {seq}");
        }
    }
}
