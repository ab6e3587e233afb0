//! Durable storage of runs, metric names and every step record, in one SQLite database.
//!
//! One writer thread owns the write connection and commits whatever commands are waiting as
//! one transaction (group commit), then answers each; a batch is reported stored only after
//! its transaction committed, which is what lets the hub acknowledge it. WAL mode lets reads
//! (on a small pool of read connections, inside `spawn_blocking`) run beside the writer.
//!
//! Records are kept one row per batch: `(run, seq)` is the primary key, so a resent batch is
//! refused by the key and ingest costs one row per batch, not one per value. Each batch row
//! also carries its step range, indexed, so a range read costs what the range holds.
//!
//! * `schema` — the tables, their migrations, and loading the runs at start-up.
//! * `writer` — the writer thread and what each command does to the database.
//! * `blob` — the records' blob format, this module's own, independent of the wire format.

mod blob;
mod schema;
mod writer;

pub use blob::{decode_records, encode_records, visit_values};
use rusqlite::{params, Connection, OptionalExtension};
use schema::{load_runs, migrate, INDEXES, SCHEMA};
use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use stepstream_protocol::{MetricDef, MetricId, RunId, RunIdentity, RunStatus, StepRecord};
use tokio::sync::{mpsc, oneshot};
use writer::{writer_loop, Command};

/// The database's row id of a run.
pub type RunKey = i64;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite refused (disk full, I/O error, locked database...).
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// A stored blob does not decode: the file was damaged or written by another version.
    #[error("corrupt record blob for run {run_key} batch {seq}")]
    Corrupt { run_key: RunKey, seq: u64 },
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
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

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
        for r in records {
            next.last_step = Some(r.step);
            next.last_point_at = Some(r.wall_time);
            for &(id, v) in &r.values {
                next.last_values.insert(id, v);
            }
        }
        next
    }
}

/// Handle to the database; cheap to clone.
#[derive(Clone)]
pub struct Store {
    writer: mpsc::Sender<Command>,
    readers: Arc<Mutex<Vec<Connection>>>,
    /// Reads in flight, at most: each holds a blocking thread and a read transaction, so a
    /// crowd of readers waits here rather than exhausting the blocking pool.
    reading: Arc<tokio::sync::Semaphore>,
    path: Arc<PathBuf>,
}

/// Reads on the blocking pool at once, at most.
const READERS: usize = 16;

fn open_connection(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    // WAL + NORMAL: a committed transaction survives the process being killed (SIGKILL);
    // only an OS crash or power loss can take the last commits. `--durability full` (FULL)
    // closes that too at the price of an fsync per group commit.
    conn.pragma_update(None, "journal_mode", "WAL")?;
    Ok(conn)
}

impl Store {
    /// Bytes of the database, its WAL and shared-memory files on disk.
    pub fn size_on_disk(&self) -> u64 {
        ["", "-wal", "-shm"]
            .iter()
            .filter_map(|suffix| {
                let mut p = self.path.as_os_str().to_owned();
                p.push(suffix);
                std::fs::metadata(PathBuf::from(p)).ok()
            })
            .map(|m| m.len())
            .sum()
    }

    /// Opens (or creates) the database and returns the runs it holds.
    pub fn open(path: &Path, fsync_every_commit: bool) -> Result<(Store, Vec<StoredRun>)> {
        if let Some(dir) = path.parent() {
            if !dir.as_os_str().is_empty() {
                std::fs::create_dir_all(dir).map_err(|source| StoreError::CreateDir {
                    path: dir.to_path_buf(),
                    source,
                })?;
            }
        }
        let mut conn = open_connection(path)?;
        conn.pragma_update(
            None,
            "synchronous",
            if fsync_every_commit { "FULL" } else { "NORMAL" },
        )?;
        conn.execute_batch(SCHEMA)?;
        migrate(&mut conn)?;
        conn.execute_batch(INDEXES)?;
        let runs = load_runs(&conn)?;

        let (tx, rx) = mpsc::channel(4096);
        std::thread::Builder::new()
            .name("stepstream-db-writer".into())
            .spawn(move || writer_loop(conn, rx))
            .expect("spawn the database writer thread");
        let store = Store {
            writer: tx,
            readers: Arc::new(Mutex::new(Vec::new())),
            reading: Arc::new(tokio::sync::Semaphore::new(READERS)),
            path: Arc::new(path.to_path_buf()),
        };
        Ok((store, runs))
    }

    async fn call<T>(&self, make: impl FnOnce(oneshot::Sender<Result<T>>) -> Command) -> Result<T> {
        let (reply, answer) = oneshot::channel();
        self.writer
            .send(make(reply))
            .await
            .map_err(|_| StoreError::WriterGone)?;
        answer.await.map_err(|_| StoreError::WriterGone)?
    }

    /// Creates the run, or refreshes its identity and marks it running again.
    pub async fn upsert_run(&self, identity: RunIdentity, at: f64) -> Result<RunKey> {
        self.call(|reply| Command::UpsertRun {
            identity,
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

    /// Stores one batch and the run's new tail; returns once committed.
    pub async fn append_batch(
        &self,
        key: RunKey,
        seq: u64,
        records: Arc<[StepRecord]>,
        tail: RunTail,
    ) -> Result<()> {
        self.call(|reply| Command::AppendBatch {
            key,
            seq,
            records,
            tail,
            reply,
        })
        .await
    }

    pub async fn set_status(
        &self,
        key: RunKey,
        status: RunStatus,
        message: Option<String>,
        at: f64,
    ) -> Result<()> {
        self.call(|reply| Command::SetStatus {
            key,
            status,
            message,
            at,
            reply,
        })
        .await
    }

    pub async fn add_alert(&self, key: RunKey, alert: stepstream_protocol::Alert) -> Result<()> {
        self.call(|reply| Command::AddAlert { key, alert, reply })
            .await
    }

    /// The run's alerts, oldest first.
    pub async fn alerts(
        &self,
        key: RunKey,
        run_id: RunId,
    ) -> Result<Vec<stepstream_protocol::Alert>> {
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT rule, fired, step, value, message, at FROM alerts WHERE run_key = ?1 \
                 ORDER BY at, rowid",
            )?;
            let rows = stmt.query_map([key], |r| {
                Ok(stepstream_protocol::Alert {
                    run_id: run_id.clone(),
                    rule: r.get(0)?,
                    fired: r.get::<_, i64>(1)? != 0,
                    step: r.get(2)?,
                    value: r.get::<_, Option<f64>>(3)?.unwrap_or(f64::NAN),
                    message: r.get(4)?,
                    at: r.get(5)?,
                })
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }

    /// Records that the run was heard from; best effort (it only matters after a restart).
    pub fn touch(&self, key: RunKey, at: f64) {
        let _ = self.writer.try_send(Command::Touch { key, at });
    }

    /// Runs `f` on a pooled read connection on the blocking pool.
    pub async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let readers = self.readers.clone();
        let path = self.path.clone();
        let permit = self
            .reading
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| StoreError::Join(e.to_string()))?;
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let pooled = readers.lock().unwrap_or_else(|e| e.into_inner()).pop();
            let conn = match pooled {
                Some(c) => c,
                None => open_connection(&path)?,
            };
            let out = f(&conn);
            let mut pool = readers.lock().unwrap_or_else(|e| e.into_inner());
            if pool.len() < READERS {
                pool.push(conn);
            }
            out
        })
        .await
        .map_err(|e| StoreError::Join(e.to_string()))?
    }

    /// Calls `f` with `state` and each stored batch of the run with
    /// `after_seq < seq <= through_seq`, in sequence order, until it returns `Break`; then
    /// returns the state. Runs on the blocking pool.
    pub async fn scan<S: Send + 'static>(
        &self,
        key: RunKey,
        after_seq: u64,
        through_seq: u64,
        mut state: S,
        mut f: impl FnMut(&mut S, u64, &[StepRecord]) -> ControlFlow<()> + Send + 'static,
    ) -> Result<S> {
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT seq, data FROM batches WHERE run_key = ?1 AND seq > ?2 AND seq <= ?3 \
                 ORDER BY seq",
            )?;
            let rows = stmt.query(params![key, after_seq as i64, through_seq as i64])?;
            let _ = each_batch(rows, key, &mut state, &mut f)?;
            Ok(state)
        })
        .await
    }

    /// Like [`Store::scan`], value by value (`f(state, step, wall_time, metric, value)`),
    /// without building records: for reading whole long runs.
    pub async fn scan_values<S: Send + 'static>(
        &self,
        key: RunKey,
        after_seq: u64,
        through_seq: u64,
        mut state: S,
        mut f: impl FnMut(&mut S, i64, f64, MetricId, f64) + Send + 'static,
    ) -> Result<S> {
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT seq, data FROM batches WHERE run_key = ?1 AND seq > ?2 AND seq <= ?3 \
                 ORDER BY seq",
            )?;
            let rows = stmt.query(params![key, after_seq as i64, through_seq as i64])?;
            let _ = each_blob(rows, key, |_, blob| {
                visit_values(blob, |s, t, id, v| f(&mut state, s, t, id, v))
                    .map(|()| ControlFlow::Continue(()))
            })?;
            Ok(state)
        })
        .await
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
        self.read(move |conn| {
            let (lo, hi): (Option<i64>, Option<i64>) = conn
                .prepare_cached(
                    "SELECT min(lo_step), max(hi_step) FROM batches WHERE run_key = ?1",
                )?
                .query_row([key], |r| Ok((r.get(0)?, r.get(1)?)))?;
            Ok(lo.zip(hi))
        })
        .await
    }

    /// Like [`Store::scan`], but only the batches that may hold a step in `lo..=hi`, found
    /// through the step index: the cost grows with the range, not with the run. Batches come
    /// in sequence order; `f` still sees whole batches and must skip steps outside the range.
    pub async fn scan_steps<S: Send + 'static>(
        &self,
        key: RunKey,
        (lo, hi): (i64, i64),
        through_seq: u64,
        mut state: S,
        mut f: impl FnMut(&mut S, u64, &[StepRecord]) -> ControlFlow<()> + Send + 'static,
    ) -> Result<S> {
        self.read(move |conn| {
            // A batch overlapping `lo..=hi` starts at or before `hi` and no further below
            // `lo` than the widest batch of the run spans (`max_span`, kept on append).
            // The batches' sequence numbers from the step index first (`INDEXED BY`: without
            // statistics SQLite would rather walk the primary key, reading the whole run),
            // then their blobs by key in sequence order, so no blob is ever sorted.
            let mut seqs: Vec<i64> = conn
                .prepare_cached(
                    "SELECT seq FROM batches INDEXED BY batches_by_step WHERE run_key = ?1 \
                     AND lo_step >= ?2 - (SELECT max_span FROM runs WHERE key = ?1) \
                     AND lo_step <= ?3 AND hi_step >= ?2 AND seq <= ?4",
                )?
                .query_map(params![key, lo, hi, through_seq as i64], |r| r.get(0))?
                .collect::<rusqlite::Result<_>>()?;
            seqs.sort_unstable();
            let mut stmt = conn
                .prepare_cached("SELECT seq, data FROM batches WHERE run_key = ?1 AND seq = ?2")?;
            for seq in seqs {
                let rows = stmt.query(params![key, seq])?;
                if each_batch(rows, key, &mut state, &mut f)?.is_break() {
                    break;
                }
            }
            Ok(state)
        })
        .await
    }

    /// The run's hyper-parameter config, as stored.
    pub async fn config(&self, key: RunKey) -> Result<Option<String>> {
        self.read(move |conn| {
            Ok(conn
                .query_row("SELECT config FROM runs WHERE key = ?1", [key], |r| {
                    r.get(0)
                })
                .optional()?)
        })
        .await
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

/// Hands each `(seq, data)` row's blob to `f` until it returns `Break`; a blob `f` cannot
/// read (`None`) is a [`StoreError::Corrupt`].
fn each_blob(
    mut rows: rusqlite::Rows<'_>,
    key: RunKey,
    mut f: impl FnMut(u64, &[u8]) -> Option<ControlFlow<()>>,
) -> Result<ControlFlow<()>> {
    while let Some(row) = rows.next()? {
        let seq = row.get::<_, i64>(0)? as u64;
        let blob = row.get_ref(1)?.as_blob().map_err(rusqlite::Error::from)?;
        if f(seq, blob)
            .ok_or(StoreError::Corrupt { run_key: key, seq })?
            .is_break()
        {
            return Ok(ControlFlow::Break(()));
        }
    }
    Ok(ControlFlow::Continue(()))
}

/// Decodes each `(seq, data)` row and hands its records to `f` until it returns `Break`.
fn each_batch<S>(
    rows: rusqlite::Rows<'_>,
    key: RunKey,
    state: &mut S,
    f: &mut impl FnMut(&mut S, u64, &[StepRecord]) -> ControlFlow<()>,
) -> Result<ControlFlow<()>> {
    let mut records = Vec::new();
    each_blob(rows, key, |seq, blob| {
        records.clear();
        decode_records(blob, &mut records)?;
        Some(f(state, seq, &records))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use blob::test_record as rec;

    #[tokio::test]
    async fn batches_survive_reopen_and_duplicates_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hub.db");
        {
            let (store, runs) = Store::open(&path, false).unwrap();
            assert!(runs.is_empty());
            let key = store
                .upsert_run(test_identity("r1", "p"), 10.0)
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
}
