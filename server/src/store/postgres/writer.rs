//! PostgreSQL's side of the writer thread: each command applied inside the group's
//! transaction, with the same meaning as SQLite's, plus the writer claim that several hubs
//! need (a hub's memory only knows its own connections).

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
use stepstream_protocol::ItemKind;
use stepstream_protocol::StepRecord;

/// The write connection, owned by the writer thread, made again when it breaks (a restarted
/// server, a terminated backend, a network cut): the failed transaction's commands were
/// answered with its error, so nothing in it was acknowledged, and collectors resend.
pub(in crate::store) struct Postgres {
    pub(in crate::store) client: postgres::Client,
    pub(in crate::store) url: String,
    /// When the connection may next be tried again, and the wait after that.
    retry: Option<(std::time::Instant, std::time::Duration)>,
}

impl Postgres {
    pub(in crate::store) fn new(client: postgres::Client, url: &str) -> Postgres {
        Postgres {
            client,
            url: url.to_string(),
            retry: None,
        }
    }

    /// A broken connection is made again, at most once per backoff (100 ms doubling to 5 s),
    /// so a down server costs a connection attempt now and then, not one per command.
    fn reconnect_if_broken(&mut self) -> Result<()> {
        if !self.client.is_closed() {
            return Ok(());
        }
        let now = std::time::Instant::now();
        if let Some((at, _)) = self.retry {
            if now < at {
                return Err(StoreError::Database {
                    engine: "PostgreSQL",
                    message: "the connection to PostgreSQL is lost; reconnecting".into(),
                });
            }
        }
        match super::connect(&self.url) {
            Ok(client) => {
                tracing::info!("reconnected to PostgreSQL");
                self.client = client;
                self.retry = None;
                Ok(())
            }
            Err(e) => {
                let wait = self
                    .retry
                    .map_or(std::time::Duration::from_millis(100), |(_, w)| {
                        (w * 2).min(std::time::Duration::from_secs(5))
                    });
                self.retry = Some((now + wait, wait));
                tracing::warn!(error = %e, retry_in = ?wait, "cannot reconnect to PostgreSQL");
                Err(e)
            }
        }
    }
}

impl Engine for Postgres {
    type Tx<'a> = postgres::Transaction<'a>;

    fn begin(&mut self) -> Result<Self::Tx<'_>> {
        self.reconnect_if_broken()?;
        Ok(self.client.transaction()?)
    }

    fn apply(tx: &mut Self::Tx<'_>, cmd: &Command) -> Result<Applied> {
        apply(tx, cmd)
    }

    fn commit(tx: Self::Tx<'_>) -> Result<()> {
        Ok(tx.commit()?)
    }
}

fn apply(tx: &mut postgres::Transaction<'_>, cmd: &Command) -> Result<Applied> {
    match cmd {
        Command::UpsertRun {
            identity,
            writer,
            at,
            ..
        } => {
            // The run is (re)claimed only by its own writer, when nobody holds it, or from a
            // writer silent past the limit (its hub died with the connection). Silence is
            // measured on the database's clock (`writer_seen`), the one clock every hub
            // shares: a hub whose clock runs ahead neither takes a live writer's run nor is
            // kept from a dead one's.
            let row = tx.query_opt(
                "INSERT INTO runs (run_id, project, name, config, host, rank, world_size, \
                 started_at, status, last_activity, job, framework, writer, writer_seen) VALUES \
                 ($1, $2, $3, $4, $5, $6, $7, $8, 'running', $9, $10, $11, $12, \
                 extract(epoch from clock_timestamp())) ON CONFLICT (run_id) DO UPDATE SET \
                 host = excluded.host, rank = excluded.rank, world_size = excluded.world_size, \
                 job = excluded.job, framework = excluded.framework, status = 'running', \
                 status_message = NULL, last_activity = excluded.last_activity, writer = \
                 excluded.writer, writer_seen = excluded.writer_seen WHERE runs.project = \
                 excluded.project AND (runs.writer = 0 OR runs.writer = excluded.writer OR \
                 runs.writer_seen < excluded.writer_seen - $13) RETURNING key",
                &[
                    &identity.run_id.as_str(),
                    &identity.project,
                    &identity.name,
                    &identity.config_json,
                    &identity.host,
                    &(identity.rank as i64),
                    &(identity.world_size as i64),
                    &identity.started_at,
                    at,
                    &identity.job,
                    &identity.framework,
                    &(*writer as i64),
                    &WRITER_SILENCE_S,
                ],
            )?;
            if let Some(row) = row {
                return Ok(Applied::Key(row.get::<_, RunKey>(0)));
            }
            // Not taken: the run is another project's, or another live writer holds it.
            let stored: String = tx
                .query_one(
                    "SELECT project FROM runs WHERE run_id = $1",
                    &[&identity.run_id.as_str()],
                )?
                .get(0);
            Ok(Applied::Refused(if stored != identity.project {
                other_project(&identity.run_id, &stored, &identity.project)
            } else {
                held_by_another(&identity.run_id)
            }))
        }
        Command::DefineMetrics { key, metrics, .. } => {
            let stmt = tx.prepare(
                "INSERT INTO metrics (run_key, id, name) VALUES ($1, $2, $3) ON CONFLICT DO \
                 NOTHING",
            )?;
            for m in metrics {
                tx.execute(&stmt, &[key, &(m.id.0 as i64), &m.name])?;
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
            // The tail moves only from the batch before this one: a batch whose predecessor
            // is not stored (it failed in an earlier transaction) must not be stored either.
            // The row lock this takes also orders two hubs storing the same run.
            let range = step_range(records);
            let values: usize = records.iter().map(|r| r.values.len()).sum();
            let follows = tx.query_opt(
                "UPDATE runs SET last_seq = $2::BIGINT, last_step = $3, last_point_at = $4, records = \
                 $5, last_values = $6, last_activity = GREATEST(last_activity, $7), \
                 writer_seen = extract(epoch from clock_timestamp()), status = CASE WHEN \
                 status = 'stale' THEN 'running' ELSE status END, unpacked_values = \
                 unpacked_values + $8, unpacked_records = unpacked_records + $9 \
                 WHERE key = $1 AND last_seq = $2::BIGINT - 1 \
                 RETURNING packed_seq, unpacked_values, unpacked_records",
                &[
                    key,
                    &(*seq as i64),
                    &tail.last_step,
                    &tail.last_point_at,
                    &(tail.records as i64),
                    &encode_values(&tail.last_values),
                    &stepstream_protocol::unix_now(),
                    &(values as i64),
                    &(records.len() as i64),
                ],
            )?;
            let Some(unpacked) = follows else {
                let stored: i64 = tx
                    .query_one("SELECT last_seq FROM runs WHERE key = $1", &[key])?
                    .get(0);
                return not_next(*key, *seq, stored as u64);
            };
            let due = Unpacked {
                batches: *seq - unpacked.get::<_, i64>(0) as u64,
                values: unpacked.get::<_, i64>(1) as u64,
                records: unpacked.get::<_, i64>(2) as u64,
            };
            let blob = encode_records(records).map_err(|e| StoreError::Schema(e.to_string()))?;
            tx.execute(
                "INSERT INTO batches (run_key, seq, n, data, lo_step, hi_step, span_class) VALUES \
                 ($1, $2, $3, $4, $5, $6, $7)",
                &[
                    key,
                    &(*seq as i64),
                    &(records.len() as i32),
                    &blob,
                    &range.map(|r| r.0),
                    &range.map(|r| r.1),
                    &(span_class(range) as i16),
                ],
            )?;
            if !items.is_empty() {
                insert_items(tx, *key, *seq, items, *console_cap)?;
            }
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
            tx.execute(
                "UPDATE runs SET status = $2, status_message = $3, status_at = $4 WHERE key = $1",
                &[key, &status.as_str(), message, at],
            )?;
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
            // Walked by the primary key from the cursor, as SQLite's.
            let packs = tx.query(
                "SELECT run_key, seq, seq_end, data FROM batches b WHERE (run_key, seq) > \
                 ($1, $2) AND seq_end IS NOT NULL AND lo_step IS NOT NULL AND NOT EXISTS \
                 (SELECT 1 FROM summaries s WHERE s.run_key = b.run_key AND s.width = $3 AND \
                 s.seq = b.seq) ORDER BY run_key, seq LIMIT $4",
                &[
                    &after.0,
                    &(after.1 as i64),
                    &WIDTHS[0],
                    &(SUMMARIZE_PER_COMMAND as i64),
                ],
            )?;
            let mut last = None;
            for row in &packs {
                let (key, seq, seq_end, blob): (RunKey, i64, i64, &[u8]) =
                    (row.get(0), row.get(1), row.get(2), row.get(3));
                let ((lo, hi), data) = summary::of_pack(blob).ok_or(StoreError::Corrupt {
                    run_key: key,
                    seq: seq as u64,
                })?;
                for (width, data) in WIDTHS.into_iter().zip(data) {
                    tx.execute(
                        "INSERT INTO summaries (run_key, width, seq, seq_end, lo_step, hi_step, \
                         data) VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (run_key, width, \
                         seq) DO NOTHING",
                        &[&key, &width, &seq, &seq_end, &lo, &hi, &data],
                    )?;
                }
                last = Some((key, seq as u64));
            }
            Ok(Applied::Cursor(summary::next_after(last, packs.len())))
        }
        Command::DeleteRun { key, .. } => {
            // The run's row locked first: a hello through another hub (which sets it
            // running) either commits before and is seen, or waits and finds it gone.
            let Some(row) = tx.query_opt(
                "SELECT run_id, status FROM runs WHERE key = $1 FOR UPDATE",
                &[key],
            )?
            else {
                return Ok(Applied::Inserted(false));
            };
            let (run_id, status): (String, String) = (row.get(0), row.get(1));
            if let Some(why) = undeletable(&run_id, &status) {
                return Ok(Applied::Refused(why));
            }
            for table in RUN_TABLES.iter().chain(&["judges"]) {
                tx.execute(&format!("DELETE FROM {table} WHERE run_key = $1"), &[key])?;
            }
            tx.execute("DELETE FROM runs WHERE key = $1", &[key])?;
            Ok(Applied::Inserted(true))
        }
        Command::AddAlert { key, alert, .. } => {
            tx.execute(
                "INSERT INTO alerts (run_key, rule, fired, step, value, message, at) VALUES ($1, \
                 $2, $3, $4, $5, $6, $7)",
                &[
                    key,
                    &alert.rule,
                    &alert.fired,
                    &alert.step,
                    &alert.value.is_finite().then_some(alert.value),
                    &alert.message,
                    &alert.at,
                ],
            )?;
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
            let row = tx.query_one(
                "INSERT INTO commands (run_key, action, by_whom, reason, issued_at, state_at) \
                 VALUES ($1, $2, $3, $4, $5, $5) RETURNING id",
                &[key, &action_text(action), by, reason, at],
            )?;
            Ok(Applied::Key(row.get(0)))
        }
        Command::Acknowledge {
            key,
            rule,
            by,
            mute_until,
            at,
            ..
        } => {
            tx.execute(
                "INSERT INTO alert_acks (run_key, rule, by_whom, mute_until, at) \
                 VALUES ($1, $2, $3, $4, $5)",
                &[key, rule, by, mute_until, at],
            )?;
            Ok(Applied::Done)
        }
        Command::AddRule {
            project,
            body,
            by,
            at,
            ..
        } => {
            let row = tx.query_one(
                "INSERT INTO page_rules (project, body, by_whom, at) VALUES ($1, $2, $3, $4) \
                 RETURNING id",
                &[project, body, by, at],
            )?;
            Ok(Applied::Key(row.get(0)))
        }
        Command::DeleteRule { project, id, .. } => {
            let gone = tx.execute(
                "DELETE FROM page_rules WHERE project = $1 AND id = $2",
                &[project, &(*id as i64)],
            )?;
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
            let moved = tx.execute(
                "UPDATE commands SET state = $3, step = coalesce($4, step), message = $5, \
                 state_at = $6 WHERE run_key = $1 AND ($2::BIGINT IS NULL OR id = $2) \
                 AND state < $3 AND state < 2",
                &[
                    key,
                    &id.map(|i| i as i64),
                    &(*state as i16),
                    step,
                    message,
                    at,
                ],
            )?;
            Ok(Applied::Inserted(moved > 0))
        }
        Command::Touch { key, at } => {
            tx.execute(
                "UPDATE runs SET last_activity = GREATEST(last_activity, $2), writer_seen = \
                 extract(epoch from clock_timestamp()) WHERE key = $1",
                &[key, at],
            )?;
            Ok(Applied::Done)
        }
        Command::ReleaseWriter { key, writer } => {
            tx.execute(
                "UPDATE runs SET writer = 0 WHERE key = $1 AND writer = $2",
                &[key, &(*writer as i64)],
            )?;
            Ok(Applied::Done)
        }
    }
}

/// Stores a batch's items and keeps the run's console within `cap` lines, the oldest
/// dropped first (as SQLite's writer does).
fn insert_items(
    tx: &mut postgres::Transaction<'_>,
    key: RunKey,
    seq: u64,
    items: &[stepstream_protocol::Item],
    cap: u64,
) -> Result<()> {
    let insert = tx.prepare(
        "INSERT INTO items (run_key, seq, idx, kind, step, wall_time, key, stream, body) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    )?;
    for (idx, item) in items.iter().enumerate() {
        let (kind, stream, body) = row_of(item);
        tx.execute(
            &insert,
            &[
                &key,
                &(seq as i64),
                &(idx as i32),
                &(kind as i16),
                &item.step,
                &item.wall_time,
                &item.key,
                &(stream as i16),
                &body,
            ],
        )?;
    }
    let samples = sample_bytes(items) as i64;
    if samples > 0 {
        tx.execute(
            "UPDATE runs SET sample_bytes = sample_bytes + $2 WHERE key = $1",
            &[&key, &samples],
        )?;
    }
    let lines = lines_in(items);
    if lines == 0 {
        return Ok(());
    }
    let kept: i64 = tx
        .query_one(
            "UPDATE runs SET console_lines = console_lines + $2, console_kept = console_kept + \
             $2 WHERE key = $1 RETURNING console_kept",
            &[&key, &lines],
        )?
        .get(0);
    let excess = kept - cap as i64;
    if excess > 0 {
        tx.execute(
            "DELETE FROM items WHERE (run_key, seq, idx) IN (SELECT run_key, seq, idx FROM items \
             WHERE run_key = $1 AND kind = $2 ORDER BY seq, idx LIMIT $3)",
            &[&key, &(ItemKind::Line.code() as i16), &excess],
        )?;
        tx.execute(
            "UPDATE runs SET console_kept = console_kept - $2 WHERE key = $1",
            &[&key, &excess],
        )?;
    }
    Ok(())
}

/// Packs the run's batches after its `packed_seq` (`store::pack`), at most `most` packs:
/// the batches short of a whole pack stay as they are unless `all`. Returns whether batches
/// are left that `all` would pack. The run's row is locked first (`FOR UPDATE`), so two hubs
/// never pack the same batches: the second sees the first's `packed_seq`.
fn pack_run(
    tx: &mut postgres::Transaction<'_>,
    key: RunKey,
    all: bool,
    most: usize,
) -> Result<bool> {
    let row = tx.query_one(
        "SELECT packed_seq, last_seq FROM runs WHERE key = $1 FOR UPDATE",
        &[&key],
    )?;
    let (packed, last): (i64, i64) = (row.get(0), row.get(1));
    let last = last as u64;
    let read = tx.prepare(
        "SELECT seq, data FROM batches WHERE run_key = $1 AND seq >= $2 AND seq <= $3 \
         ORDER BY seq",
    )?;
    let mut first = packed as u64 + 1;
    let mut made = 0;
    loop {
        // One pack's batches read through a portal, 64 rows at a time (closed before the
        // pack is written): at most a pack's worth, and a few batches, in memory.
        let mut batches: Vec<Vec<StepRecord>> = Vec::new();
        let mut due = Unpacked::default();
        let portal = tx.bind(&read, &[&key, &(first as i64), &(last as i64)])?;
        'read: loop {
            let rows = tx.query_portal(&portal, 64)?;
            if rows.is_empty() {
                break;
            }
            for row in rows {
                let seq = first + batches.len() as u64;
                let corrupt = StoreError::Corrupt { run_key: key, seq };
                if row.get::<_, i64>(0) as u64 != seq {
                    return Err(corrupt);
                }
                let mut records = Vec::new();
                decode_records(row.get::<_, &[u8]>(1), &mut records).ok_or(corrupt)?;
                due.add(&records);
                batches.push(records);
                if due.make_a_pack() {
                    break 'read;
                }
            }
        }
        drop(portal);
        let whole = due.make_a_pack() || (all && !batches.is_empty());
        if !whole || made == most {
            tx.execute(
                "UPDATE runs SET packed_seq = $2, unpacked_values = $3, unpacked_records = $4 \
                 WHERE key = $1",
                &[
                    &key,
                    &(first as i64 - 1),
                    &(due.values as i64),
                    &(due.records as i64),
                ],
            )?;
            return Ok(all && first <= last);
        }
        write_pack(tx, key, first, &batches)?;
        made += 1;
        first += batches.len() as u64;
    }
}

/// Replaces the rows of batches `first..` with one pack of them.
fn write_pack(
    tx: &mut postgres::Transaction<'_>,
    key: RunKey,
    first: u64,
    batches: &[Vec<StepRecord>],
) -> Result<()> {
    let last = first + batches.len() as u64 - 1;
    let all: Vec<StepRecord> = batches.iter().flatten().cloned().collect();
    let range = step_range(&all);
    tx.execute(
        "DELETE FROM batches WHERE run_key = $1 AND seq >= $2 AND seq <= $3",
        &[&key, &(first as i64), &(last as i64)],
    )?;
    tx.execute(
        "INSERT INTO batches (run_key, seq, n, data, lo_step, hi_step, span_class, seq_end) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        &[
            &key,
            &(first as i64),
            &(all.len() as i32),
            &encode_pack(first, batches),
            &range.map(|r| r.0),
            &range.map(|r| r.1),
            &(span_class(range) as i16),
            &(last as i64),
        ],
    )?;
    // A pack without steps (its batches were empty) has nothing to summarise.
    if let Some((lo, hi)) = range {
        for (width, data) in WIDTHS.into_iter().zip(summarize(&all)) {
            tx.execute(
                "INSERT INTO summaries (run_key, width, seq, seq_end, lo_step, hi_step, data) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (run_key, width, seq) \
                 DO UPDATE SET data = excluded.data",
                &[
                    &key,
                    &width,
                    &(first as i64),
                    &(last as i64),
                    &lo,
                    &hi,
                    &data,
                ],
            )?;
        }
    }
    Ok(())
}
