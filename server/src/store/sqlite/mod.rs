//! The default engine: one SQLite file owned by one hub. WAL mode lets reads (on a small pool
//! of read connections, inside `spawn_blocking`) run beside the writer thread.
//!
//! * `backup` — a consistent copy while the hub ingests, and restoring one.
//! * `checkpoint` — copying the WAL back into the database file, beside the writer.
//! * `schema` — the tables, their migrations (`PRAGMA user_version`), loading runs.
//! * `writer` — what each write command does inside the group's transaction.

pub mod backup;
mod checkpoint;
#[cfg(test)]
mod delete_tests;
#[cfg(test)]
mod pack_tests;
mod schema;
#[cfg(test)]
mod summary_tests;
mod writer;

use super::blob::class_floors;
use super::command::{spawn_writer, Command, Writer};
use super::commands::{Acked, Row as CommandRow, StoredRule};
use super::items::{kind_of, stream_of, ItemQuery, StoredItem};
use super::reads::{Dialect, Reads, Row, Visit};
use super::{Result, RunKey, StoreError, StoredRun};
use checkpoint::Checkpointer;
use rusqlite::{params, Connection, OptionalExtension};
use schema::{load_runs, migrate, recent_id, INDEXES, SCHEMA};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use stepstream_protocol::ItemKind;
use stepstream_protocol::{Alert, RunId};
use tokio::sync::mpsc;

/// The row of `batches` that may be a pack holding the batch after `?2`: the last starting
/// at or before it (a pack holds `seq..=seq_end`).
const PACK_AT: &str = "SELECT seq, seq_end, data FROM batches WHERE run_key = ?1 AND seq <= ?2 \
     ORDER BY seq DESC LIMIT 1";
/// Blobs of a run's rows of `batches` (packs, and batches stored before packs) starting with
/// `after < seq <= through`, in sequence order.
const SCAN: &str =
    "SELECT seq, data FROM batches WHERE run_key = ?1 AND seq > ?2 AND seq <= ?3 ORDER BY seq";
/// The same of `recent` (the batches since the run's last pack, all after every row of
/// `batches`), by id ([`recent_id`]): those of batches `after + 1` and `through`.
const SCAN_RECENT: &str = "SELECT seq, data FROM recent WHERE id BETWEEN ?1 AND ?2 ORDER BY id";

/// SQLite's reads: connections to the database file.
pub(super) struct Sqlite {
    path: PathBuf,
}

/// The writer connection's page cache, KiB.
const WRITER_CACHE_KIB: i64 = 64 << 10;

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
) -> Result<(mpsc::Sender<Command>, Reads<Sqlite>, Vec<StoredRun>)> {
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
    // The writer's page cache holds every run's newest pages: at SQLite's default (2 MiB) a
    // fleet's commit spilled and reread them, a third of the writer's reads and writes.
    conn.pragma_update(None, "cache_size", -WRITER_CACHE_KIB)?;
    // Checkpoints run on their own thread (`checkpoint`); SQLite's own is a backstop.
    conn.pragma_update(None, "wal_autocheckpoint", checkpoint::BACKSTOP_PAGES)?;
    conn.pragma_update(None, "journal_size_limit", checkpoint::WAL_KEPT_BYTES)?;
    reclaim_deleted_pages(&conn, path)?;
    conn.execute_batch(SCHEMA)?;
    migrate(&mut conn)?;
    conn.execute_batch(INDEXES)?;
    let runs = load_runs(&conn)?;

    let checkpointer = Checkpointer::start(path)?;
    let tx = spawn_writer(writer::Sqlite { conn, checkpointer }, writer);
    let reads = Reads::new(Sqlite {
        path: path.to_path_buf(),
    });
    Ok((tx, reads, runs))
}

/// Databases up to this size made before deleted runs gave their pages back are rebuilt
/// (`VACUUM`) once when opened; a larger one keeps reusing its free pages instead, and says
/// how to rebuild it (a `VACUUM` writes a copy as large as the database).
const VACUUM_AT_OPEN_BYTES: u64 = 1 << 30;

/// Makes pages freed by deleting a run leave the file (`PRAGMA incremental_vacuum` after
/// each delete): `auto_vacuum` takes effect through one `VACUUM`.
fn reclaim_deleted_pages(conn: &Connection, path: &Path) -> Result<()> {
    const INCREMENTAL: i64 = 2;
    let mode: i64 = conn.pragma_query_value(None, "auto_vacuum", |r| r.get(0))?;
    if mode == INCREMENTAL {
        return Ok(());
    }
    // Even a new file needs the `VACUUM` (instant then): WAL mode, set first, already wrote
    // its header.
    conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")?;
    let size = std::fs::metadata(path).map_or(0, |m| m.len());
    if size > VACUUM_AT_OPEN_BYTES {
        tracing::warn!(
            db = %path.display(),
            bytes = size,
            "deleted runs' space is reused but not returned to the file system: stop the hub \
             and run `sqlite3 DB 'PRAGMA auto_vacuum = INCREMENTAL; VACUUM'` once to change that"
        );
        return Ok(());
    }
    let started = std::time::Instant::now();
    conn.execute_batch("VACUUM")?;
    if size > 1 << 20 {
        tracing::info!(db = %path.display(), bytes = size, ms = started.elapsed().as_millis() as u64,
            "rebuilt the database once so that deleting runs frees space");
    }
    Ok(())
}

impl Reads<Sqlite> {
    /// Bytes of the database, its WAL and shared-memory files on disk.
    pub(super) fn size_on_disk(&self) -> u64 {
        ["", "-wal", "-shm"]
            .iter()
            .filter_map(|suffix| {
                let mut p = self.dialect().path.as_os_str().to_owned();
                p.push(suffix);
                std::fs::metadata(PathBuf::from(p)).ok()
            })
            .map(|m| m.len())
            .sum()
    }
}

impl Dialect for Sqlite {
    type Conn = Connection;

    fn connect(&self) -> Result<Connection> {
        Ok(open_connection(&self.path)?)
    }

    fn reusable(_: &Connection, _: bool) -> bool {
        true
    }

    fn load_runs(conn: &mut Connection, run_id: Option<&str>) -> Result<Vec<StoredRun>> {
        match run_id {
            None => load_runs(conn),
            Some(id) => Ok(schema::load_run(conn, id)?.into_iter().collect()),
        }
    }

    fn commands(conn: &mut Connection, key: RunKey) -> Result<Vec<CommandRow>> {
        let mut stmt = conn.prepare_cached(
            "SELECT id, action, by_whom, reason, issued_at, state, step, message, state_at \
             FROM commands WHERE run_key = ?1 ORDER BY id",
        )?;
        let rows = stmt.query_map([key], |r| {
            Ok(CommandRow {
                id: r.get(0)?,
                action: r.get(1)?,
                by: r.get(2)?,
                reason: r.get(3)?,
                issued_at: r.get(4)?,
                state: r.get(5)?,
                step: r.get(6)?,
                message: r.get(7)?,
                state_at: r.get(8)?,
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    }

    fn rules(conn: &mut Connection) -> Result<Vec<StoredRule>> {
        let mut stmt = conn
            .prepare_cached("SELECT id, project, body, by_whom, at FROM page_rules ORDER BY id")?;
        let rows = stmt.query_map([], |r| {
            Ok(StoredRule {
                id: r.get::<_, i64>(0)? as u64,
                project: r.get(1)?,
                body: r.get(2)?,
                by: r.get(3)?,
                at: r.get(4)?,
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    }

    fn acks(conn: &mut Connection, key: RunKey) -> Result<Vec<Acked>> {
        let mut stmt = conn.prepare_cached(
            "SELECT rule, by_whom, mute_until, at FROM alert_acks WHERE run_key = ?1 \
             ORDER BY at, rowid",
        )?;
        let rows = stmt.query_map([key], |r| {
            Ok(Acked {
                rule: r.get(0)?,
                by: r.get(1)?,
                mute_until: r.get(2)?,
                at: r.get(3)?,
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    }

    fn alerts(conn: &mut Connection, key: RunKey, run_id: &RunId) -> Result<Vec<Alert>> {
        let mut stmt = conn.prepare_cached(
            "SELECT rule, fired, step, value, message, at FROM alerts WHERE run_key = ?1 \
             ORDER BY at, rowid",
        )?;
        let rows = stmt.query_map([key], |r| {
            Ok(Alert {
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
    }

    fn batches(
        conn: &mut Connection,
        key: RunKey,
        after: u64,
        through: u64,
        visit: &mut Visit<'_>,
    ) -> Result<()> {
        let (after, through) = (after as i64, through.min(i64::MAX as u64) as i64);
        // One read transaction: a pack written between the statements would otherwise move
        // batches from `recent` to `batches` behind this read's back.
        let tx = conn.transaction()?;
        {
            let mut at = tx.prepare_cached(PACK_AT)?;
            let mut rows = at.query(params![key, after])?;
            if let Some(row) = rows.next()? {
                let end: Option<i64> = row.get(1)?;
                if end.is_some_and(|end| end > after) {
                    let seq = row.get::<_, i64>(0)? as u64;
                    let blob = row.get_ref(2)?.as_blob().map_err(rusqlite::Error::from)?;
                    if visit(seq, blob)?.is_break() {
                        return Ok(());
                    }
                }
            }
        }
        let mut scan = tx.prepare_cached(SCAN)?;
        if each_batch(scan.query(params![key, after, through])?, visit)?.is_break() {
            return Ok(());
        }
        let mut scan = tx.prepare_cached(SCAN_RECENT)?;
        let ids = (
            recent_id(key, (after as u64).saturating_add(1)),
            recent_id(key, through as u64),
        );
        // The last rows: whether the visitor stopped early changes nothing after them.
        let _ = each_batch(scan.query(params![ids.0, ids.1])?, visit)?;
        Ok(())
    }

    fn batches_in_steps(
        conn: &mut Connection,
        key: RunKey,
        (lo, hi): (i64, i64),
        through: u64,
        visit: &mut Visit<'_>,
    ) -> Result<()> {
        // A batch overlapping `lo..=hi` starts at or before `hi` and no further below `lo`
        // than the reach of its span class: one index probe per class. The batches'
        // sequence numbers first (`INDEXED BY`: without statistics SQLite would rather walk
        // the primary key, reading the whole run), then their blobs by key in sequence
        // order, so no blob is ever sorted. The run's recent batches (at most a pack's
        // worth) are looked at one by one, by their step range, after them.
        let through = through.min(i64::MAX as u64) as i64;
        let tx = conn.transaction()?;
        let mut seqs: Vec<i64> = Vec::new();
        {
            let mut probe = tx.prepare_cached(
                "SELECT seq FROM batches INDEXED BY batches_by_span WHERE run_key = ?1 \
                 AND span_class = ?5 AND lo_step >= ?2 AND lo_step <= ?3 \
                 AND hi_step >= ?4 AND seq <= ?6",
            )?;
            for (class, floor) in class_floors(lo) {
                let found =
                    probe.query_map(params![key, floor, hi, lo, class, through], |r| r.get(0))?;
                for seq in found {
                    seqs.push(seq?);
                }
            }
        }
        seqs.sort_unstable();
        {
            let mut stmt =
                tx.prepare_cached("SELECT seq, data FROM batches WHERE run_key = ?1 AND seq = ?2")?;
            for seq in seqs {
                let rows = stmt.query(params![key, seq])?;
                if each_batch(rows, visit)?.is_break() {
                    return Ok(());
                }
            }
        }
        let mut stmt = tx.prepare_cached(
            "SELECT seq, data FROM recent WHERE id BETWEEN ?1 AND ?2 AND lo_step <= ?3 \
             AND hi_step >= ?4 ORDER BY id",
        )?;
        let (first, last) = (recent_id(key, 0), recent_id(key, through as u64));
        let rows = stmt.query(params![first, last, hi, lo])?;
        let _ = each_batch(rows, visit)?;
        Ok(())
    }

    fn summarized(
        conn: &mut Connection,
        key: RunKey,
        width: i64,
        (lo, hi): (i64, i64),
        through: u64,
        visit: &mut dyn FnMut(Row<'_>) -> Result<ControlFlow<()>>,
    ) -> Result<()> {
        let through = through.min(i64::MAX as u64) as i64;
        let tx = conn.transaction()?;
        {
            // A pack's values are read (`CASE`) only when it has no summary to give.
            let mut stmt = tx.prepare_cached(
                "SELECT b.seq, s.data, CASE WHEN s.data IS NULL THEN b.data END \
                 FROM batches b LEFT JOIN summaries s ON s.run_key = b.run_key \
                 AND s.width = ?2 AND s.seq = b.seq AND s.seq_end <= ?5 \
                 AND s.lo_step >= ?3 AND s.hi_step <= ?4 \
                 WHERE b.run_key = ?1 AND b.seq <= ?5 AND b.hi_step >= ?3 AND b.lo_step <= ?4 \
                 ORDER BY b.seq",
            )?;
            let mut rows = stmt.query(params![key, width, lo, hi, through])?;
            while let Some(row) = rows.next()? {
                let seq = row.get::<_, i64>(0)? as u64;
                let summary = row
                    .get_ref(1)?
                    .as_blob_or_null()
                    .map_err(rusqlite::Error::from)?;
                let visited = match summary {
                    Some(summary) => visit(Row::Summary(seq, summary))?,
                    None => {
                        let blob = row.get_ref(2)?.as_blob().map_err(rusqlite::Error::from)?;
                        visit(Row::Blob(seq, blob))?
                    }
                };
                if visited.is_break() {
                    return Ok(());
                }
            }
        }
        let mut stmt = tx.prepare_cached(
            "SELECT seq, data FROM recent WHERE id BETWEEN ?1 AND ?2 AND hi_step >= ?3 \
             AND lo_step <= ?4 ORDER BY id",
        )?;
        let (first, last) = (recent_id(key, 0), recent_id(key, through as u64));
        let mut rows = stmt.query(params![first, last, lo, hi])?;
        while let Some(row) = rows.next()? {
            let seq = row.get::<_, i64>(0)? as u64;
            let blob = row.get_ref(1)?.as_blob().map_err(rusqlite::Error::from)?;
            if visit(Row::Blob(seq, blob))?.is_break() {
                return Ok(());
            }
        }
        Ok(())
    }

    fn step_bounds(conn: &mut Connection, key: RunKey) -> Result<Option<(i64, i64)>> {
        let (lo, hi): (Option<i64>, Option<i64>) = conn
            .prepare_cached(
                "SELECT min(lo), max(hi) FROM (SELECT min(lo_step) AS lo, max(hi_step) AS hi \
                 FROM batches WHERE run_key = ?1 UNION ALL SELECT min(lo_step), max(hi_step) \
                 FROM recent WHERE id BETWEEN ?2 AND ?3)",
            )?
            .query_row(
                params![key, recent_id(key, 0), recent_id(key, u64::MAX)],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?;
        Ok(lo.zip(hi))
    }

    fn config(conn: &mut Connection, key: RunKey) -> Result<Option<String>> {
        Ok(conn
            .query_row("SELECT config FROM runs WHERE key = ?1", [key], |r| {
                r.get(0)
            })
            .optional()?)
    }

    fn items(
        conn: &mut Connection,
        key: RunKey,
        query: &ItemQuery,
        visit: &mut dyn FnMut(StoredItem) -> ControlFlow<()>,
    ) -> Result<()> {
        let sql = if query.newest_first {
            "SELECT seq, idx, step, wall_time, key, stream, body, kind FROM items WHERE run_key = ?1 \
             AND (?2 IS NULL OR kind = ?2) AND seq > ?6 AND seq <= ?7 AND (?3 IS NULL OR key = ?3) AND step >= ?4 AND step <= ?5 \
             ORDER BY seq DESC, idx DESC"
        } else {
            "SELECT seq, idx, step, wall_time, key, stream, body, kind FROM items WHERE run_key = ?1 \
             AND (?2 IS NULL OR kind = ?2) AND seq > ?6 AND seq <= ?7 AND (?3 IS NULL OR key = ?3) AND step >= ?4 AND step <= ?5 \
             ORDER BY seq, idx"
        };
        let mut stmt = conn.prepare_cached(sql)?;
        let mut rows = stmt.query(params![
            key,
            query.kind.map(ItemKind::code),
            query.key,
            query.steps.0,
            query.steps.1,
            query.seqs.0 as i64,
            query.seqs.1.min(i64::MAX as u64) as i64
        ])?;
        while let Some(r) = rows.next()? {
            let row_kind: i64 = r.get(7)?;
            let item = StoredItem {
                seq: r.get::<_, i64>(0)? as u64,
                idx: r.get::<_, i64>(1)? as u32,
                kind: kind_of(row_kind)?,
                step: r.get(2)?,
                wall_time: r.get(3)?,
                key: r.get(4)?,
                stream: stream_of(r.get(5)?),
                body: r.get(6)?,
            };
            if visit(item).is_break() {
                break;
            }
        }
        Ok(())
    }

    fn console_counts(conn: &mut Connection, key: RunKey) -> Result<(u64, u64)> {
        let (lines, kept): (i64, i64) = conn
            .prepare_cached("SELECT console_lines, console_kept FROM runs WHERE key = ?1")?
            .query_row([key], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?
            .unwrap_or((0, 0));
        Ok((lines as u64, kept as u64))
    }
}

/// Hands each `(seq, data)` row to `visit` until it breaks.
fn each_batch(mut rows: rusqlite::Rows<'_>, visit: &mut Visit<'_>) -> Result<ControlFlow<()>> {
    while let Some(row) = rows.next()? {
        let seq = row.get::<_, i64>(0)? as u64;
        let blob = row.get_ref(1)?.as_blob().map_err(rusqlite::Error::from)?;
        if visit(seq, blob)?.is_break() {
            return Ok(ControlFlow::Break(()));
        }
    }
    Ok(ControlFlow::Continue(()))
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> StoreError {
        StoreError::Database {
            engine: "SQLite",
            message: e.to_string(),
        }
    }
}
