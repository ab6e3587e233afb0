//! What the hub says must be true: a write token stays in its project (a resume neither
//! crosses projects nor rewrites the stored run), revoking a token closes what it opened,
//! the tokens file is private, and names that would forge what surrounds them are refused.

use crate::util::*;
use std::time::{Duration, Instant};
use stepstream_protocol::*;

fn hello_in(run_id: &str, project: &str, name: &str, config: &str, token: &str) -> ToHub {
    let mut run = identity(run_id, name);
    run.project = project.into();
    run.config_json = config.into();
    ToHub::Hello(Hello {
        protocol: codec::VERSION,
        token: Some(token.into()),
        run,
        writer: 7,
        acked_through: 0,
    })
}

/// The answer to a hello: `Ok` for a welcome, the error otherwise.
fn answer(hub: &Hub, hello: ToHub) -> Result<Welcome, HubError> {
    let mut c = RawCollector::connect(hub);
    c.send(hello);
    match c.recv() {
        Some(FromHub::Welcome(w)) => Ok(w),
        Some(FromHub::HubError(e)) => Err(e),
        other => panic!("expected Welcome or HubError, got {other:?}"),
    }
}

/// A write token scoped to `vision` once appended to a run of `audio`, renamed it and moved
/// it into `vision`, whose readers then read its whole history.
#[test]
fn a_write_token_neither_resumes_another_projects_run_nor_rewrites_a_stored_one() {
    let mut hub = Hub::start_with_tokens(
        "[[tokens]]\ntoken = \"vision-writer\"\naccess = \"write\"\nprojects = [\"vision\"]\n\
         [[tokens]]\ntoken = \"vision-reader\"\naccess = \"read\"\nprojects = [\"vision\"]\n",
        &[],
    );
    answer(
        &hub,
        hello_in("a-1", "audio", "original", r#"{"lr":1}"#, "w"),
    )
    .unwrap();
    // The vision token naming the run's own project is not allowed to write it ...
    let e = answer(&hub, hello_in("a-1", "audio", "x", "{}", "vision-writer")).unwrap_err();
    assert_eq!(e.code, ErrorCode::Unauthorized, "{e:?}");
    // ... and naming its own project cannot move the run there.
    let e = answer(
        &hub,
        hello_in("a-1", "vision", "moved", r#"{"lr":9}"#, "vision-writer"),
    )
    .unwrap_err();
    assert_eq!(e.code, ErrorCode::Unauthorized, "{e:?}");
    assert!(e.message.contains("belongs to project \"audio\""), "{e:?}");
    // Not even the global token moves it, and a resume keeps the stored name and config.
    assert!(answer(&hub, hello_in("a-1", "vision", "m", "{}", "w")).is_err());
    answer(
        &hub,
        hello_in("a-1", "audio", "renamed", r#"{"lr":2}"#, "w"),
    )
    .unwrap();
    for round in ["live", "after a restart"] {
        let run: serde_json::Value =
            serde_json::from_slice(&http_get(&hub.addr(), "/api/runs/a-1", Some("r")).body)
                .unwrap();
        assert_eq!(run["project"], "audio", "{round}");
        assert_eq!(run["name"], "original", "{round}");
        assert_eq!(run["config"]["lr"], 1, "{round}");
        let listed = http_get(&hub.addr(), "/api/runs", Some("vision-reader")).text();
        assert!(!listed.contains("a-1"), "{round}: {listed}");
        hub.restart();
    }
}

/// Revoking a token (its entry removed, the file emptied, deleted, or edited to the same
/// length within a second) closes the sockets it opened within a second and refuses it after.
#[test]
fn a_revoked_token_closes_its_sockets_and_a_gone_file_keeps_no_token_alive() {
    let scoped = "[[tokens]]\ntoken = \"tw-1\"\naccess = \"write\"\nprojects = [\"p\"]\n\
                  [[tokens]]\ntoken = \"tr-1\"\naccess = \"read\"\nprojects = [\"p\"]\n";
    let hub = Hub::start_with_tokens(scoped, &[]);
    let file = hub.tokens_file();
    let mut collector = RawCollector::connect(&hub);
    collector.send(hello_in("p-1", "p", "n", "{}", "tw-1"));
    assert!(matches!(collector.recv(), Some(FromHub::Welcome(_))));
    let mut viewer = Viewer::connect_with_token(&hub, "tr-1");
    assert!(viewer.pump(Duration::from_secs(5), |v| !v.run_list.is_empty()));

    // The same length, the same second: only the content tells.
    let revoked = Instant::now();
    std::fs::write(
        &file,
        scoped.replace("tw-1", "tw-2").replace("tr-1", "tr-2"),
    )
    .unwrap();
    match collector.recv() {
        Some(FromHub::HubError(e)) => assert_eq!(e.code, ErrorCode::Unauthorized, "{e:?}"),
        other => panic!("the collector socket stays open: {other:?}"),
    }
    assert!(viewer.pump(Duration::from_secs(3), |v| v.closed));
    assert!(
        revoked.elapsed() < Duration::from_millis(1500),
        "closed after {:?}",
        revoked.elapsed()
    );
    assert!(viewer
        .errors
        .iter()
        .any(|e| e.code == ErrorCode::Unauthorized));
    let status = |token: &str| http_get(&hub.addr(), "/api/runs", Some(token)).status;
    assert_eq!(status("tr-1"), 401);
    assert_eq!(status("tr-2"), 200);
    assert!(answer(&hub, hello_in("p-2", "p", "n", "{}", "tw-2")).is_ok());

    // Deleted: none of its tokens stays in force, and the hub stays guarded.
    std::fs::remove_file(&file).unwrap();
    wait_for(
        "the deleted file's tokens to go",
        Duration::from_secs(3),
        || (status("tr-2") == 401).then_some(()),
    );
    assert_eq!(http_get(&hub.addr(), "/api/runs", None).status, 401);
    assert_eq!(status("r"), 200, "the global tokens stay");
    let e = answer(&hub, hello_in("p-3", "p", "n", "{}", "tw-2")).unwrap_err();
    assert_eq!(e.code, ErrorCode::Unauthorized);
    assert!(
        answer(&hub, hello_in("p-3", "p", "n", "{}", "")).is_err(),
        "an emptied or deleted tokens file never opens writes"
    );
}

/// `stepstream token` makes the tokens file private, even one created by hand.
#[test]
fn the_tokens_file_is_private_after_every_write() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens.toml");
    std::fs::write(&file, "").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    succeed(std::process::Command::new(BIN).args([
        "token",
        "--tokens",
        file.to_str().unwrap(),
        "--project",
        "p",
    ]));
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{mode:o}");
}

/// A NUL in a name wedged a PostgreSQL run's group commits, and a line feed or an escape
/// forges log lines and labels: control characters are refused at the door, with the reason.
#[test]
fn names_with_control_characters_are_refused_with_a_clear_error() {
    let hub = Hub::start(&[]);
    for (project, name) in [("a\0b", "n"), ("p", "line\nfeed"), ("p", "esc\u{1b}[31m")] {
        let mut h = identity("c-1", name);
        h.project = project.into();
        let e = answer(
            &hub,
            ToHub::Hello(Hello {
                protocol: codec::VERSION,
                token: None,
                run: h,
                writer: 1,
                acked_through: 0,
            }),
        )
        .unwrap_err();
        assert_eq!(e.code, ErrorCode::Limit, "{e:?}");
        assert!(e.message.contains("control character"), "{e:?}");
    }
    let mut c = RawCollector::connect(&hub);
    c.send(hello("c-2", None));
    assert!(matches!(c.recv(), Some(FromHub::Welcome(_))));
    c.send(ToHub::DefineMetrics(DefineMetrics {
        metrics: vec![MetricDef {
            id: MetricId(0),
            name: "lo\0ss".into(),
        }],
    }));
    match c.recv() {
        Some(FromHub::HubError(e)) => assert!(e.message.contains("control character"), "{e:?}"),
        other => panic!("{other:?}"),
    }
    // The collector keeps to it: the value is counted refused, the others are stored.
    let run = stepstream_collector::Collector::start(stepstream_collector::Options::new(
        &hub.ws(),
        "p",
        "n",
    ))
    .unwrap();
    run.log(0, &[("ok", 1.0), ("bad\nname", 2.0)]);
    let report = run.finish(stepstream_collector::Outcome::Finished);
    assert!(report.delivered);
    assert_eq!(report.refused, 1);
    assert_eq!(
        report.stored,
        [("ok".to_string(), 1), ("bad\nname".to_string(), 0)]
    );
}

/// `tail` and `import` read the write token from a file (a command line is visible to every
/// user of the machine), and a token the hub refuses ends them with the reason instead of
/// retrying forever.
#[test]
fn tail_takes_its_token_from_a_file_and_stops_when_refused() {
    let hub = Hub::start_with_tokens("", &[]);
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("m.csv");
    append(&csv, "step,loss\n1,0.5\n2,0.25\n");
    let good = dir.path().join("good");
    std::fs::write(&good, "w\n").unwrap();
    let bad = dir.path().join("bad");
    std::fs::write(&bad, "nope\n").unwrap();
    let tail = |token_file: &std::path::Path, by_env: bool, id: &str| {
        let mut c = std::process::Command::new("timeout");
        c.args([
            "30",
            BIN,
            "tail",
            "--no-follow",
            "--hub",
            &hub.ws(),
            "--run-id",
            id,
        ])
        .arg(&csv)
        .env_remove("STEPSTREAM_WRITE_TOKEN");
        if by_env {
            c.env("STEPSTREAM_WRITE_TOKEN_FILE", token_file);
        } else {
            c.arg("--token-file").arg(token_file);
        }
        c.output().unwrap()
    };
    for (by_env, id) in [(false, "by-flag"), (true, "by-env")] {
        let out = tail(&good, by_env, id);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let run: serde_json::Value = serde_json::from_slice(
            &http_get(&hub.addr(), &format!("/api/runs/{id}"), Some("r")).body,
        )
        .unwrap();
        assert_eq!(run["records"], 2);
    }
    let started = Instant::now();
    let out = tail(&bad, false, "refused");
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("refuses this run (Unauthorized)"), "{said}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
}

/// A reconnecting viewer once asked for "steps after the highest step held", and the hub cut
/// live batches the same way: a late evaluation at an earlier step, or a resumed run that
/// rewinds, was lost for the rest of the subscription. It resumes by batch sequence number.
#[test]
fn a_resubscription_gets_late_and_rewound_points_after_what_it_holds_exactly_once() {
    use stepstream_collector::{Collector, Options, Outcome};
    let hub = Hub::start(&[]);
    let run = Collector::start(Options::new(&hub.ws(), "p", "rewinds")).unwrap();
    for s in 0..100 {
        run.log(s, &[("loss", s as f64)]);
    }
    run.flush();
    let id = run.run_id().clone();
    wait_for(
        "the first 100 steps stored",
        Duration::from_secs(20),
        || (hub.run_json(id.as_str())?["records"] == 100).then_some(()),
    );
    let mut first = Viewer::connect(&hub);
    first.subscribe(std::slice::from_ref(&id), None);
    assert!(first.pump(Duration::from_secs(20), |v| v
        .runs
        .get(&id)
        .is_some_and(|s| s.count("loss") == 100)));
    let held = first.runs[&id].through_seq;
    drop(first);
    // While it is away: an evaluation at an earlier step, then a rewind (a resumed run).
    run.log(50, &[("eval_loss", 0.5)]);
    run.flush();
    std::thread::sleep(Duration::from_millis(100));
    for s in 60..80 {
        run.log(s, &[("loss", -(s as f64))]);
    }
    run.flush();
    std::thread::sleep(Duration::from_millis(300));
    let mut again = Viewer::connect(&hub);
    again.subscribe_after(std::slice::from_ref(&id), held);
    // And live, after it resubscribed: another late evaluation.
    assert!(again.pump(Duration::from_secs(5), |v| v
        .runs
        .get(&id)
        .is_some_and(|s| s.count("loss") == 20)));
    run.log(10, &[("eval_loss", 0.25)]);
    assert!(run.finish(Outcome::Finished).delivered);
    assert!(
        again.pump(Duration::from_secs(20), |v| v.runs.get(&id).is_some_and(
            |s| s.count("eval_loss") == 2 && s.status == Some(RunStatus::Finished)
        ))
    );
    let seen = &again.runs[&id];
    let loss = &seen.points["loss"];
    assert_eq!(loss.len(), 20, "only what came after the held batches");
    assert!(loss
        .iter()
        .all(|(s, (n, v))| (60..80).contains(s) && *n == 1 && *v == -(*s as f64)));
    let eval = &seen.points["eval_loss"];
    assert_eq!(eval.get(&50), Some(&(1, 0.5)));
    assert_eq!(eval.get(&10), Some(&(1, 0.25)));
}
