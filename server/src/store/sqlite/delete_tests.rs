//! Deleting a run against a real SQLite database: refused while it runs, then no row of it
//! left in any table that names runs, and the other runs untouched.

use super::summary_tests::records;
use crate::store::tests::sqlite_store;
use crate::store::*;
use std::sync::Arc;
use std::time::Duration;
use stepstream_protocol::{MetricId, StepRecord};

/// A deleted run leaves no row behind in any table that names runs (every table with a
/// `run_key` column, found from the schema: a table added later is covered too), and the
/// other run keeps all of its rows.
#[tokio::test]
async fn deleting_a_run_leaves_no_row_of_it_in_any_table() {
    let (store, dir) = sqlite_store(Duration::ZERO);
    let mut keys = Vec::new();
    for id in ["doomed", "kept"] {
        let key = store
            .upsert_run(test_identity(id, "p"), 1, 1.0)
            .await
            .unwrap();
        store
            .define_metrics(
                key,
                vec![stepstream_protocol::MetricDef {
                    id: MetricId(0),
                    name: "loss".into(),
                }],
            )
            .await
            .unwrap();
        let mut tail = RunTail::default();
        for (i, batch) in records(0, 1, 20_000, 3).chunks(100).enumerate() {
            let seq = i as u64 + 1;
            let batch: Arc<[StepRecord]> = batch.to_vec().into();
            tail = tail.after(seq, &batch);
            let items: Arc<[stepstream_protocol::Item]> = Arc::new([stepstream_protocol::Item {
                step: batch[0].step,
                wall_time: 1.0,
                key: "console".into(),
                body: stepstream_protocol::ItemBody::Text("a sample".into()),
            }]);
            let stored = StoredBatch {
                records: batch,
                items,
                console_cap: u64::MAX,
            };
            assert!(store
                .submit_batch(key, seq, stored, tail.clone())
                .await
                .unwrap()
                .await
                .unwrap()
                .unwrap());
        }
        store
            .add_alert(
                key,
                stepstream_protocol::Alert {
                    run_id: stepstream_protocol::RunId::new(id).unwrap(),
                    rule: "nan".into(),
                    fired: true,
                    step: 1,
                    value: f64::NAN,
                    message: "m".into(),
                    at: 1.0,
                },
            )
            .await
            .unwrap()
            .committed()
            .await
            .unwrap();
        keys.push(key);
    }
    // Running: refused, with why.
    let refused = store.delete_run(keys[0]).await.unwrap_err().to_string();
    assert!(refused.contains("only a run that ended"), "{refused}");
    store
        .set_status(keys[0], stepstream_protocol::RunStatus::Finished, None, 2.0)
        .await
        .unwrap()
        .committed()
        .await
        .unwrap();
    let conn = rusqlite::Connection::open(dir.path().join("hub.db")).unwrap();
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table'")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .filter(|t: &String| {
            conn.prepare(&format!("PRAGMA table_info({t})"))
                .unwrap()
                .query_map([], |r| r.get::<_, String>(1))
                .unwrap()
                .any(|c| c.unwrap() == "run_key")
        })
        .collect();
    let rows = |key: RunKey| -> Vec<(String, i64)> {
        tables
            .iter()
            .map(|t| {
                let n = conn
                    .query_row(
                        &format!("SELECT count(*) FROM {t} WHERE run_key = ?1"),
                        [key],
                        |r| r.get(0),
                    )
                    .unwrap();
                (t.clone(), n)
            })
            .collect()
    };
    let before = rows(keys[1]);
    for table in ["batches", "summaries", "items", "alerts", "metrics"] {
        let n = rows(keys[0]).iter().find(|(t, _)| t == table).unwrap().1;
        assert!(n > 0, "{table} holds nothing of the run to delete");
    }
    assert!(store.delete_run(keys[0]).await.unwrap());
    assert!(
        rows(keys[0]).iter().all(|(_, n)| *n == 0),
        "{:?}",
        rows(keys[0])
    );
    let runs: i64 = conn
        .query_row("SELECT count(*) FROM runs WHERE key = ?1", [keys[0]], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(runs, 0);
    assert_eq!(rows(keys[1]), before);
    // Gone: a second delete finds nothing.
    assert!(!store.delete_run(keys[0]).await.unwrap());
}
