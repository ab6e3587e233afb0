//! The hub end to end: fan-out exactly once, durability across SIGKILL, downsampling,
//! run status, tokens and bad input.

use crate::util::*;
use std::time::Duration;
use stepstream_collector::{Collector, Options, Outcome};
use stepstream_protocol::*;

const STEPS: i64 = 10_000;

fn loss(step: i64, salt: f64) -> f64 {
    salt + 1.0 / (1.0 + step as f64 * 0.01)
}

/// Logs `STEPS` steps, pausing now and then so the run streams for a while.
fn stream_run(hub: String, name: &'static str, salt: f64) -> (RunId, stepstream_collector::Report) {
    let run = Collector::start(Options::new(&hub, "tests", name)).unwrap();
    let id = run.run_id().clone();
    let thread = std::thread::spawn(move || {
        for step in 0..STEPS {
            run.log(
                step,
                &[
                    ("loss", loss(step, salt)),
                    ("lr", 1e-3),
                    ("grad_norm", salt),
                ],
            );
            if step % 50 == 0 {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        run.finish(Outcome::Finished)
    });
    (id, thread.join().unwrap())
}

#[test]
fn late_viewer_gets_every_point_of_two_runs_exactly_once() {
    let hub = Hub::start(&[]);
    let a = std::thread::spawn({
        let ws = hub.ws();
        move || stream_run(ws, "a", 0.0)
    });
    let b = std::thread::spawn({
        let ws = hub.ws();
        move || stream_run(ws, "b", 10.0)
    });
    // Subscribe mid-way: once both runs are a few thousand steps in, and still running.
    let ids: Vec<RunId> = wait_for("both runs mid-way", Duration::from_secs(60), || {
        let runs = hub.json("/api/runs");
        let runs = runs["runs"].as_array()?;
        let mid: Vec<RunId> = runs
            .iter()
            .filter(|r| r["last_step"].as_i64().unwrap_or(0) >= 2_000)
            .map(|r| RunId::new(r["run_id"].as_str().unwrap()).unwrap())
            .collect();
        (mid.len() == 2).then_some(mid)
    });
    let mut viewer = Viewer::connect(&hub);
    viewer.subscribe(&ids, None);
    let complete = viewer.pump(Duration::from_secs(120), |v| {
        ids.iter().all(|id| {
            v.runs.get(id).is_some_and(|s| {
                s.backfill_done
                    && s.count("loss") == STEPS as usize
                    && s.count("lr") == STEPS as usize
            })
        })
    });
    let (a_id, a_report) = a.join().unwrap();
    let (b_id, b_report) = b.join().unwrap();
    assert!(
        a_report.delivered && b_report.delivered,
        "{a_report:?} {b_report:?}"
    );
    assert!(complete, "viewer did not get every point");
    for (id, salt) in [(&a_id, 0.0), (&b_id, 10.0)] {
        let seen = &viewer.runs[id];
        assert!(
            seen.live_batches > 0,
            "the viewer saw no live batch: it subscribed too late"
        );
        for metric in ["loss", "lr", "grad_norm"] {
            assert_eq!(seen.count(metric), STEPS as usize, "{metric}");
            assert!(seen.duplicates(metric).is_empty(), "{metric} duplicated");
        }
        for (&step, &(_, v)) in &seen.points["loss"] {
            assert_eq!(v, loss(step, salt), "run {id} step {step}");
        }
    }
}

#[test]
fn sigkill_mid_stream_loses_nothing_and_doubles_nothing() {
    let mut hub = Hub::start(&[]);
    let a = std::thread::spawn({
        let ws = hub.ws();
        move || stream_run(ws, "a", 0.0)
    });
    let b = std::thread::spawn({
        let ws = hub.ws();
        move || stream_run(ws, "b", 5.0)
    });
    wait_for("the runs to be a third in", Duration::from_secs(60), || {
        let runs = hub.json("/api/runs");
        let n = runs["runs"]
            .as_array()?
            .iter()
            .filter(|r| r["last_step"].as_i64().unwrap_or(0) >= STEPS / 3)
            .count();
        (n == 2).then_some(())
    });
    hub.kill9();
    std::thread::sleep(Duration::from_millis(700));
    hub.restart();
    let (a_id, a_report) = a.join().unwrap();
    let (b_id, b_report) = b.join().unwrap();
    assert!(
        a_report.delivered && b_report.delivered,
        "{a_report:?} {b_report:?}"
    );
    assert_eq!(a_report.acked, STEPS as u64);

    for (id, salt) in [(a_id, 0.0), (b_id, 5.0)] {
        let run = hub.run_json(id.as_str()).unwrap();
        assert_eq!(run["status"], "finished");
        assert_eq!(run["records"], STEPS);
        let csv = hub.get(&format!("/api/runs/{id}/metrics.csv"));
        assert_eq!(csv.status, 200);
        let name = &csv.headers["content-disposition"];
        assert!(
            name.contains("run_") && name.contains("_metrics.csv"),
            "{name}"
        );
        let (header, rows) = parse_csv(&csv.text());
        assert_eq!(header, ["step", "timestamp", "loss", "lr", "grad_norm"]);
        let steps: Vec<i64> = rows.iter().map(|r| r[0].parse().unwrap()).collect();
        assert_eq!(
            steps,
            (0..STEPS).collect::<Vec<_>>(),
            "every step once, in order"
        );
        for r in &rows {
            let step: i64 = r[0].parse().unwrap();
            assert_eq!(r[2].parse::<f64>().unwrap(), loss(step, salt));
        }
    }
    // The restarted hub serves the runs as before.
    hub.restart();
    assert_eq!(hub.json("/api/runs")["runs"].as_array().unwrap().len(), 2);
}

#[test]
fn downsampled_series_keeps_the_spike() {
    let hub = Hub::start(&[]);
    let run = Collector::start(Options::new(&hub.ws(), "tests", "spike")).unwrap();
    let id = run.run_id().clone();
    let spike_at = 73_456;
    for step in 0..100_000i64 {
        let noise = ((step * 7919) % 1000) as f64 * 1e-4;
        let loss = if step == spike_at {
            40.0
        } else {
            2.0 - step as f64 * 1e-5 + noise
        };
        run.log(step, &[("loss", loss)]);
    }
    assert!(run.finish(Outcome::Finished).delivered);

    let s = hub.json(&format!("/api/runs/{id}/series?metric=loss&budget=500"));
    assert_eq!(s["total_points"], 100_000);
    assert_eq!(s["downsampled"], true);
    let steps = series_steps(&s);
    let values: Vec<f64> = s["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert!(steps.len() <= 500, "{} points", steps.len());
    let i = steps
        .iter()
        .position(|&x| x == spike_at)
        .expect("spike step kept");
    assert_eq!(values[i], 40.0);
    assert_eq!((steps[0], *steps.last().unwrap()), (0, 99_999));
    // Deterministic: asking again gives the same answer.
    assert_eq!(
        s,
        hub.json(&format!("/api/runs/{id}/series?metric=loss&budget=500"))
    );
    // A step range zooms in.
    let z = hub.json(&format!(
        "/api/runs/{id}/series?metric=loss&from=73000&to=74000&budget=5000"
    ));
    assert_eq!(z["total_points"], 1001);
    assert_eq!(z["downsampled"], false);

    // The viewer's budgeted backfill shows it too.
    let mut viewer = Viewer::connect(&hub);
    viewer.subscribe(std::slice::from_ref(&id), Some(400));
    assert!(viewer.pump(Duration::from_secs(30), |v| v
        .runs
        .get(&id)
        .is_some_and(|s| s.backfill_done)));
    let seen = &viewer.runs[&id];
    assert!(seen.count("loss") <= 400);
    assert_eq!(seen.points["loss"][&spike_at].1, 40.0);
}

/// A thinned history of many metrics is read in groups whose budgets add up to at most
/// 100,000 points (it once held every metric's at once): 60 metrics at a budget of 2,000
/// are two groups, and the viewer gets every metric, thinned, its spike kept, and `done`
/// only after the last.
#[test]
fn a_thinned_history_of_many_metrics_arrives_whole_and_done_last() {
    let hub = Hub::start(&[]);
    let run = Collector::start(Options::new(&hub.ws(), "tests", "wide")).unwrap();
    let id = run.run_id().clone();
    let names: Vec<String> = (0..60).map(|i| format!("m{i:02}")).collect();
    for step in 0..10_000i64 {
        let values: Vec<(&str, f64)> = names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                (
                    n.as_str(),
                    if step == 7_777 {
                        1e6
                    } else {
                        (step + i as i64) as f64
                    },
                )
            })
            .collect();
        run.log(step, &values);
    }
    assert!(
        run.finish_shared(Outcome::Finished, Duration::from_secs(60))
            .delivered
    );
    let mut viewer = Viewer::connect(&hub);
    viewer.subscribe(std::slice::from_ref(&id), Some(2000));
    let mut metrics_when_done = None;
    assert!(viewer.pump(Duration::from_secs(60), |v| {
        let seen = v.runs.get(&id);
        if seen.is_some_and(|s| s.backfill_done) && metrics_when_done.is_none() {
            metrics_when_done = seen.map(|s| s.points.len());
        }
        metrics_when_done.is_some()
    }));
    assert_eq!(metrics_when_done, Some(60), "done came before every metric");
    let seen = &viewer.runs[&id];
    for name in &names {
        let n = seen.count(name);
        assert!((1000..=2000).contains(&n), "{name}: {n} points");
        assert_eq!(seen.points[name][&7_777].1, 1e6, "{name} lost its spike");
        assert!(seen.duplicates(name).is_empty());
    }
}

#[test]
fn a_slow_viewer_is_resynchronised_and_still_gets_everything_once() {
    let hub = Hub::start(&[]);
    let mut c = RawCollector::connect(&hub);
    c.send(hello("flood", None));
    assert!(matches!(c.recv(), Some(FromHub::Welcome(_))));
    let names: Vec<MetricDef> = (0..10)
        .map(|i| MetricDef {
            id: MetricId(i),
            name: format!("m{i}"),
        })
        .collect();
    c.send(ToHub::DefineMetrics(DefineMetrics { metrics: names }));
    let id = RunId::new("flood").unwrap();

    let mut viewer = Viewer::connect(&hub);
    viewer.subscribe(std::slice::from_ref(&id), None);
    assert!(viewer.pump(Duration::from_secs(10), |v| v
        .runs
        .get(&id)
        .is_some_and(|s| s.backfill_done)));

    // The viewer stops reading while ~40 MB of live batches pass.
    let batches = 2_000u64;
    let per_batch = 100i64;
    for seq in 1..=batches {
        let records = (0..per_batch)
            .map(|i| {
                let step = (seq as i64 - 1) * per_batch + i;
                StepRecord {
                    step,
                    wall_time: unix_now(),
                    values: (0..10)
                        .map(|m| (MetricId(m), step as f64 + m as f64))
                        .collect(),
                }
            })
            .collect();
        c.send(ToHub::Batch(Batch {
            seq,
            records,
            items: Vec::new(),
        }));
    }
    let mut acked = 0;
    while acked < batches {
        match c.recv() {
            Some(FromHub::Ack(a)) => acked = a.through_seq,
            other => panic!("unexpected {other:?}"),
        }
    }
    let total = (batches as i64 * per_batch) as usize;
    assert!(
        viewer.pump(Duration::from_secs(60), |v| v.runs[&id].count("m9")
            == total)
    );
    let seen = &viewer.runs[&id];
    assert!(
        seen.resyncs > 0,
        "the viewer never lagged; make the flood larger"
    );
    for m in 0..10 {
        let name = format!("m{m}");
        assert_eq!(seen.count(&name), total);
        assert!(seen.duplicates(&name).is_empty());
    }
}

#[test]
fn run_status_goes_stale_and_comes_back() {
    let hub = Hub::start(&["--stale-after", "1", "--fail-after", "3"]);
    let mut c = RawCollector::connect(&hub);
    c.send(hello("quiet", None));
    assert!(matches!(c.recv(), Some(FromHub::Welcome(_))));
    let status = |hub: &Hub| {
        hub.run_json("quiet").unwrap()["status"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(status(&hub), "running");
    wait_for("stale", Duration::from_secs(10), || {
        (status(&hub) == "stale").then_some(())
    });
    let detail = hub.run_json("quiet").unwrap();
    assert_eq!(detail["training"], false);
    assert!(detail["status_message"]
        .as_str()
        .unwrap()
        .contains("no data"));
    c.send(ToHub::Heartbeat(Heartbeat {
        wall_time: unix_now(),
    }));
    wait_for("running again", Duration::from_secs(10), || {
        (status(&hub) == "running").then_some(())
    });
    // Silence long enough is judged a dead process.
    wait_for("failed", Duration::from_secs(15), || {
        (status(&hub) == "failed").then_some(())
    });
    // Its collector comes back: running again, not failed forever.
    let mut again = RawCollector::connect(&hub);
    again.send(hello("quiet", None));
    assert!(matches!(again.recv(), Some(FromHub::Welcome(_))));
    assert_eq!(status(&hub), "running");
    // The stale alert fired while it was quiet and resolved when it came back.
    wait_for("the stale alert resolved", Duration::from_secs(10), || {
        let alerts = hub.json("/api/runs/quiet/alerts");
        let list: Vec<(String, String)> = alerts["alerts"]
            .as_array()?
            .iter()
            .map(|a| {
                (
                    a["rule"].as_str().unwrap().to_string(),
                    a["state"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        (list.first() == Some(&("stale".into(), "fired".into()))
            && list.contains(&("stale".into(), "resolved".into())))
        .then_some(())
    });
}

#[test]
fn bad_frames_get_clear_errors_and_lose_nothing_accepted() {
    let hub = Hub::start(&[]);
    let mut c = RawCollector::connect(&hub);
    c.send(hello("bad", None));
    let Some(FromHub::Welcome(w)) = c.recv() else {
        panic!()
    };
    assert_eq!(w.last_seq, 0);
    c.send(ToHub::DefineMetrics(DefineMetrics {
        metrics: vec![MetricDef {
            id: MetricId(0),
            name: "loss".into(),
        }],
    }));
    let now = unix_now();
    let rec = |step| StepRecord {
        step,
        wall_time: now,
        values: vec![(MetricId(0), f64::NAN)],
    };
    c.send(ToHub::Batch(Batch {
        seq: 1,
        records: vec![rec(1)],
        items: Vec::new(),
    }));
    assert_eq!(
        c.recv(),
        Some(FromHub::Ack(Ack {
            through_seq: 1,
            items_refused: 0
        }))
    );
    // A resend of an acknowledged batch is acknowledged and ignored.
    c.send(ToHub::Batch(Batch {
        seq: 1,
        records: vec![rec(1)],
        items: Vec::new(),
    }));
    assert_eq!(
        c.recv(),
        Some(FromHub::Ack(Ack {
            through_seq: 1,
            items_refused: 0
        }))
    );
    // Garbage: a clear fatal error.
    c.send_bytes(b"definitely not a frame".to_vec());
    let Some(FromHub::HubError(e)) = c.recv() else {
        panic!()
    };
    assert_eq!(e.code, ErrorCode::BadFrame);
    assert!(
        e.fatal && e.message.contains("not a stepstream frame"),
        "{e:?}"
    );
    assert_eq!(c.recv(), None, "closed after a fatal error");

    // A future wire version.
    let mut c = RawCollector::connect(&hub);
    let mut frame = hello("bad", None).encode();
    frame[2] = codec::VERSION + 1;
    c.send_bytes(frame);
    let Some(FromHub::HubError(e)) = c.recv() else {
        panic!()
    };
    assert_eq!(e.code, ErrorCode::UnsupportedVersion);

    // A skipped sequence number and an undefined metric are refused with reasons.
    let mut c = RawCollector::connect(&hub);
    c.send(hello("bad", None));
    let Some(FromHub::Welcome(w)) = c.recv() else {
        panic!()
    };
    assert_eq!(w.last_seq, 1, "what was accepted before is still there");
    c.send(ToHub::Batch(Batch {
        seq: 5,
        records: vec![rec(5)],
        items: Vec::new(),
    }));
    let Some(FromHub::HubError(e)) = c.recv() else {
        panic!()
    };
    assert!(e.message.contains("must not skip"), "{e:?}");
    let mut c = RawCollector::connect(&hub);
    c.send(hello("bad", None));
    c.recv();
    let stray = StepRecord {
        step: 2,
        wall_time: 0.0,
        values: vec![(MetricId(9), 1.0)],
    };
    c.send(ToHub::Batch(Batch {
        seq: 2,
        records: vec![stray],
        items: Vec::new(),
    }));
    let Some(FromHub::HubError(e)) = c.recv() else {
        panic!()
    };
    assert!(e.message.contains("never defined"), "{e:?}");

    // Something too large for the protocol.
    let mut c = RawCollector::connect(&hub);
    c.send(hello("bad", None));
    c.recv();
    let mut huge = ToHub::Heartbeat(Heartbeat { wall_time: 0.0 }).encode();
    huge.resize(codec::MAX_FRAME_LEN + 10, 0);
    c.send_bytes(huge);
    let Some(FromHub::HubError(e)) = c.recv() else {
        panic!()
    };
    assert!(e.message.contains("exceeds"), "{e:?}");

    // The one accepted point is intact, NaN and all.
    let s = hub.json("/api/runs/bad/series?metric=loss");
    assert_eq!(s["values"], serde_json::json!(["NaN"]));
    // Unknown runs and metrics are 404 with a reason.
    let r = hub.get("/api/runs/nope");
    assert_eq!(r.status, 404);
    assert!(r.text().contains("unknown run"));
    assert_eq!(hub.get("/api/runs/bad/series?metric=nope").status, 404);
}

#[test]
fn tokens_guard_writes_and_reads() {
    // Beyond loopback without tokens, the hub refuses to start.
    let out = std::process::Command::new(BIN)
        .args(["serve", "--bind", "0.0.0.0:0", "--db"])
        .arg(tempfile::tempdir().unwrap().path().join("x.db"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("without tokens"));

    let hub = Hub::start(&["--write-token", "w-secret", "--read-token", "r-secret"]);
    let mut c = RawCollector::connect(&hub);
    c.send(hello("guarded", Some("wrong")));
    let Some(FromHub::HubError(e)) = c.recv() else {
        panic!()
    };
    assert_eq!(e.code, ErrorCode::Unauthorized);

    let mut opts = Options::new(&hub.ws(), "tests", "guarded");
    opts.token = Some("w-secret".into());
    let run = Collector::start(opts).unwrap();
    run.log(1, &[("loss", 1.0)]);
    let id = run.run_id().clone();
    assert!(run.finish(Outcome::Failed("diverged".into())).delivered);

    assert_eq!(http_get(&hub.addr(), "/api/runs", None).status, 401);
    assert_eq!(
        http_get(&hub.addr(), "/api/runs", Some("wrong")).status,
        401
    );
    let ok = http_get(&hub.addr(), &format!("/api/runs/{id}"), Some("r-secret"));
    assert_eq!(ok.status, 200);
    let run: serde_json::Value = serde_json::from_slice(&ok.body).unwrap();
    assert_eq!(run["status"], "failed");
    assert_eq!(run["status_message"], "diverged");
    assert_eq!(
        http_get(
            &hub.addr(),
            &format!("/api/runs/{id}/config.json?token=r-secret"),
            None
        )
        .status,
        200
    );
}

#[test]
fn collector_started_before_the_hub_spools_and_delivers_everything() {
    let port = free_port();
    let spool_dir = tempfile::tempdir().unwrap();
    let mut options = Options::new(&format!("ws://127.0.0.1:{port}"), "tests", "early");
    // A tiny memory budget, so the outage spills to the spool file.
    options.memory_records = 50;
    options.spool_dir = Some(spool_dir.path().to_path_buf());
    let run = Collector::start(options).unwrap();
    let id = run.run_id().clone();
    for step in 0..500 {
        run.log(step, &[("loss", step as f64)]);
    }
    wait_for("the spool file to fill", Duration::from_secs(10), || {
        let file = std::fs::read_dir(spool_dir.path())
            .ok()?
            .flatten()
            .find(|e| e.file_name().to_string_lossy().starts_with(id.as_str()))?;
        (file.metadata().ok()?.len() > 1000).then_some(())
    });
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(BIN)
        .args(["serve", "--bind", &format!("127.0.0.1:{port}"), "--db"])
        .arg(dir.path().join("hub.db"))
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    for step in 500..1000 {
        run.log(step, &[("loss", step as f64)]);
    }
    let report = run.finish(Outcome::Finished);
    let hub = format!("127.0.0.1:{port}");
    let detail = http_get(&hub, &format!("/api/runs/{id}"), None);
    let csv = http_get(&hub, &format!("/api/runs/{id}/metrics.csv"), None);
    child.kill().unwrap();
    let _ = child.wait();
    assert!(report.delivered, "{report:?}");
    let detail: serde_json::Value = serde_json::from_slice(&detail.body).unwrap();
    assert_eq!(detail["records"], 1000);
    assert_eq!(detail["last_step"], 999);
    let (_, rows) = parse_csv(&csv.text());
    let steps: Vec<i64> = rows.iter().map(|r| r[0].parse().unwrap()).collect();
    assert_eq!(
        steps,
        (0..1000).collect::<Vec<_>>(),
        "every step once, in order"
    );
    let left = std::fs::read_dir(spool_dir.path()).unwrap().count();
    assert_eq!(left, 0, "the spool is removed once delivered");
}

/// The collector's linger: records logged within it wait and share one batch; a flush, and
/// the run's end, send what is held at once instead of after the linger.
#[test]
fn records_within_the_linger_share_a_batch_and_a_flush_sends_at_once() {
    // A hub that asks for a long linger (one with room asks for none).
    let hub = Hub::start(&["--linger", "60000"]);
    let mut options = Options::new(&hub.ws(), "tests", "linger");
    options.linger = Duration::from_secs(60);
    let run = Collector::start(options).unwrap();
    let id = run.run_id().clone();
    assert!(run.wait_welcome(Duration::from_secs(10)).is_some());
    let records = || hub.run_json(id.as_str()).unwrap()["records"].as_u64();
    for step in 0..20 {
        run.log(step, &[("loss", step as f64)]);
    }
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(records(), Some(0), "records wait for their linger");
    run.flush();
    wait_for("the flushed records", Duration::from_secs(5), || {
        (records() == Some(20)).then_some(())
    });
    for step in 20..30 {
        run.log(step, &[("loss", step as f64)]);
    }
    let started = std::time::Instant::now();
    let report = run.finish(Outcome::Finished);
    assert!(report.delivered, "{report:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "finish waited {:?} for the linger",
        started.elapsed()
    );
    assert_eq!(records(), Some(30));
    // Two batches: the twenty the flush sent, the ten the end sent.
    let mut raw = RawCollector::connect(&hub);
    raw.send(hello(id.as_str(), None));
    match raw.recv() {
        Some(FromHub::Welcome(w)) => assert_eq!(w.last_seq, 2),
        other => panic!("expected a welcome, got {other:?}"),
    }
}

#[test]
fn alerts_fire_resolve_and_reach_the_api_and_viewers() {
    let hub = Hub::start(&[]);
    let run = Collector::start(Options::new(&hub.ws(), "tests", "nan-run")).unwrap();
    let id = run.run_id().clone();
    let mut viewer = Viewer::connect(&hub);
    for step in 0..400i64 {
        let loss = if step == 150 {
            f64::NAN
        } else {
            2.0 / (1.0 + step as f64 * 0.01)
        };
        run.log(step, &[("loss", loss), ("grad_norm", 1.0)]);
        if step == 10 {
            run.flush();
            wait_for("the run", Duration::from_secs(10), || {
                hub.run_json(id.as_str())
            });
            viewer.subscribe(std::slice::from_ref(&id), None);
        }
    }
    assert!(run.finish(Outcome::Finished).delivered);
    // The judge runs beside ingest: its alerts follow the acknowledgements shortly.
    let alerts = wait_for("both alerts", Duration::from_secs(10), || {
        let alerts = hub.json(&format!("/api/runs/{id}/alerts"));
        (alerts["alerts"].as_array()?.len() >= 2).then_some(alerts)
    });
    let list = alerts["alerts"].as_array().unwrap();
    assert_eq!(list.len(), 2, "{alerts}");
    assert_eq!(
        (
            list[0]["rule"].as_str(),
            list[0]["state"].as_str(),
            list[0]["step"].as_i64()
        ),
        (Some("non_finite"), Some("fired"), Some(150))
    );
    assert_eq!(list[0]["value"], "NaN");
    assert_eq!(
        (list[1]["state"].as_str(), list[1]["step"].as_i64()),
        (Some("resolved"), Some(151))
    );
    assert!(viewer.pump(Duration::from_secs(10), |v| v.alerts.len() >= 2));
    assert!(viewer.alerts[0].fired && viewer.alerts[0].step == 150);
}

#[test]
fn a_straggling_rank_is_flagged_and_the_others_are_not() {
    let hub = Hub::start(&[]);
    let ranks: Vec<Collector> = (0..4)
        .map(|r| {
            let mut o = Options::new(&hub.ws(), "tests", "job");
            o.job = Some("launch-1".into());
            o.rank = r;
            o.world_size = 4;
            Collector::start(o).unwrap()
        })
        .collect();
    for step in 0..200i64 {
        for (r, c) in ranks.iter().enumerate() {
            let t =
                if r == 2 { 0.25 } else { 0.1 } * (1.0 + 0.05 * ((step * 7 + r as i64) % 5) as f64);
            c.log(step, &[("loss", 1.0), ("step_time", t)]);
        }
        if step % 20 == 0 {
            ranks.iter().for_each(|c| c.flush());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let ids: Vec<RunId> = ranks.iter().map(|c| c.run_id().clone()).collect();
    for c in ranks {
        assert!(c.finish(Outcome::Finished).delivered);
    }
    for (r, id) in ids.iter().enumerate() {
        let alerts = hub.json(&format!("/api/runs/{id}/alerts"));
        let rules: Vec<&str> = alerts["alerts"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|a| a["rule"].as_str())
            .collect();
        if r == 2 {
            assert!(rules.contains(&"straggler"), "rank 2: {alerts}");
        } else {
            assert!(rules.is_empty(), "rank {r}: {alerts}");
        }
    }
}

/// With many busy runs the hub commits at most once per `--commit-interval`, yet viewers do
/// not wait for it: a batch is published once checked. A viewer subscribing while batches
/// wait for their commit still gets every point exactly once.
#[test]
fn viewers_get_batches_before_their_commit_and_every_point_once() {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    use std::time::Instant;
    const STEPS: i64 = 300;
    // Collectors lingering as on a busy hub (the subject here is the commit interval).
    let hub = Hub::start(&["--commit-interval", "1000", "--linger", "40"]);
    // Sixteen runs sending a batch each every ~20 ms: soon one commit holds batches of four
    // or more, and from then on the writer commits once a second.
    let runs: Vec<Collector> = (0..16)
        .map(|i| Collector::start(Options::new(&hub.ws(), "tests", &format!("c{i}"))).unwrap())
        .collect();
    for run in &runs {
        assert!(run.wait_welcome(Duration::from_secs(10)).is_some());
    }
    let watched = runs[0].run_id().clone();
    let mut early = Viewer::connect(&hub);
    early.subscribe(std::slice::from_ref(&watched), None);
    assert!(early.pump(Duration::from_secs(10), |v| v
        .runs
        .get(&watched)
        .is_some_and(|s| s.backfill_done)));
    let logged: Arc<Mutex<HashMap<i64, Instant>>> = Arc::default();
    let writers: Vec<_> = runs
        .into_iter()
        .enumerate()
        .map(|(i, run)| {
            let logged = logged.clone();
            std::thread::spawn(move || {
                for step in 0..STEPS {
                    if i == 0 {
                        logged.lock().unwrap().insert(step, Instant::now());
                    }
                    run.log(step, &[("loss", 1.0 / (1.0 + step as f64))]);
                    std::thread::sleep(Duration::from_millis(5));
                }
                run.finish(Outcome::Finished)
            })
        })
        .collect();
    // Half-way through, a second viewer subscribes: batches are then published and not all
    // stored.
    let mut late = None;
    let mut arrived: HashMap<i64, Instant> = HashMap::new();
    let all = early.pump(Duration::from_secs(60), |v| {
        let seen = &v.runs[&watched];
        if let Some(points) = seen.points.get("loss") {
            for &step in points.keys() {
                arrived.entry(step).or_insert_with(Instant::now);
            }
        }
        if late.is_none() && seen.count("loss") >= STEPS as usize / 2 {
            let mut viewer = Viewer::connect(&hub);
            viewer.subscribe(std::slice::from_ref(&watched), None);
            late = Some(viewer);
        }
        seen.count("loss") == STEPS as usize
    });
    for w in writers {
        assert!(w.join().unwrap().delivered);
    }
    assert!(all, "the early viewer got every step");
    let mut late = late.expect("the late viewer subscribed");
    assert!(late.pump(Duration::from_secs(30), |v| v
        .runs
        .get(&watched)
        .is_some_and(|s| s.count("loss") == STEPS as usize)));
    for viewer in [&early, &late] {
        let seen = &viewer.runs[&watched];
        assert!(seen.duplicates("loss").is_empty(), "a point came twice");
        assert_eq!(seen.resyncs, 0);
    }
    // Log to arrival: the collector's linger and the hub's work, not a 1 s commit interval.
    let logged = logged.lock().unwrap();
    let (slowest, step) = (0..STEPS)
        .map(|s| (arrived[&s].saturating_duration_since(logged[&s]), s))
        .max()
        .unwrap();
    assert!(
        slowest < Duration::from_millis(600),
        "step {step} took {slowest:?} to reach the viewer"
    );
}

/// The hub asks collectors for no linger while it has room (each record reaches viewers at
/// once), for one once records pour in (batches of several cost it less), and for none again
/// when they stop; the library's collector keeps to it.
#[test]
fn the_hub_paces_collectors_by_the_records_it_receives() {
    let hub = Hub::start(&[]);
    let mut c = RawCollector::connect(&hub);
    c.send(hello("paced", None));
    assert!(matches!(c.recv(), Some(FromHub::Welcome(_))));
    assert_eq!(c.await_pace(Duration::from_secs(5), |p| p == 0), Some(0));
    c.send(ToHub::DefineMetrics(DefineMetrics {
        metrics: vec![MetricDef {
            id: MetricId(0),
            name: "loss".into(),
        }],
    }));
    // About 6,000 records a second for three seconds.
    let started = std::time::Instant::now();
    let mut seq = 0u64;
    while started.elapsed() < Duration::from_secs(3) {
        seq += 1;
        let from = (seq as i64 - 1) * 60;
        c.send(ToHub::Batch(Batch {
            seq,
            records: (from..from + 60)
                .map(|step| StepRecord {
                    step,
                    wall_time: unix_now(),
                    values: vec![(MetricId(0), step as f64)],
                })
                .collect(),
            items: Vec::new(),
        }));
        std::thread::sleep(Duration::from_millis(10));
    }
    let busy = c.await_pace(Duration::from_secs(5), |p| p >= 15);
    assert!(busy.is_some(), "the pace stayed at {:?} under load", c.pace);
    // A collector connecting now is told the linger in force at once.
    let mut other = RawCollector::connect(&hub);
    other.send(hello("paced-too", None));
    assert!(matches!(other.recv(), Some(FromHub::Welcome(_))));
    assert!(other
        .await_pace(Duration::from_secs(2), |p| p >= 15)
        .is_some());
    drop(other);
    // Quiet again: no linger.
    assert_eq!(c.await_pace(Duration::from_secs(15), |p| p == 0), Some(0));
}
