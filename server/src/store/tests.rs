//! The store against a real SQLite database: commits, the commit interval, reads.

use super::*;

use blob::test_record as rec;

/// A store over a fresh SQLite database committing at most once per `interval` while busy;
/// the database lives as long as the folder returned.
pub(super) fn sqlite_store(interval: Duration) -> (Store, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let location = Location::Sqlite {
        path: dir.path().join("hub.db"),
        fsync: false,
    };
    let (store, _) = Store::open_at(&location, interval).unwrap();
    (store, dir)
}

/// A command someone waits on (here a new metric's definition, which holds back its
/// run's batches) ends the writer's commit interval instead of waiting it out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_someone_waits_on_cuts_the_commit_interval_short() {
    let interval = Duration::from_secs(3);
    let (store, _dir) = sqlite_store(interval);
    let mut keys = Vec::new();
    for r in 0..8 {
        let id = test_identity(&format!("r{r}"), "p");
        keys.push(store.upsert_run(id, 1, 1.0).await.unwrap());
    }
    let append_all = |seq: u64| {
        let mut sent = tokio::task::JoinSet::new();
        for &key in &keys {
            let store = store.clone();
            let records: Arc<[StepRecord]> = vec![rec(seq as i64, 1.0)].into();
            // Each run's tail before this batch: empty, or its batch 1.
            let tail = match seq {
                1 => RunTail::default(),
                _ => RunTail::default().after(1, &[rec(1, 1.0)]),
            };
            sent.spawn(async move {
                let tail = tail.after(seq, &records);
                store.append_batch(key, seq, records, tail).await
            });
        }
        sent
    };
    // Eight runs' batches in one transaction: from then on the writer waits its interval.
    for appended in append_all(1).join_all().await {
        assert!(appended.unwrap());
    }
    let second = append_all(2);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let asked = std::time::Instant::now();
    store
        .define_metrics(
            keys[0],
            vec![MetricDef {
                id: MetricId(0),
                name: "loss".into(),
            }],
        )
        .await
        .unwrap();
    let waited = asked.elapsed();
    assert!(
        waited < Duration::from_secs(1),
        "a metric definition waited {waited:?} of a {interval:?} commit interval"
    );
    for appended in second.join_all().await {
        assert!(appended.unwrap());
    }
}

/// Batches of many runs arriving within one commit interval share a transaction; with
/// no interval each is committed on its own as it comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_within_the_commit_interval_share_one_commit() {
    async fn commits_for_spread_appends(interval: Duration) -> u64 {
        let (store, _dir) = sqlite_store(interval);
        let mut opened = tokio::task::JoinSet::new();
        for r in 0..40 {
            let store = store.clone();
            let id = test_identity(&format!("r{r}"), "p");
            opened.spawn(async move { store.upsert_run(id, 1, 1.0).await });
        }
        let keys: Vec<RunKey> = opened
            .join_all()
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        let before = store.commits();
        // One batch per run, 4 at a time, 2 ms apart: 20 ms in all, as a fleet's runs
        // send (collectors seal on the same wall-clock tick). Each four are handed over
        // together, from one task: four tasks on two threads sometimes reached the writer
        // one by one, each its own commit, so four runs were never seen busy at once (a
        // flake of the test's own making, 6 or 10 commits on a loaded machine).
        let mut sent = tokio::task::JoinSet::new();
        for four in keys.chunks(4) {
            let appends: Vec<_> = four
                .iter()
                .map(|&key| {
                    let store = store.clone();
                    let records: Arc<[StepRecord]> = vec![rec(1, 1.0)].into();
                    async move {
                        let tail = RunTail::default().after(1, &records);
                        store.append_batch(key, 1, records, tail).await
                    }
                })
                .collect();
            sent.spawn(futures_util::future::join_all(appends));
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        while let Some(appended) = sent.join_next().await {
            for a in appended.unwrap() {
                assert!(a.unwrap(), "every batch is stored");
            }
        }
        store.commits() - before
    }
    // The interval engages once four runs were busy within it, however the scheduler split
    // their first batches into transactions (the rule once keyed on the last transaction
    // alone, and a loaded machine's split made 6 or 10 commits).
    let shared = commits_for_spread_appends(Duration::from_millis(500)).await;
    // The first commits hold what arrived before four runs were seen busy at once (one
    // run, then the rest of the first four); after that one wait takes everything.
    assert!(shared <= 4, "40 batches in 20 ms took {shared} commits");
    let alone = commits_for_spread_appends(Duration::ZERO).await;
    assert!(
        alone >= 5,
        "without an interval 40 batches took {alone} commits"
    );
}

/// A lone writer's batches are not held back for the interval: each commits as it
/// comes (ten would take five seconds if each waited).
#[tokio::test]
async fn a_lone_writer_does_not_wait_for_the_commit_interval() {
    let (store, _dir) = sqlite_store(Duration::from_millis(500));
    let key = store
        .upsert_run(test_identity("r", "p"), 1, 1.0)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let mut tail = RunTail::default();
    for seq in 1..=10u64 {
        let records: Arc<[StepRecord]> = vec![rec(seq as i64, 1.0)].into();
        tail = tail.after(seq, &records);
        store
            .append_batch(key, seq, records, tail.clone())
            .await
            .unwrap();
    }
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(2500),
        "ten batches took {took:?}"
    );
}

/// Batches may be handed to the writer before the earlier ones commit: one whose
/// predecessor is not stored is refused, whichever transaction it shares, so a failed
/// batch takes the ones behind it along and the run never has a hole.
#[tokio::test]
async fn a_batch_whose_predecessor_is_not_stored_is_refused() {
    let (store, dir) = sqlite_store(Duration::ZERO);
    let key = store
        .upsert_run(test_identity("r", "p"), 1, 1.0)
        .await
        .unwrap();
    let tails = |seqs: &[u64]| {
        let mut tail = RunTail::default();
        seqs.iter()
            .map(|&seq| {
                let records: Arc<[StepRecord]> = vec![rec(seq as i64, seq as f64)].into();
                tail = tail.after(seq, &records);
                (seq, records, tail.clone())
            })
            .collect::<Vec<_>>()
    };
    let all = tails(&[1, 2, 3, 4]);
    let (seq, records, tail) = all[0].clone();
    assert!(store.append_batch(key, seq, records, tail).await.unwrap());
    // 3 and 4 skip 2; 2 comes last. Handed over together, they share transactions.
    let mut answers = Vec::new();
    for i in [2, 3, 1] {
        let (seq, records, tail) = all[i].clone();
        answers.push((
            seq,
            store
                .submit_batch(
                    key,
                    seq,
                    crate::store::StoredBatch {
                        records,
                        items: std::sync::Arc::new([]),
                        console_cap: u64::MAX,
                    },
                    tail,
                )
                .await
                .unwrap(),
        ));
    }
    let mut outcomes = Vec::new();
    for (seq, answer) in answers {
        outcomes.push((seq, answer.await.unwrap()));
    }
    for (seq, outcome) in &outcomes[..2] {
        assert!(
            matches!(outcome, Err(StoreError::Gap { stored: 1, .. })),
            "batch {seq}: {outcome:?}"
        );
    }
    assert!(matches!(outcomes[2], (2, Ok(true))), "{:?}", outcomes[2]);
    // What is stored is 1 and 2, and the tail says so.
    let stored = store
        .scan(key, 0, 100, Vec::new(), |out, seq, _| {
            out.push(seq);
            ControlFlow::Continue(())
        })
        .await
        .unwrap();
    assert_eq!(stored, vec![1, 2]);
    drop(store);
    let (_, runs) = Store::open(&dir.path().join("hub.db"), false).unwrap();
    assert_eq!(runs[0].tail.last_seq, 2);
    assert_eq!(runs[0].tail.records, 2);
}

/// SQLite's own checkpoint waits for 65,536 WAL pages: a few hundred kilobytes of
/// batches reach the database file only through the checkpointer, which no read or
/// timer starts, only a commit.
#[tokio::test]
async fn commits_reach_the_database_file_through_the_checkpointer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hub.db");
    let (store, _) = Store::open(&path, false).unwrap();
    let key = store
        .upsert_run(test_identity("r", "p"), 1, 1.0)
        .await
        .unwrap();
    let mut tail = RunTail::default();
    for seq in 1..=40u64 {
        let records: Arc<[StepRecord]> = (0..100)
            .map(|i| StepRecord {
                step: (seq * 100 + i) as i64,
                wall_time: 1.0,
                values: (0..10).map(|m| (MetricId(m), (seq * i) as f64)).collect(),
            })
            .collect::<Vec<_>>()
            .into();
        tail = tail.after(seq, &records);
        assert!(store
            .append_batch(key, seq, records, tail.clone())
            .await
            .unwrap());
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let file = || std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    while file() < 200_000 {
        assert!(
            std::time::Instant::now() < deadline,
            "the database file holds {} bytes after 10 s: nothing checkpointed",
            file()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn batches_survive_reopen_and_duplicates_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hub.db");
    {
        let (store, runs) = Store::open(&path, false).unwrap();
        assert!(runs.is_empty());
        let key = store
            .upsert_run(test_identity("r1", "p"), 1, 10.0)
            .await
            .unwrap();
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
    assert_eq!(store.step_bounds(run.key).await.unwrap(), Some((1, 3)));
}

/// `after` skips the map updates of a record its successor overwrites; the last values
/// must still be every metric's last value in the batch, whatever sets of metrics the
/// records carry.
#[test]
fn a_tail_holds_each_metrics_last_value_in_the_batch() {
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let mut tail = RunTail::default();
    let mut want: BTreeMap<MetricId, f64> = BTreeMap::new();
    for seq in 1..=300u64 {
        let records: Vec<StepRecord> = (0..next(6))
            .map(|i| {
                // Mostly the same set step after step, sometimes another.
                let set = if next(4) == 0 { next(3) } else { 0 };
                let values: Vec<(MetricId, f64)> = (0..4u32)
                    .filter(|id| (id + set as u32) % 3 != 0 || set == 0)
                    .map(|id| (MetricId(id), (seq * 10 + i) as f64 + f64::from(id) / 10.0))
                    .collect();
                StepRecord {
                    step: seq as i64,
                    wall_time: 0.0,
                    values,
                }
            })
            .collect();
        for r in &records {
            want.extend(r.values.iter().copied());
        }
        tail = tail.after(seq, &records);
        assert_eq!(tail.last_values, want, "batch {seq}");
    }
}

/// Appends batches of `rec(step, step)` records, one batch per list, as sequence 1, 2, ...
pub(super) async fn append_steps(store: &Store, key: RunKey, batches: &[Vec<i64>]) {
    let mut tail = RunTail::default();
    for (i, steps) in batches.iter().enumerate() {
        let seq = i as u64 + 1;
        let records: Arc<[StepRecord]> = steps.iter().map(|&s| rec(s, s as f64)).collect();
        tail = tail.after(seq, &records);
        assert!(store
            .append_batch(key, seq, records, tail.clone())
            .await
            .unwrap());
    }
}

/// The batches a range read visits, and the steps of its points.
pub(super) async fn read_range(store: &Store, key: RunKey, range: (i64, i64)) -> (usize, Vec<i64>) {
    store
        .scan_steps(
            key,
            range,
            i64::MAX as u64,
            (0, Vec::new()),
            move |(n, steps), _, records| {
                *n += 1;
                steps.extend(
                    records
                        .iter()
                        .map(|r| r.step)
                        .filter(|s| (range.0..=range.1).contains(s)),
                );
                ControlFlow::Continue(())
            },
        )
        .await
        .unwrap()
}

/// 2,000 batches of 10 steps and, in the middle, one that also holds step 0 (an
/// evaluation logged late): one widest span per run once made every later read of a
/// narrow window scan back to step 0, ~1,500 batches; by span class it visits the
/// window's batch and the wide one.
#[tokio::test]
async fn one_wide_batch_does_not_widen_later_range_reads() {
    let (store, _dir) = sqlite_store(Duration::ZERO);
    let key = store
        .upsert_run(test_identity("r", "p"), 1, 1.0)
        .await
        .unwrap();
    let mut batches: Vec<Vec<i64>> = (0..2000).map(|b| (b * 10..b * 10 + 10).collect()).collect();
    batches[1000].push(0);
    append_steps(&store, key, &batches).await;
    let (visited, steps) = read_range(&store, key, (15_000, 15_009)).await;
    assert_eq!(steps, (15_000..15_010).collect::<Vec<_>>());
    assert_eq!(
        visited, 1,
        "a window after the wide batch read {visited} batches"
    );
    // Windows the wide batch covers find it, and what it holds, exactly once.
    let (visited, steps) = read_range(&store, key, (0, 4)).await;
    assert_eq!(steps, vec![0, 1, 2, 3, 4, 0]);
    assert_eq!(visited, 2);
    let (_, steps) = read_range(&store, key, (9_999, 10_001)).await;
    assert_eq!(steps, vec![9_999, 10_000, 10_001]);
    // Spans at the ends of i64 neither overflow nor hide a batch.
    let key = store
        .upsert_run(test_identity("far", "p"), 1, 1.0)
        .await
        .unwrap();
    append_steps(&store, key, &[vec![i64::MIN, i64::MAX], vec![5]]).await;
    assert_eq!(read_range(&store, key, (-1, 1)).await.1, Vec::<i64>::new());
    assert_eq!(
        read_range(&store, key, (i64::MAX, i64::MAX)).await.1,
        vec![i64::MAX]
    );
    assert_eq!(
        read_range(&store, key, (i64::MIN, 5)).await.1,
        vec![i64::MIN, 5]
    );
}

/// A command's state only moves forward and never out of a final state; a run's end expires
/// only its unfinished commands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commands_state_only_moves_forward() {
    use stepstream_protocol::{Action, CommandState as S};
    let (store, _dir) = sqlite_store(Duration::ZERO);
    let key = store
        .upsert_run(test_identity("cmd", "p"), 1, 1.0)
        .await
        .unwrap();
    let add = |action| {
        let store = store.clone();
        async move {
            store
                .add_command(key, action, "ann".into(), "why".into(), 1.0)
                .await
                .unwrap()
                .committed()
                .await
                .unwrap()
        }
    };
    let set = |id: Option<u64>, state| {
        let store = store.clone();
        async move {
            store
                .set_command(key, id, state, Some(7), format!("{state:?}"), 2.0)
                .await
                .unwrap()
                .committed()
                .await
                .unwrap()
        }
    };
    let stop = add(Action::Stop { checkpoint: true }).await;
    let note = add(Action::Note { text: "n".into() }).await;
    let save = add(Action::Checkpoint).await;
    assert!(stop < note && note < save, "ids grow");
    assert!(set(Some(stop), S::Delivered).await);
    assert!(!set(Some(stop), S::Queued).await, "never back");
    assert!(
        !set(Some(stop), S::Delivered).await,
        "a repeat changes nothing"
    );
    assert!(set(Some(stop), S::Honoured).await);
    assert!(!set(Some(stop), S::Declined).await, "a final state stays");
    assert!(set(Some(note), S::Delivered).await);
    // The run ends: the unfinished ones expire, the honoured one stays honoured.
    assert!(set(None, S::Expired).await);
    let states: Vec<_> = store
        .commands(key, RunId::new("cmd").unwrap())
        .await
        .unwrap()
        .into_iter()
        .map(|c| (c.command.id, c.state, c.step))
        .collect();
    assert_eq!(
        states,
        vec![
            (stop, S::Honoured, Some(7)),
            (note, S::Expired, Some(7)),
            (save, S::Expired, Some(7))
        ]
    );
    assert!(!set(None, S::Expired).await, "nothing left to expire");
}
