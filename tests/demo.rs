//! `stepstream demo`: real trainings streaming to the hub it starts.

use crate::util::*;

#[test]
fn demo_trains_four_runs_one_diverges_and_a_rule_stops_the_one_whose_loss_drifts_up() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("demo.db");
    let port = free_port();
    let out = std::process::Command::new(BIN)
        // Fast, but slow enough for the rule's 3 s grace period to pass mid-run.
        .args([
            "demo",
            "--steps",
            "2000",
            "--rate",
            "250",
            "--exit-when-done",
        ])
        .args(["--bind", &format!("127.0.0.1:{port}")])
        .arg("--db")
        .arg(&db)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("http://127.0.0.1:{port}/")),
        "prints the URL: {stdout}"
    );

    // The runs it streamed are stored: serve the same database and look.
    let mut hub = Hub::start(&[]);
    hub.db = db.clone();
    hub.restart();
    let runs = hub.json("/api/runs");
    let runs = runs["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4);
    for r in runs {
        let id = r["run_id"].as_str().unwrap();
        let name = r["name"].as_str().unwrap();
        let loss = hub.json(&format!("/api/runs/{id}/series?metric=loss&budget=100000"));
        let values: Vec<f64> = loss["values"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v.as_f64())
            .collect();
        let lr = hub.json(&format!("/api/runs/{id}/series?metric=lr&budget=100000"));
        let lr: Vec<f64> = lr["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert!(lr[1] > lr[0], "{name}: warmup raises the learning rate");
        for metric in ["grad_norm", "samples_per_sec"] {
            assert!(
                hub.json(&format!("/api/runs/{id}/series?metric={metric}"))["total_points"]
                    .as_u64()
                    .unwrap()
                    > 0
            );
        }
        if name.contains("diverges") {
            assert_eq!(r["status"], "failed", "{name}");
            assert!(r["status_message"].as_str().unwrap().contains("diverged"));
            assert!(*values.last().unwrap() > 10.0 * values[0]);
        } else if name.contains("drift") {
            // The divergence rule fired, nobody acknowledged it, and 3 s later it stopped the
            // run (a checkpoint first), saying what the stop saved.
            assert_eq!(r["status"], "stopped", "{name}: {r}");
            let message = r["status_message"].as_str().unwrap();
            assert!(
                message.starts_with("stopped by rule:divergence"),
                "{message}"
            );
            assert!(
                message.contains("saved about") && message.contains("of 2000 steps left"),
                "{message}"
            );
            let commands = hub.json(&format!("/api/runs/{id}/commands"));
            let stop = &commands["commands"][0];
            assert_eq!(
                (stop["by"].as_str(), stop["state"].as_str()),
                (Some("rule:divergence"), Some("honoured")),
                "{commands}"
            );
            assert!(
                stop["message"].as_str().unwrap().contains("saved"),
                "{stop}"
            );
            assert!(r["records"].as_u64().unwrap() < 2000);
        } else {
            assert_eq!(r["status"], "finished", "{name}");
            assert_eq!(r["records"], 2000);
            let head: f64 = values[..20].iter().sum::<f64>() / 20.0;
            let tail: f64 = values[values.len() - 20..].iter().sum::<f64>() / 20.0;
            assert!(tail < head / 3.0, "{name} learns: {head} -> {tail}");
            // Cosine decay ends at 10% of the peak.
            let peak = lr.iter().cloned().fold(0.0, f64::max);
            assert!((lr.last().unwrap() / peak - 0.1).abs() < 0.01);
        }
    }
}
