//! Whole-run answers from the packs' summaries (`store::summary`) against a real SQLite
//! database: at each summary width, what `downsample::summarized` answers is the M4 of the
//! raw points (the same aligned buckets fed every stored value), with spikes, NaN and the
//! infinities, a run whose steps go back, ranges that cut through packs, and the run's
//! unpacked tail.

use crate::downsample::{summarized, Aligned};
use crate::store::summary::{width_for, WIDTHS};
use crate::store::tests::sqlite_store;
use crate::store::*;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use stepstream_protocol::{MetricId, StepRecord};

/// `n` records `stride` steps apart from `from`: a noisy float32 loss with spikes and every
/// non-finite value now and then, a sparse metric every 64th record, and a constant.
pub(super) fn records(from: i64, stride: i64, n: usize, seed: u64) -> Vec<StepRecord> {
    let mut x = seed | 1;
    (0..n)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let step = from + i as i64 * stride;
            let loss = match x % 5_000 {
                0 => f64::NAN,
                1 => f64::INFINITY,
                2 => f64::NEG_INFINITY,
                3 => 1e9,
                _ => f64::from(((x >> 20) % 1000) as f32 / 1000.0),
            };
            let mut values = vec![(MetricId(0), loss), (MetricId(2), 65_536.0)];
            if i % 64 == 0 {
                values.push((MetricId(1), (i as f64).sqrt()));
            }
            StepRecord {
                step,
                wall_time: 1.7e9 + i as f64 * 0.01,
                values,
            }
        })
        .collect()
}

/// What the raw points give: every stored value pushed into the same aligned M4.
async fn from_raw(
    store: &Store,
    key: RunKey,
    width: i64,
    range: (i64, i64),
    wanted: Arc<HashSet<MetricId>>,
) -> Vec<(MetricId, u64, (Vec<i64>, Vec<u64>, Vec<u64>))> {
    let aligned = store
        .scan(
            key,
            0,
            u64::MAX,
            Aligned::new(width, range, wanted),
            |aligned, _, records| {
                aligned.add(Part::Records(records));
                std::ops::ControlFlow::Continue(())
            },
        )
        .await
        .unwrap();
    aligned
        .finish()
        .into_iter()
        .map(|(id, total, (s, v, t))| (id, total, (s, bits(&v), bits(&t))))
        .collect()
}

fn bits(v: &[f64]) -> Vec<u64> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[tokio::test]
async fn summaries_give_the_m4_of_the_raw_points_at_every_width() {
    let (store, dir) = sqlite_store(Duration::ZERO);
    let key = store
        .upsert_run(test_identity("long", "p"), 1, 1.0)
        .await
        .unwrap();
    // 1.2 M steps one by one, then a resume from step 600,000 (steps go back) for
    // 300,000 more, then 8 records 2 M steps apart (a range of 20 M steps for the coarse
    // width), in batches of 50; the last batches stay unpacked (the run has not ended).
    let mut all = records(0, 1, 1_200_000, 7);
    all.extend(records(600_000, 1, 300_000, 11));
    all.extend(records(2_000_000, 2_000_000, 8, 13));
    let mut tail = RunTail::default();
    let mut seq = 0;
    for batch in all.chunks(50) {
        seq += 1;
        let batch: Arc<[StepRecord]> = batch.to_vec().into();
        tail = tail.after(seq, &batch);
        assert!(store
            .append_batch(key, seq, batch, tail.clone())
            .await
            .unwrap());
    }
    let conn = rusqlite::Connection::open(dir.path().join("hub.db")).unwrap();
    let (summaries, unpacked): (i64, i64) = conn
        .query_row(
            "SELECT (SELECT count(*) FROM summaries WHERE run_key = ?1), \
             (SELECT count(*) FROM recent WHERE run_key = ?1)",
            [key],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert!(
        summaries > 500 && unpacked > 0,
        "{summaries} summaries, {unpacked} unpacked"
    );
    let every: Arc<HashSet<MetricId>> = Arc::new((0..3).map(MetricId).collect());
    let mut widths_seen = HashSet::new();
    for (range, budget) in [
        ((0, 16_000_000), 4_000),
        ((0, 1_499_999), 4_000),
        ((0, 1_000_000), 4_000),
        // Cutting through packs at both ends.
        ((123_457, 1_100_001), 2_000),
        ((-5, 18_000_000), 1_000),
    ] {
        let (level, width) = width_for(range, budget / 4).expect("long enough");
        widths_seen.insert(WIDTHS[level]);
        let got = summarized(&store, key, seq, range, budget, every.clone())
            .await
            .unwrap()
            .expect("answered from the summaries");
        let got: Vec<_> = got
            .into_iter()
            .map(|(id, total, (s, v, t, _))| (id, total, (s, bits(&v), bits(&t))))
            .collect();
        let want = from_raw(&store, key, width, range, every.clone()).await;
        assert_eq!(got.len(), 3);
        assert_eq!(got, want, "range {range:?} at width {width}");
        // In every bucket, the first NaN, +inf, -inf and spike of the range is there (M4
        // keeps each bucket's first of each, and its extremes).
        let loss = &got.iter().find(|g| g.0 == MetricId(0)).unwrap().2;
        let mut firsts = std::collections::HashMap::new();
        for r in all.iter().filter(|r| (range.0..=range.1).contains(&r.step)) {
            let v = r.values[0].1;
            let kind = if v.is_nan() {
                0
            } else if v == f64::INFINITY {
                1
            } else if v == f64::NEG_INFINITY {
                2
            } else if v == 1e9 {
                3
            } else {
                continue;
            };
            firsts
                .entry((r.step.div_euclid(width), kind))
                .or_insert((r.step, v.to_bits()));
        }
        assert!(firsts.len() > 10, "{}", firsts.len());
        for ((bucket, kind), (step, b)) in firsts {
            assert!(
                loss.0
                    .iter()
                    .zip(&loss.1)
                    .any(|(s, x)| *s == step && *x == b),
                "the first of kind {kind} in bucket {bucket} (step {step}) lost in {range:?}"
            );
        }
    }
    assert_eq!(widths_seen.len(), WIDTHS.len(), "{widths_seen:?}");
    // A metric with fewer points than the budget comes whole: not from the summaries.
    let sparse = Arc::new(HashSet::from([MetricId(1)]));
    assert!(
        summarized(&store, key, seq, (0, 1_499_999), 100_000, sparse)
            .await
            .unwrap()
            .is_none()
    );
    // A short range is read raw.
    assert!(
        summarized(&store, key, seq, (0, 100_000), 4_000, every.clone())
            .await
            .unwrap()
            .is_none()
    );

    // Packs made before summaries existed (every third one's here): read raw among the
    // others, the same answer; then summarised in the background, a few per command.
    let count = |conn: &rusqlite::Connection| -> i64 {
        conn.query_row(
            "SELECT count(*) FROM summaries WHERE run_key = ?1",
            [key],
            |r| r.get(0),
        )
        .unwrap()
    };
    let before = count(&conn);
    conn.execute(
        "DELETE FROM summaries WHERE run_key = ?1 AND seq IN (SELECT seq FROM batches WHERE \
         run_key = ?1 AND seq_end IS NOT NULL AND seq % 3 = 0)",
        [key],
    )
    .unwrap();
    let missing = before - count(&conn);
    assert!(missing > 100, "{missing}");
    let range = (0, 16_000_000);
    let (_, width) = width_for(range, 1000).unwrap();
    let want = from_raw(&store, key, width, range, every.clone()).await;
    let answer = |got: Vec<(MetricId, u64, crate::downsample::Answer)>| -> Vec<_> {
        got.into_iter()
            .map(|(id, total, (s, v, t, _))| (id, total, (s, bits(&v), bits(&t))))
            .collect()
    };
    let got = summarized(&store, key, seq, range, 4_000, every.clone())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answer(got), want);
    let mut commands = 0;
    let mut after = Some((0, 0));
    while let Some(at) = after {
        after = store.summarize(at).await.unwrap();
        commands += 1;
    }
    assert_eq!(count(&conn), before);
    assert!(commands >= (missing / 2) as usize / crate::store::summary::SUMMARIZE_PER_COMMAND);
    let got = summarized(&store, key, seq, range, 4_000, every)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answer(got), want);
}
