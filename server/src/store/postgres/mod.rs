//! The cluster engine: one PostgreSQL database shared by several hubs (`--store
//! postgres://...`). Same tables and meaning as SQLite's; the writer claim and the judges'
//! leases live here too, because no hub's memory sees the others' connections.
//!
//! * `schema` — the tables and their versioned migrations, loading runs.
//! * `writer` — what each write command does inside the group's transaction.

mod schema;
mod writer;

use super::blob::class_floors;
use super::command::{spawn_writer, Command, Writer};
use super::commands::{Acked, Row as CommandRow, StoredRule};
use super::items::{kind_of, stream_of, ItemQuery, StoredItem};
use super::reads::{Dialect, Reads, Row, Visit};
use super::{Result, RunKey, StoreError, StoredRun};
use postgres::fallible_iterator::FallibleIterator;
use postgres::{Client, NoTls};
use std::ops::ControlFlow;
use stepstream_protocol::{Alert, RunId};
use tokio::sync::mpsc;

/// PostgreSQL's reads: connections to the database at `url`.
pub(super) struct Postgres {
    url: String,
}

/// A connection with TCP keepalives (a dead server or a cut network is noticed) and a
/// statement timeout (no command waits forever on a lock or a stuck server).
fn connect(url: &str) -> Result<Client> {
    let mut config: postgres::Config =
        url.parse()
            .map_err(|e: postgres::Error| StoreError::Database {
                engine: "PostgreSQL",
                message: format!("bad URL: {e}"),
            })?;
    config
        .keepalives(true)
        .keepalives_idle(std::time::Duration::from_secs(10))
        .connect_timeout(std::time::Duration::from_secs(5));
    let mut client = config.connect(NoTls)?;
    client.batch_execute("SET statement_timeout = '60s'")?;
    Ok(client)
}

/// Connects, migrates, starts the writer thread, and returns the runs stored. Blocking.
pub(super) fn open(
    url: &str,
    writer: Writer,
) -> Result<(mpsc::Sender<Command>, Reads<Postgres>, Vec<StoredRun>)> {
    let mut client = connect(url)?;
    schema::migrate(&mut client)?;
    let runs = schema::load(&mut client, None)?;
    let tx = spawn_writer(writer::Postgres::new(client, url), writer);
    let reads = Reads::new(Postgres {
        url: url.to_string(),
    });
    Ok((tx, reads, runs))
}

/// The row that may be a pack holding the batch after `$2`: the last starting at or before
/// it (a pack holds `seq..=seq_end`).
const PACK_AT: &str = "SELECT seq, seq_end, data FROM batches WHERE run_key = $1 AND seq <= $2 \
                       ORDER BY seq DESC LIMIT 1";
/// Blobs of `run_key`'s rows starting with `after < seq <= through`, in sequence order.
const SCAN: &str = "SELECT seq, data FROM batches WHERE run_key = $1 AND seq > $2 AND seq <= $3 \
                    ORDER BY seq";

impl Reads<Postgres> {
    pub(super) async fn size(&self) -> Result<u64> {
        self.read(|c| {
            let n: i64 = c
                .query_one("SELECT pg_database_size(current_database())", &[])?
                .get(0);
            Ok(n as u64)
        })
        .await
    }

    /// See [`super::Store::judge_leases`]. A lease is valid while its hub is alive, so a
    /// renewal is one row (this hub's sign of life), however many runs it judges; runs are
    /// written only when they change hands: a new run without a judge, or a dead hub's.
    /// Finished runs need no judge and are left alone.
    pub(super) async fn judge_leases(&self, hub: u64, ttl: f64) -> Result<Vec<RunKey>> {
        self.read(move |c| {
            let hub = hub as i64;
            // Signs of life and their ages are read on the database's clock, the one clock
            // every hub shares: hubs whose own clocks differ never both judge a run.
            c.execute(
                "INSERT INTO hubs (id, seen) VALUES ($1, extract(epoch FROM \
                 clock_timestamp())::double precision) ON CONFLICT (id) DO UPDATE SET seen = \
                 excluded.seen",
                &[&hub],
            )?;
            c.execute(
                "INSERT INTO judges (run_key, hub) SELECT key, $1 FROM runs r WHERE status IN \
                 ('running', 'stale') AND NOT EXISTS (SELECT 1 FROM judges j WHERE j.run_key = \
                 r.key) ON CONFLICT DO NOTHING",
                &[&hub],
            )?;
            // One statement takes a dead hub's runs over: under two hubs doing it at once the
            // second re-reads each row after the first's commit, finds a live judge, and takes
            // nothing (one winner per run).
            let taken = c.query(
                "UPDATE judges SET hub = $1 WHERE hub <> $1 AND hub NOT IN (SELECT id FROM hubs \
                 WHERE seen >= extract(epoch FROM clock_timestamp())::double precision - $2) \
                 RETURNING run_key",
                &[&hub, &ttl],
            )?;
            if !taken.is_empty() {
                tracing::info!(
                    runs = taken.len(),
                    "took over the judge leases of a silent hub"
                );
            }
            let rows = c.query(
                "SELECT j.run_key FROM judges j JOIN runs r ON r.key = j.run_key WHERE j.hub = \
                 $1 AND r.status IN ('running', 'stale')",
                &[&hub],
            )?;
            Ok(rows.iter().map(|r| r.get(0)).collect())
        })
        .await
    }

    /// See [`super::Store::take_lease`].
    pub(super) async fn take_lease(&self, hub: u64, key: RunKey) -> Result<()> {
        self.read(move |c| {
            c.execute(
                "INSERT INTO judges (run_key, hub) VALUES ($1, $2) ON CONFLICT (run_key) DO \
                 UPDATE SET hub = excluded.hub",
                &[&key, &(hub as i64)],
            )?;
            Ok(())
        })
        .await
    }
}

impl Dialect for Postgres {
    type Conn = Client;

    fn connect(&self) -> Result<Client> {
        connect(&self.url)
    }

    fn reusable(client: &Client, ok: bool) -> bool {
        ok && !client.is_closed()
    }

    fn load_runs(client: &mut Client, run_id: Option<&str>) -> Result<Vec<StoredRun>> {
        schema::load(client, run_id)
    }

    fn commands(client: &mut Client, key: RunKey) -> Result<Vec<CommandRow>> {
        let rows = client.query(
            "SELECT id, action, by_whom, reason, issued_at, state, step, message, state_at \
             FROM commands WHERE run_key = $1 ORDER BY id",
            &[&key],
        )?;
        Ok(rows
            .iter()
            .map(|r| CommandRow {
                id: r.get(0),
                action: r.get(1),
                by: r.get(2),
                reason: r.get(3),
                issued_at: r.get(4),
                state: i64::from(r.get::<_, i16>(5)),
                step: r.get(6),
                message: r.get(7),
                state_at: r.get(8),
            })
            .collect())
    }

    fn rules(client: &mut Client) -> Result<Vec<StoredRule>> {
        let rows = client.query(
            "SELECT id, project, body, by_whom, at FROM page_rules ORDER BY id",
            &[],
        )?;
        Ok(rows
            .iter()
            .map(|r| StoredRule {
                id: r.get::<_, i64>(0) as u64,
                project: r.get(1),
                body: r.get(2),
                by: r.get(3),
                at: r.get(4),
            })
            .collect())
    }

    fn acks(client: &mut Client, key: RunKey) -> Result<Vec<Acked>> {
        let rows = client.query(
            "SELECT rule, by_whom, mute_until, at FROM alert_acks WHERE run_key = $1 ORDER BY at",
            &[&key],
        )?;
        Ok(rows
            .iter()
            .map(|r| Acked {
                rule: r.get(0),
                by: r.get(1),
                mute_until: r.get(2),
                at: r.get(3),
            })
            .collect())
    }

    fn alerts(client: &mut Client, key: RunKey, run_id: &RunId) -> Result<Vec<Alert>> {
        let rows = client.query(
            "SELECT rule, fired, step, value, message, at FROM alerts WHERE run_key = $1 \
             ORDER BY at, id",
            &[&key],
        )?;
        Ok(rows
            .iter()
            .map(|r| Alert {
                run_id: run_id.clone(),
                rule: r.get(0),
                fired: r.get(1),
                step: r.get(2),
                value: r.get::<_, Option<f64>>(3).unwrap_or(f64::NAN),
                message: r.get(4),
                at: r.get(5),
            })
            .collect())
    }

    fn batches(
        client: &mut Client,
        key: RunKey,
        after: u64,
        through: u64,
        visit: &mut Visit<'_>,
    ) -> Result<()> {
        let (after, through) = (after as i64, through.min(i64::MAX as u64) as i64);
        // One snapshot for both statements: a pack written between them would otherwise
        // move batches out of the range behind this read's back.
        let mut tx = client
            .build_transaction()
            .isolation_level(postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()?;
        if let Some(row) = tx.query_opt(PACK_AT, &[&key, &after])? {
            let end: Option<i64> = row.get(1);
            if end.is_some_and(|end| end > after)
                && visit(row.get::<_, i64>(0) as u64, row.get::<_, &[u8]>(2))?.is_break()
            {
                return Ok(());
            }
        }
        let params: [i64; 3] = [key, after, through];
        each_batch(tx.query_raw(SCAN, params)?, visit)?;
        tx.commit()?;
        Ok(())
    }

    fn batches_in_steps(
        client: &mut Client,
        key: RunKey,
        (lo, hi): (i64, i64),
        through: u64,
        visit: &mut Visit<'_>,
    ) -> Result<()> {
        // The same bounds as SQLite's: a batch overlapping `lo..=hi` starts no further
        // below `lo` than the reach of its span class; one statement probes every class.
        let (classes, floors): (Vec<i16>, Vec<i64>) =
            class_floors(lo).map(|(c, floor)| (c as i16, floor)).unzip();
        let rows = client.query_raw(
            "SELECT b.seq, b.data FROM unnest($5::SMALLINT[], $6::BIGINT[]) AS k(class, \
             floor) JOIN batches b ON b.run_key = $1 AND b.span_class = k.class AND \
             b.lo_step >= k.floor AND b.lo_step <= $3 AND b.hi_step >= $2 AND b.seq <= $4 \
             ORDER BY b.seq",
            [
                &key as &(dyn postgres::types::ToSql + Sync),
                &lo,
                &hi,
                &(through as i64),
                &classes,
                &floors,
            ],
        )?;
        each_batch(rows, visit)
    }

    fn summarized(
        client: &mut Client,
        key: RunKey,
        width: i64,
        (lo, hi): (i64, i64),
        through: u64,
        visit: &mut dyn FnMut(Row<'_>) -> Result<ControlFlow<()>>,
    ) -> Result<()> {
        // A pack's values are read (`CASE`) only when it has no summary to give; the
        // portal streams the rows.
        let rows = client.query_raw(
            "SELECT b.seq, s.data, CASE WHEN s.data IS NULL THEN b.data END \
             FROM batches b LEFT JOIN summaries s ON s.run_key = b.run_key \
             AND s.width = $2 AND s.seq = b.seq AND s.seq_end <= $5 \
             AND s.lo_step >= $3 AND s.hi_step <= $4 \
             WHERE b.run_key = $1 AND b.seq <= $5 AND b.hi_step >= $3 AND b.lo_step <= $4 \
             ORDER BY b.seq",
            [
                &key as &(dyn postgres::types::ToSql + Sync),
                &width,
                &lo,
                &hi,
                &(through.min(i64::MAX as u64) as i64),
            ],
        )?;
        let mut rows = rows;
        while let Some(row) = rows.next()? {
            let seq = row.get::<_, i64>(0) as u64;
            let visited = match row.get::<_, Option<&[u8]>>(1) {
                Some(summary) => visit(Row::Summary(seq, summary))?,
                None => visit(Row::Blob(seq, row.get::<_, &[u8]>(2)))?,
            };
            if visited.is_break() {
                return Ok(());
            }
        }
        Ok(())
    }

    fn step_bounds(client: &mut Client, key: RunKey) -> Result<Option<(i64, i64)>> {
        let row = client.query_one(
            "SELECT min(lo_step), max(hi_step) FROM batches WHERE run_key = $1",
            &[&key],
        )?;
        let (lo, hi): (Option<i64>, Option<i64>) = (row.get(0), row.get(1));
        Ok(lo.zip(hi))
    }

    fn config(client: &mut Client, key: RunKey) -> Result<Option<String>> {
        Ok(client
            .query_opt("SELECT config FROM runs WHERE key = $1", &[&key])?
            .map(|r| r.get(0)))
    }

    fn items(
        client: &mut Client,
        key: RunKey,
        query: &ItemQuery,
        visit: &mut dyn FnMut(StoredItem) -> ControlFlow<()>,
    ) -> Result<()> {
        let sql = if query.newest_first {
            "SELECT seq, idx, step, wall_time, key, stream, body, kind FROM items WHERE run_key = $1 \
             AND ($2::SMALLINT IS NULL OR kind = $2) AND seq > $6 AND seq <= $7 AND ($3::TEXT IS NULL OR key = $3) AND step >= $4 AND step <= $5 \
             ORDER BY seq DESC, idx DESC"
        } else {
            "SELECT seq, idx, step, wall_time, key, stream, body, kind FROM items WHERE run_key = $1 \
             AND ($2::SMALLINT IS NULL OR kind = $2) AND seq > $6 AND seq <= $7 AND ($3::TEXT IS NULL OR key = $3) AND step >= $4 AND step <= $5 \
             ORDER BY seq, idx"
        };
        let kind = query.kind.map(|k| k.code() as i16);
        let seqs = (
            query.seqs.0 as i64,
            query.seqs.1.min(i64::MAX as u64) as i64,
        );
        let mut rows = client.query_raw(
            sql,
            [
                &key as &(dyn postgres::types::ToSql + Sync),
                &kind,
                &query.key,
                &query.steps.0,
                &query.steps.1,
                &seqs.0,
                &seqs.1,
            ],
        )?;
        while let Some(r) = rows.next()? {
            let row_kind = i64::from(r.get::<_, i16>(7));
            let item = StoredItem {
                seq: r.get::<_, i64>(0) as u64,
                idx: r.get::<_, i32>(1) as u32,
                kind: kind_of(row_kind)?,
                step: r.get(2),
                wall_time: r.get(3),
                key: r.get(4),
                stream: stream_of(i64::from(r.get::<_, i16>(5))),
                body: r.get(6),
            };
            if visit(item).is_break() {
                break;
            }
        }
        Ok(())
    }

    fn console_counts(client: &mut Client, key: RunKey) -> Result<(u64, u64)> {
        let row = client.query_opt(
            "SELECT console_lines, console_kept FROM runs WHERE key = $1",
            &[&key],
        )?;
        Ok(row.map_or((0, 0), |r| {
            (r.get::<_, i64>(0) as u64, r.get::<_, i64>(1) as u64)
        }))
    }
}

/// Hands each `(seq, data)` row to `visit` until it breaks.
fn each_batch(mut rows: postgres::RowIter<'_>, visit: &mut Visit<'_>) -> Result<()> {
    while let Some(row) = rows.next()? {
        let seq = row.get::<_, i64>(0) as u64;
        if visit(seq, row.get::<_, &[u8]>(1))?.is_break() {
            break;
        }
    }
    Ok(())
}

impl From<postgres::Error> for StoreError {
    fn from(e: postgres::Error) -> StoreError {
        // The error's own text is only "db error": the server's message is in its source.
        let text = match e.as_db_error() {
            Some(db) => format!("{} ({})", db.message(), db.code().code()),
            None => match std::error::Error::source(&e) {
                Some(source) => format!("{e}: {source}"),
                None => e.to_string(),
            },
        };
        StoreError::Database {
            engine: "PostgreSQL",
            message: text,
        }
    }
}
