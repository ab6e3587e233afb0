//! A run's console lines and samples: streamed with its records (acknowledged, resent after
//! a hub restart), pushed to viewers, stored apart and capped, searched and downloaded over
//! the API, and bad ones refused by name while the rest go on.

use crate::util::*;
use std::time::Duration;
use stepstream_collector::{Collector, Options, Outcome};
use stepstream_protocol::*;

fn line(text: &str, stream: Stream) -> ItemBody {
    ItemBody::Line {
        stream,
        text: text.into(),
    }
}

fn console(hub: &Hub, run: &str, query: &str) -> serde_json::Value {
    hub.json(&format!("/api/runs/{run}/console?{query}"))
}

fn texts(answer: &serde_json::Value) -> Vec<String> {
    answer["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["text"].as_str().unwrap().to_string())
        .collect()
}

/// Lines logged at steps, with a viewer watching: the viewer gets them live in order, the API
/// finds them by step window and regular expression, the tail is the last ones, and a hub
/// killed and restarted mid-run loses none that was acknowledged and repeats none.
#[test]
fn console_lines_arrive_live_in_order_and_survive_a_hub_restart() {
    let mut hub = Hub::start(&[]);
    let mut viewer = Viewer::connect(&hub);
    let mut o = Options::new(&hub.ws(), "p", "console");
    o.run_id = Some(RunId::new("con-1").unwrap());
    let run = Collector::start(o).unwrap();
    for step in 0..500i64 {
        run.log(step, &[("loss", 1.0 / (step + 1) as f64)]);
        let stream = if step % 10 == 0 {
            Stream::Stderr
        } else {
            Stream::Stdout
        };
        assert!(run.log_item("", line(&format!("step {step} done"), stream)));
        if step == 0 {
            viewer.subscribe(&[RunId::new("con-1").unwrap()], None);
        }
        if step == 250 {
            // Everything so far acknowledged, then the hub dies; the rest waits and is resent.
            wait_for("acks", Duration::from_secs(10), || {
                (run.acknowledged() == 251).then_some(())
            });
            hub.kill9();
            hub.restart();
            viewer = Viewer::connect(&hub);
            viewer.subscribe(&[RunId::new("con-1").unwrap()], None);
        }
    }
    let report = run.finish(Outcome::Finished);
    assert!(report.delivered, "{report:?}");
    assert_eq!(report.items_acked, 500, "{report:?}");
    let all = console(&hub, "con-1", "from_step=0&limit=100000");
    let got = texts(&all);
    let want: Vec<String> = (0..500).map(|s| format!("step {s} done")).collect();
    assert_eq!(got, want, "every line once, in order");
    assert_eq!(all["total"], 500);
    assert_eq!(all["dropped"], 0);
    // Steps: each line is at the step logged before it.
    let steps: Vec<i64> = all["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["step"].as_i64().unwrap())
        .collect();
    assert_eq!(steps, (0..500).collect::<Vec<_>>());
    // A window, a search, a stream, the tail.
    assert_eq!(
        texts(&console(&hub, "con-1", "from_step=100&to_step=102")),
        ["step 100 done", "step 101 done", "step 102 done"]
    );
    assert_eq!(
        texts(&console(&hub, "con-1", "q=step%2049%5Cd%20done")),
        (490..500)
            .map(|s| format!("step {s} done"))
            .collect::<Vec<_>>()
    );
    let errs = texts(&console(&hub, "con-1", "stream=stderr&from_step=0"));
    assert_eq!(errs.len(), 50);
    assert!(errs.iter().all(|t| t.ends_with("0 done")), "{errs:?}");
    let tail = console(&hub, "con-1", "limit=3");
    assert_eq!(
        texts(&tail),
        ["step 497 done", "step 498 done", "step 499 done"]
    );
    assert_eq!(tail["more"], true);
    // A bad pattern is a clear 400.
    let bad = hub.get("/api/runs/con-1/console?q=(unclosed");
    assert_eq!(bad.status, 400, "{}", bad.text());
    assert!(bad.text().contains("regular expression"), "{}", bad.text());
    // The viewer connected after the restart saw the lines logged after it, live, in order.
    viewer.pump(Duration::from_secs(5), |v| {
        v.runs
            .get(&RunId::new("con-1").unwrap())
            .is_some_and(|s| s.items.len() >= 249)
    });
    let seen = &viewer.runs[&RunId::new("con-1").unwrap()];
    let live: Vec<String> = seen
        .items
        .iter()
        .filter_map(|i| match &i.body {
            ItemBody::Line { text, .. } => Some(text.clone()),
            _ => None,
        })
        .collect();
    assert!(live.len() >= 249, "{} lines live", live.len());
    let first: usize = live[0].split(' ').nth(1).unwrap().parse().unwrap();
    assert_eq!(
        live,
        (first..500)
            .map(|s| format!("step {s} done"))
            .collect::<Vec<_>>()
    );
    // The text download: every line, stderr marked.
    let text = hub.get("/api/runs/con-1/console?format=text").text();
    assert_eq!(text.lines().count(), 500);
    assert!(
        text.starts_with("[stderr] step 0 done\nstep 1 done\n"),
        "{}",
        &text[..80]
    );
}

/// Past the hub's `console_lines` the oldest lines go, and every answer says how many; the
/// records of the run are untouched.
#[test]
fn a_console_over_its_cap_keeps_the_newest_lines_and_counts_the_dropped() {
    let hub = Hub::start(&["--limit", "console_lines=1000"]);
    let mut o = Options::new(&hub.ws(), "p", "chatty");
    o.run_id = Some(RunId::new("chatty").unwrap());
    let run = Collector::start(o).unwrap();
    for step in 0..3000i64 {
        run.log(step, &[("loss", 1.0)]);
        run.log_item("", line(&format!("line {step}"), Stream::Stdout));
        if step % 700 == 0 {
            run.flush();
        }
    }
    let report = run.finish(Outcome::Finished);
    assert!(report.delivered && report.items_acked == 3000, "{report:?}");
    let all = console(&hub, "chatty", "from_step=0&limit=100000");
    assert_eq!(all["total"], 3000);
    assert_eq!(all["kept"], 1000);
    assert_eq!(all["dropped"], 2000);
    assert_eq!(
        texts(&all),
        (2000..3000)
            .map(|s| format!("line {s}"))
            .collect::<Vec<_>>()
    );
    let text = hub.get("/api/runs/chatty/console?format=text").text();
    assert!(
        text.starts_with("[stepstream: the first 2000 lines were dropped"),
        "{}",
        &text[..120]
    );
    assert_eq!(hub.json("/api/runs/chatty")["records"], 3000);
}

/// A text sample, a table, and bad samples (too big, a ragged table, a NUL): the bad ones are
/// counted and named, never sent; everything else of the run, scalars included, is stored.
#[test]
fn samples_are_stored_by_key_and_bad_ones_are_refused_by_name_while_the_run_goes_on() {
    let hub = Hub::start(&["--limit", "item_bytes=100000"]);
    let mut o = Options::new(&hub.ws(), "p", "samples");
    o.run_id = Some(RunId::new("samples").unwrap());
    let run = Collector::start(o).unwrap();
    run.wait_welcome(Duration::from_secs(10)).unwrap();
    for step in 0..20i64 {
        run.log(step, &[("loss", step as f64)]);
        run.log_item_at(
            step,
            unix_now(),
            "generation",
            ItemBody::Text(format!("text at {step}")),
        );
    }
    run.log_item_at(
        19,
        unix_now(),
        "rollouts",
        ItemBody::Table {
            columns: vec!["prompt".into(), "reward".into()],
            rows: vec![
                vec![Cell::Text("2+2=".into()), Cell::Number(0.5)],
                vec![Cell::Text("nan?".into()), Cell::Number(f64::NAN)],
            ],
        },
    );
    // Too big for this hub, ragged, a NUL: refused before sending.
    run.log_item("generation", ItemBody::Text("x".repeat(200_000)));
    run.log_item(
        "rollouts",
        ItemBody::Table {
            columns: vec!["a".into(), "b".into()],
            rows: vec![vec![Cell::Number(1.0)]],
        },
    );
    run.log_item("generation", ItemBody::Text("a\0b".into()));
    // The last refusal is named.
    wait_for("the refusals", Duration::from_secs(5), || {
        run.last_error().filter(|e| e.contains("NUL"))
    });
    let report = run.finish(Outcome::Finished);
    assert!(report.delivered, "{report:?}");
    assert_eq!(report.items_acked, 21, "{report:?}");
    assert_eq!(report.items_refused, 3, "{report:?}");
    let gen = hub.json("/api/runs/samples/samples?key=generation&from_step=0");
    let bodies: Vec<&str> = gen["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["body"].as_str().unwrap())
        .collect();
    assert_eq!(
        bodies,
        (0..20).map(|s| format!("text at {s}")).collect::<Vec<_>>()
    );
    let table = hub.json("/api/runs/samples/samples?key=rollouts");
    let t = &table["samples"][0];
    assert_eq!(t["kind"], "table");
    assert_eq!(
        t["body"]["columns"],
        serde_json::json!(["prompt", "reward"])
    );
    assert_eq!(t["body"]["rows"][0], serde_json::json!(["2+2=", 0.5]));
    assert_eq!(t["body"]["rows"][1][1], "NaN");
    assert_eq!(hub.json("/api/runs/samples")["records"], 20);
    // Samples are no console lines.
    assert_eq!(console(&hub, "samples", "")["total"], 0);
}

/// A raw collector that sends an item past the hub's limits has its batch refused with the
/// limit's name (a collector of this build never sends one: it checks first).
#[test]
fn a_batch_with_an_item_over_the_limit_is_refused_naming_the_limit() {
    let hub = Hub::start(&["--limit", "item_bytes=1000"]);
    let mut c = RawCollector::connect(&hub);
    c.send(hello("raw-items", None));
    assert!(matches!(c.recv(), Some(FromHub::Welcome(_))));
    c.send(ToHub::Batch(Batch {
        seq: 1,
        records: Vec::new(),
        items: vec![Item {
            step: 0,
            wall_time: 1.0,
            key: String::new(),
            body: line(&"y".repeat(2000), Stream::Stdout),
        }],
    }));
    match c.recv() {
        Some(FromHub::HubError(e)) => {
            assert_eq!(e.code, ErrorCode::Limit, "{e:?}");
            assert!(e.message.contains("item_bytes"), "{e:?}");
        }
        other => panic!("expected a limit error, got {other:?}"),
    }
}
