//! `stepstream backup` while a run streams into the hub, and `restore`: the copy is one
//! consistent moment (each run a prefix of what was sent, exactly), a restore over a
//! database a hub has open is refused, and a backup never overwrites a file.

use crate::util::*;
use std::process::Command;
use std::time::Duration;
use stepstream_protocol::{Batch, DefineMetrics, FromHub, MetricDef, MetricId, StepRecord, ToHub};

fn record(step: i64) -> StepRecord {
    StepRecord {
        step,
        wall_time: 1.765e9 + step as f64 * 0.01,
        values: vec![
            (MetricId(0), f64::from((1.0 / (1.0 + step as f64)) as f32)),
            (MetricId(1), step as f64 * 1e-7),
        ],
    }
}

#[test]
fn a_backup_taken_while_a_run_streams_restores_to_a_consistent_hub() {
    let hub = Hub::start(&[]);
    let mut c = RawCollector::connect(&hub);
    c.send(hello("busy", None));
    assert!(matches!(c.recv(), Some(FromHub::Welcome(_))));
    c.send(ToHub::DefineMetrics(DefineMetrics {
        metrics: ["loss", "lr"]
            .iter()
            .enumerate()
            .map(|(i, n)| MetricDef {
                id: MetricId(i as u32),
                name: n.to_string(),
            })
            .collect(),
    }));
    const BATCHES: u64 = 4_000;
    let writer = std::thread::spawn(move || {
        for seq in 1..=BATCHES {
            let from = (seq as i64 - 1) * 4;
            c.send(ToHub::Batch(Batch {
                seq,
                records: (from..from + 4).map(record).collect(),
                items: Vec::new(),
            }));
            if seq % 50 == 0 {
                // A collector at a few thousand steps a second, not a flood.
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        let mut acked = 0;
        while acked < BATCHES {
            match c.recv() {
                Some(FromHub::Ack(a)) => acked = a.through_seq,
                Some(_) => {}
                None => panic!("the hub closed the socket"),
            }
        }
    });
    let before = wait_for("the run to be under way", Duration::from_secs(30), || {
        let step = hub.run_json("busy")?["last_step"].as_i64()?;
        (step >= 2_000).then_some(step)
    });
    let backups = tempfile::tempdir().unwrap();
    let dest = backups.path().join("copy.db");
    let out = succeed(
        Command::new(BIN)
            .arg("backup")
            .arg(&dest)
            .arg("--db")
            .arg(&hub.db),
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("1 runs"), "{said}");
    // Never over a file, and never over the database a hub has open.
    let again = Command::new(BIN)
        .arg("backup")
        .arg(&dest)
        .arg("--db")
        .arg(&hub.db)
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("never overwrites"));
    let over = Command::new(BIN)
        .arg("restore")
        .arg(&dest)
        .arg("--db")
        .arg(&hub.db)
        .output()
        .unwrap();
    assert!(!over.status.success());
    let why = String::from_utf8_lossy(&over.stderr);
    assert!(why.contains("in use"), "{why}");
    writer.join().unwrap();
    let sent_steps = BATCHES as i64 * 4;
    assert_eq!(hub.run_json("busy").unwrap()["last_step"], sent_steps - 1);
    drop(hub);

    // Restored into a new place, a hub serves a prefix of what was sent, bit for bit.
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("restored.db");
    succeed(
        Command::new(BIN)
            .arg("restore")
            .arg(&dest)
            .arg("--db")
            .arg(&db),
    );
    let hub = Hub::start_with(free_port(), db, dir, &[]);
    let series = hub.json(&format!(
        "/api/runs/busy/series?metric=loss&from=0&to={sent_steps}&budget=1000000"
    ));
    let steps = series_steps(&series);
    let n = steps.len() as i64;
    assert!(
        n > before && n < sent_steps,
        "{n} steps restored, {before} stored before the backup"
    );
    assert_eq!(steps, (0..n).collect::<Vec<_>>());
    let values: Vec<f64> = serde_json::from_value(series["values"].clone()).unwrap();
    for (s, v) in steps.iter().zip(values) {
        assert_eq!(v.to_bits(), record(*s).values[0].1.to_bits(), "step {s}");
    }
    assert_eq!(hub.run_json("busy").unwrap()["last_step"], n - 1);
}
