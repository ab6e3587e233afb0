//! The hub's refusals and its acknowledgement path, against a real store.

use super::*;
use crate::limits::HubLimits;
use crate::store::test_identity as identity;
use stepstream_protocol::{Batch, Limits, ToPeer};

fn def(id: u32, name: &str) -> MetricDef {
    MetricDef {
        id: MetricId(id),
        name: name.into(),
    }
}

fn batch(seq: u64, values: Vec<(MetricId, f64)>) -> Batch {
    Batch {
        seq,
        records: vec![StepRecord {
            step: seq as i64,
            wall_time: 1.0,
            values,
        }],
        items: Vec::new(),
    }
}

/// A hub over a fresh database, with its judge's jobs left undrained.
fn hub(limits: HubLimits) -> (Arc<Hub>, mpsc::Receiver<Job>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let (store, runs) = Store::open(&dir.path().join("hub.db"), false).unwrap();
    let policy = StatusPolicy {
        stale_after: Duration::from_secs(30),
        fail_after: None,
    };
    let (hub, jobs) = Hub::unjudged(store, runs, policy, &Default::default(), limits);
    (hub, jobs, dir)
}

/// Another hub over the same database (as the hubs of a cluster share one store).
fn second_hub(dir: &tempfile::TempDir) -> (Arc<Hub>, mpsc::Receiver<Job>) {
    let (store, runs) = Store::open(&dir.path().join("hub.db"), false).unwrap();
    let policy = StatusPolicy {
        stale_after: Duration::from_secs(30),
        fail_after: None,
    };
    Hub::unjudged(
        store,
        runs,
        policy,
        &Default::default(),
        HubLimits::default(),
    )
}

/// Run `r` of project `p`, opened by `writer`, with metric 0 named `loss`.
async fn run_with_loss(hub: &Hub, writer: u64) -> Arc<Run> {
    let run = hub.open_run(identity("r", "p"), writer, 1).await.unwrap();
    hub.define_metrics(&run, vec![def(0, "loss")])
        .await
        .unwrap();
    run
}

#[tokio::test]
async fn acknowledgements_never_wait_for_the_alert_judge() {
    let (hub, _jobs, _dir) = hub(HubLimits::default());
    let run = run_with_loss(&hub, 1).await;
    // Every record fires or resolves an alert; nobody drains the judge. Appends must still
    // complete: more of them than the judge's channel holds.
    let n = judge::JUDGE_CAPACITY as u64 + 500;
    for seq in 1..=n {
        let v = if seq % 2 == 0 { f64::NAN } else { 1.0 };
        let done = tokio::time::timeout(
            Duration::from_secs(5),
            hub.append(&run, batch(seq, vec![(MetricId(0), v)])),
        )
        .await
        .expect("an append waited on the judge");
        assert_eq!(done.unwrap(), Appended::Stored);
    }
    assert!(hub.unjudged.load(std::sync::atomic::Ordering::Relaxed) >= 500);
}

#[tokio::test]
async fn records_over_the_limits_are_refused_and_never_stored() {
    let limits = HubLimits {
        wire: Limits {
            record_values: 3,
            ..Limits::default()
        },
        ..HubLimits::default()
    };
    let (hub, _jobs, _dir) = hub(limits);
    let run = hub.open_run(identity("r", "p"), 1, 1).await.unwrap();
    let defs = (0..5).map(|i| def(i, &format!("m{i}"))).collect();
    hub.define_metrics(&run, defs).await.unwrap();
    let wide = (0..4).map(|i| (MetricId(i), 1.0)).collect();
    let err = hub.append(&run, batch(1, wide)).await.unwrap_err();
    assert!(err.to_string().contains("record_values"), "{err}");
    let twice = vec![(MetricId(1), 1.0), (MetricId(1), 2.0)];
    let err = hub.append(&run, batch(1, twice)).await.unwrap_err();
    assert!(err.to_string().contains("twice"), "{err}");
    let undefined = vec![(MetricId(9), 1.0)];
    assert!(matches!(
        hub.append(&run, batch(1, undefined)).await,
        Err(IngestError::UndefinedMetric { .. })
    ));
    assert_eq!(run.state(|st| st.tail.last_seq), 0, "nothing was stored");
    let ok = vec![(MetricId(0), 1.0), (MetricId(2), 2.0)];
    assert_eq!(
        hub.append(&run, batch(1, ok)).await.unwrap(),
        Appended::Stored
    );
}

#[tokio::test]
async fn too_many_metric_definitions_are_refused_before_any_work() {
    let (hub, _jobs, _dir) = hub(HubLimits::default());
    let run = hub.open_run(identity("r", "p"), 1, 1).await.unwrap();
    let many: Vec<MetricDef> = (0..70_000).map(|i| def(i, "m")).collect();
    let t = std::time::Instant::now();
    let err = hub.define_metrics(&run, many).await.unwrap_err();
    assert!(err.to_string().contains("run_metrics"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    let long = vec![def(0, &"x".repeat(600))];
    assert!(hub
        .define_metrics(&run, long)
        .await
        .unwrap_err()
        .to_string()
        .contains("name_bytes"));
    // Within the limit, in one pass (duplicates of one definition are fine).
    let ok: Vec<MetricDef> = (0..10_000).map(|i| def(i, &format!("m{i}"))).collect();
    hub.define_metrics(&run, ok.clone()).await.unwrap();
    hub.define_metrics(&run, ok).await.unwrap();
    let one_more = hub.define_metrics(&run, vec![def(10_000, "extra")]).await;
    assert!(one_more.unwrap_err().to_string().contains("run_metrics"));
}

#[tokio::test]
async fn a_second_live_writer_is_refused_and_a_mismatched_resend_detected() {
    let (hub, _jobs, _dir) = hub(HubLimits::default());
    let run = run_with_loss(&hub, 111).await;
    hub.append(&run, batch(1, vec![(MetricId(0), 1.0)]))
        .await
        .unwrap();
    // Another process, same run id, while the first is connected and talking.
    let err = hub
        .open_run(identity("r", "p"), 222, 2)
        .await
        .err()
        .unwrap();
    assert!(matches!(err, IngestError::Conflict(_)), "{err}");
    // The same writer reconnecting (its old socket half-open) takes over.
    let again = hub.open_run(identity("r", "p"), 111, 3).await.unwrap();
    // A resend of what is stored is a duplicate; different records under a stored seq are not.
    assert_eq!(
        hub.append(&again, batch(1, vec![(MetricId(0), 1.0)]))
            .await
            .unwrap(),
        Appended::Duplicate
    );
    let err = hub
        .append(&again, batch(1, vec![(MetricId(0), 2.0)]))
        .await
        .unwrap_err();
    assert!(matches!(err, IngestError::Conflict(_)), "{err}");
    // Once the writer's connection ends, another process may resume the run.
    hub.release_writer(&run, 1);
    hub.release_writer(&again, 3);
    hub.open_run(identity("r", "p"), 222, 4).await.unwrap();
}

#[tokio::test]
async fn run_and_identity_limits() {
    let limits = HubLimits {
        runs: 3,
        runs_per_project: 2,
        ..HubLimits::default()
    };
    let (hub, _jobs, _dir) = hub(limits);
    hub.open_run(identity("a1", "a"), 1, 1).await.unwrap();
    hub.open_run(identity("a2", "a"), 2, 2).await.unwrap();
    let err = hub.open_run(identity("a3", "a"), 3, 3).await.err().unwrap();
    assert!(err.to_string().contains("runs_per_project"), "{err}");
    hub.open_run(identity("b1", "b"), 4, 4).await.unwrap();
    let err = hub.open_run(identity("c1", "c"), 5, 5).await.err().unwrap();
    assert!(err.to_string().contains("limit runs)"), "{err}");
    // A known run comes back whatever the counts.
    hub.open_run(identity("a1", "a"), 1, 6).await.unwrap();
    let mut big = identity("b2", "b");
    big.config_json = format!("{{\"x\":\"{}\"}}", "y".repeat(200_000));
    let err = hub.open_run(big, 7, 7).await.err().unwrap();
    assert!(err.to_string().contains("config_bytes"), "{err}");
}

/// A hub of a cluster that missed messages (NATS dropped them) reads the missing batches
/// from the shared store before the one that arrived, so its viewers get each once, in order.
#[tokio::test]
async fn a_peer_batch_after_a_gap_brings_the_missed_ones_from_the_store_first() {
    let (a, _jobs, dir) = hub(HubLimits::default());
    let (b, _b_jobs) = second_hub(&dir);
    let run = a.open_run(identity("r", "p"), 1, 1).await.unwrap();
    a.define_metrics(&run, vec![def(0, "loss")]).await.unwrap();
    a.append(&run, batch(1, vec![(MetricId(0), 1.0)]))
        .await
        .unwrap();
    let peer = |seq: u64| {
        ToPeer::PeerBatch(stepstream_protocol::PeerBatch {
            hub: 99,
            run_id: RunId::new("r").unwrap(),
            seq,
            records: batch(seq, vec![(MetricId(0), seq as f64)]).records,
        })
    };
    // Hub B learns of the run from its first batch.
    b.apply_peer(peer(1)).await;
    let on_b = b.run(&RunId::new("r").unwrap()).expect("adopted");
    assert_eq!(on_b.state(|st| st.tail.last_seq), 1);
    let mut live = on_b.live.subscribe();
    for seq in 2..=5 {
        a.append(&run, batch(seq, vec![(MetricId(0), seq as f64)]))
            .await
            .unwrap();
    }
    // Only batch 5's message arrives.
    b.apply_peer(peer(5)).await;
    let mut got = Vec::new();
    while let Ok(LiveEvent::Batch { seq, .. }) = live.try_recv() {
        got.push(seq);
    }
    assert_eq!(got, vec![2, 3, 4, 5]);
    // A late copy of a missed message changes nothing.
    b.apply_peer(peer(3)).await;
    assert!(live.try_recv().is_err());
    assert_eq!(on_b.state(|st| st.tail.last_seq), 5);
}

/// A viewer or API client of one hub asks for a run another hub created a moment ago,
/// before any message about it arrived: the hub finds it in the shared store.
#[tokio::test]
async fn a_run_another_hub_just_created_is_found_in_the_shared_store() {
    let (a, _jobs, dir) = hub(HubLimits::default());
    let (b, _b_jobs) = second_hub(&dir);
    b.share_store();
    let run = a.open_run(identity("fresh", "p"), 1, 1).await.unwrap();
    a.define_metrics(&run, vec![def(0, "loss")]).await.unwrap();
    a.append(&run, batch(1, vec![(MetricId(0), 1.0)]))
        .await
        .unwrap();
    let id = RunId::new("fresh").unwrap();
    assert!(b.run(&id).is_none());
    let found = b.find_run(&id).await.expect("found in the store");
    assert_eq!(found.state(|st| st.tail.last_seq), 1);
    assert_eq!(found.state(|st| st.metrics.len()), 1);
    assert!(b.find_run(&RunId::new("never").unwrap()).await.is_none());
}

/// A connection hands the store its next batch before the previous one committed: each is
/// checked against the tail the batches before it leave, and settling them in order leaves
/// the run's tail, its viewers and its store exactly as one at a time would.
#[tokio::test]
async fn batches_in_flight_settle_in_order_as_one_at_a_time_would() {
    let (hub, _jobs, _dir) = hub(HubLimits::default());
    let run = run_with_loss(&hub, 1).await;
    let mut live = run.live.subscribe();
    let _lock = run.lock_ingest().await;
    let mut base = run.state(|st| st.tail.clone());
    let mut in_flight = Vec::new();
    for seq in 1..=5u64 {
        match hub
            .submit(
                &run,
                Some(&base),
                batch(seq, vec![(MetricId(0), seq as f64)]),
            )
            .await
            .unwrap()
        {
            Submitted::InFlight(b) => {
                base = b.tail().clone();
                in_flight.push(b);
            }
            Submitted::Duplicate { .. } => panic!("batch {seq} is new"),
        }
    }
    // Nothing settled yet: the run's tail has not moved, but its viewers saw each batch
    // once it was checked, in order (a lone hub does not make them wait for the commit).
    assert_eq!(run.state(|st| st.tail.last_seq), 0);
    for seq in 1..=5u64 {
        match live.try_recv().unwrap() {
            LiveEvent::Batch { seq: got, .. } => assert_eq!(got, seq),
            other => panic!("expected batch {seq}, got {other:?}"),
        }
    }
    assert!(live.try_recv().is_err());
    // A batch that skips one is refused against the tail in flight, not the settled one.
    assert!(matches!(
        hub.submit(&run, Some(&base), batch(7, vec![(MetricId(0), 7.0)]))
            .await,
        Err(IngestError::SequenceGap { got: 7, last: 5 })
    ));
    for mut b in in_flight {
        let answer = b.answer().await;
        assert_eq!(hub.settle(&run, b, answer).await.unwrap(), Appended::Stored);
    }
    let tail = run.state(|st| st.tail.clone());
    assert_eq!(
        (tail.last_seq, tail.records, tail.last_step),
        (5, 5, Some(5))
    );
    // Settling publishes nothing twice.
    assert!(live.try_recv().is_err());
    // What the store holds is what the tail says, and a resend is recognised.
    assert!(matches!(
        hub.submit(&run, Some(&tail), batch(3, vec![(MetricId(0), 3.0)]))
            .await
            .unwrap(),
        Submitted::Duplicate { refused: 0 }
    ));
}

/// Batches are published when checked, before their commit: a viewer subscribing meanwhile
/// reads its history through the published tail only once the store holds it, so no batch
/// falls between history and live; a batch whose commit failed is taken back, and a
/// subscriber then reads through what is stored.
#[tokio::test]
async fn a_subscriber_meets_published_batches_at_their_commit_and_failed_ones_are_taken_back() {
    let (hub, _jobs, _dir) = hub(HubLimits::default());
    let run = run_with_loss(&hub, 1).await;
    hub.append(&run, batch(1, vec![(MetricId(0), 1.0)]))
        .await
        .unwrap();
    let _lock = run.lock_ingest().await;
    let mut base = run.state(|st| st.tail.clone());
    let mut in_flight = std::collections::VecDeque::new();
    for seq in 2..=4u64 {
        let Submitted::InFlight(b) = hub
            .submit(&run, Some(&base), batch(seq, vec![(MetricId(0), 0.0)]))
            .await
            .unwrap()
        else {
            panic!("batch {seq} is new")
        };
        base = b.tail().clone();
        in_flight.push_back(b);
    }
    // Published through 4, stored through 1 (as far as the hub has settled): a subscriber
    // waits, whatever the store's writer has done meanwhile.
    let subscriber = tokio::spawn({
        let run = run.clone();
        async move { run.subscribe().await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !subscriber.is_finished(),
        "history read before it was stored"
    );
    let mut b2 = in_flight.pop_front().unwrap();
    let answer = b2.answer().await;
    hub.settle(&run, b2, answer).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !subscriber.is_finished(),
        "waits for every batch it was not sent"
    );
    for mut b in in_flight.drain(..) {
        let answer = b.answer().await;
        hub.settle(&run, b, answer).await.unwrap();
    }
    let (mut live, through) = subscriber.await.unwrap();
    assert_eq!(through, 4);
    assert!(live.try_recv().is_err(), "nothing through 4 comes live");

    // Batch 5 is published, then its commit fails: a new subscriber reads through 4 and gets
    // the resend live; the first one got 5 when it was checked.
    let Submitted::InFlight(b5) = hub
        .submit(&run, Some(&base), batch(5, vec![(MetricId(0), 5.0)]))
        .await
        .unwrap()
    else {
        panic!("batch 5 is new")
    };
    assert!(matches!(
        live.try_recv(),
        Ok(LiveEvent::Batch { seq: 5, .. })
    ));
    let late = tokio::spawn({
        let run = run.clone();
        async move { run.subscribe().await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!late.is_finished());
    assert!(hub
        .settle(&run, b5, Err(crate::store::StoreError::WriterGone))
        .await
        .is_err());
    let (_late_live, late_through) = late.await.unwrap();
    assert_eq!(late_through, 4, "what failed to commit is not history");
    assert_eq!(run.state(|st| (st.tail.last_seq, st.published)), (4, 4));
}

/// The judge hands an alert's write to the store and goes on to the next job: twenty runs
/// firing at once, while busy runs keep the writer waiting out a 1 s commit interval, are
/// all announced (after their commit) within a few seconds, not one interval per alert.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_judge_never_waits_for_an_alerts_commit() {
    let dir = tempfile::tempdir().unwrap();
    let location = crate::store::Location::Sqlite {
        path: dir.path().join("hub.db"),
        fsync: false,
    };
    let (store, runs) = Store::open_at(&location, Duration::from_secs(1)).unwrap();
    let policy = StatusPolicy {
        stale_after: Duration::from_secs(30),
        fail_after: None,
    };
    let hub = Hub::new(
        store,
        runs,
        policy,
        &Default::default(),
        HubLimits::default(),
    );
    let open = |name: String| {
        let hub = hub.clone();
        async move {
            let run = hub.open_run(identity(&name, "p"), 1, 1).await.unwrap();
            hub.define_metrics(&run, vec![def(0, "loss")])
                .await
                .unwrap();
            run
        }
    };
    let mut quiet = Vec::new();
    for r in 0..20 {
        quiet.push(open(format!("nan{r}")).await);
    }
    // Eight busy runs: every transaction holds their batches, so each waits the interval.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut busy = tokio::task::JoinSet::new();
    for r in 0..8 {
        let (run, hub, stop) = (open(format!("busy{r}")).await, hub.clone(), stop.clone());
        busy.spawn(async move {
            let mut seq = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                seq += 1;
                hub.append(&run, batch(seq, vec![(MetricId(0), 1.0)]))
                    .await
                    .unwrap();
            }
        });
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let mut firing = tokio::task::JoinSet::new();
    for run in quiet {
        let mut live = run.live.subscribe();
        let hub = hub.clone();
        firing.spawn(async move {
            hub.append(&run, batch(1, vec![(MetricId(0), f64::NAN)]))
                .await
                .unwrap();
            loop {
                if let LiveEvent::Alert(a) = live.recv().await.unwrap() {
                    assert!(a.fired, "{a:?}");
                    return;
                }
            }
        });
    }
    let started = tokio::time::Instant::now();
    let all = tokio::time::timeout(Duration::from_secs(8), firing.join_all()).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(
        all.is_ok(),
        "20 alerts not announced within 8 s of a 1 s commit interval: the judge waits for commits"
    );
    println!("20 alerts announced in {:?}", started.elapsed());
    busy.join_all().await;
}
