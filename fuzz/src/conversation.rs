//! A collector's conversation with a real hub, from arbitrary bytes: hellos (a second writer,
//! a reconnect), metric definitions (clashing, too many, too long), batches (next, repeated,
//! backwards, skipping; wide, duplicate ids, NaN), heartbeats, finishes. After every batch
//! the hub acknowledges, that batch must read back as sent; after the conversation the
//! run's summary must agree with every stored batch.

use arbitrary::{Arbitrary, Unstructured};
use std::cell::RefCell;
use std::sync::Arc;
use stepstream_protocol::{Batch, Limits, MetricDef, MetricId, RunId, RunIdentity, StepRecord};
use stepstream_server::hub::{Appended, Hub, Run};
use stepstream_server::limits::HubLimits;

#[derive(Arbitrary, Debug)]
enum Op {
    Hello { writer: u8 },
    Define(Vec<(u8, Name)>),
    Batch { seq: Seq, records: Vec<Rec> },
    Heartbeat,
    Finish(u8),
}

#[derive(Arbitrary, Debug)]
enum Name {
    Pool(u8),
    Raw(String),
}

#[derive(Arbitrary, Debug)]
enum Seq {
    Next,
    Again,
    Back(u8),
    Skip(u8),
    Any(u64),
}

#[derive(Arbitrary, Debug)]
struct Rec {
    step: i64,
    wall_time: f64,
    values: Vec<(u8, f64)>,
}

const POOL: [&str; 6] = [
    "loss",
    "lr",
    "grad_norm",
    "gpu0/mem_used_gb",
    "gpu0/mem_total_gb",
    "step_time",
];

/// Inputs one hub serves before it is replaced (its database grows).
const HUB_LIFETIME: u64 = 2000;

struct Harness {
    rt: tokio::runtime::Runtime,
    hub: Option<(Arc<Hub>, tempfile::TempDir)>,
    served: u64,
}

thread_local! {
    static HARNESS: RefCell<Option<Harness>> = const { RefCell::new(None) };
}

fn new_hub() -> (Arc<Hub>, tempfile::TempDir) {
    // On a memory filesystem where there is one: commits then cost no disk.
    let shm = std::path::Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        tempfile::tempdir_in(shm)
    } else {
        tempfile::tempdir()
    }
    .expect("a temp dir");
    let (store, runs) =
        stepstream_server::store::Store::open(&dir.path().join("fuzz.db"), false).expect("open");
    let limits = HubLimits {
        wire: Limits {
            record_values: 8,
            run_metrics: 12,
            name_bytes: 16,
            config_bytes: 256,
            batch_records: 32,
            batch_items: Limits::default().batch_items,
            item_bytes: Limits::default().item_bytes,
        },
        runs: 1000,
        runs_per_project: 1000,
        ..HubLimits::default()
    };
    let policy = stepstream_server::StatusPolicy {
        stale_after: std::time::Duration::from_secs(60),
        fail_after: None,
    };
    let hub = Hub::new(store, runs, policy, &Default::default(), limits);
    (hub, dir)
}

/// The target.
pub fn conversation(data: &[u8]) {
    HARNESS.with(|h| {
        let mut slot = h.borrow_mut();
        let harness = slot.get_or_insert_with(|| Harness {
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime"),
            hub: None,
            served: 0,
        });
        harness.served += 1;
        if harness.served % HUB_LIFETIME == 1 {
            harness.hub = None;
            harness.hub = Some(harness.rt.block_on(async { new_hub() }));
        }
        let (hub, _) = harness.hub.as_ref().expect("made above");
        let run_id = format!("f{}", harness.served % 500);
        harness.rt.block_on(converse(hub, &run_id, data));
    });
}

fn identity(run_id: &str) -> RunIdentity {
    RunIdentity {
        run_id: RunId::new(run_id).expect("valid"),
        project: "fuzz".into(),
        name: "conversation".into(),
        config_json: "{}".into(),
        host: "h".into(),
        rank: 0,
        world_size: 1,
        job: String::new(),
        framework: String::new(),
        started_at: 1.0,
    }
}

async fn converse(hub: &Arc<Hub>, run_id: &str, data: &[u8]) {
    let mut u = Unstructured::new(data);
    let mut run: Option<Arc<Run>> = None;
    let mut connection = 0u64;
    // `arbitrary` keeps producing (default) values from exhausted input: stop at its end.
    while !u.is_empty() {
        let Ok(op) = Op::arbitrary(&mut u) else { break };
        connection += 1;
        match op {
            Op::Hello { writer } => {
                if let Some(old) = run.take() {
                    hub.release_writer(&old, connection - 1);
                }
                run = hub
                    .open_run(identity(run_id), u64::from(writer % 3), connection)
                    .await
                    .ok();
            }
            Op::Define(defs) => {
                let Some(r) = &run else { continue };
                let defs = defs
                    .into_iter()
                    .map(|(id, name)| MetricDef {
                        id: MetricId(u32::from(id % 16)),
                        name: match name {
                            Name::Pool(i) => POOL[i as usize % POOL.len()].to_string(),
                            Name::Raw(s) => s,
                        },
                    })
                    .collect();
                let _ = hub.define_metrics(r, defs).await;
            }
            Op::Batch { seq, records } => {
                let Some(r) = &run else { continue };
                let last = r.state(|st| st.tail.last_seq);
                let seq = match seq {
                    Seq::Next => last + 1,
                    Seq::Again => last,
                    Seq::Back(n) => last.saturating_sub(u64::from(n)),
                    Seq::Skip(n) => last + 2 + u64::from(n),
                    Seq::Any(n) => n,
                };
                let records: Vec<StepRecord> = records
                    .into_iter()
                    .map(|rec| StepRecord {
                        step: rec.step,
                        wall_time: rec.wall_time,
                        values: rec
                            .values
                            .into_iter()
                            .map(|(id, v)| (MetricId(u32::from(id % 16)), v))
                            .collect(),
                    })
                    .collect();
                let batch = Batch {
                    seq,
                    records: records.clone(),
                    items: Vec::new(),
                };
                if let Ok(Appended::Stored) = hub.append(r, batch).await {
                    // Acknowledged: it must read back exactly.
                    let stored = hub.store.batch(r.key, seq).await.expect("readable");
                    let stored = stored.expect("an acknowledged batch is stored");
                    assert_eq!(stored.len(), records.len());
                    for (a, b) in stored.iter().zip(&records) {
                        assert_eq!(a.step, b.step);
                        assert_eq!(a.wall_time.to_bits(), b.wall_time.to_bits());
                        assert_eq!(a.values.len(), b.values.len());
                    }
                }
            }
            Op::Heartbeat => {
                if let Some(r) = &run {
                    hub.heartbeat(r);
                }
            }
            Op::Finish(code) => {
                if let Some(r) = run.take() {
                    let status = [
                        stepstream_protocol::RunStatus::Finished,
                        stepstream_protocol::RunStatus::Failed,
                        stepstream_protocol::RunStatus::Killed,
                    ][code as usize % 3];
                    let _ = hub
                        .finish(&r, status, Some("x".repeat(code as usize)))
                        .await;
                    hub.release_writer(&r, connection);
                }
            }
        }
    }
    if let Some(r) = run {
        hub.release_writer(&r, connection);
        check_summary(hub, &r).await;
    }
}

/// Every stored batch of the run reads, and the run's summary counts exactly them.
async fn check_summary(hub: &Hub, run: &Run) {
    let (last_seq, records) = run.state(|st| (st.tail.last_seq, st.tail.records));
    let (batches, counted) = hub
        .store
        .scan(run.key, 0, last_seq, (0u64, 0u64), |(b, n), _, recs| {
            *b += 1;
            *n += recs.len() as u64;
            std::ops::ControlFlow::Continue(())
        })
        .await
        .expect("every stored batch reads");
    assert_eq!(batches, last_seq, "a sequence gap in what was acknowledged");
    assert_eq!(counted, records, "the run summary disagrees with the store");
}
