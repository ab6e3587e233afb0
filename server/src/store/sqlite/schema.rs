//! The database's tables, their versioned migrations (`PRAGMA user_version`), and reading
//! the runs back at start-up.

use super::super::blob::{decode_records, decode_values, span_class, step_range};
use super::super::{Result, RunKey, RunTail, StoreError, StoredRun};
use rusqlite::{params, Connection};
use std::collections::BTreeMap;
use stepstream_protocol::{MetricDef, MetricId, RunId, RunIdentity, RunStatus};

pub(super) const SCHEMA: &str = "
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
    max_span INTEGER NOT NULL DEFAULT 0,
    -- The collector process writing the run (0: none), and when it was last heard from:
    -- another writer is refused meanwhile (`store::WRITER_SILENCE_S`).
    writer INTEGER NOT NULL DEFAULT 0,
    writer_seen REAL NOT NULL DEFAULT 0,
    -- Console lines received in all, and kept now (the oldest beyond the cap are dropped).
    console_lines INTEGER NOT NULL DEFAULT 0,
    console_kept INTEGER NOT NULL DEFAULT 0,
    -- Bytes of the run's samples (text, tables, histograms, images).
    sample_bytes INTEGER NOT NULL DEFAULT 0,
    -- Every batch through this one is in a pack (`store::pack`), and the values and records
    -- of the batches after it, which the next pack will hold.
    packed_seq INTEGER NOT NULL DEFAULT 0,
    unpacked_values INTEGER NOT NULL DEFAULT 0,
    unpacked_records INTEGER NOT NULL DEFAULT 0
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
    lo_step INTEGER,
    hi_step INTEGER,
    span_class INTEGER NOT NULL DEFAULT 0,
    data BLOB NOT NULL,
    -- A pack's last batch (`store::pack`: it holds `seq..=seq_end`); NULL for one batch.
    seq_end INTEGER,
    PRIMARY KEY (run_key, seq)
);
-- A run's batches since its last pack (`store::pack`), one row each, kept in order of run
-- and sequence number: storing one writes one B-tree, and packing them deletes a run of
-- neighbouring rows. Packs, and batches stored before packs existed, are in `batches`.
-- Keyed by one integer, the run's key above the batch's sequence number (`recent_id`): a
-- rowid table's inner pages hold only those integers, where a `WITHOUT ROWID` table's held
-- whole rows (a few hundred bytes each: a sixth of its pages were inner pages, and a fleet's
-- commit rewrote ~880 pages of it). Reads name `id` ranges; `run_key` and `seq` are for
-- reading back.
CREATE TABLE IF NOT EXISTS recent (
    id INTEGER PRIMARY KEY,
    n INTEGER NOT NULL,
    lo_step INTEGER,
    hi_step INTEGER,
    data BLOB NOT NULL,
    run_key INTEGER GENERATED ALWAYS AS (id >> 36) VIRTUAL,
    seq INTEGER GENERATED ALWAYS AS (id & 68719476735) VIRTUAL
);
-- Each pack's M4 summaries (`store::summary`), one row per bucket width: whole-run views
-- read these, not the packs' values. Packs made before version 7 have none (read raw).
-- The pack's last batch and step range are repeated here: a read of the summaries never
-- touches the pack's row, whose blob comes before its `seq_end`.
CREATE TABLE IF NOT EXISTS summaries (
    run_key INTEGER NOT NULL,
    width INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    seq_end INTEGER NOT NULL,
    lo_step INTEGER NOT NULL,
    hi_step INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (run_key, width, seq)
);
-- Console lines and samples (`store::items`), apart from the records' blobs.
CREATE TABLE IF NOT EXISTS items (
    run_key INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    idx INTEGER NOT NULL,
    kind INTEGER NOT NULL,
    step INTEGER NOT NULL,
    wall_time REAL NOT NULL,
    key TEXT NOT NULL,
    stream INTEGER NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (run_key, seq, idx)
);
-- Commands for a run's training (stop, checkpoint, note) and where each is: `state` orders
-- them (0 queued, 1 delivered, 2 honoured, 3 declined, 4 expired) and only grows.
CREATE TABLE IF NOT EXISTS commands (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_key INTEGER NOT NULL,
    action TEXT NOT NULL,
    by_whom TEXT NOT NULL,
    reason TEXT NOT NULL,
    issued_at REAL NOT NULL,
    state INTEGER NOT NULL DEFAULT 0,
    step INTEGER,
    message TEXT NOT NULL DEFAULT '',
    state_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS commands_by_run ON commands (run_key, id);
-- Alerts acknowledged (their action called off), and notices muted until a time.
CREATE TABLE IF NOT EXISTS alert_acks (
    run_key INTEGER NOT NULL,
    rule TEXT NOT NULL,
    by_whom TEXT NOT NULL,
    mute_until REAL,
    at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS alert_acks_by_run ON alert_acks (run_key, at);
-- Alert rules made in the page, per project (`alerts::custom`), as JSON.
CREATE TABLE IF NOT EXISTS page_rules (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    project TEXT NOT NULL,
    body TEXT NOT NULL,
    by_whom TEXT NOT NULL,
    at REAL NOT NULL
);
";

/// Indexes created after [`migrate`] brought the tables they cover to this version.
pub(super) const INDEXES: &str = "
CREATE INDEX IF NOT EXISTS batches_by_span ON batches (run_key, span_class, lo_step, hi_step);
CREATE INDEX IF NOT EXISTS items_by_kind ON items (run_key, kind, key, step);
";

/// `batches` as this version lays it out. A rowid table, not `WITHOUT ROWID`: a batch's
/// blob is often hundreds of kilobytes, and in a `WITHOUT ROWID` table every key comparison
/// and every read of a column after the blob walks its overflow pages (a point lookup cost
/// five times a sequential read). The blob comes last for the same reason.
const BATCHES_V2: &str = "CREATE TABLE batches_v2 (run_key INTEGER NOT NULL, seq INTEGER NOT \
    NULL, n INTEGER NOT NULL, lo_step INTEGER, hi_step INTEGER, data BLOB NOT NULL, \
    PRIMARY KEY (run_key, seq))";

/// The schema version this build writes (`PRAGMA user_version`).
pub(super) const SCHEMA_VERSION: i64 = 8;

/// Bits of a `recent` row's id given to the batch's sequence number: 68.7 billion batches a
/// run (two years at 1,000 a second), under 134 million run keys.
const SEQ_BITS: u32 = 36;
/// The largest sequence number and run key a `recent` row can hold.
pub(super) const RECENT_MAX_SEQ: u64 = (1 << SEQ_BITS) - 1;
pub(super) const RECENT_MAX_KEY: RunKey = (1 << (63 - SEQ_BITS)) - 1;

/// The id of batch `seq` of run `key` in `recent`, a sequence number past the largest
/// clamped to it (a read's `through` is often "everything").
pub(super) fn recent_id(key: RunKey, seq: u64) -> i64 {
    (key << SEQ_BITS) | seq.min(RECENT_MAX_SEQ) as i64
}

/// Why run `key` cannot store batch `seq` in `recent`, if it cannot.
pub(super) fn beyond_recent(key: RunKey, seq: u64) -> Option<String> {
    (seq > RECENT_MAX_SEQ || !(0..=RECENT_MAX_KEY).contains(&key)).then(|| {
        format!(
            "batch {seq} of run key {key} is beyond what this database holds ({RECENT_MAX_SEQ} \
             batches a run, run keys through {RECENT_MAX_KEY})"
        )
    })
}

/// `recent` as version 7 laid it out (`WITHOUT ROWID`, keyed by run and sequence number)
/// is copied into this version's table.
const RECENT_V8: &str = "CREATE TABLE recent_v8 (id INTEGER PRIMARY KEY, n INTEGER NOT NULL, \
    lo_step INTEGER, hi_step INTEGER, data BLOB NOT NULL, \
    run_key INTEGER GENERATED ALWAYS AS (id >> 36) VIRTUAL, \
    seq INTEGER GENERATED ALWAYS AS (id & 68719476735) VIRTUAL); \
    INSERT INTO recent_v8 (id, n, lo_step, hi_step, data) \
    SELECT (run_key << 36) | seq, n, lo_step, hi_step, data FROM recent ORDER BY run_key, seq; \
    DROP TABLE recent; ALTER TABLE recent_v8 RENAME TO recent;";

/// Brings a database written by an older build to [`SCHEMA_VERSION`]. Version 1 had no job,
/// framework or step-range columns and kept batches `WITHOUT ROWID`: the batches are copied
/// into the new layout with the step range of each read back from its blob, so range reads
/// are exact on old runs too. Version 2 found range reads through one widest span per run;
/// version 3 through each batch's span class. Version 4 added console lines and samples
/// (the `items` table, created by [`SCHEMA`], and the runs' console counts); version 5 the
/// `commands`, `alert_acks` and `page_rules` tables (created by [`SCHEMA`]); version 6 packs
/// (`batches.seq_end`, the runs' `packed_seq` and unpacked counts; the batches stored before
/// are packed by the writer afterwards, `Store::open`); version 7 the packs' summaries (the
/// `summaries` table, created by [`SCHEMA`]); version 8 keys `recent` by one integer
/// ([`recent_id`]). One transaction: an interrupted migration
/// leaves the version it started from.
pub(super) fn migrate(conn: &mut Connection) -> Result<()> {
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
    for (column, decl) in [
        ("job", "TEXT NOT NULL DEFAULT ''"),
        ("framework", "TEXT NOT NULL DEFAULT ''"),
        ("max_span", "INTEGER NOT NULL DEFAULT 0"),
        ("writer", "INTEGER NOT NULL DEFAULT 0"),
        ("writer_seen", "REAL NOT NULL DEFAULT 0"),
        ("console_lines", "INTEGER NOT NULL DEFAULT 0"),
        ("console_kept", "INTEGER NOT NULL DEFAULT 0"),
        ("sample_bytes", "INTEGER NOT NULL DEFAULT 0"),
        ("packed_seq", "INTEGER NOT NULL DEFAULT 0"),
        ("unpacked_values", "INTEGER NOT NULL DEFAULT 0"),
        ("unpacked_records", "INTEGER NOT NULL DEFAULT 0"),
    ] {
        if !has("runs", column)? {
            tx.execute_batch(&format!("ALTER TABLE runs ADD COLUMN {column} {decl}"))?;
        }
    }
    if !has("batches", "lo_step")? {
        tx.execute_batch(BATCHES_V2)?;
        {
            let mut read = tx.prepare("SELECT run_key, seq, n, data FROM batches")?;
            let mut write = tx.prepare(
                "INSERT INTO batches_v2 (run_key, seq, n, lo_step, hi_step, data) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?;
            let mut rows = read.query([])?;
            let mut records = Vec::new();
            while let Some(row) = rows.next()? {
                let (key, seq, n): (RunKey, i64, i64) = (row.get(0)?, row.get(1)?, row.get(2)?);
                let blob = row.get_ref(3)?.as_blob().map_err(rusqlite::Error::from)?;
                records.clear();
                decode_records(blob, &mut records).ok_or(StoreError::Corrupt {
                    run_key: key,
                    seq: seq as u64,
                })?;
                let range = step_range(&records);
                write.execute(params![
                    key,
                    seq,
                    n,
                    range.map(|r| r.0),
                    range.map(|r| r.1),
                    blob
                ])?;
            }
        }
        tx.execute_batch("DROP TABLE batches; ALTER TABLE batches_v2 RENAME TO batches;")?;
    }
    if !has("batches", "span_class")? {
        tx.execute_batch(
            "ALTER TABLE batches ADD COLUMN span_class INTEGER NOT NULL DEFAULT 0; \
             DROP INDEX IF EXISTS batches_by_step;",
        )?;
        let mut read = tx.prepare("SELECT rowid, lo_step, hi_step FROM batches")?;
        let mut write = tx.prepare("UPDATE batches SET span_class = ?2 WHERE rowid = ?1")?;
        let mut rows = read.query([])?;
        while let Some(row) = rows.next()? {
            let (rowid, lo, hi): (i64, Option<i64>, Option<i64>) =
                (row.get(0)?, row.get(1)?, row.get(2)?);
            write.execute(params![rowid, span_class(lo.zip(hi))])?;
        }
    }
    if !has("batches", "seq_end")? {
        // NULL: one batch, as every row stored before packs was.
        tx.execute_batch("ALTER TABLE batches ADD COLUMN seq_end INTEGER")?;
    }
    if !has("recent", "id")? {
        tx.execute_batch(RECENT_V8)?;
    }
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    tx.commit()?;
    Ok(())
}

pub(super) fn load_runs(conn: &Connection) -> Result<Vec<StoredRun>> {
    load(conn, None)
}

/// One run, read again (a hub of a cluster learns what another hub changed).
pub(super) fn load_run(conn: &Connection, run_id: &str) -> Result<Option<StoredRun>> {
    Ok(load(conn, Some(run_id))?.pop())
}

/// Every run, or the one named `run_id`.
fn load(conn: &Connection, run_id: Option<&str>) -> Result<Vec<StoredRun>> {
    let mut metrics: BTreeMap<RunKey, Vec<MetricDef>> = BTreeMap::new();
    let mut stmt = conn.prepare(
        "SELECT run_key, id, name FROM metrics WHERE ?1 IS NULL OR run_key = (SELECT key FROM \
         runs WHERE run_id = ?1) ORDER BY run_key, id",
    )?;
    let mut rows = stmt.query([run_id])?;
    while let Some(row) = rows.next()? {
        metrics.entry(row.get(0)?).or_default().push(MetricDef {
            id: MetricId(row.get(1)?),
            name: row.get(2)?,
        });
    }
    let mut stmt = conn.prepare(
        "SELECT key, run_id, project, name, config, host, rank, world_size, started_at, status, \
         status_message, last_activity, last_seq, last_step, last_point_at, records, last_values, \
         job, framework, sample_bytes FROM runs WHERE ?1 IS NULL OR run_id = ?1 ORDER BY key",
    )?;
    let mut rows = stmt.query([run_id])?;
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
            sample_bytes: row.get::<_, i64>(19)?.max(0) as u64,
        });
    }
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{encode_records, Store};
    use std::ops::ControlFlow;

    use crate::store::blob::test_record as rec;

    /// A database file `hub.db` in `dir`.
    fn in_dir(dir: &tempfile::TempDir) -> crate::store::Location {
        crate::store::Location::Sqlite {
            path: dir.path().join("hub.db"),
            fsync: false,
        }
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
                encode_records(&[rec(0, 0.0), rec(1, 1.0), rec(2, 2.0)]).unwrap(),
                encode_records(&[rec(7, 7.0), rec(5, 5.0), rec(6, 6.0)]).unwrap(),
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
        assert_eq!(store.step_bounds(1).await.unwrap().map(|b| b.0), Some(0));
        // Opening again does not migrate twice.
        drop(store);
        let (store, _) = Store::open(&path, false).unwrap();
        assert_eq!(store.step_bounds(1).await.unwrap().map(|b| b.0), Some(0));
    }

    /// A database of schema version 2 (no span classes) is migrated: its batches, wide ones
    /// included, are found by range reads afterwards.
    #[tokio::test]
    async fn a_version_2_database_gets_span_classes() {
        let dir = tempfile::tempdir().unwrap();
        let location = in_dir(&dir);
        {
            let (store, _) = Store::open_at(&location, std::time::Duration::ZERO).unwrap();
            let key = store
                .upsert_run(crate::store::test_identity("r", "p"), 1, 1.0)
                .await
                .unwrap();
            crate::store::tests::append_steps(
                &store,
                key,
                &[vec![1, 2], vec![100_000, 3], vec![100_001]],
            )
            .await;
            drop(store);
        }
        // What version 2 wrote: no class column, the step index, `max_span` on the run.
        let conn = rusqlite::Connection::open(dir.path().join("hub.db")).unwrap();
        conn.execute_batch(
            "DROP INDEX batches_by_span; ALTER TABLE batches DROP COLUMN span_class; \
             CREATE INDEX batches_by_step ON batches (run_key, lo_step, hi_step); \
             UPDATE runs SET max_span = 99997; PRAGMA user_version = 2;",
        )
        .unwrap();
        drop(conn);
        let (store, runs) = Store::open_at(&location, std::time::Duration::ZERO).unwrap();
        let key = runs[0].key;
        assert_eq!(
            crate::store::tests::read_range(&store, key, (3, 3)).await.1,
            vec![3]
        );
        assert_eq!(
            crate::store::tests::read_range(&store, key, (2, 100_000))
                .await
                .1,
            vec![2, 100_000, 3]
        );
        assert_eq!(
            crate::store::tests::read_range(&store, key, (100_001, 100_001))
                .await
                .1,
            vec![100_001]
        );
    }

    /// A database of schema version 7 (`recent` `WITHOUT ROWID`, keyed by run and sequence
    /// number) is migrated: every batch of two runs is read back whole and by step range,
    /// each run's own only, and the runs go on storing and packing.
    #[tokio::test]
    async fn a_version_7_database_gets_recent_keyed_by_one_integer() {
        let dir = tempfile::tempdir().unwrap();
        let location = in_dir(&dir);
        let mut keys = Vec::new();
        {
            let (store, _) = Store::open_at(&location, std::time::Duration::ZERO).unwrap();
            for (name, base) in [("a", 0), ("b", 1_000)] {
                let key = store
                    .upsert_run(crate::store::test_identity(name, "p"), 1, 1.0)
                    .await
                    .unwrap();
                let batches: Vec<Vec<i64>> = (0..5)
                    .map(|i| vec![base + 2 * i, base + 2 * i + 1])
                    .collect();
                crate::store::tests::append_steps(&store, key, &batches).await;
                keys.push(key);
            }
        }
        // What version 7 wrote.
        let conn = rusqlite::Connection::open(dir.path().join("hub.db")).unwrap();
        conn.execute_batch(
            "CREATE TABLE recent_v7 (run_key INTEGER NOT NULL, seq INTEGER NOT NULL, \
             n INTEGER NOT NULL, lo_step INTEGER, hi_step INTEGER, data BLOB NOT NULL, \
             PRIMARY KEY (run_key, seq)) WITHOUT ROWID; \
             INSERT INTO recent_v7 SELECT run_key, seq, n, lo_step, hi_step, data FROM recent; \
             DROP TABLE recent; ALTER TABLE recent_v7 RENAME TO recent; \
             PRAGMA user_version = 7;",
        )
        .unwrap();
        drop(conn);
        let (store, runs) = Store::open_at(&location, std::time::Duration::ZERO).unwrap();
        for (key, base) in keys.iter().zip([0, 1_000]) {
            let all = store
                .scan(*key, 0, u64::MAX, Vec::new(), |out, seq, recs| {
                    out.extend(recs.iter().map(|r| (seq, r.step)));
                    ControlFlow::Continue(())
                })
                .await
                .unwrap();
            let want: Vec<(u64, i64)> = (0..10).map(|i| (i as u64 / 2 + 1, base + i)).collect();
            assert_eq!(all, want);
            let later = store
                .scan(*key, 3, 4, Vec::new(), |out, seq, _| {
                    out.push(seq);
                    ControlFlow::Continue(())
                })
                .await
                .unwrap();
            assert_eq!(later, vec![4]);
            // Two batches visited: steps 2-3 and 4-5.
            assert_eq!(
                crate::store::tests::read_range(&store, *key, (base + 3, base + 4)).await,
                (2, vec![base + 3, base + 4])
            );
            assert_eq!(
                store.step_bounds(*key).await.unwrap(),
                Some((base, base + 9))
            );
        }
        // The next batch follows, and packing reads the migrated rows.
        let tail = &runs.iter().find(|r| r.key == keys[0]).unwrap().tail;
        let records: std::sync::Arc<[stepstream_protocol::StepRecord]> = vec![rec(10, 1.0)].into();
        assert!(store
            .append_batch(keys[0], 6, records.clone(), tail.after(6, &records))
            .await
            .unwrap());
        store.pack(keys[0]).await.unwrap();
        let conn = rusqlite::Connection::open(dir.path().join("hub.db")).unwrap();
        let left: Vec<(i64, i64)> = conn
            .prepare("SELECT run_key, seq FROM recent ORDER BY id")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert_eq!(left, (1..=5).map(|seq| (keys[1], seq)).collect::<Vec<_>>());
        let steps = store
            .scan(keys[0], 0, u64::MAX, Vec::new(), |out, _, recs| {
                out.extend(recs.iter().map(|r| r.step));
                ControlFlow::Continue(())
            })
            .await
            .unwrap();
        assert_eq!(steps, (0..=10).collect::<Vec<_>>());
    }

    /// A run whose key does not fit `recent`'s ids is refused its batches with a clear error,
    /// and stores nothing (not even its tail).
    #[tokio::test]
    async fn a_batch_beyond_what_recent_can_key_is_refused_and_nothing_is_stored() {
        let dir = tempfile::tempdir().unwrap();
        let location = in_dir(&dir);
        let (store, _) = Store::open_at(&location, std::time::Duration::ZERO).unwrap();
        let key = store
            .upsert_run(crate::store::test_identity("big", "p"), 1, 1.0)
            .await
            .unwrap();
        drop(store);
        let conn = rusqlite::Connection::open(dir.path().join("hub.db")).unwrap();
        conn.execute(
            "UPDATE runs SET key = ?2 WHERE key = ?1",
            params![key, RECENT_MAX_KEY + 1],
        )
        .unwrap();
        drop(conn);
        let (store, runs) = Store::open_at(&location, std::time::Duration::ZERO).unwrap();
        let key = runs[0].key;
        let records: std::sync::Arc<[stepstream_protocol::StepRecord]> = vec![rec(0, 1.0)].into();
        let tail = crate::store::RunTail::default().after(1, &records);
        let err = store
            .append_batch(key, 1, records, tail)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("beyond what this database holds"), "{err}");
        let (_, runs) = {
            drop(store);
            Store::open_at(&location, std::time::Duration::ZERO).unwrap()
        };
        assert_eq!(runs[0].tail.last_seq, 0);
        assert!(beyond_recent(0, RECENT_MAX_SEQ + 1).is_some());
        assert_eq!(recent_id(1, u64::MAX), recent_id(1, RECENT_MAX_SEQ));
        assert!(recent_id(1, RECENT_MAX_SEQ) < recent_id(2, 0));
    }
}
