//! Packs (`store::pack`) against a real SQLite database: a run is packed as it grows and
//! when it ends, every read sees each batch once, and a database written before packs is
//! packed afterwards with nothing lost.

use crate::store::blob;
use crate::store::tests::{read_range, sqlite_store};
use crate::store::*;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;
use stepstream_protocol::{MetricId, RunStatus, StepRecord};

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

/// `(rows, packs, bytes of blobs)` of a run's batches: packs and batches from before packs
/// in `batches`, the batches since its last pack in `recent`.
fn rows(dir: &tempfile::TempDir, key: RunKey) -> (i64, i64, i64) {
    let conn = rusqlite::Connection::open(dir.path().join("hub.db")).unwrap();
    conn.query_row(
        "SELECT sum(n), sum(p), sum(b) FROM (SELECT count(*) AS n, count(seq_end) AS p, \
         coalesce(sum(length(data)), 0) AS b FROM batches WHERE run_key = ?1 UNION ALL \
         SELECT count(*), 0, coalesce(sum(length(data)), 0) FROM recent WHERE run_key = ?1)",
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

/// Metric values of one mix at a step: `None` where the metric is not logged at that step.
type Mix = fn(&mut u64, i64) -> Vec<(u32, f64)>;

fn uniform(s: &mut u64) -> f64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    (*s >> 11) as f64 / (1u64 << 53) as f64
}

fn gauss(s: &mut u64) -> f64 {
    let (u, v) = (uniform(s).max(1e-12), uniform(s));
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

/// A float32 training run at 10 steps/s: loss and grad norm (float32 tensors), a warmup +
/// cosine learning rate and throughput (Python floats), tokens, epoch, loss scale; and
/// every 5 s (50 steps) eight accelerators' utilisation, memory, power and temperature as
/// NVML reports them.
fn training_mix(s: &mut u64, step: i64) -> Vec<(u32, f64)> {
    let t = step as f64;
    let lr = if t < 2_000.0 {
        3e-4 * t / 2_000.0
    } else {
        3e-4 * 0.5 * (1.0 + (std::f64::consts::PI * (t - 2e3) / 198e3).cos())
    };
    let mut v = vec![
        (
            0,
            f64::from((2.0 * (-t / 5e4).exp() + 0.3 + 0.05 * gauss(s)) as f32),
        ),
        (1, f64::from((1.0 + 0.3 * gauss(s)).abs() as f32)),
        (2, lr),
        (3, 4096.0 / (0.1 + 0.004 * gauss(s).abs())),
        (4, t * 4096.0),
        (5, (step / 50_000) as f64),
        (6, 65536.0),
    ];
    if step % 50 == 0 {
        for gpu in 0..8 {
            let id = 10 + gpu * 4;
            v.push((id, (85.0 + 10.0 * gauss(s)).clamp(0.0, 100.0).round()));
            v.push((id + 1, (37_000_000_000.0 + 1e8 * gauss(s)).round() / 1e9));
            v.push((id + 2, (300_000.0 + 20_000.0 * gauss(s)).round() / 1000.0));
            v.push((id + 3, (70.0 + 3.0 * gauss(s)).round()));
        }
    }
    v
}

/// Ten float64 series of noise around a trend: what no codec can predict.
fn noise_mix(s: &mut u64, step: i64) -> Vec<(u32, f64)> {
    (0..10)
        .map(|i| (i, 1.0 + step as f64 * 1e-6 + 0.01 * gauss(s)))
        .collect()
}

/// Ten series that rarely change: epoch, a constant learning rate, flags.
fn constant_mix(_: &mut u64, step: i64) -> Vec<(u32, f64)> {
    (0..10)
        .map(|i| {
            (
                i,
                if i == 0 {
                    (step / 10_000) as f64
                } else {
                    i as f64 * 0.1
                },
            )
        })
        .collect()
}

struct Measured {
    blob_bytes: f64,
    file_bytes: f64,
    values: usize,
    ingest_s: f64,
    whole_s: f64,
    window_ms: f64,
    /// Bytes of the packs' summaries (`store::summary`).
    summary_bytes: f64,
}

/// Stores `steps` steps of a mix, four records a batch (a collector at 100 steps/s), many
/// batches in flight as the hub hands them; then reads the whole run and 200 windows of
/// 1,000 steps.
async fn measure(mix: Mix, steps: i64, packing: bool) -> Measured {
    crate::store::pack::set_packing(packing);
    let (store, dir) = sqlite_store(Duration::ZERO);
    let key = store
        .upsert_run(test_identity("bench", "p"), 1, 1.0)
        .await
        .unwrap();
    let mut seed = 0x2545_f491_4f6c_dd1d;
    let mut tail = RunTail::default();
    let mut values = 0;
    let started = std::time::Instant::now();
    let mut answers = std::collections::VecDeque::new();
    for (i, from) in (0..steps).step_by(4).enumerate() {
        let records: Arc<[StepRecord]> = (from..from + 4)
            .map(|step| StepRecord {
                step,
                wall_time: 1.765e9 + step as f64 * 0.1 + 0.002 * gauss(&mut seed),
                values: mix(&mut seed, step)
                    .into_iter()
                    .map(|(id, v)| (MetricId(id), v))
                    .collect(),
            })
            .collect();
        values += records.iter().map(|r| r.values.len()).sum::<usize>();
        let seq = i as u64 + 1;
        tail = tail.after(seq, &records);
        let batch = StoredBatch {
            records,
            items: Arc::new([]),
            console_cap: u64::MAX,
        };
        answers.push_back(
            store
                .submit_batch(key, seq, batch, tail.clone())
                .await
                .unwrap(),
        );
        if answers.len() >= 64 {
            assert!(answers.pop_front().unwrap().await.unwrap().unwrap());
        }
    }
    for a in answers {
        assert!(a.await.unwrap().unwrap());
    }
    if packing {
        store
            .set_status(key, RunStatus::Finished, None, 2.0)
            .await
            .unwrap()
            .committed()
            .await
            .unwrap();
    }
    let ingest_s = started.elapsed().as_secs_f64();
    let (_, _, blob_bytes) = rows(&dir, key);
    let conn = rusqlite::Connection::open(dir.path().join("hub.db")).unwrap();
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE); VACUUM;")
        .unwrap();
    let summary_bytes: i64 = conn
        .query_row(
            "SELECT coalesce(sum(length(data)), 0) FROM summaries",
            [],
            |r| r.get(0),
        )
        .unwrap();
    drop(conn);
    let file_bytes = std::fs::metadata(dir.path().join("hub.db")).unwrap().len() as f64;
    let started = std::time::Instant::now();
    let read = store
        .scan_values(key, 0, u64::MAX, 0usize, |n, _, _, _, _| *n += 1)
        .await
        .unwrap();
    let whole_s = started.elapsed().as_secs_f64();
    assert_eq!(read, values);
    let started = std::time::Instant::now();
    for w in 0..200 {
        let lo = (w * 7_919 * 1_000) % (steps - 1_000);
        let (_, got) = read_range(&store, key, (lo, lo + 999)).await;
        assert_eq!(got.len(), 1_000);
    }
    let window_ms = started.elapsed().as_secs_f64() * 1e3 / 200.0;
    crate::store::pack::set_packing(true);
    Measured {
        blob_bytes: blob_bytes as f64,
        summary_bytes: summary_bytes as f64,
        file_bytes,
        values,
        ingest_s,
        whole_s,
        window_ms,
    }
}

/// The storage benchmark (#35): bytes per value of three mixes with packs, and ingest and
/// read speed, each against the store without packs measured in the same run.
/// `cargo test -p stepstream-server --release --lib bench_storage -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run by hand, numbers in the notes"]
async fn bench_storage() {
    let steps = 200_000;
    let mixes: [(&str, Mix); 3] = [
        ("float32 training run", training_mix),
        ("float64 noise", noise_mix),
        ("constants", constant_mix),
    ];
    for (name, mix) in mixes {
        let reference = measure(mix, steps, false).await;
        let packed = measure(mix, steps, true).await;
        let per = |m: &Measured| {
            (
                m.blob_bytes / m.values as f64,
                m.file_bytes / m.values as f64,
            )
        };
        let (rb, rf) = per(&reference);
        let (pb, pf) = per(&packed);
        println!(
            "{name}: {} values; bytes/value blobs {pb:.2} (without packs {rb:.2}), summaries \
             {:.2}, database file {pf:.2} ({rf:.2}); ingest {:.0} k values/s ({:.0}, ratio {:.2}); whole run \
             read {:.0} ms ({:.0}, ratio {:.2}); 1,000-step window {:.2} ms ({:.2}, ratio {:.2})",
            packed.values,
            packed.summary_bytes / packed.values as f64,
            packed.values as f64 / packed.ingest_s / 1e3,
            reference.values as f64 / reference.ingest_s / 1e3,
            reference.ingest_s / packed.ingest_s,
            packed.whole_s * 1e3,
            reference.whole_s * 1e3,
            packed.whole_s / reference.whole_s,
            packed.window_ms,
            reference.window_ms,
            packed.window_ms / reference.window_ms,
        );
    }
}
