//! `stepstream tail` following a CSV that a training job is still writing.

use crate::util::*;
use std::process::{Command, Stdio};
use std::time::Duration;

fn row(step: i64) -> String {
    let loss = if step == 7 {
        "nan".to_string()
    } else {
        format!("{}", 3.0 / (step + 1) as f64)
    };
    let sps = if step == 8 {
        "inf".to_string()
    } else {
        "250.5".to_string()
    };
    format!(
        "{step},{}.25,{loss},0.001,{},{sps}\n",
        1_764_700_000 + step,
        step as f64 * 0.1
    )
}

#[test]
fn tail_follows_a_growing_csv_with_a_torn_last_line() {
    let hub = Hub::start(&[]);
    let csv = hub.dir.path().join("train_metrics.csv");
    append(&csv, "step,timestamp,loss,lr,grad_norm,samples_per_sec\n");
    for step in 1..=10 {
        append(&csv, &row(step));
    }
    let tail = Command::new(BIN)
        .args([
            "tail",
            "--hub",
            &hub.ws(),
            "--project",
            "legacy",
            "--poll-ms",
            "50",
        ])
        .arg(&csv)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let run_id = wait_for("the tailed run", Duration::from_secs(30), || {
        let runs = hub.json("/api/runs");
        let r = runs["runs"].as_array()?.first()?.clone();
        (r["last_step"] == 10).then(|| r["run_id"].as_str().unwrap().to_string())
    });

    // Half a line: the writer has not finished it. It must not be read as step 1.
    append(&csv, "11,1764700011.25,0.2");
    std::thread::sleep(Duration::from_millis(600));
    let run = hub.run_json(&run_id).unwrap();
    assert_eq!(run["last_step"], 10, "a torn line was read");
    assert_eq!(run["records"], 10);
    append(&csv, "5,0.001,1.1,250.5\n");
    append(&csv, "not,a,valid,row,at,all\n");
    for step in 12..=20 {
        append(&csv, &row(step));
    }
    wait_for("the rest of the file", Duration::from_secs(30), || {
        (hub.run_json(&run_id).unwrap()["last_step"] == 20).then_some(())
    });

    // Stop the tail as a user would; it finishes the run.
    Command::new("kill")
        .args(["-INT", &tail.id().to_string()])
        .status()
        .unwrap();
    let out = tail.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("skipped"),
        "the bad row is reported: {stderr}"
    );

    let run = hub.run_json(&run_id).unwrap();
    assert_eq!(run["records"], 20, "20 good rows, the bad one skipped");
    assert_eq!(run["project"], "legacy");
    assert_eq!(run["status"], "finished");
    let (header, rows) = parse_csv(&hub.get(&format!("/api/runs/{run_id}/metrics.csv")).text());
    assert_eq!(
        header,
        [
            "step",
            "timestamp",
            "loss",
            "lr",
            "grad_norm",
            "samples_per_sec"
        ]
    );
    assert_eq!(rows.len(), 20);
    let r11 = &rows[10];
    assert_eq!(r11[0], "11");
    assert_eq!(
        r11[1], "1764700011.250000",
        "the file's own timestamps are kept"
    );
    assert_eq!(r11[2], "0.25", "the torn line, once complete");
    assert_eq!(r11[4], "1.1");
    assert_eq!(rows[6][2], "nan", "nan is a value");
    assert_eq!(rows[7][5], "inf", "inf is a value");

    // A second tail of the same file resumes the same run and sends nothing twice.
    append(&csv, &row(21));
    let out = Command::new(BIN)
        .args(["tail", "--no-follow", "--hub", &hub.ws()])
        .arg(&csv)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = hub.run_json(&run_id).unwrap();
    assert_eq!(run["records"], 21);
    assert_eq!(run["last_step"], 21);
}

/// Evaluation rows share a step with a training row; a file is rotated, then truncated.
/// Once every row whose step was not above the last one was dropped.
#[test]
fn tail_merges_rows_of_one_step_and_follows_rotation_and_truncation() {
    let hub = Hub::start(&[]);
    let csv = hub.dir.path().join("metrics.csv");
    append(
        &csv,
        "step,loss,eval_loss\n1,2.0,\n2,1.5,\n2,,1.8\n3,1.2,\n",
    );
    let mut tail = Command::new(BIN)
        .args(["tail", "--hub", &hub.ws(), "--poll-ms", "50"])
        .arg(&csv)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let run_id = wait_for("the tailed run", Duration::from_secs(30), || {
        let runs = hub.json("/api/runs");
        let r = runs["runs"].as_array()?.first()?.clone();
        (r["last_step"] == 3).then(|| r["run_id"].as_str().unwrap().to_string())
    });
    let series = |metric: &str| {
        let s = hub.json(&format!("/api/runs/{run_id}/series?metric={metric}"));
        serde_json::from_value::<Vec<i64>>(s["steps"].clone()).unwrap()
    };
    assert_eq!(
        series("eval_loss"),
        vec![2],
        "the evaluation row at a seen step"
    );
    assert_eq!(series("loss"), vec![1, 2, 3]);
    assert_eq!(
        hub.run_json(&run_id).unwrap()["records"],
        3,
        "rows of step 2 merged"
    );

    // Rotated: the old file moves away, a new one (a new training) starts at step 1.
    std::fs::rename(&csv, csv.with_extension("csv.1")).unwrap();
    append(&csv, "step,loss,eval_loss\n1,9.0,\n2,8.0,\n");
    wait_for("the rotated file's rows", Duration::from_secs(10), || {
        (series("loss").len() == 5).then_some(())
    });
    // Truncated in place and written again.
    std::fs::write(&csv, "").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    append(&csv, "step,loss,eval_loss\n1,7.0,\n");
    wait_for("the truncated file's row", Duration::from_secs(10), || {
        (series("loss").len() == 6).then_some(())
    });
    tail.kill().unwrap();
    let _ = tail.wait();
}
