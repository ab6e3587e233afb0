//! Durable storage of runs, metric names and every step record, in one SQLite database.
//!
//! One writer thread owns the write connection and commits whatever commands are waiting as
//! one transaction (group commit), then answers each; a batch is reported stored only after
//! its transaction committed, which is what lets the hub acknowledge it. WAL mode lets reads
//! (on a small pool of read connections, inside `spawn_blocking`) run beside the writer.
//!
//! Records are kept one row per batch: `(run, seq)` is the primary key, so a resent batch is
//! refused by the key and ingest costs one row per batch, not one per value. The blob format
//! is this module's own (see [`encode_records`]), independent of the wire format.

use rusqlite::{params, Connection, OptionalExtension};
use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use stepstream_protocol::{MetricDef, MetricId, RunId, RunIdentity, RunStatus, StepRecord};
use tokio::sync::{mpsc, oneshot};

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

enum Command {
    UpsertRun {
        identity: RunIdentity,
        at: f64,
        reply: oneshot::Sender<Result<RunKey>>,
    },
    DefineMetrics {
        key: RunKey,
        metrics: Vec<MetricDef>,
        reply: oneshot::Sender<Result<()>>,
    },
    AppendBatch {
        key: RunKey,
        seq: u64,
        records: Arc<[StepRecord]>,
        tail: RunTail,
        reply: oneshot::Sender<Result<()>>,
    },
    SetStatus {
        key: RunKey,
        status: RunStatus,
        message: Option<String>,
        at: f64,
        reply: oneshot::Sender<Result<()>>,
    },
    Touch {
        key: RunKey,
        at: f64,
    },
    AddAlert {
        key: RunKey,
        alert: stepstream_protocol::Alert,
        reply: oneshot::Sender<Result<()>>,
    },
}

/// Handle to the database; cheap to clone.
#[derive(Clone)]
pub struct Store {
    writer: mpsc::Sender<Command>,
    readers: Arc<Mutex<Vec<Connection>>>,
    path: Arc<PathBuf>,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS runs (
    key INTEGER PRIMARY KEY,
    run_id TEXT NOT NULL UNIQUE,
    project TEXT NOT NULL,
    name TEXT NOT NULL,
    config TEXT NOT NULL,
    host TEXT NOT NULL,
    rank INTEGER NOT NULL,
    world_size INTEGER NOT NULL,
    started_at REAL NOT NULL,
    status TEXT NOT NULL,
    status_message TEXT,
    last_activity REAL NOT NULL,
    last_seq INTEGER NOT NULL DEFAULT 0,
    last_step INTEGER,
    last_point_at REAL,
    records INTEGER NOT NULL DEFAULT 0,
    last_values BLOB,
    status_at REAL,
    job TEXT NOT NULL DEFAULT '',
    framework TEXT NOT NULL DEFAULT '',
    max_span INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS metrics (
    run_key INTEGER NOT NULL,
    id INTEGER NOT NULL,
    name TEXT NOT NULL,
    PRIMARY KEY (run_key, id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS alerts (
    run_key INTEGER NOT NULL,
    rule TEXT NOT NULL,
    fired INTEGER NOT NULL,
    step INTEGER NOT NULL,
    value REAL,
    message TEXT NOT NULL,
    at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS alerts_by_run ON alerts (run_key, at);
CREATE TABLE IF NOT EXISTS batches (
    run_key INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    n INTEGER NOT NULL,
    data BLOB NOT NULL,
    lo_step INTEGER,
    hi_step INTEGER,
    PRIMARY KEY (run_key, seq)
) WITHOUT ROWID;
";

/// Indexes created after [`migrate`] added the columns they cover.
const INDEXES: &str = "
CREATE INDEX IF NOT EXISTS batches_by_step ON batches (run_key, lo_step);
";

/// The schema version this build writes (`PRAGMA user_version`).
const SCHEMA_VERSION: i64 = 2;

/// Brings a database written by an older build to [`SCHEMA_VERSION`]: version 1 had no job,
/// framework or step range columns; the step range of each stored batch is read back from
/// its blob, so range queries are exact on old runs too.
fn migrate(conn: &mut Connection) -> Result<()> {
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if version >= SCHEMA_VERSION {
        return Ok(());
    }
    let tx = conn.transaction()?;
    let has = |table: &str, column: &str| -> rusqlite::Result<bool> {
        let mut stmt = tx.prepare(&format!("PRAGMA table_info({table})"))?;
        let names = stmt.query_map([], |r| r.get::<_, String>(1))?;
        for name in names {
            if name? == column {
                return Ok(true);
            }
        }
        Ok(false)
    };
    for (table, column, decl) in [
        ("runs", "job", "TEXT NOT NULL DEFAULT ''"),
        ("runs", "framework", "TEXT NOT NULL DEFAULT ''"),
        ("runs", "max_span", "INTEGER NOT NULL DEFAULT 0"),
        ("batches", "lo_step", "INTEGER"),
        ("batches", "hi_step", "INTEGER"),
    ] {
        if !has(table, column)? {
            tx.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {decl}"))?;
        }
    }
    let mut ranges = Vec::new();
    {
        let mut stmt =
            tx.prepare("SELECT run_key, seq, data FROM batches WHERE lo_step IS NULL")?;
        let mut rows = stmt.query([])?;
        let mut records = Vec::new();
        while let Some(row) = rows.next()? {
            let (key, seq): (RunKey, i64) = (row.get(0)?, row.get(1)?);
            records.clear();
            let blob = row.get_ref(2)?.as_blob().map_err(rusqlite::Error::from)?;
            decode_records(blob, &mut records).ok_or(StoreError::Corrupt {
                run_key: key,
                seq: seq as u64,
            })?;
            if let Some((lo, hi)) = step_range(&records) {
                ranges.push((key, seq, lo, hi));
            }
        }
    }
    for (key, seq, lo, hi) in ranges {
        tx.execute(
            "UPDATE batches SET lo_step = ?3, hi_step = ?4 WHERE run_key = ?1 AND seq = ?2",
            params![key, seq, lo, hi],
        )?;
    }
    tx.execute_batch(
        "UPDATE runs SET max_span = coalesce((SELECT max(hi_step - lo_step) FROM batches \
         WHERE run_key = runs.key), 0);",
    )?;
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    tx.commit()?;
    Ok(())
}

/// The lowest and highest step of some records.
fn step_range(records: &[StepRecord]) -> Option<(i64, i64)> {
    let lo = records.iter().map(|r| r.step).min()?;
    let hi = records.iter().map(|r| r.step).max()?;
    Some((lo, hi))
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

impl Store {
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
        tokio::task::spawn_blocking(move || {
            let pooled = readers.lock().expect("reader pool").pop();
            let conn = match pooled {
                Some(c) => c,
                None => open_connection(&path)?,
            };
            let out = f(&conn);
            let mut pool = readers.lock().expect("reader pool");
            if pool.len() < 8 {
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
            let mut rows = stmt.query(params![key, after_seq as i64, through_seq as i64])?;
            let mut records = Vec::new();
            while let Some(row) = rows.next()? {
                let seq = row.get::<_, i64>(0)? as u64;
                let blob = row.get_ref(1)?.as_blob().map_err(rusqlite::Error::from)?;
                records.clear();
                decode_records(blob, &mut records)
                    .ok_or(StoreError::Corrupt { run_key: key, seq })?;
                if f(&mut state, seq, &records).is_break() {
                    break;
                }
            }
            Ok(state)
        })
        .await
    }

    /// The lowest step stored for the run.
    pub async fn first_step(&self, key: RunKey) -> Result<Option<i64>> {
        self.read(move |conn| {
            Ok(conn
                .prepare_cached("SELECT min(lo_step) FROM batches WHERE run_key = ?1")?
                .query_row([key], |r| r.get(0))?)
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
            let mut stmt = conn.prepare_cached(
                "SELECT seq, data FROM batches WHERE run_key = ?1 \
                 AND lo_step >= ?2 - (SELECT max_span FROM runs WHERE key = ?1) \
                 AND lo_step <= ?3 AND hi_step >= ?2 AND seq <= ?4 ORDER BY seq",
            )?;
            let mut rows = stmt.query(params![key, lo, hi, through_seq as i64])?;
            let mut records = Vec::new();
            while let Some(row) = rows.next()? {
                let seq = row.get::<_, i64>(0)? as u64;
                let blob = row.get_ref(1)?.as_blob().map_err(rusqlite::Error::from)?;
                records.clear();
                decode_records(blob, &mut records)
                    .ok_or(StoreError::Corrupt { run_key: key, seq })?;
                if f(&mut state, seq, &records).is_break() {
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

fn load_runs(conn: &Connection) -> Result<Vec<StoredRun>> {
    let mut metrics: BTreeMap<RunKey, Vec<MetricDef>> = BTreeMap::new();
    let mut stmt = conn.prepare("SELECT run_key, id, name FROM metrics ORDER BY run_key, id")?;
    let mut rows = stmt.query([])?;
    while let Some(row) = rows.next()? {
        metrics.entry(row.get(0)?).or_default().push(MetricDef {
            id: MetricId(row.get(1)?),
            name: row.get(2)?,
        });
    }
    let mut stmt = conn.prepare(
        "SELECT key, run_id, project, name, config, host, rank, world_size, started_at, status, \
         status_message, last_activity, last_seq, last_step, last_point_at, records, last_values, \
         job, framework FROM runs ORDER BY key",
    )?;
    let mut rows = stmt.query([])?;
    let mut runs = Vec::new();
    while let Some(row) = rows.next()? {
        let key: RunKey = row.get(0)?;
        let run_id: String = row.get(1)?;
        let Ok(run_id) = RunId::new(run_id.clone()) else {
            tracing::warn!(run_id, "skipping a stored run with an invalid id");
            continue;
        };
        let status: String = row.get(9)?;
        let last_values: Option<Vec<u8>> = row.get(16)?;
        runs.push(StoredRun {
            key,
            identity: RunIdentity {
                run_id,
                project: row.get(2)?,
                name: row.get(3)?,
                config_json: row.get(4)?,
                host: row.get(5)?,
                rank: row.get(6)?,
                world_size: row.get(7)?,
                job: row.get(17)?,
                framework: row.get(18)?,
                started_at: row.get(8)?,
            },
            status: RunStatus::parse(&status).unwrap_or(RunStatus::Stale),
            status_message: row.get(10)?,
            last_activity: row.get(11)?,
            tail: RunTail {
                last_seq: row.get::<_, i64>(12)? as u64,
                last_step: row.get(13)?,
                last_point_at: row.get(14)?,
                records: row.get::<_, i64>(15)? as u64,
                last_values: last_values
                    .as_deref()
                    .and_then(decode_values)
                    .unwrap_or_default(),
            },
            metrics: metrics.remove(&key).unwrap_or_default(),
        });
    }
    Ok(runs)
}

fn writer_loop(mut conn: Connection, mut rx: mpsc::Receiver<Command>) {
    let mut pending = Vec::with_capacity(256);
    while let Some(first) = rx.blocking_recv() {
        pending.push(first);
        while pending.len() < 1024 {
            match rx.try_recv() {
                Ok(c) => pending.push(c),
                Err(_) => break,
            }
        }
        commit_group(&mut conn, &mut pending);
    }
    tracing::debug!("database writer stopped");
}

/// Applies every command in one transaction; answers each with the transaction's outcome.
fn commit_group(conn: &mut Connection, pending: &mut Vec<Command>) {
    let outcome = (|| -> rusqlite::Result<Vec<Option<RunKey>>> {
        let tx = conn.transaction()?;
        let mut keys = Vec::with_capacity(pending.len());
        for cmd in pending.iter() {
            keys.push(apply(&tx, cmd)?);
        }
        tx.commit()?;
        Ok(keys)
    })();
    match outcome {
        Ok(keys) => {
            for (cmd, key) in pending.drain(..).zip(keys) {
                answer(cmd, Ok(key));
            }
        }
        Err(e) => {
            tracing::error!(error = %e, commands = pending.len(), "database commit failed");
            // One bad command must not fail the others: retry each alone.
            for cmd in pending.drain(..) {
                let single = (|| -> rusqlite::Result<Option<RunKey>> {
                    let tx = conn.transaction()?;
                    let key = apply(&tx, &cmd)?;
                    tx.commit()?;
                    Ok(key)
                })();
                answer(cmd, single);
            }
        }
    }
}

fn apply(tx: &rusqlite::Transaction<'_>, cmd: &Command) -> rusqlite::Result<Option<RunKey>> {
    match cmd {
        Command::UpsertRun { identity, at, .. } => {
            let id = &identity.run_id;
            tx.prepare_cached(
                "INSERT INTO runs (run_id, project, name, config, host, rank, world_size, \
                 started_at, status, last_activity, job, framework) VALUES (?1, ?2, ?3, ?4, \
                 ?5, ?6, ?7, ?8, 'running', ?9, ?10, ?11) ON CONFLICT(run_id) DO UPDATE SET \
                 project = excluded.project, name = excluded.name, config = excluded.config, \
                 host = excluded.host, rank = excluded.rank, world_size = excluded.world_size, \
                 job = excluded.job, framework = excluded.framework, status = 'running', \
                 status_message = NULL, last_activity = excluded.last_activity",
            )?
            .execute(params![
                id.as_str(),
                identity.project,
                identity.name,
                identity.config_json,
                identity.host,
                identity.rank,
                identity.world_size,
                identity.started_at,
                at,
                identity.job,
                identity.framework,
            ])?;
            let key = tx
                .prepare_cached("SELECT key FROM runs WHERE run_id = ?1")?
                .query_row([id.as_str()], |r| r.get(0))?;
            Ok(Some(key))
        }
        Command::DefineMetrics { key, metrics, .. } => {
            let mut stmt = tx.prepare_cached(
                "INSERT OR IGNORE INTO metrics (run_key, id, name) VALUES (?1, ?2, ?3)",
            )?;
            for m in metrics {
                stmt.execute(params![key, m.id.0, m.name])?;
            }
            Ok(None)
        }
        Command::AppendBatch {
            key,
            seq,
            records,
            tail,
            ..
        } => {
            let range = step_range(records);
            let inserted = tx
                .prepare_cached(
                    "INSERT OR IGNORE INTO batches (run_key, seq, n, data, lo_step, hi_step) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                )?
                .execute(params![
                    key,
                    *seq as i64,
                    records.len() as i64,
                    encode_records(records),
                    range.map(|r| r.0),
                    range.map(|r| r.1),
                ])?;
            if let (1, Some((lo, hi))) = (inserted, range) {
                tx.prepare_cached(
                    "UPDATE runs SET max_span = ?2 WHERE key = ?1 AND max_span < ?2",
                )?
                .execute(params![key, hi.saturating_sub(lo)])?;
            }
            tx.prepare_cached(
                "UPDATE runs SET last_seq = ?2, last_step = ?3, last_point_at = ?4, \
                 records = ?5, last_values = ?6, last_activity = max(last_activity, ?7), \
                 status = CASE WHEN status = 'stale' THEN 'running' ELSE status END \
                 WHERE key = ?1 AND last_seq < ?2",
            )?
            .execute(params![
                key,
                tail.last_seq as i64,
                tail.last_step,
                tail.last_point_at,
                tail.records as i64,
                encode_values(&tail.last_values),
                protocol_now(),
            ])?;
            Ok(None)
        }
        Command::SetStatus {
            key,
            status,
            message,
            at,
            ..
        } => {
            tx.prepare_cached(
                "UPDATE runs SET status = ?2, status_message = ?3, status_at = ?4 WHERE key = ?1",
            )?
            .execute(params![key, status.as_str(), message, at])?;
            Ok(None)
        }
        Command::AddAlert { key, alert, .. } => {
            tx.prepare_cached(
                "INSERT INTO alerts (run_key, rule, fired, step, value, message, at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?
            .execute(params![
                key,
                alert.rule,
                alert.fired as i64,
                alert.step,
                alert.value.is_finite().then_some(alert.value),
                alert.message,
                alert.at
            ])?;
            Ok(None)
        }
        Command::Touch { key, at } => {
            tx.prepare_cached(
                "UPDATE runs SET last_activity = max(last_activity, ?2) WHERE key = ?1",
            )?
            .execute(params![key, at])?;
            Ok(None)
        }
    }
}

fn protocol_now() -> f64 {
    stepstream_protocol::unix_now()
}

fn answer(cmd: Command, outcome: rusqlite::Result<Option<RunKey>>) {
    let outcome = outcome.map_err(StoreError::from);
    match cmd {
        Command::UpsertRun { reply, .. } => {
            let _ = reply.send(outcome.map(|k| k.expect("upsert yields a key")));
        }
        Command::DefineMetrics { reply, .. }
        | Command::AddAlert { reply, .. }
        | Command::AppendBatch { reply, .. }
        | Command::SetStatus { reply, .. } => {
            let _ = reply.send(outcome.map(|_| ()));
        }
        Command::Touch { .. } => {}
    }
}

const BLOB_VERSION: u8 = 1;

/// Blob layout: `version u8`, then per record `step i64 | wall_time f64 | n u16` and `n`
/// times `metric u32 | value f64`, all little endian.
pub fn encode_records(records: &[StepRecord]) -> Vec<u8> {
    let values: usize = records.iter().map(|r| r.values.len()).sum();
    let mut out = Vec::with_capacity(1 + records.len() * 18 + values * 12);
    out.push(BLOB_VERSION);
    for r in records {
        out.extend_from_slice(&r.step.to_le_bytes());
        out.extend_from_slice(&r.wall_time.to_le_bytes());
        out.extend_from_slice(&(r.values.len() as u16).to_le_bytes());
        for &(id, v) in &r.values {
            out.extend_from_slice(&id.0.to_le_bytes());
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    out
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }
}

/// Appends the records of a blob to `out`; `None` if the blob is damaged.
pub fn decode_records(blob: &[u8], out: &mut Vec<StepRecord>) -> Option<()> {
    let mut r = Reader(blob);
    if r.take::<1>()? != [BLOB_VERSION] {
        return None;
    }
    while !r.0.is_empty() {
        let step = i64::from_le_bytes(r.take()?);
        let wall_time = f64::from_le_bytes(r.take()?);
        let n = u16::from_le_bytes(r.take()?) as usize;
        let mut values = Vec::with_capacity(n.min(r.0.len() / 12));
        for _ in 0..n {
            let id = MetricId(u32::from_le_bytes(r.take()?));
            values.push((id, f64::from_le_bytes(r.take()?)));
        }
        out.push(StepRecord {
            step,
            wall_time,
            values,
        });
    }
    Some(())
}

fn encode_values(values: &BTreeMap<MetricId, f64>) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * 12);
    for (id, v) in values {
        out.extend_from_slice(&id.0.to_le_bytes());
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

fn decode_values(blob: &[u8]) -> Option<BTreeMap<MetricId, f64>> {
    let mut r = Reader(blob);
    let mut out = BTreeMap::new();
    while !r.0.is_empty() {
        let id = MetricId(u32::from_le_bytes(r.take()?));
        out.insert(id, f64::from_le_bytes(r.take()?));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(id: &str) -> RunIdentity {
        RunIdentity {
            run_id: RunId::new(id).unwrap(),
            project: "p".into(),
            name: "n".into(),
            config_json: "{\"lr\":0.1}".into(),
            host: "h".into(),
            rank: 0,
            world_size: 1,
            job: String::new(),
            framework: String::new(),
            started_at: 1.0,
        }
    }

    fn rec(step: i64, v: f64) -> StepRecord {
        StepRecord {
            step,
            wall_time: step as f64,
            values: vec![(MetricId(0), v), (MetricId(1), f64::NAN)],
        }
    }

    #[test]
    fn blob_round_trip_and_damage() {
        let records = vec![rec(1, 0.5), rec(2, f64::INFINITY)];
        let blob = encode_records(&records);
        let mut back = Vec::new();
        decode_records(&blob, &mut back).unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!(back[1].values[0].1, f64::INFINITY);
        assert!(back[0].values[1].1.is_nan());
        for cut in 1..blob.len() {
            let mut out = Vec::new();
            // A cut inside a record is an error; a cut between records is not detectable
            // from the blob alone, which is why the row also stores `n`.
            if decode_records(&blob[..cut], &mut out).is_some() {
                assert!(out.len() < 2);
            }
        }
    }

    #[tokio::test]
    async fn batches_survive_reopen_and_duplicates_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hub.db");
        {
            let (store, runs) = Store::open(&path, false).unwrap();
            assert!(runs.is_empty());
            let key = store.upsert_run(identity("r1"), 10.0).await.unwrap();
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
        assert_eq!(store.first_step(run.key).await.unwrap(), Some(1));
    }

    #[tokio::test]
    async fn a_version_1_database_gets_step_ranges_and_answers_range_reads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.db");
        {
            // The layout the first release wrote: no job, framework or step range columns.
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(
                "CREATE TABLE runs (key INTEGER PRIMARY KEY, run_id TEXT NOT NULL UNIQUE, \
                 project TEXT NOT NULL, name TEXT NOT NULL, config TEXT NOT NULL, \
                 host TEXT NOT NULL, rank INTEGER NOT NULL, world_size INTEGER NOT NULL, \
                 started_at REAL NOT NULL, status TEXT NOT NULL, status_message TEXT, \
                 last_activity REAL NOT NULL, last_seq INTEGER NOT NULL DEFAULT 0, \
                 last_step INTEGER, last_point_at REAL, records INTEGER NOT NULL DEFAULT 0, \
                 last_values BLOB, status_at REAL);
                 CREATE TABLE batches (run_key INTEGER NOT NULL, seq INTEGER NOT NULL, \
                 n INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY (run_key, seq)) WITHOUT ROWID;
                 INSERT INTO runs (key, run_id, project, name, config, host, rank, world_size, \
                 started_at, status, last_activity, last_seq, last_step, records) \
                 VALUES (1, 'old', 'p', 'n', '{}', 'h', 0, 1, 1.0, 'finished', 1.0, 2, 7, 6);",
            )
            .unwrap();
            let blobs = [
                encode_records(&[rec(0, 0.0), rec(1, 1.0), rec(2, 2.0)]),
                encode_records(&[rec(7, 7.0), rec(5, 5.0), rec(6, 6.0)]),
            ];
            for (i, blob) in blobs.iter().enumerate() {
                conn.execute(
                    "INSERT INTO batches (run_key, seq, n, data) VALUES (1, ?1, 3, ?2)",
                    params![i as i64 + 1, blob],
                )
                .unwrap();
            }
        }
        let (store, runs) = Store::open(&path, false).unwrap();
        assert_eq!(runs[0].identity.job, "");
        let steps = |lo, hi| {
            let store = store.clone();
            async move {
                store
                    .scan_steps(1, (lo, hi), 2, Vec::new(), move |out, _, recs| {
                        out.extend(
                            recs.iter()
                                .map(|r| r.step)
                                .filter(|s| (lo..=hi).contains(s)),
                        );
                        ControlFlow::Continue(())
                    })
                    .await
                    .unwrap()
            }
        };
        assert_eq!(steps(5, 6).await, vec![5, 6]);
        assert_eq!(steps(1, 5).await, vec![1, 2, 5]);
        assert_eq!(store.first_step(1).await.unwrap(), Some(0));
        // Opening again does not migrate twice.
        drop(store);
        let (store, _) = Store::open(&path, false).unwrap();
        assert_eq!(store.first_step(1).await.unwrap(), Some(0));
    }
}
