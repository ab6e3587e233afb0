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

    // Stop the tail as a user would; it finishes the run, and since one row that looked like
    // a record was not stored, it says so and exits non-zero rather than claim success.
    Command::new("kill")
        .args(["-INT", &tail.id().to_string()])
        .status()
        .unwrap();
    let out = tail.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a bad row is no success: {stderr}");
    assert!(
        stderr.contains("line 13 skipped") && stderr.contains("1 lines that look like records"),
        "the bad row is reported: {stderr}"
    );
    assert!(
        stderr.contains("loss: 20 of 20 values stored"),
        "what was read is reported stored: {stderr}"
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

    // A second tail of the same file resumes the same run and sends nothing twice; one that
    // names another project is refused (a resume never moves a run) and says so.
    append(&csv, &row(21));
    let moved = Command::new(BIN)
        .args(["tail", "--no-follow", "--hub", &hub.ws()])
        .arg(&csv)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&moved.stderr);
    assert!(
        !moved.status.success() && said.contains("belongs to project \"legacy\""),
        "{said}"
    );
    // (The file still holds the bad row: this tail says so too, and exits non-zero.)
    let again = Command::new(BIN)
        .args([
            "tail",
            "--no-follow",
            "--project",
            "legacy",
            "--hub",
            &hub.ws(),
        ])
        .arg(&csv)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&again.stderr);
    assert!(
        !again.status.success()
            && said.contains("1 lines that look like records")
            && said.contains("loss: 1 of 1 values stored"),
        "{said}"
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

#[test]
fn tail_reads_a_mindformers_training_log_without_touching_the_script() {
    let hub = Hub::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("mindformers.log");
    // Lines as MindFormers' loss monitor prints them (older shape, two epochs of 3 steps,
    // with its progress lines), amid the rest of a training log, then the newer shape.
    let mut text = String::from(
        "2025-03-02 10:23:40,000 - mindformers[mindformers/trainer/base_trainer.py:100] - INFO - .........Build Network..........\n",
    );
    for epoch in 1..=2 {
        for step in 1..=3 {
            let g = (epoch - 1) * 3 + step;
            text.push_str(&format!(
                "2025-03-02 10:23:4{g},123 - mindformers[mindformers/core/callback/callback.py:360] - INFO - {{ Epoch:[{epoch:3}/  2], step:[{step:5}/    3], loss: {:.3}, per_step_time: {}ms, lr: {:e}, overflow cond: False, loss_scale: 1.0, global_norm: [{}], train_throughput_per_npu: 1.5T\n",
                10.0 / g as f64,
                100 + g,
                1e-4 * g as f64,
                0.5 + g as f64
            ));
            if g == 2 {
                // Another line between a monitor line and its progress line (a warning of
                // MindSpore's): once it dropped the step being gathered.
                text.push_str("[WARNING] ME(1234:5678,MainProcess):2025-03-02-10:23:42.200.000 [mindspore/train/callback/_callback.py:1] a warning\n");
            }
            text.push_str(&format!(
                "2025-03-02 10:23:4{g},124 - mindformers[mindformers/core/callback/callback.py:371] - INFO -   {:.1}% |████      | {}.5 samples/s/p  0:00:0{g} }}\n",
                g as f64 * 100.0 / 6.0,
                g
            ));
        }
    }
    text.push_str("2026-06-01 08:00:00,001 - mindformers[mindformers/core/callback/callback.py:512] - INFO - { epoch: 3, step: 7, loss: 0.125, per_step_time: 90ms, lr: 7e-4, global_norm: 0.25 }\n");
    // What a real log ends with: its last step was lost to this line once.
    text.push_str("2026-06-01 08:00:00,010 - mindformers[mindformers/trainer/base_trainer.py:1689] - INFO - .........Training Over!.............\n");
    std::fs::write(&log, text).unwrap();
    succeed(
        Command::new(BIN)
            .args([
                "tail",
                log.to_str().unwrap(),
                "--format",
                "mindformers",
                "--no-follow",
            ])
            .args(["--hub", &hub.ws(), "--run-id", "mf-log"]),
    );
    let series = |m: &str| hub.json(&format!("/api/runs/mf-log/series?metric={m}"));
    let loss = series("loss");
    let steps = series_steps(&loss);
    assert_eq!(steps, [1, 2, 3, 4, 5, 6, 7], "global steps across epochs");
    assert_eq!(loss["values"][4], 2.0, "10 / step 5");
    assert_eq!(series("lr")["values"][6], 7e-4);
    assert_eq!(series("step_time")["values"][0], 0.101);
    assert_eq!(series("global_norm")["values"][2], 3.5);
    assert_eq!(series("samples_per_sec_per_device")["values"][3], 4.5);
    assert_eq!(series("overflow")["values"][0], 0.0);
    let run = hub.json("/api/runs/mf-log");
    assert_eq!(run["framework"], "mindformers (log tail)");
    assert_eq!(
        run["records"], 7,
        "monitor and progress lines of a step are one record"
    );
}

/// A line without an end (or a file that is no log) once grew the tail's memory without
/// bound: a line past 1 MiB is skipped and reported, and the rows after it are read.
#[test]
fn a_line_longer_than_a_mebibyte_is_skipped_and_reported() {
    let hub = Hub::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("m.csv");
    append(&csv, "step,loss\n1,0.5\n");
    append(&csv, &format!("2,{}\n", "9".repeat(3 << 20)));
    append(&csv, "3,0.25\n");
    let out = Command::new(BIN)
        .args([
            "tail",
            "--no-follow",
            "--hub",
            &hub.ws(),
            "--run-id",
            "long",
        ])
        .arg(&csv)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("longer than 1048576 bytes"), "{err}");
    assert!(err.contains("loss: 2 of 2 values stored"), "{err}");
    assert_eq!(hub.run_json("long").unwrap()["records"], 2);
}
