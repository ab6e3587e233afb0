//! The default engine: one SQLite file owned by one hub. WAL mode lets reads (on a small pool
//! of read connections, inside `spawn_blocking`) run beside the writer thread.
//!
//! * `checkpoint` — copying the WAL back into the database file, beside the writer.
//! * `schema` — the tables, their migrations (`PRAGMA user_version`), loading runs.
//! * `writer` — what each write command does inside the group's transaction.

mod checkpoint;
mod schema;
mod writer;

use super::blob::{class_floors, visit_values};
use super::command::{spawn_writer, Command, Writer};
use super::{Batches, Result, RunKey, StoreError, StoredRun};
use checkpoint::Checkpointer;
use rusqlite::{params, Connection, OptionalExtension};
use schema::{load_runs, migrate, INDEXES, SCHEMA};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use stepstream_protocol::{MetricId, RunId, StepRecord};
use tokio::sync::mpsc;

/// Blobs of a run's batches with `after < seq <= through`, in sequence order.
const SCAN: &str =
    "SELECT seq, data FROM batches WHERE run_key = ?1 AND seq > ?2 AND seq <= ?3 ORDER BY seq";

/// Reads on the blocking pool at once, at most.
const READERS: usize = 16;

/// SQLite's read side; cheap to clone.
#[derive(Clone)]
pub(super) struct Reads {
    readers: Arc<Mutex<Vec<Connection>>>,
    /// Reads in flight, at most: each holds a blocking thread and a read transaction, so a
    /// crowd of readers waits here rather than exhausting the blocking pool.
    reading: Arc<tokio::sync::Semaphore>,
    path: Arc<PathBuf>,
}

fn open_connection(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    // WAL + NORMAL: a committed transaction survives the process being killed (SIGKILL);
    // only an OS crash or power loss can take the last commits. `--durability full` (FULL)
    // closes that too at the price of an fsync per group commit.
    conn.pragma_update(None, "journal_mode", "WAL")?;
    Ok(conn)
}

/// Opens (or creates) the database, starts its writer thread, and returns the runs it holds.
pub(super) fn open(
    path: &Path,
    fsync_every_commit: bool,
    writer: Writer,
) -> Result<(mpsc::Sender<Command>, Reads, Vec<StoredRun>)> {
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
    // Checkpoints run on their own thread (`checkpoint`); SQLite's own is a backstop.
    conn.pragma_update(None, "wal_autocheckpoint", checkpoint::BACKSTOP_PAGES)?;
    conn.pragma_update(None, "journal_size_limit", checkpoint::WAL_KEPT_BYTES)?;
    conn.execute_batch(SCHEMA)?;
    migrate(&mut conn)?;
    conn.execute_batch(INDEXES)?;
    let runs = load_runs(&conn)?;

    let checkpointer = Checkpointer::start(path)?;
    let tx = spawn_writer(writer::Sqlite { conn, checkpointer }, writer);
    let reads = Reads {
        readers: Arc::new(Mutex::new(Vec::new())),
        reading: Arc::new(tokio::sync::Semaphore::new(READERS)),
        path: Arc::new(path.to_path_buf()),
    };
    Ok((tx, reads, runs))
}

impl Reads {
    /// Bytes of the database, its WAL and shared-memory files on disk.
    pub(super) fn size_on_disk(&self) -> u64 {
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

    /// Runs `f` on a pooled read connection on the blocking pool.
    async fn read<T: Send + 'static>(
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

    pub(super) async fn load_runs(&self) -> Result<Vec<StoredRun>> {
        self.read(load_runs).await
    }

    pub(super) async fn load_run(&self, run_id: RunId) -> Result<Option<StoredRun>> {
        self.read(move |conn| schema::load_run(conn, run_id.as_str()))
            .await
    }

    pub(super) async fn alerts(
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

    pub(super) async fn scan<S: Send + 'static>(
        &self,
        key: RunKey,
        after_seq: u64,
        through_seq: u64,
        mut state: S,
        mut f: impl FnMut(&mut S, u64, &[StepRecord]) -> ControlFlow<()> + Send + 'static,
    ) -> Result<S> {
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(SCAN)?;
            let rows = stmt.query(params![key, after_seq as i64, through_seq as i64])?;
            let _ = each_batch(rows, key, &mut state, &mut f)?;
            Ok(state)
        })
        .await
    }

    pub(super) async fn scan_values<S: Send + 'static>(
        &self,
        key: RunKey,
        after_seq: u64,
        through_seq: u64,
        mut state: S,
        mut f: impl FnMut(&mut S, i64, f64, MetricId, f64) + Send + 'static,
    ) -> Result<S> {
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(SCAN)?;
            let mut rows = stmt.query(params![key, after_seq as i64, through_seq as i64])?;
            while let Some(row) = rows.next()? {
                let seq = row.get::<_, i64>(0)? as u64;
                let blob = row.get_ref(1)?.as_blob().map_err(rusqlite::Error::from)?;
                visit_values(blob, |s, t, id, v| f(&mut state, s, t, id, v))
                    .ok_or(StoreError::Corrupt { run_key: key, seq })?;
            }
            Ok(state)
        })
        .await
    }

    pub(super) async fn step_bounds(&self, key: RunKey) -> Result<Option<(i64, i64)>> {
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

    pub(super) async fn scan_steps<S: Send + 'static>(
        &self,
        key: RunKey,
        (lo, hi): (i64, i64),
        through_seq: u64,
        mut state: S,
        mut f: impl FnMut(&mut S, u64, &[StepRecord]) -> ControlFlow<()> + Send + 'static,
    ) -> Result<S> {
        self.read(move |conn| {
            // A batch overlapping `lo..=hi` starts at or before `hi` and no further below
            // `lo` than the reach of its span class: one index probe per class. The
            // batches' sequence numbers first (`INDEXED BY`: without statistics SQLite would
            // rather walk the primary key, reading the whole run), then their blobs by key in
            // sequence order, so no blob is ever sorted.
            let mut seqs: Vec<i64> = Vec::new();
            {
                let mut probe = conn.prepare_cached(
                    "SELECT seq FROM batches INDEXED BY batches_by_span WHERE run_key = ?1 \
                     AND span_class = ?5 AND lo_step >= ?2 AND lo_step <= ?3 \
                     AND hi_step >= ?4 AND seq <= ?6",
                )?;
                for (class, floor) in class_floors(lo) {
                    let found = probe.query_map(
                        params![key, floor, hi, lo, class, through_seq as i64],
                        |r| r.get(0),
                    )?;
                    for seq in found {
                        seqs.push(seq?);
                    }
                }
            }
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

    pub(super) async fn config(&self, key: RunKey) -> Result<Option<String>> {
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

/// Hands each `(seq, data)` row's records to `f` until it returns `Break`.
fn each_batch<S>(
    mut rows: rusqlite::Rows<'_>,
    key: RunKey,
    state: &mut S,
    f: &mut impl FnMut(&mut S, u64, &[StepRecord]) -> ControlFlow<()>,
) -> Result<ControlFlow<()>> {
    let mut batches = Batches::new(key);
    while let Some(row) = rows.next()? {
        let seq = row.get::<_, i64>(0)? as u64;
        let blob = row.get_ref(1)?.as_blob().map_err(rusqlite::Error::from)?;
        if batches.visit(seq, blob, state, f)?.is_break() {
            return Ok(ControlFlow::Break(()));
        }
    }
    Ok(ControlFlow::Continue(()))
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> StoreError {
        StoreError::Sqlite(e.to_string())
    }
}
