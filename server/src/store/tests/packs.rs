//! Packs (`store::pack`) against a real SQLite database: a run is packed as it grows and
//! when it ends, every read sees each batch once, and a database written before packs is
//! packed afterwards with nothing lost.

use super::*;

/// Records like a training's: float32 loss and grad norm, a float64 cosine learning rate,
/// a constant loss scale, tokens seen, in a scrambled metric order.
fn training(from: i64, n: usize) -> Vec<StepRecord> {
    (from..from + n as i64)
        .map(|step| {
            let t = step as f64;
            let noise = ((step * 7919) % 1000) as f64 / 1000.0;
            StepRecord {
                step,
                wall_time: 1.765e9 + t * 0.1,
                values: vec![
                    (MetricId(3), 65536.0),
                    (
                        MetricId(0),
                        f64::from((2.0 * (-t / 5e4).exp() + 0.1 * noise) as f32),
                    ),
                    (
                        MetricId(2),
                        3e-4 * 0.5 * (1.0 + (std::f64::consts::PI * t / 1e6).cos()),
                    ),
                    (MetricId(1), f64::from((1.0 + noise) as f32)),
                    (MetricId(4), t * 4096.0),
                ],
            }
        })
        .collect()
}

/// A record as bits: step, wall time, and its values in metric id order.
type Bits = (i64, u64, Vec<(u32, u64)>);

fn sorted(records: &[StepRecord]) -> Vec<Bits> {
    records
        .iter()
        .map(|r| {
            let mut v: Vec<(u32, u64)> = r.values.iter().map(|(i, v)| (i.0, v.to_bits())).collect();
            v.sort_unstable();
            (r.step, r.wall_time.to_bits(), v)
        })
        .collect()
}

/// `(rows, packs, bytes of blobs)` of a run's batches.
fn rows(dir: &tempfile::TempDir, key: RunKey) -> (i64, i64, i64) {
    let conn = rusqlite::Connection::open(dir.path().join("hub.db")).unwrap();
    conn.query_row(
        "SELECT count(*), count(seq_end), coalesce(sum(length(data)), 0) FROM batches \
         WHERE run_key = ?1",
        [key],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )
    .unwrap()
}

async fn seqs(store: &Store, key: RunKey, after: u64, through: u64) -> Vec<(u64, usize)> {
    store
        .scan(key, after, through, Vec::new(), |out, seq, records| {
            out.push((seq, records.len()));
            ControlFlow::Continue(())
        })
        .await
        .unwrap()
}

#[tokio::test]
async fn a_long_run_is_packed_as_it_grows_and_every_read_sees_each_batch_once() {
    let (store, dir) = sqlite_store(Duration::ZERO);
    let key = store
        .upsert_run(test_identity("r", "p"), 1, 1.0)
        .await
        .unwrap();
    let batches: Vec<Vec<StepRecord>> = (0..3_001).map(|b| training(b * 4, 4)).collect();
    let mut tail = RunTail::default();
    for (i, records) in batches.iter().enumerate() {
        let seq = i as u64 + 1;
        let records: Arc<[StepRecord]> = records.clone().into();
        tail = tail.after(seq, &records);
        assert!(store
            .append_batch(key, seq, records, tail.clone())
            .await
            .unwrap());
    }
    // 12,004 records: packs of 4,096 records (1,024 batches) as it grew.
    let (n_rows, packs, _) = rows(&dir, key);
    assert_eq!(packs, 2, "{n_rows} rows");
    assert_eq!(n_rows, 2 + 3_001 - 2_048);

    // Every batch once, in order, with its records, by sequence number; windows that start
    // and end inside a pack, across its end, and past the run.
    let all = store
        .scan(key, 0, u64::MAX, Vec::new(), |out, seq, r| {
            out.push((seq, sorted(r)));
            ControlFlow::Continue(())
        })
        .await
        .unwrap();
    assert_eq!(all.len(), batches.len());
    for ((seq, got), (i, want)) in all.iter().zip(batches.iter().enumerate()) {
        assert_eq!(*seq, i as u64 + 1);
        assert_eq!(got, &sorted(want), "batch {seq}");
    }
    for (after, through) in [
        (0, 1),
        (5, 9),
        (1_020, 1_030),
        (1_023, 1_025),
        (2_040, 2_060),
        (2_990, 5_000),
    ] {
        let want: Vec<u64> = (after + 1..=through.min(3_001)).collect();
        let got: Vec<u64> = seqs(&store, key, after, through)
            .await
            .into_iter()
            .map(|s| s.0)
            .collect();
        assert_eq!(got, want, "after {after} through {through}");
    }
    // A packed batch alone (what a resend is compared with).
    let alone = store.batch(key, 700).await.unwrap().unwrap();
    assert_eq!(sorted(&alone), sorted(&batches[699]));
    // Step range reads are exact inside a pack and across its end.
    for (lo, hi) in [
        (100, 103),
        (4_090, 4_100),
        (8_190, 8_200),
        (0, 0),
        (12_000, 12_003),
    ] {
        assert_eq!(
            read_range(&store, key, (lo, hi)).await.1,
            (lo..=hi).collect::<Vec<_>>()
        );
    }
    assert_eq!(store.step_bounds(key).await.unwrap(), Some((0, 12_003)));
    let values = store
        .scan_values(key, 0, u64::MAX, 0usize, |n, _, _, _, _| *n += 1)
        .await
        .unwrap();
    assert_eq!(values, 3_001 * 4 * 5);

    // Its end packs the rest: three packs, nothing else, and the float32 and slowly changing
    // series take a few bytes a value.
    store
        .set_status(key, RunStatus::Finished, None, 2.0)
        .await
        .unwrap()
        .committed()
        .await
        .unwrap();
    let (n_rows, packs, bytes) = rows(&dir, key);
    assert_eq!((n_rows, packs), (3, 3));
    let per_value = bytes as f64 / values as f64;
    assert!(per_value < 2.0, "{per_value:.2} bytes per value");
    assert_eq!(seqs(&store, key, 0, u64::MAX).await.len(), 3_001);
    let alone = store.batch(key, 3_001).await.unwrap().unwrap();
    assert_eq!(sorted(&alone), sorted(&batches[3_000]));
}

/// A database of schema version 5 (each batch its own row) opens with every batch readable
/// as before, and packing it afterwards (what `serve` does for ended runs) loses nothing.
#[tokio::test]
async fn a_version_5_database_is_read_as_it_was_and_packed_afterwards() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hub.db");
    let batches: Vec<Vec<StepRecord>> = (0..2_000).map(|b| training(b * 10, 10)).collect();
    {
        let (store, _) = Store::open(&path, false).unwrap();
        let key = store
            .upsert_run(test_identity("old", "p"), 1, 1.0)
            .await
            .unwrap();
        drop(store);
        // What version 5 wrote: a row per batch, no pack columns.
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "ALTER TABLE batches DROP COLUMN seq_end; \
             CREATE TABLE runs5 AS SELECT key, run_id, project, name, config, host, rank, \
             world_size, started_at, status, status_message, last_activity, last_seq, \
             last_step, last_point_at, records, last_values, status_at, job, framework, \
             max_span, writer, writer_seen, console_lines, console_kept, sample_bytes \
             FROM runs; DROP TABLE runs; ALTER TABLE runs5 RENAME TO runs; \
             PRAGMA user_version = 5;",
        )
        .unwrap();
        for (i, records) in batches.iter().enumerate() {
            let range = blob::step_range(records);
            conn.execute(
                "INSERT INTO batches (run_key, seq, n, data, lo_step, hi_step, span_class) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                rusqlite::params![
                    key,
                    i as i64 + 1,
                    records.len() as i64,
                    encode_records(records).unwrap(),
                    range.map(|r| r.0),
                    range.map(|r| r.1),
                    blob::span_class(range)
                ],
            )
            .unwrap();
        }
        conn.execute(
            "UPDATE runs SET last_seq = 2000, status = 'finished' WHERE key = ?1",
            [key],
        )
        .unwrap();
    }
    let (store, runs) = Store::open(&path, false).unwrap();
    let key = runs[0].key;
    let before = read_range(&store, key, (9_995, 10_004)).await.1;
    assert_eq!(before, (9_995..=10_004).collect::<Vec<_>>());
    assert_eq!(rows(&dir, key).1, 0);
    // 20,000 records: five packs (4,100 records each), the last the tail.
    let mut calls = 0;
    while store.pack(key).await.unwrap() {
        calls += 1;
    }
    assert_eq!(calls, 0, "16 packs per command cover this run");
    assert_eq!(rows(&dir, key), (5, 5, rows(&dir, key).2));
    let all = store
        .scan(key, 0, u64::MAX, Vec::new(), |out, seq, r| {
            out.push((seq, sorted(r)));
            ControlFlow::Continue(())
        })
        .await
        .unwrap();
    assert_eq!(all.len(), 2_000);
    assert!(all
        .iter()
        .zip(&batches)
        .all(|((_, got), want)| got == &sorted(want)));
    assert_eq!(read_range(&store, key, (9_995, 10_004)).await.1, before);
    // Packing again finds nothing to do.
    assert!(!store.pack(key).await.unwrap());
    assert_eq!(rows(&dir, key).0, 5);
}
