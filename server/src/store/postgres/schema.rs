//! PostgreSQL's tables, their versioned migrations, and reading runs back.
//!
//! Migrations are numbered and applied in order, each in its own transaction, under an
//! advisory lock: three hubs starting at once against an empty database create it once.
//! `stepstream_schema` records the version reached.

use super::super::blob::decode_values;
use super::super::{Result, RunKey, RunTail, StoreError, StoredRun};
use postgres::GenericClient;
use std::collections::BTreeMap;
use stepstream_protocol::{MetricDef, MetricId, RunId, RunIdentity, RunStatus};

/// Each migration, in order: version `i + 1` is `MIGRATIONS[i]`.
const MIGRATIONS: &[&str] = &[
    "
CREATE TABLE runs (
    key BIGSERIAL PRIMARY KEY,
    run_id TEXT NOT NULL UNIQUE,
    project TEXT NOT NULL,
    name TEXT NOT NULL,
    config TEXT NOT NULL,
    host TEXT NOT NULL,
    rank BIGINT NOT NULL,
    world_size BIGINT NOT NULL,
    started_at DOUBLE PRECISION NOT NULL,
    status TEXT NOT NULL,
    status_message TEXT,
    status_at DOUBLE PRECISION,
    last_activity DOUBLE PRECISION NOT NULL,
    last_seq BIGINT NOT NULL DEFAULT 0,
    last_step BIGINT,
    last_point_at DOUBLE PRECISION,
    records BIGINT NOT NULL DEFAULT 0,
    last_values BYTEA,
    job TEXT NOT NULL DEFAULT '',
    framework TEXT NOT NULL DEFAULT '',
    max_span BIGINT NOT NULL DEFAULT 0,
    -- The collector process writing the run (0: none). A hub refuses another writer while
    -- this one was heard from (last_activity) within the writer silence.
    writer BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE metrics (
    run_key BIGINT NOT NULL,
    id BIGINT NOT NULL,
    name TEXT NOT NULL,
    PRIMARY KEY (run_key, id)
);
CREATE TABLE alerts (
    id BIGSERIAL PRIMARY KEY,
    run_key BIGINT NOT NULL,
    rule TEXT NOT NULL,
    fired BOOLEAN NOT NULL,
    step BIGINT NOT NULL,
    value DOUBLE PRECISION,
    message TEXT NOT NULL,
    at DOUBLE PRECISION NOT NULL
);
CREATE INDEX alerts_by_run ON alerts (run_key, at);
CREATE TABLE batches (
    run_key BIGINT NOT NULL,
    seq BIGINT NOT NULL,
    n INTEGER NOT NULL,
    lo_step BIGINT,
    hi_step BIGINT,
    data BYTEA NOT NULL,
    PRIMARY KEY (run_key, seq)
);
CREATE INDEX batches_by_step ON batches (run_key, lo_step, hi_step);
-- Each hub's sign of life (hub clock, unix seconds), renewed every second.
CREATE TABLE hubs (
    id BIGINT PRIMARY KEY,
    seen DOUBLE PRECISION NOT NULL
);
-- Which hub judges a run (status and alerts): valid while that hub is alive.
CREATE TABLE judges (
    run_key BIGINT PRIMARY KEY,
    hub BIGINT NOT NULL
);
",
    "
-- Range reads find batches by span class (`blob::span_class`), not by one widest span per
-- run. Rows written before have class 0 until filled here.
ALTER TABLE batches ADD COLUMN IF NOT EXISTS span_class SMALLINT NOT NULL DEFAULT 0;
-- The class is how many of 2^0 .. 2^62 the span reaches (numeric: spans past i64::MAX).
UPDATE batches SET span_class = (SELECT count(*) FROM generate_series(0, 62) AS c
    WHERE hi_step::numeric - lo_step >= 2::numeric ^ c) WHERE hi_step > lo_step;
DROP INDEX IF EXISTS batches_by_step;
CREATE INDEX IF NOT EXISTS batches_by_span ON batches (run_key, span_class, lo_step, hi_step);
-- When the run's writer was last heard from, on the database's clock (unix seconds): the
-- writer claim compares it, not `last_activity` (each hub's own clock).
ALTER TABLE runs ADD COLUMN IF NOT EXISTS writer_seen DOUBLE PRECISION NOT NULL DEFAULT 0;
",
    "
-- Console lines and samples (`store::items`), apart from the records' blobs; console lines
-- received in all and kept now (the oldest beyond the cap are dropped).
CREATE TABLE IF NOT EXISTS items (
    run_key BIGINT NOT NULL,
    seq BIGINT NOT NULL,
    idx INTEGER NOT NULL,
    kind SMALLINT NOT NULL,
    step BIGINT NOT NULL,
    wall_time DOUBLE PRECISION NOT NULL,
    key TEXT NOT NULL,
    stream SMALLINT NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (run_key, seq, idx)
);
CREATE INDEX IF NOT EXISTS items_by_kind ON items (run_key, kind, key, step);
ALTER TABLE runs ADD COLUMN IF NOT EXISTS console_lines BIGINT NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN IF NOT EXISTS console_kept BIGINT NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN IF NOT EXISTS sample_bytes BIGINT NOT NULL DEFAULT 0;
",
    "
-- Commands for a run's training (stop, checkpoint, note) and where each is: `state` orders
-- them (0 queued, 1 delivered, 2 honoured, 3 declined, 4 expired) and only grows.
CREATE TABLE IF NOT EXISTS commands (
    id BIGSERIAL PRIMARY KEY,
    run_key BIGINT NOT NULL,
    action TEXT NOT NULL,
    by_whom TEXT NOT NULL,
    reason TEXT NOT NULL,
    issued_at DOUBLE PRECISION NOT NULL,
    state SMALLINT NOT NULL DEFAULT 0,
    step BIGINT,
    message TEXT NOT NULL DEFAULT '',
    state_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS commands_by_run ON commands (run_key, id);
-- Alerts acknowledged (their action called off), and notices muted until a time.
CREATE TABLE IF NOT EXISTS alert_acks (
    run_key BIGINT NOT NULL,
    rule TEXT NOT NULL,
    by_whom TEXT NOT NULL,
    mute_until DOUBLE PRECISION,
    at DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS alert_acks_by_run ON alert_acks (run_key, at);
-- Alert rules made in the page, per project (`alerts::custom`), as JSON.
CREATE TABLE IF NOT EXISTS page_rules (
    id BIGSERIAL PRIMARY KEY,
    project TEXT NOT NULL,
    body TEXT NOT NULL,
    by_whom TEXT NOT NULL,
    at DOUBLE PRECISION NOT NULL
);
",
    "
-- Packs (`store::pack`): a row may hold the batches `seq..=seq_end` (NULL: one batch). A
-- run's batches through `packed_seq` are in packs; the unpacked ones' values and records.
ALTER TABLE batches ADD COLUMN IF NOT EXISTS seq_end BIGINT;
ALTER TABLE runs ADD COLUMN IF NOT EXISTS packed_seq BIGINT NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN IF NOT EXISTS unpacked_values BIGINT NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN IF NOT EXISTS unpacked_records BIGINT NOT NULL DEFAULT 0;
",
    "
-- Each pack's M4 summaries (`store::summary`), one row per bucket width: whole-run views
-- read these, not the packs' values. Packs made before have none (read raw).
CREATE TABLE IF NOT EXISTS summaries (
    run_key BIGINT NOT NULL,
    width BIGINT NOT NULL,
    seq BIGINT NOT NULL,
    seq_end BIGINT NOT NULL,
    lo_step BIGINT NOT NULL,
    hi_step BIGINT NOT NULL,
    data BYTEA NOT NULL,
    PRIMARY KEY (run_key, width, seq)
);
",
];

/// Any number: the advisory lock's key for migrations.
const MIGRATION_LOCK: i64 = 0x5e5e_0001;

/// Brings the database to the newest version this build knows; refuses a database written
/// by a newer build (its tables may mean something this one does not know).
pub(super) fn migrate(client: &mut postgres::Client) -> Result<()> {
    let mut tx = client.transaction()?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS stepstream_schema (version INTEGER NOT NULL)")?;
    let version: i32 = tx
        .query_opt("SELECT version FROM stepstream_schema", &[])?
        .map(|r| r.get(0))
        .unwrap_or(0);
    if version as usize > MIGRATIONS.len() {
        return Err(StoreError::Schema(format!(
            "the database is at schema version {version}; this build knows up to {}: upgrade \
             the hub",
            MIGRATIONS.len()
        )));
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        tracing::info!(version = i + 1, "migrating the PostgreSQL schema");
        tx.batch_execute(sql)?;
    }
    let newest = MIGRATIONS.len() as i32;
    if version == 0 {
        tx.execute(
            "INSERT INTO stepstream_schema (version) VALUES ($1)",
            &[&newest],
        )?;
    } else {
        tx.execute("UPDATE stepstream_schema SET version = $1", &[&newest])?;
    }
    tx.commit()?;
    Ok(())
}

/// Every run, or the one named `run_id`.
pub(super) fn load(
    client: &mut impl GenericClient,
    run_id: Option<&str>,
) -> Result<Vec<StoredRun>> {
    let mut metrics: BTreeMap<RunKey, Vec<MetricDef>> = BTreeMap::new();
    for row in client.query(
        "SELECT run_key, id, name FROM metrics WHERE $1::TEXT IS NULL OR run_key = (SELECT key \
         FROM runs WHERE run_id = $1) ORDER BY run_key, id",
        &[&run_id],
    )? {
        metrics.entry(row.get(0)).or_default().push(MetricDef {
            id: MetricId(row.get::<_, i64>(1) as u32),
            name: row.get(2),
        });
    }
    let mut runs = Vec::new();
    for row in client.query(
        "SELECT key, run_id, project, name, config, host, rank, world_size, started_at, status, \
         status_message, last_activity, last_seq, last_step, last_point_at, records, last_values, \
         job, framework, sample_bytes FROM runs WHERE $1::TEXT IS NULL OR run_id = $1 ORDER BY key",
        &[&run_id],
    )? {
        let key: RunKey = row.get(0);
        let id: String = row.get(1);
        let Ok(id) = RunId::new(id.clone()) else {
            tracing::warn!(run_id = id, "skipping a stored run with an invalid id");
            continue;
        };
        let status: String = row.get(9);
        let last_values: Option<Vec<u8>> = row.get(16);
        runs.push(StoredRun {
            key,
            identity: RunIdentity {
                run_id: id,
                project: row.get(2),
                name: row.get(3),
                config_json: row.get(4),
                host: row.get(5),
                rank: row.get::<_, i64>(6) as u32,
                world_size: row.get::<_, i64>(7) as u32,
                job: row.get(17),
                framework: row.get(18),
                started_at: row.get(8),
            },
            status: RunStatus::parse(&status).unwrap_or(RunStatus::Stale),
            status_message: row.get(10),
            last_activity: row.get(11),
            tail: RunTail {
                last_seq: row.get::<_, i64>(12) as u64,
                last_step: row.get(13),
                last_point_at: row.get(14),
                records: row.get::<_, i64>(15) as u64,
                last_values: last_values
                    .as_deref()
                    .and_then(decode_values)
                    .unwrap_or_default(),
            },
            metrics: metrics.remove(&key).unwrap_or_default(),
            sample_bytes: row.get::<_, i64>(19).max(0) as u64,
        });
    }
    Ok(runs)
}
