//! SQLite's side of the writer thread: each command applied inside the group's transaction.

use super::super::blob::{decode_records, encode_records, encode_values, span_class, step_range};
use super::super::command::{not_next, Applied, Command, Engine};
use super::super::commands::action_text;
use super::super::items::{lines_in, row_of, sample_bytes};
use super::super::pack::{encode_pack, Unpacked, PACKS_PER_COMMAND};
use super::super::summary::{self, summarize, SUMMARIZE_PER_COMMAND, WIDTHS};
use super::super::{
    held_by_another, other_project, undeletable, Result, RunKey, StoreError, RUN_TABLES,
    WRITER_SILENCE_S,
};
use super::schema::recent_id;
use rusqlite::{params, Connection, OptionalExtension};
use stepstream_protocol::ItemKind;
use stepstream_protocol::StepRecord;

/// The write connection, owned by the writer thread, and the checkpointer it wakes.
pub(in crate::store) struct Sqlite {
    pub(in crate::store) conn: Connection,
    pub(in crate::store) checkpointer: super::checkpoint::Checkpointer,
}

impl Engine for Sqlite {
    type Tx<'a> = rusqlite::Transaction<'a>;

    fn begin(&mut self) -> Result<Self::Tx<'_>> {
        Ok(self.conn.transaction()?)
    }

    fn apply(tx: &mut Self::Tx<'_>, cmd: &Command) -> Result<Applied> {
        apply(tx, cmd)
    }

    fn commit(tx: Self::Tx<'_>) -> Result<()> {
        Ok(tx.commit()?)
    }

    fn committed(&mut self) {
        self.checkpointer.wake();
    }
}

fn apply(tx: &rusqlite::Transaction<'_>, cmd: &Command) -> Result<Applied> {
    match cmd {
        Command::UpsertRun {
            identity,
            writer,
            at,
            ..
        } => {
            let id = &identity.run_id;
            // The same claim as PostgreSQL's: (re)claimed only by its own writer, when
            // nobody holds it, or from a writer silent past the limit. One hub owns the
            // file, so its clock is the only one.
            tx.prepare_cached(
                "INSERT INTO runs (run_id, project, name, config, host, rank, world_size, \
                 started_at, status, last_activity, job, framework, writer, writer_seen) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 'running', ?9, ?10, ?11, ?12, ?9) \
                 ON CONFLICT(run_id) DO UPDATE SET host = excluded.host, rank = excluded.rank, \
                 world_size = excluded.world_size, job = excluded.job, framework = \
                 excluded.framework, status = 'running', status_message = NULL, \
                 last_activity = excluded.last_activity, writer = excluded.writer, \
                 writer_seen = excluded.writer_seen WHERE runs.project = excluded.project AND \
                 (runs.writer = 0 OR runs.writer = excluded.writer OR runs.writer_seen < \
                 excluded.writer_seen - ?13)",
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
                *writer as i64,
                WRITER_SILENCE_S,
            ])?;
            // A resume keeps the stored project, name and config; one naming another
            // project is refused, and so is one while another live writer holds the run.
            let (key, project, holder): (RunKey, String, i64) = tx
                .prepare_cached("SELECT key, project, writer FROM runs WHERE run_id = ?1")?
                .query_row([id.as_str()], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
            if project != identity.project {
                return Ok(Applied::Refused(other_project(
                    id,
                    &project,
                    &identity.project,
                )));
            }
            if holder != *writer as i64 {
                return Ok(Applied::Refused(held_by_another(id)));
            }
            Ok(Applied::Key(key))
        }
        Command::DefineMetrics { key, metrics, .. } => {
            let mut stmt = tx.prepare_cached(
                "INSERT OR IGNORE INTO metrics (run_key, id, name) VALUES (?1, ?2, ?3)",
            )?;
            for m in metrics {
                stmt.execute(params![key, m.id.0, m.name])?;
            }
            Ok(Applied::Done)
        }
        Command::AppendBatch {
            key,
            seq,
            records,
            items,
            console_cap,
            tail,
            ..
        } => {
            if let Some(why) = super::schema::beyond_recent(*key, *seq) {
                return Err(StoreError::Schema(why));
            }
            let range = step_range(records);
            // The tail moves only from the batch before this one: a batch whose predecessor
            // is not stored (it failed in an earlier transaction) must not be stored either.
            let values: usize = records.iter().map(|r| r.values.len()).sum();
            let unpacked: Option<(i64, i64, i64)> = tx
                .prepare_cached(
                    "UPDATE runs SET last_seq = ?2, last_step = ?3, last_point_at = ?4, \
                     records = ?5, last_values = ?6, last_activity = max(last_activity, ?7), \
                     writer_seen = max(writer_seen, ?7), \
                     status = CASE WHEN status = 'stale' THEN 'running' ELSE status END, \
                     unpacked_values = unpacked_values + ?8, \
                     unpacked_records = unpacked_records + ?9 \
                     WHERE key = ?1 AND last_seq = ?2 - 1 \
                     RETURNING packed_seq, unpacked_values, unpacked_records",
                )?
                .query_row(
                    params![
                        key,
                        *seq as i64,
                        tail.last_step,
                        tail.last_point_at,
                        tail.records as i64,
                        encode_values(&tail.last_values),
                        protocol_now(),
                        values as i64,
                        records.len() as i64,
                    ],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )
                .optional()?;
            let Some((packed_seq, unpacked_values, unpacked_records)) = unpacked else {
                let stored: i64 = tx
                    .prepare_cached("SELECT last_seq FROM runs WHERE key = ?1")?
                    .query_row(params![key], |row| row.get(0))?;
                return not_next(*key, *seq, stored as u64);
            };
            let blob = encode_records(records)
                .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
            tx.prepare_cached(
                "INSERT INTO recent (id, n, lo_step, hi_step, data) VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute(params![
                recent_id(*key, *seq),
                records.len() as i64,
                range.map(|r| r.0),
                range.map(|r| r.1),
                blob,
            ])?;
            if !items.is_empty() {
                insert_items(tx, *key, *seq, items, *console_cap)?;
            }
            let due = Unpacked {
                batches: *seq - packed_seq as u64,
                values: unpacked_values as u64,
                records: unpacked_records as u64,
            };
            if due.make_a_pack() {
                pack_run(tx, *key, false, usize::MAX)?;
            }
            Ok(Applied::Inserted(true))
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
            if status.is_terminal() {
                // Its last batches: nothing more will make them a pack.
                pack_run(tx, *key, true, PACKS_PER_COMMAND)?;
            }
            Ok(Applied::Done)
        }
        Command::Pack { key, .. } => Ok(Applied::Inserted(pack_run(
            tx,
            *key,
            true,
            PACKS_PER_COMMAND,
        )?)),
        Command::Summarize { after, .. } => {
            // Walked by the primary key from the cursor: every pack is looked at once over
            // all the commands, and only the blobs of those summarised are read.
            let packs: Vec<(RunKey, i64, i64, Vec<u8>)> = tx
                .prepare_cached(
                    "SELECT run_key, seq, seq_end, data FROM batches b WHERE (run_key, seq) > \
                     (?1, ?2) AND seq_end IS NOT NULL AND lo_step IS NOT NULL AND NOT EXISTS \
                     (SELECT 1 FROM summaries s WHERE s.run_key = b.run_key AND s.width = ?3 \
                     AND s.seq = b.seq) ORDER BY run_key, seq LIMIT ?4",
                )?
                .query_map(
                    params![
                        after.0,
                        after.1 as i64,
                        WIDTHS[0],
                        SUMMARIZE_PER_COMMAND as i64
                    ],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
                )?
                .collect::<rusqlite::Result<_>>()?;
            let mut insert = tx.prepare_cached(
                "INSERT OR REPLACE INTO summaries (run_key, width, seq, seq_end, lo_step, hi_step, \
                 data) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?;
            for (key, seq, seq_end, blob) in &packs {
                let ((lo, hi), data) = summary::of_pack(blob).ok_or(StoreError::Corrupt {
                    run_key: *key,
                    seq: *seq as u64,
                })?;
                for (width, data) in WIDTHS.into_iter().zip(data) {
                    insert.execute(params![key, width, seq, seq_end, lo, hi, data])?;
                }
            }
            Ok(Applied::Cursor(summary::next_after(
                packs.last().map(|p| (p.0, p.1 as u64)),
                packs.len(),
            )))
        }
        Command::DeleteRun { key, .. } => {
            let found: Option<(String, String)> = tx
                .prepare_cached("SELECT run_id, status FROM runs WHERE key = ?1")?
                .query_row([key], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?;
            let Some((run_id, status)) = found else {
                return Ok(Applied::Inserted(false));
            };
            if let Some(why) = undeletable(&run_id, &status) {
                return Ok(Applied::Refused(why));
            }
            for table in RUN_TABLES {
                tx.prepare_cached(&format!("DELETE FROM {table} WHERE run_key = ?1"))?
                    .execute([key])?;
            }
            tx.prepare_cached("DELETE FROM recent WHERE id BETWEEN ?1 AND ?2")?
                .execute([recent_id(*key, 0), recent_id(*key, u64::MAX)])?;
            tx.prepare_cached("DELETE FROM runs WHERE key = ?1")?
                .execute([key])?;
            // The freed pages leave the file (a database made before auto_vacuum was set
            // reuses them instead: `sqlite::open`).
            // Stepped to its end: each step frees one page.
            let mut vacuum = tx.prepare("PRAGMA incremental_vacuum")?;
            let mut steps = vacuum.query([])?;
            while steps.next()?.is_some() {}
            Ok(Applied::Inserted(true))
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
            Ok(Applied::Done)
        }
        Command::QueueOrder {
            key,
            action,
            by,
            reason,
            at,
            ..
        } => {
            tx.prepare_cached(
                "INSERT INTO commands (run_key, action, by_whom, reason, issued_at, state_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?5)",
            )?
            .execute(params![key, action_text(action), by, reason, at])?;
            Ok(Applied::Key(tx.last_insert_rowid()))
        }
        Command::Acknowledge {
            key,
            rule,
            by,
            mute_until,
            at,
            ..
        } => {
            tx.prepare_cached(
                "INSERT INTO alert_acks (run_key, rule, by_whom, mute_until, at) \
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute(params![key, rule, by, mute_until, at])?;
            Ok(Applied::Done)
        }
        Command::AddRule {
            project,
            body,
            by,
            at,
            ..
        } => {
            tx.prepare_cached(
                "INSERT INTO page_rules (project, body, by_whom, at) VALUES (?1, ?2, ?3, ?4)",
            )?
            .execute(params![project, body, by, at])?;
            Ok(Applied::Key(tx.last_insert_rowid()))
        }
        Command::DeleteRule { project, id, .. } => {
            let gone = tx
                .prepare_cached("DELETE FROM page_rules WHERE project = ?1 AND id = ?2")?
                .execute(params![project, *id as i64])?;
            Ok(Applied::Inserted(gone > 0))
        }
        Command::MoveOrder {
            key,
            id,
            state,
            step,
            message,
            at,
            ..
        } => {
            let moved = tx
                .prepare_cached(
                    "UPDATE commands SET state = ?3, step = coalesce(?4, step), \
                     message = ?5, state_at = ?6 \
                     WHERE run_key = ?1 AND (?2 IS NULL OR id = ?2) AND state < ?3 AND state < 2",
                )?
                .execute(params![
                    key,
                    id.map(|i| i as i64),
                    *state as i64,
                    step,
                    message,
                    at
                ])?;
            Ok(Applied::Inserted(moved > 0))
        }
        Command::ReleaseWriter { key, writer } => {
            tx.prepare_cached("UPDATE runs SET writer = 0 WHERE key = ?1 AND writer = ?2")?
                .execute(params![key, *writer as i64])?;
            Ok(Applied::Done)
        }
        Command::Touch { key, at } => {
            tx.prepare_cached(
                "UPDATE runs SET last_activity = max(last_activity, ?2), writer_seen = \
                 max(writer_seen, ?2) WHERE key = ?1",
            )?
            .execute(params![key, at])?;
            Ok(Applied::Done)
        }
    }
}

/// Stores a batch's items and keeps the run's console within `cap` lines, the oldest
/// dropped first.
fn insert_items(
    tx: &rusqlite::Transaction<'_>,
    key: RunKey,
    seq: u64,
    items: &[stepstream_protocol::Item],
    cap: u64,
) -> Result<()> {
    let mut insert = tx.prepare_cached(
        "INSERT INTO items (run_key, seq, idx, kind, step, wall_time, key, stream, body)          VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
    )?;
    for (idx, item) in items.iter().enumerate() {
        let (kind, stream, body) = row_of(item);
        insert.execute(params![
            key,
            seq as i64,
            idx as i64,
            kind,
            item.step,
            item.wall_time,
            item.key,
            stream,
            body
        ])?;
    }
    let samples = sample_bytes(items) as i64;
    if samples > 0 {
        tx.prepare_cached("UPDATE runs SET sample_bytes = sample_bytes + ?2 WHERE key = ?1")?
            .execute(params![key, samples])?;
    }
    let lines = lines_in(items);
    if lines == 0 {
        return Ok(());
    }
    let kept: i64 = tx
        .prepare_cached(
            "UPDATE runs SET console_lines = console_lines + ?2, console_kept = console_kept +              ?2 WHERE key = ?1 RETURNING console_kept",
        )?
        .query_row(params![key, lines], |r| r.get(0))?;
    let excess = kept - cap as i64;
    if excess > 0 {
        tx.prepare_cached(
            "DELETE FROM items WHERE rowid IN (SELECT rowid FROM items WHERE run_key = ?1 AND              kind = ?2 ORDER BY seq, idx LIMIT ?3)",
        )?
        .execute(params![key, ItemKind::Line.code(), excess])?;
        tx.prepare_cached("UPDATE runs SET console_kept = console_kept - ?2 WHERE key = ?1")?
            .execute(params![key, excess])?;
    }
    Ok(())
}

/// Packs the run's batches after its `packed_seq` (`store::pack`), at most `most` packs:
/// the batches short of a whole pack stay as they are unless `all`. Returns whether batches
/// are left that `all` would pack.
fn pack_run(tx: &rusqlite::Transaction<'_>, key: RunKey, all: bool, most: usize) -> Result<bool> {
    let (packed, last): (i64, i64) = tx
        .prepare_cached("SELECT packed_seq, last_seq FROM runs WHERE key = ?1")?
        .query_row(params![key], |r| Ok((r.get(0)?, r.get(1)?)))?;
    let last = last as u64;
    let mut first = packed as u64 + 1;
    let mut made = 0;
    loop {
        // One pack's batches read in one pass (each cursor closed before the pack is
        // written): at most a pack's worth, and one batch, in memory. Batches stored before
        // packs existed (in `batches`, never a pack) come before every one in `recent`.
        let mut batches: Vec<Vec<StepRecord>> = Vec::new();
        let mut due = Unpacked::default();
        for recent in [false, true] {
            if due.make_a_pack() {
                break;
            }
            let from = first + batches.len() as u64;
            let (mut read, bounds) = if recent {
                let ids = (recent_id(key, from), recent_id(key, last));
                let sql = "SELECT seq, data FROM recent WHERE id BETWEEN ?1 AND ?2 ORDER BY id";
                (tx.prepare_cached(sql)?, vec![ids.0, ids.1])
            } else {
                let sql = "SELECT seq, data FROM batches WHERE run_key = ?1 AND seq >= ?2 \
                           AND seq <= ?3 AND seq_end IS NULL ORDER BY seq";
                (tx.prepare_cached(sql)?, vec![key, from as i64, last as i64])
            };
            let mut rows = read.query(rusqlite::params_from_iter(bounds))?;
            while let Some(row) = rows.next()? {
                let seq = first + batches.len() as u64;
                let corrupt = StoreError::Corrupt { run_key: key, seq };
                if row.get::<_, i64>(0)? as u64 != seq {
                    return Err(corrupt);
                }
                let blob = row.get_ref(1)?.as_blob().map_err(rusqlite::Error::from)?;
                let mut records = Vec::new();
                decode_records(blob, &mut records).ok_or(corrupt)?;
                due.add(&records);
                batches.push(records);
                if due.make_a_pack() {
                    break;
                }
            }
        }
        let whole = due.make_a_pack() || (all && !batches.is_empty());
        if !whole || made == most {
            tx.prepare_cached(
                "UPDATE runs SET packed_seq = ?2, unpacked_values = ?3, unpacked_records = ?4 \
                 WHERE key = ?1",
            )?
            .execute(params![
                key,
                first as i64 - 1,
                due.values as i64,
                due.records as i64
            ])?;
            return Ok(all && first <= last);
        }
        write_pack(tx, key, first, &batches)?;
        made += 1;
        first += batches.len() as u64;
    }
}

/// Replaces the rows of batches `first..` (in `recent`, or from before packs in `batches`)
/// with one pack of them in `batches`.
fn write_pack(
    tx: &rusqlite::Transaction<'_>,
    key: RunKey,
    first: u64,
    batches: &[Vec<StepRecord>],
) -> Result<()> {
    let last = first + batches.len() as u64 - 1;
    let all: Vec<StepRecord> = batches.iter().flatten().cloned().collect();
    let range = step_range(&all);
    tx.prepare_cached("DELETE FROM recent WHERE id BETWEEN ?1 AND ?2")?
        .execute([recent_id(key, first), recent_id(key, last)])?;
    tx.prepare_cached(
        "DELETE FROM batches WHERE run_key = ?1 AND seq >= ?2 AND seq <= ?3 AND seq_end IS NULL",
    )?
    .execute(params![key, first as i64, last as i64])?;
    tx.prepare_cached(
        "INSERT INTO batches (run_key, seq, n, data, lo_step, hi_step, span_class, seq_end) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?
    .execute(params![
        key,
        first as i64,
        all.len() as i64,
        encode_pack(first, batches),
        range.map(|r| r.0),
        range.map(|r| r.1),
        span_class(range),
        last as i64,
    ])?;
    // A pack without steps (its batches were empty) has nothing to summarise.
    if let Some((lo, hi)) = range {
        let mut summary = tx.prepare_cached(
            "INSERT OR REPLACE INTO summaries (run_key, width, seq, seq_end, lo_step, hi_step, \
             data) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )?;
        for (width, data) in WIDTHS.into_iter().zip(summarize(&all)) {
            summary.execute(params![key, width, first as i64, last as i64, lo, hi, data])?;
        }
    }
    Ok(())
}

fn protocol_now() -> f64 {
    stepstream_protocol::unix_now()
}
