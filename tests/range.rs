//! Range reads of the series endpoint (`from`/`to`), the web app's zoom: exact at the edges,
//! non-finite values kept, batches whose steps go backwards found, and correct while the
//! run is being written. Plus the benchmark of a narrow window of a 1,000,000-step run.

use crate::util::*;
use std::time::{Duration, Instant};
use stepstream_collector::{Collector, Options, Outcome};
use stepstream_protocol::*;

/// Steps and values (NaN/Infinity as the strings the API writes) of a series answer.
fn points(v: &serde_json::Value) -> Vec<(i64, String)> {
    let steps = v["steps"].as_array().unwrap();
    let values = v["values"].as_array().unwrap();
    assert_eq!(steps.len(), values.len());
    assert_eq!(
        v["times"].as_array().unwrap().len(),
        steps.len(),
        "a time per point"
    );
    steps
        .iter()
        .zip(values)
        .map(|(s, v)| (s.as_i64().unwrap(), v.to_string()))
        .collect()
}

fn value(step: i64) -> f64 {
    match step {
        1000 => f64::NAN,
        1001 => f64::INFINITY,
        1002 => f64::NEG_INFINITY,
        s => (s as f64 * 0.37).sin(),
    }
}

fn range(hub: &Hub, id: &str, metric: &str, from: i64, to: i64) -> serde_json::Value {
    hub.json(&format!(
        "/api/runs/{id}/series?metric={metric}&from={from}&to={to}&budget=1000000"
    ))
}

#[test]
fn range_queries_are_exact_at_the_edges_with_non_finite_values_while_written() {
    let hub = Hub::start(&[]);
    let mut o = Options::new(&hub.ws(), "tests", "range");
    o.max_batch = 64; // many batches: ranges cut through them
    let run = Collector::start(o).unwrap();
    let id = run.run_id().to_string();
    for step in 0..20_000i64 {
        let mut values = vec![("loss", value(step))];
        if step % 2 == 0 {
            values.push(("eval", step as f64));
        }
        run.log(step, &values);
    }
    run.flush();
    wait_for("20,000 steps stored", Duration::from_secs(30), || {
        (hub.run_json(&id)?["last_step"] == 19_999).then_some(())
    });

    // The edges are inclusive, non-finite values come back as they were logged.
    let got = points(&range(&hub, &id, "loss", 999, 1003));
    let want: Vec<(i64, String)> = [
        (999, serde_json::json!(value(999)).to_string()),
        (1000, "\"NaN\"".into()),
        (1001, "\"Infinity\"".into()),
        (1002, "\"-Infinity\"".into()),
        (1003, serde_json::json!(value(1003)).to_string()),
    ]
    .into();
    assert_eq!(got, want);
    // Cuts inside batches (64 records each), a single step, the first and the last.
    for (from, to) in [
        (63, 129),
        (0, 0),
        (19_999, 19_999),
        (5, 4_000),
        (19_000, 25_000),
    ] {
        let v = range(&hub, &id, "loss", from, to);
        let steps: Vec<i64> = points(&v).into_iter().map(|p| p.0).collect();
        let want: Vec<i64> = (from..=to.min(19_999)).collect();
        assert_eq!(steps, want, "{from}..={to}");
        assert_eq!(v["downsampled"], false);
        assert_eq!(v["total_points"], want.len());
    }
    // A metric on every other step only.
    let v = range(&hub, &id, "eval", 101, 111);
    let steps: Vec<i64> = points(&v).into_iter().map(|p| p.0).collect();
    assert_eq!(steps, vec![102, 104, 106, 108, 110]);
    // A range before the run, and a reversed one.
    assert!(points(&range(&hub, &id, "loss", -50, -1)).is_empty());
    let bad = hub.get(&format!("/api/runs/{id}/series?metric=loss&from=10&to=5"));
    assert_eq!(bad.status, 400);

    // While the run is being written, every answer holds every step of its range that the
    // hub had, without a gap.
    let writer = std::thread::spawn(move || {
        for step in 20_000..60_000i64 {
            run.log(step, &[("loss", value(step))]);
            if step % 500 == 0 {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        run.finish(Outcome::Finished)
    });
    let mut checked = 0;
    while !writer.is_finished() {
        let v = range(&hub, &id, "loss", 19_990, 70_000);
        let steps: Vec<i64> = points(&v).into_iter().map(|p| p.0).collect();
        let want: Vec<i64> = (19_990..19_990 + steps.len() as i64).collect();
        assert_eq!(steps, want, "a contiguous prefix of the range");
        checked += 1;
    }
    assert!(writer.join().unwrap().delivered);
    assert!(checked > 2, "queried while writing ({checked} times)");
    let v = range(&hub, &id, "loss", 59_990, 70_000);
    assert_eq!(points(&v).len(), 10);
}

#[test]
fn a_batch_whose_steps_go_backwards_is_found_by_every_range_it_covers() {
    batches_that_go_backwards_are_found(&Hub::start(&[]));
}

/// Range reads of batches whose steps go backwards, on `hub`'s store (also run on
/// PostgreSQL by the cluster tests).
pub fn batches_that_go_backwards_are_found(hub: &Hub) {
    let mut c = RawCollector::connect(hub);
    c.send(hello("backwards", None));
    assert!(matches!(c.recv(), Some(FromHub::Welcome(_))));
    c.send(ToHub::DefineMetrics(DefineMetrics {
        metrics: vec![MetricDef {
            id: MetricId(0),
            name: "loss".into(),
        }],
    }));
    let rec = |step: i64| StepRecord {
        step,
        wall_time: 1000.0 + step as f64,
        values: vec![(MetricId(0), step as f64)],
    };
    // Batch 1 spans 0..=9; batch 2 (an evaluation written late, then a resumed run) jumps
    // from 50,000 back to 3; batch 3 continues at 50,001; batch 4 spans nearly all of i64;
    // then 2,500 narrow batches.
    let mut batches = vec![
        (0..10).map(rec).collect::<Vec<_>>(),
        vec![rec(50_000), rec(3), rec(4)],
        vec![rec(50_001)],
        vec![rec(i64::MIN + 1), rec(i64::MAX - 1)],
    ];
    // Enough that the store packs them (`store::pack`), the wide batches with them.
    batches.extend((0..2500).map(|b| vec![rec(60_000 + 2 * b), rec(60_001 + 2 * b)]));
    let last = batches.len() as u64;
    let sent: Vec<String> = batches
        .iter()
        .flatten()
        .map(|r| r.step.to_string())
        .collect();
    for (i, records) in batches.into_iter().enumerate() {
        c.send(ToHub::Batch(Batch {
            seq: i as u64 + 1,
            records,
            items: Vec::new(),
        }));
    }
    let mut acked = 0;
    while acked < last {
        match c.recv() {
            Some(FromHub::Ack(a)) => acked = a.through_seq,
            other => panic!("unexpected {other:?}"),
        }
    }
    let steps = |from: i64, to: i64| -> Vec<i64> {
        points(&range(hub, "backwards", "loss", from, to))
            .into_iter()
            .map(|p| p.0)
            .collect()
    };
    // Read by sequence number (the CSV export pages through them), packed or not: every
    // record once, in the order sent.
    let csv = hub.get("/api/runs/backwards/metrics.csv");
    assert_eq!(csv.status, 200);
    let (_, rows) = parse_csv(&csv.text());
    let stored: Vec<String> = rows.into_iter().map(|r| r[0].clone()).collect();
    assert_eq!(stored, sent);
    // In the order they were stored, every point of the range, once.
    assert_eq!(steps(3, 4), vec![3, 4, 3, 4]);
    assert_eq!(steps(40_000, 60_000), vec![50_000, 50_001, 60_000]);
    assert_eq!(steps(0, 2), vec![0, 1, 2]);
    assert_eq!(steps(61_001, 61_002), vec![61_001, 61_002]);
    assert_eq!(steps(i64::MAX - 1, i64::MAX), vec![i64::MAX - 1]);
    assert_eq!(steps(i64::MIN, 0), vec![0, i64::MIN + 1]);
}

/// A benchmark, not a test: `cargo test --release --test e2e bench_range -- --ignored
/// --nocapture`. A 1,000,000-step run of 10 metrics, then 1,000-step windows at its start,
/// middle and end against the whole run, each the median of 20 queries.
#[test]
#[ignore]
fn bench_range_query_of_a_million_step_run() {
    let hub = Hub::start(&[]);
    let t0 = Instant::now();
    let id = million_step_run(&hub, "million", None);
    println!(
        "ingest: 1,000,000 steps x 10 metrics in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let whole = median_ms(&hub, &id, (0, 999_999));
    for (label, from) in [("start", 0), ("middle", 500_000), ("end", 998_999)] {
        let w = median_ms(&hub, &id, (from, from + 999));
        println!(
            "1,000-step window at the {label}: {w:.2} ms (whole run: {whole:.1} ms, ratio {:.3})",
            w / whole
        );
    }
}

/// A benchmark, not a test: `cargo test --release --test e2e bench_range_after -- --ignored
/// --nocapture`. The same run as above, but with one evaluation logged late at step 0
/// half-way through (one batch then spans ~500,000 steps): 1,000-step windows after it,
/// against the whole run. With one widest span per run, every later window scanned back
/// to step 0's batch; by span class it costs what it did without the wide batch.
#[test]
#[ignore]
fn bench_range_after_one_wide_batch() {
    let hub = Hub::start(&[]);
    let id = million_step_run(&hub, "wide", Some(500_000));
    let whole = median_ms(&hub, &id, (0, 999_999));
    for (label, from) in [
        ("before the wide batch", 100_000),
        ("after it", 900_000),
        ("at the end", 998_999),
    ] {
        let w = median_ms(&hub, &id, (from, from + 999));
        println!(
            "1,000-step window {label}: {w:.2} ms (whole run: {whole:.1} ms, ratio {:.3})",
            w / whole
        );
    }
}

/// A finished run of 1,000,000 steps × 10 metrics (`m3` logged at step 0 again after
/// `late_eval_at`, when given); its id.
fn million_step_run(hub: &Hub, name: &str, late_eval_at: Option<i64>) -> String {
    let run = Collector::start(Options::new(&hub.ws(), "bench", name)).unwrap();
    let id = run.run_id().to_string();
    let names: Vec<String> = (0..10).map(|i| format!("m{i}")).collect();
    for step in 0..1_000_000i64 {
        let values: Vec<(&str, f64)> = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.as_str(), (step as f64 * 1e-3 + i as f64).sin()))
            .collect();
        run.log(step, &values);
        if Some(step) == late_eval_at {
            run.log(0, &[("m3", 0.5)]);
        }
    }
    assert!(run.finish(Outcome::Finished).delivered);
    id
}

/// The median of 20 range queries of `m3` over `from..=to` (budget 4,000), in ms.
fn median_ms(hub: &Hub, id: &str, (from, to): (i64, i64)) -> f64 {
    let mut ms: Vec<f64> = (0..20)
        .map(|_| {
            let t = Instant::now();
            let v = hub.json(&format!(
                "/api/runs/{id}/series?metric=m3&from={from}&to={to}&budget=4000"
            ));
            assert!(v["total_points"].as_u64().unwrap() > 0);
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    ms[10]
}

/// A zoom window over the viewer socket (the page's one way in) answers what the series
/// endpoint answers for the same window, both read by one routine; a budget past the
/// socket's limit, an unknown metric and a run outside the token's scope are refused with
/// the reason; the newest request for a window is the one answered when two overlap.
#[test]
fn a_zoom_over_the_socket_answers_what_the_series_endpoint_does() {
    let hub = Hub::start_with_tokens(
        "[[tokens]]\ntoken = \"nlp-r\"\naccess = \"read\"\nprojects = [\"nlp\"]\n",
        &[],
    );
    let mut o = Options::new(&hub.ws(), "tests", "zoom");
    o.token = Some("w".into());
    let run = Collector::start(o).unwrap();
    let id = run.run_id().clone();
    for step in 0..20_000i64 {
        run.log(step, &[("loss", value(step))]);
    }
    assert!(run.finish(Outcome::Finished).delivered);
    let mut viewer = Viewer::connect_with_token(&hub, "r");
    let zoom =
        |viewer: &mut Viewer, id_: u64, metric: &str, (from, to): (i64, i64), budget: u32| {
            viewer.send(FromViewer::Zoom(Zoom {
                id: id_,
                run_id: id.clone(),
                metric: metric.into(),
                from,
                to,
                budget,
            }));
        };
    for (n, (window, budget)) in [((900, 1100), 1000), ((0, 19_999), 400), ((5, 5), 4)]
        .into_iter()
        .enumerate()
    {
        zoom(&mut viewer, n as u64, "loss", window, budget);
        assert!(viewer.pump(Duration::from_secs(10), |v| v.zoomed.len() == n + 1));
        let z = viewer.zoomed[n].clone();
        let http = http_get(
            &hub.addr(),
            &format!(
                "/api/runs/{id}/series?metric=loss&from={}&to={}&budget={budget}",
                window.0, window.1
            ),
            Some("r"),
        );
        let s: serde_json::Value = serde_json::from_slice(&http.body).unwrap();
        assert_eq!(z.id, n as u64);
        assert_eq!((z.from, z.to), window);
        assert_eq!(series_steps(&s), z.steps);
        assert_eq!(s["total_points"].as_u64(), Some(z.total_points));
        assert_eq!(s["downsampled"].as_bool(), Some(z.downsampled));
        // serde_json reads a float to within one unit in the last place: compare so.
        let expected = s["values"].as_array().unwrap();
        assert_eq!(z.values.len(), expected.len());
        for (got, want) in z.values.iter().zip(expected) {
            match want.as_f64() {
                Some(w) => assert!((got - w).abs() <= f64::EPSILON * w.abs(), "{got} vs {w}"),
                None => assert_eq!(json_text(*got), want.to_string()),
            }
        }
    }
    // NaN and the infinities travel as themselves.
    zoom(&mut viewer, 10, "loss", (1000, 1002), 100);
    assert!(viewer.pump(Duration::from_secs(10), |v| v.zoomed.len() == 4));
    let z = &viewer.zoomed[3];
    assert!(
        z.values[0].is_nan() && z.values[1] == f64::INFINITY && z.values[2] == f64::NEG_INFINITY
    );
    // Refusals say why.
    zoom(&mut viewer, 11, "loss", (0, 10), 1_000_000);
    zoom(&mut viewer, 12, "nope", (0, 10), 100);
    assert!(viewer.pump(Duration::from_secs(10), |v| v.errors.len() == 2));
    assert!(
        viewer.errors[0].message.contains("zoom budget"),
        "{:?}",
        viewer.errors
    );
    assert!(
        viewer.errors[1].message.contains("no metric"),
        "{:?}",
        viewer.errors
    );
    let mut other = Viewer::connect_with_token(&hub, "nlp-r");
    other.send(FromViewer::Zoom(Zoom {
        id: 1,
        run_id: id.clone(),
        metric: "loss".into(),
        from: 0,
        to: 10,
        budget: 100,
    }));
    assert!(other.pump(Duration::from_secs(10), |v| !v.errors.is_empty()));
    assert!(other.zoomed.is_empty());
    assert!(
        other.errors[0].message.contains("unknown run"),
        "{:?}",
        other.errors
    );
}

/// A non-finite value as the series endpoint writes it in JSON.
fn json_text(v: f64) -> String {
    if v.is_nan() {
        "\"NaN\"".into()
    } else if v > 0.0 {
        "\"Infinity\"".into()
    } else {
        "\"-Infinity\"".into()
    }
}
