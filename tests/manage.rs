//! Managing the store through the real hub: deleting a run (API, `stepstream delete`, the
//! page), told to its viewers, refused while it is written and to tokens that may not
//! write its project, with its space given back and its place under the run limits freed;
//! and per-project retention (`serve --retain`).

use crate::browser::Browser;
use crate::util::*;
use std::process::Command;
use std::time::Duration;
use stepstream_collector::{Collector, Options, Outcome};
use stepstream_protocol::*;

/// `DELETE /api/runs/{id}?by=ann` with `token`; the status and the JSON answer.
fn delete(addr: &str, run_id: &str, token: Option<&str>) -> (u16, serde_json::Value) {
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut headers = Vec::new();
    if let Some(a) = &auth {
        headers.push(("Authorization", a.as_str()));
    }
    let r = http_request(
        addr,
        "DELETE",
        &format!("/api/runs/{run_id}?by=ann"),
        &headers,
    );
    let json = serde_json::from_slice(&r.body).unwrap_or(serde_json::Value::Null);
    (r.status, json)
}

/// A run of `project` with id `id`, `steps` steps of six noisy metrics and a text sample
/// every 100 steps, finished.
fn finished_run(hub: &Hub, project: &str, id: &str, token: Option<&str>, steps: i64) {
    let run = started_run(hub, project, id, token);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ id.len() as u64;
    for step in 0..steps {
        let mut values = Vec::with_capacity(6);
        for name in ["loss", "grad_norm", "a", "b", "c", "d"] {
            // xorshift: values that no codec shrinks much, as a run's real space.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            values.push((name, (x >> 11) as f64 / (1u64 << 53) as f64));
        }
        run.log(step, &values);
        if step % 100 == 0 {
            run.log_item(
                "generation",
                ItemBody::Text(format!("{step}: {}", "x".repeat(900))),
            );
        }
    }
    let report = run.finish(Outcome::Finished);
    assert!(report.delivered, "{report:?}");
}

fn started_run(hub: &Hub, project: &str, id: &str, token: Option<&str>) -> Collector {
    let mut opts = Options::new(&hub.ws(), project, id);
    opts.token = token.map(str::to_string);
    opts.run_id = Some(RunId::new(id).unwrap());
    Collector::start(opts).unwrap()
}

/// Bytes of the hub's SQLite database file (its WAL is kept at a size for reuse).
fn db_bytes(hub: &Hub) -> u64 {
    std::fs::metadata(&hub.db).map_or(0, |m| m.len())
}

fn listed(hub: &Hub, token: &str) -> Vec<String> {
    let r = http_get(&hub.addr(), "/api/runs", Some(token));
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    v["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn a_run_that_ended_is_deleted_with_all_it_stored_its_viewers_told_and_its_space_returned() {
    let scoped = "[[tokens]]\ntoken = \"w-a\"\naccess = \"write\"\nprojects = [\"a\"]\n\
                  [[tokens]]\ntoken = \"w-b\"\naccess = \"write\"\nprojects = [\"b\"]\n\
                  [[tokens]]\ntoken = \"r-a\"\naccess = \"read\"\nprojects = [\"a\"]\n";
    let mut hub = Hub::start_with_tokens(scoped, &["--limit", "runs=2"]);
    finished_run(&hub, "a", "big", Some("w-a"), 60_000);
    let live = started_run(&hub, "a", "live", Some("w-a"));
    live.log(0, &[("loss", 1.0)]);
    live.flush();
    wait_for("both runs", Duration::from_secs(30), || {
        (listed(&hub, "r-a").len() == 2).then_some(())
    });
    // The hub holds two runs, its limit: a third is refused by name.
    let mut third = RawCollector::connect(&hub);
    third.send(hello("third", Some("w")));
    match third.recv() {
        Some(FromHub::HubError(e)) => assert!(e.message.contains("limit runs"), "{e:?}"),
        other => panic!("a third run was not refused: {other:?}"),
    }
    let mut viewer = Viewer::connect_with_token(&hub, "r-a");
    viewer.subscribe(&[RunId::new("big").unwrap()], None);
    assert!(viewer.pump(Duration::from_secs(20), |v| v
        .runs
        .get(&RunId::new("big").unwrap())
        .is_some_and(|s| s.count("loss") > 0)));
    std::thread::sleep(Duration::from_secs(1));
    let before = db_bytes(&hub);
    assert!(before > 3_000_000, "the run takes {before} bytes");

    // Who may not: no token, a read token, another project's write token.
    for (token, expected) in [(None, 401), (Some("r-a"), 403), (Some("w-b"), 403)] {
        let (status, body) = delete(&hub.addr(), "big", token);
        assert_eq!(status, expected, "{token:?}: {body}");
    }
    // A run being written is refused with why, and stays whole.
    let (status, body) = delete(&hub.addr(), "live", Some("w-a"));
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("only a run that ended may be deleted"),
        "{body}"
    );
    live.log(1, &[("loss", 0.5)]);
    live.flush();
    wait_for("the live run goes on", Duration::from_secs(10), || {
        let r = http_get(&hub.addr(), "/api/runs/live", Some("r-a"));
        let v: serde_json::Value = serde_json::from_slice(&r.body).ok()?;
        (v["last_step"] == 1).then_some(())
    });

    // The CLI deletes it; the viewer watching it is told, by whom.
    let out = succeed(Command::new(BIN).args([
        "delete",
        "big",
        "--hub",
        &hub.ws(),
        "--token",
        "w-a",
        "--by",
        "ann",
    ]));
    assert!(String::from_utf8_lossy(&out.stdout).contains("run big deleted"));
    assert!(
        viewer.pump(Duration::from_secs(10), |v| v.deleted.iter().any(|d| d
            .run_id
            .as_str()
            == "big"
            && d.by == "ann"
            && d.project == "a")),
        "the viewer was not told: {:?}",
        viewer.deleted
    );
    assert!(viewer.errors.is_empty(), "{:?}", viewer.errors);
    for path in [
        "/api/runs/big",
        "/api/runs/big/metrics.csv",
        "/api/runs/big/samples",
    ] {
        assert_eq!(
            http_get(&hub.addr(), path, Some("r-a")).status,
            404,
            "{path}"
        );
    }
    assert_eq!(listed(&hub, "r-a"), vec!["live".to_string()]);
    // Again: it is gone, and the CLI says so and fails.
    let again = Command::new(BIN)
        .args(["delete", "big", "--hub", &hub.ws(), "--token", "w-a"])
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("unknown run"));
    // Its place under the run limit is free.
    let mut third = RawCollector::connect(&hub);
    third.send(hello("third", Some("w")));
    assert!(matches!(third.recv(), Some(FromHub::Welcome(_))));
    // Its pages left the file (incremental vacuum, once the WAL is checkpointed).
    let after = wait_for("the space returned", Duration::from_secs(20), || {
        let now = db_bytes(&hub);
        (now < before / 10).then_some(now)
    });
    println!("database: {before} bytes with the run, {after} after deleting it");

    // Durable: after a restart it is still gone, and a new run of that id starts empty.
    drop(third);
    assert!(live.finish(Outcome::Finished).delivered);
    // Ended, the live run may go too (through the API); that frees the place a new `big`
    // takes below.
    let (status, body) = delete(&hub.addr(), "live", Some("w-a"));
    assert_eq!(
        (status, &body["deleted"]),
        (200, &serde_json::json!(true)),
        "{body}"
    );
    hub.kill9();
    hub.restart();
    assert_eq!(
        http_get(&hub.addr(), "/api/runs/big", Some("r-a")).status,
        404
    );
    let again = started_run(&hub, "a", "big", Some("w-a"));
    again.log(7, &[("loss", 2.0)]);
    assert!(again.finish(Outcome::Finished).delivered);
    let r = http_get(&hub.addr(), "/api/runs/big", Some("r-a"));
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["records"], 1, "{v}");
    let csv = http_get(&hub.addr(), "/api/runs/big/metrics.csv", Some("r-a")).text();
    assert_eq!(csv.lines().count(), 2, "{csv}");
}

#[test]
fn retention_deletes_only_ended_runs_beyond_each_projects_rule() {
    let hub = Hub::start(&["--retain", "keep=2", "--retain", "old=2s"]);
    let mut viewer = Viewer::connect(&hub);
    let running = started_run(&hub, "old", "old-running", None);
    running.log(0, &[("loss", 1.0)]);
    running.flush();
    for (project, id) in [
        ("keep", "k1"),
        ("keep", "k2"),
        ("other", "x1"),
        ("old", "o1"),
    ] {
        finished_run(&hub, project, id, None, 10);
        std::thread::sleep(Duration::from_millis(50));
    }
    // The third of `keep` to end takes the first's place at once (at its end).
    finished_run(&hub, "keep", "k3", None, 10);
    let ids = || -> Vec<String> {
        let mut ids: Vec<String> = hub.json("/api/runs")["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["run_id"].as_str().unwrap().to_string())
            .collect();
        ids.sort();
        ids
    };
    wait_for("k1 and o1 deleted", Duration::from_secs(20), || {
        let now = ids();
        (!now.contains(&"k1".into()) && !now.contains(&"o1".into())).then_some(())
    });
    // A running run of a project whose rule is an age stays, however old.
    running.log(1, &[("loss", 1.0)]);
    running.flush();
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(ids(), ["k2", "k3", "old-running", "x1"]);
    assert!(viewer.pump(Duration::from_secs(5), |v| v.deleted.len() == 2));
    assert!(viewer.deleted.iter().all(|d| d.by == "retention"));
    assert!(running.finish(Outcome::Finished).delivered);
    wait_for(
        "the ended run of old deleted",
        Duration::from_secs(20),
        || (!ids().contains(&"old-running".into())).then_some(()),
    );
    assert_eq!(ids(), ["k2", "k3", "x1"]);
}

#[test]
fn bad_retention_rules_stop_the_hub_from_starting_with_why() {
    for (rule, why) in [
        ("keep", "PROJECT=RULE"),
        ("p=0", "at least 1"),
        ("p=3w", "neither"),
    ] {
        let out = Command::new("timeout")
            .args([
                "20",
                BIN,
                "serve",
                "--bind",
                "127.0.0.1:0",
                "--retain",
                rule,
            ])
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && said.contains(why),
            "{rule}: {said}"
        );
    }
}

/// The page deletes a run that ended: the button, its confirmation, and the run leaves the
/// list of this page and of another page watching it, which says who deleted it.
#[test]
fn a_run_is_deleted_from_the_page_and_leaves_every_page() {
    let hub = Hub::start(&[]);
    finished_run(&hub, "web", "doomed", None, 50);
    finished_run(&hub, "web", "kept", None, 50);
    let url = format!("http://{}/?lang=en&runs=doomed", hub.addr());
    let mut other = Browser::open(&url);
    let mut page = Browser::open(&url);
    for p in [&mut other, &mut page] {
        p.wait(
            "the run panel's delete button",
            Duration::from_secs(20),
            "document.querySelector('[data-testid=delete]') != null",
        );
    }
    page.eval("document.querySelector('[data-testid=delete]').click()");
    page.wait(
        "the confirmation",
        Duration::from_secs(5),
        "document.querySelector('[data-testid=delete-confirm-box]') != null",
    );
    page.screenshot("page-delete-confirm");
    // Nothing is deleted before it is confirmed.
    assert_eq!(hub.get("/api/runs/doomed").status, 200);
    page.eval("document.querySelector('[data-testid=delete-confirm]').click()");
    for p in [&mut page, &mut other] {
        p.wait(
            "the run gone from the list",
            Duration::from_secs(10),
            "document.querySelector('tr.run[data-run-id=\"doomed\"]') == null \
             && document.querySelector('tr.run[data-run-id=\"kept\"]') != null",
        );
        let said = p.wait(
            "the deleted banner",
            Duration::from_secs(5),
            "(() => { const b = document.querySelector('[data-testid=deleted-banner]'); \
             return b ? b.textContent : ''; })()",
        );
        assert!(said.as_str().unwrap().contains("doomed"), "{said}");
    }
    assert_eq!(hub.get("/api/runs/doomed").status, 404);
}

/// The Python with pyarrow and DuckDB (`scripts/python-wheel` makes it).
fn readers_python() -> std::path::PathBuf {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv-readers/bin/python");
    assert!(
        p.exists(),
        "{} is missing: run scripts/python-wheel (it installs pyarrow and duckdb there)",
        p.display()
    );
    p
}

/// What the readers report of one exported run: rows, each metric's non-null count and an
/// order-sensitive sum of its values' bits (wrapping), and the run's project from the
/// file's metadata; DuckDB's view of all the files together.
const READ_PARQUET: &str = r#"
import json, sys
import duckdb, numpy as np, pyarrow.parquet as pq

out = {"files": {}}
for path in sys.argv[2:]:
    t = pq.read_table(path)
    meta = json.loads(t.schema.metadata[b"stepstream.run"])
    cols = {}
    for name in t.column_names[4:]:
        col = t.column(name)
        present = col.drop_null().to_numpy().astype(np.float64)
        bits = present.view(np.uint64)
        weights = np.arange(1, len(bits) + 1, dtype=np.uint64)
        cols[name] = [len(present), int(np.sum(bits * weights, dtype=np.uint64))]
    steps = t.column("step").to_numpy()
    out["files"][t.column("run_id")[0].as_py()] = {
        "rows": t.num_rows, "project": meta["project"], "columns": t.column_names,
        "metrics": cols, "first_step": int(steps[0]), "last_step": int(steps[-1]),
        "time_type": str(t.schema.field("time").type),
    }
glob = sys.argv[1] + "/*.parquet"
out["duckdb"] = duckdb.sql(
    f"SELECT run_id, count(*), count(loss), sum(step), "
    f"sum(CASE WHEN epoch_us(time) = round(timestamp * 1e6) THEN 0 ELSE 1 END) "
    f"FROM read_parquet('{glob}', union_by_name = true) GROUP BY run_id ORDER BY run_id"
).fetchall()
print(json.dumps(out))
"#;

/// Exported runs read back by pyarrow and DuckDB as they were logged: every value's bits
/// (NaN, the infinities, -0.0, subnormals), nulls where a step logged nothing, steps that go
/// back, and a metric named like a leading column; `--project` exports each of its runs.
#[test]
fn parquet_exports_are_read_exactly_by_pyarrow_and_duckdb() {
    let hub = Hub::start(&[]);
    let specials = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.0, 5e-324];
    // Per run, what it logged: each step and its values by name.
    type Logged = Vec<(i64, Vec<(&'static str, f64)>)>;
    let mut logged: std::collections::BTreeMap<&str, Logged> = Default::default();
    for (id, steps) in [("pq-long", 150_000i64), ("pq-short", 1_000)] {
        let run = started_run(&hub, "exp", id, None);
        let mut rows = Vec::new();
        for i in 0..steps {
            // A resume: the steps go back once.
            let step = if i < steps / 2 { i } else { i - steps / 4 };
            let mut values = vec![("loss", f64::from((2.0 / (1.0 + i as f64 * 1e-3)) as f32))];
            if i % 10 == 0 {
                values.push(("grad_norm", 1.0 + (i as f64).sin()));
            }
            if i % 1_000 == 7 {
                values.push(("odd", specials[(i / 1_000) as usize % specials.len()]));
            }
            if i % 3 == 0 {
                values.push(("step", i as f64 * 0.5));
            }
            run.log_at(step, 1.765e9 + i as f64 * 0.01, &values);
            rows.push((step, values));
        }
        assert!(run.finish(Outcome::Finished).delivered);
        logged.insert(id, rows);
    }
    finished_run(&hub, "elsewhere", "not-exported", None, 10);
    let dir = tempfile::tempdir().unwrap();
    let out = succeed(Command::new(BIN).args([
        "export",
        "--project",
        "exp",
        "--out",
        dir.path().to_str().unwrap(),
        "--hub",
        &hub.ws(),
    ]));
    println!("{}", String::from_utf8_lossy(&out.stdout));
    let mut files: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(files, ["pq-long.parquet", "pq-short.parquet"]);
    let read = Command::new(readers_python())
        .arg("-c")
        .arg(READ_PARQUET)
        .arg(dir.path())
        .args(files.iter().map(|f| dir.path().join(f)))
        .output()
        .unwrap();
    assert!(
        read.status.success(),
        "{}",
        String::from_utf8_lossy(&read.stderr)
    );
    let said: serde_json::Value = serde_json::from_slice(&read.stdout).unwrap();
    for (id, rows) in &logged {
        let file = &said["files"][id];
        assert_eq!(file["rows"], rows.len(), "{id}");
        assert_eq!(file["project"], "exp");
        assert_eq!(
            file["columns"],
            serde_json::json!([
                "run_id",
                "step",
                "timestamp",
                "time",
                "loss",
                "grad_norm",
                "step (metric)",
                "odd"
            ])
        );
        assert_eq!(file["time_type"], "timestamp[us, tz=UTC]");
        assert_eq!(file["first_step"], rows[0].0);
        assert_eq!(file["last_step"], rows.last().unwrap().0);
        for (metric, column) in [
            ("loss", "loss"),
            ("grad_norm", "grad_norm"),
            ("odd", "odd"),
            ("step", "step (metric)"),
        ] {
            let values: Vec<u64> = rows
                .iter()
                .filter_map(|(_, v)| {
                    v.iter()
                        .find(|(n, _)| *n == metric)
                        .map(|(_, x)| x.to_bits())
                })
                .collect();
            let sum = values.iter().enumerate().fold(0u64, |s, (i, b)| {
                s.wrapping_add(b.wrapping_mul(i as u64 + 1))
            });
            assert_eq!(
                file["metrics"][column],
                serde_json::json!([values.len(), sum]),
                "{id} {metric}"
            );
        }
    }
    // DuckDB reads both files as one table: per run, rows, non-null losses, the sum of the
    // steps, and no row whose `time` differs from its `timestamp`.
    let expect: Vec<serde_json::Value> = logged
        .iter()
        .map(|(id, rows)| {
            let sum: i64 = rows.iter().map(|r| r.0).sum();
            serde_json::json!([id, rows.len(), rows.len(), sum, 0])
        })
        .collect();
    assert_eq!(said["duckdb"], serde_json::json!(expect));
    // A run that is not there, or a token that may not read it: a clear refusal, no file.
    let missing = Command::new(BIN)
        .args([
            "export",
            "nope",
            "--out",
            dir.path().to_str().unwrap(),
            "--hub",
            &hub.ws(),
        ])
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("unknown run"));
    assert!(!dir.path().join("nope.parquet").exists());
}
