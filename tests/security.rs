//! Who may connect: the `Host` and `Origin` checks in front of every route (the hardening
//! issue; tokens are in `hub.rs`).

use crate::util::*;
use std::net::TcpStream;
use std::time::{Duration, Instant};

#[test]
fn a_foreign_origin_is_refused_on_both_sockets_and_the_api_and_allowed_ones_are_served() {
    let hub = Hub::start(&["--allow-origin", "https://wiki.example.org"]);
    let addr = hub.addr();
    let host = ("Host", addr.as_str());
    let own = format!("http://{addr}");
    for (path, upgrade, ok) in [
        ("/ws/viewer", true, 101),
        ("/ws/collector", true, 101),
        ("/api/runs", false, 200),
        ("/", false, 200),
    ] {
        let evil = http_status(
            &addr,
            path,
            &[host, ("Origin", "http://evil.example")],
            upgrade,
        );
        assert_eq!(evil, 403, "{path} from a foreign page");
        let other_port = format!("http://127.0.0.1:{}", hub.port + 1);
        let near = http_status(&addr, path, &[host, ("Origin", &other_port)], upgrade);
        assert_eq!(near, 403, "{path} from another port of the same machine");
        assert_eq!(
            http_status(&addr, path, &[host, ("Origin", &own)], upgrade),
            ok,
            "{path} from the hub's own page"
        );
        assert_eq!(
            http_status(
                &addr,
                path,
                &[host, ("Origin", "https://wiki.example.org")],
                upgrade
            ),
            ok,
            "{path} from an allowed page"
        );
        assert_eq!(
            http_status(&addr, path, &[host], upgrade),
            ok,
            "{path} from a non-browser client"
        );
    }
    // The refusal says why.
    let r = http_request(
        &addr,
        "GET",
        "/api/runs",
        &[("Origin", "http://evil.example")],
    );
    assert!(
        r.status == 403 && r.text().contains("allow-origin"),
        "{}",
        r.text()
    );
}

#[test]
fn a_foreign_host_is_refused_and_the_hubs_names_are_served() {
    // A name other than loopback's means clients from beyond it: without tokens the hub
    // refuses to start, unless told the network is trusted.
    let db = tempfile::tempdir().unwrap();
    let refused = std::process::Command::new("timeout")
        .args(["20", BIN, "serve", "--bind", "127.0.0.1:0", "--db"])
        .arg(db.path().join("hub.db"))
        .args(["--allow-host", "hub.lab.internal"])
        .env_remove("STEPSTREAM_WRITE_TOKEN")
        .env_remove("STEPSTREAM_READ_TOKEN")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && said.contains("without tokens"),
        "{said}"
    );
    let hub = Hub::start(&["--allow-host", "hub.lab.internal", "--insecure-no-auth"]);
    let addr = hub.addr();
    let port = hub.port;
    for (host, ok) in [
        ("evil.example".to_string(), false),
        (format!("evil.example:{port}"), false),
        (format!("127.0.0.1:{}", port + 1), false),
        (addr.clone(), true),
        (format!("localhost:{port}"), true),
        ("hub.lab.internal".to_string(), true),
    ] {
        for path in ["/api/runs", "/"] {
            let got = http_status(&addr, path, &[("Host", &host)], false);
            assert_eq!(got == 200, ok, "Host {host} on {path}: {got}");
        }
        let ws = http_status(&addr, "/ws/viewer", &[("Host", &host)], true);
        assert_eq!(ws == 101, ok, "Host {host} on the viewer socket: {ws}");
    }
}

#[test]
fn percent_encoded_tokens_work_in_the_query_and_on_the_viewer_socket() {
    // A base64 token: `+`, `/` and `=` travel percent-encoded in a URL.
    let token = "q+Zx/8Ab==";
    let hub = Hub::start(&["--write-token", "w", "--read-token", token]);
    let addr = hub.addr();
    let encoded = "q%2BZx%2F8Ab%3D%3D";
    let host = ("Host", addr.as_str());
    assert_eq!(
        http_status(&addr, &format!("/api/runs?token={encoded}"), &[host], false),
        200
    );
    assert_eq!(
        http_status(&addr, &format!("/ws/viewer?token={encoded}"), &[host], true),
        101
    );
    // Decoded, `+` is a space: the raw token in a URL is a different token.
    assert_eq!(
        http_status(&addr, &format!("/api/runs?token={token}"), &[host], false),
        401
    );
    assert_eq!(
        http_status(&addr, "/api/runs?token=wrong", &[host], false),
        401
    );
}

#[test]
fn before_a_hello_is_accepted_only_a_small_frame_is_read() {
    use stepstream_protocol::*;
    let hub = Hub::start(&["--write-token", "w", "--read-token", "r"]);
    // A megabyte before any hello: refused undecoded, with the reason, and the socket closed.
    let mut c = RawCollector::connect(&hub);
    let mut big = ToHub::Heartbeat(Heartbeat { wall_time: 0.0 }).encode();
    big.resize(1 << 20, 0);
    c.send_bytes(big);
    let Some(FromHub::HubError(e)) = c.recv() else {
        panic!("a refusal")
    };
    assert!(e.fatal && e.code == ErrorCode::ProtocolViolation, "{e:?}");
    assert!(e.message.contains("before an accepted hello"), "{e:?}");
    assert!(c.recv().is_none(), "closed");
    // A hello with a generous config still fits, and after it, large batches are welcome.
    let mut c = RawCollector::connect(&hub);
    let ToHub::Hello(mut h) = hello("big-config", Some("w")) else {
        unreachable!()
    };
    h.run.config_json = serde_json::json!({ "notes": "x".repeat(100_000) }).to_string();
    c.send(ToHub::Hello(h));
    assert!(matches!(c.recv(), Some(FromHub::Welcome(_))));
    c.send(ToHub::DefineMetrics(DefineMetrics {
        metrics: vec![MetricDef {
            id: MetricId(0),
            name: "loss".into(),
        }],
    }));
    let records: Vec<StepRecord> = (0..40_000)
        .map(|s| StepRecord {
            step: s,
            wall_time: 0.0,
            values: vec![(MetricId(0), 1.0)],
        })
        .collect();
    c.send(ToHub::Batch(Batch {
        seq: 1,
        records,
        items: Vec::new(),
    }));
    assert!(matches!(
        c.recv(),
        Some(FromHub::Ack(Ack {
            through_seq: 1,
            items_refused: 0
        }))
    ));
}

#[test]
fn no_token_or_webhook_secret_reaches_the_logs() {
    use stepstream_collector::{Collector, Options, Outcome};
    let dir = tempfile::tempdir().unwrap();
    let closed = free_port(); // nothing listens: every delivery fails with a transport error
    let alerts = dir.path().join("alerts.toml");
    std::fs::write(
        &alerts,
        format!(
            "attempts = 2\n\
             [[channels]]\nkind = \"dingtalk\"\nurl = \"http://127.0.0.1:{closed}/robot/send?access_token=TOKSECRET1\"\nsecret = \"SECSECRET2\"\n\
             [[channels]]\nkind = \"wecom\"\nurl = \"http://127.0.0.1:{closed}/cgi-bin/webhook/send?key=KEYSECRET3\"\n\
             [[channels]]\nkind = \"slack\"\nurl = \"http://127.0.0.1:{closed}/services/T0/B0/SLACKSECRET4\"\n"
        ),
    )
    .unwrap();
    let port = free_port();
    let log = dir.path().join("hub.log");
    let mut hub = std::process::Command::new(BIN)
        .args(["serve", "--bind", &format!("127.0.0.1:{port}"), "--db"])
        .arg(dir.path().join("hub.db"))
        .arg("--alerts")
        .arg(&alerts)
        .env("RUST_LOG", "debug")
        .env("STEPSTREAM_WRITE_TOKEN", "WRITESECRET5")
        .env("STEPSTREAM_READ_TOKEN", "READSECRET6")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let url = format!("ws://127.0.0.1:{port}");
    wait_for("the hub", Duration::from_secs(20), || {
        TcpStream::connect(format!("127.0.0.1:{port}")).ok()
    });
    // A collector with a wrong token, then the right one, and a NaN that fires an alert.
    let mut wrong = Options::new(&url, "p", "wrong");
    wrong.token = Some("WRONGSECRET7".into());
    let refused = Collector::start(wrong).unwrap();
    refused.log(0, &[("loss", 1.0)]);
    let mut o = Options::new(&url, "p", "nan");
    o.token = Some("WRITESECRET5".into());
    let run = Collector::start(o).unwrap();
    for step in 0..5 {
        run.log(step, &[("loss", if step == 3 { f64::NAN } else { 1.0 })]);
    }
    assert!(run.finish(Outcome::Finished).delivered);
    let text = wait_for("three channels to give up", Duration::from_secs(30), || {
        let text = std::fs::read_to_string(&log).ok()?;
        (text.matches("giving up").count() >= 3).then_some(text)
    });
    // It can never deliver: give it a moment, not the default finish timeout.
    let report = refused.finish_shared(Outcome::Finished, Duration::from_millis(200));
    assert!(!report.delivered);
    let _ = hub.kill();
    let _ = hub.wait();
    assert!(
        text.contains("127.0.0.1"),
        "the logs still say where delivery failed:\n{text}"
    );
    for secret in [
        "TOKSECRET1",
        "SECSECRET2",
        "KEYSECRET3",
        "SLACKSECRET4",
        "WRITESECRET5",
        "READSECRET6",
        "WRONGSECRET7",
        "sign=",
    ] {
        assert!(!text.contains(secret), "{secret} in the logs:\n{text}");
    }
}

#[test]
fn tokens_can_come_from_files_and_stay_out_of_the_command_line() {
    use stepstream_collector::{Collector, Options, Outcome};
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("write"), "file-write-token\n").unwrap();
    std::fs::write(dir.path().join("read"), "  file-read-token \n").unwrap();
    let w = dir.path().join("write").display().to_string();
    let r = dir.path().join("read").display().to_string();
    let hub = Hub::start(&["--write-token-file", &w, "--read-token-file", &r]);
    let mut o = Options::new(&hub.ws(), "p", "from-file");
    o.token = Some("file-write-token".into());
    let run = Collector::start(o).unwrap();
    run.log(0, &[("loss", 1.0)]);
    assert!(run.finish(Outcome::Finished).delivered);
    let addr = hub.addr();
    let host = ("Host", addr.as_str());
    assert_eq!(http_status(&addr, "/api/runs", &[host], false), 401);
    assert_eq!(
        http_status(&addr, "/api/runs?token=file-read-token", &[host], false),
        200
    );
    // What `ps` shows of the hub holds no token.
    let pids = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok()?.parse::<u32>().ok());
    let ours: Vec<String> = pids
        .filter_map(|p| std::fs::read(format!("/proc/{p}/cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&r))
        .collect();
    assert_eq!(ours.len(), 1, "{ours:?}");
    assert!(!ours[0].contains("file-read-token") && !ours[0].contains("file-write-token"));
    // A missing file is a clear error at start.
    let out = std::process::Command::new(BIN)
        .args([
            "serve",
            "--bind",
            "127.0.0.1:0",
            "--read-token-file",
            "/nonexistent/token",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read the token file"));
}

#[test]
fn scoped_tokens_write_and_read_only_their_projects_and_runs() {
    use stepstream_collector::{Collector, Options, Outcome};
    use stepstream_protocol::*;
    let hub = Hub::start_with_tokens(
        "[[tokens]]\ntoken = \"vision-writer\"\naccess = \"write\"\nprojects = [\"vision\"]\n\
         [[tokens]]\ntoken = \"nlp-reader\"\naccess = \"read\"\nprojects = [\"nlp\"]\n\
         [[tokens]]\ntoken = \"one-run\"\naccess = \"read\"\nruns = [\"the-run\"]\n",
        &[],
    );
    let write = |token: &str, project: &str, id: &str| {
        let mut o = Options::new(&hub.ws(), project, id);
        o.token = Some(token.into());
        o.run_id = Some(RunId::new(id).unwrap());
        let run = Collector::start(o).unwrap();
        run.log(0, &[("loss", 1.0)]);
        run.finish_shared(Outcome::Finished, Duration::from_secs(5))
            .delivered
    };
    // A per-project write token writes its project only; the refusal says which project.
    assert!(write("vision-writer", "vision", "v-1"));
    assert!(!write("vision-writer", "nlp", "n-refused"));
    let mut c = RawCollector::connect(&hub);
    let ToHub::Hello(mut h) = hello("n-raw", Some("vision-writer")) else {
        unreachable!()
    };
    h.run.project = "nlp".into();
    c.send(ToHub::Hello(h));
    let Some(FromHub::HubError(e)) = c.recv() else {
        panic!("refused")
    };
    assert!(
        e.code == ErrorCode::Unauthorized && e.message.contains("\"nlp\""),
        "{e:?}"
    );
    assert!(write("w", "nlp", "n-1"));
    assert!(write("w", "nlp", "the-run"));
    assert!(write("w", "audio", "a-1"));

    let addr = hub.addr();
    let get = |path: &str, token: &str| http_get(&addr, path, Some(token));
    let listed = |token: &str| -> Vec<String> {
        let v: serde_json::Value = serde_json::from_slice(&get("/api/runs", token).body).unwrap();
        let mut ids: Vec<String> = v["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["run_id"].as_str().unwrap().to_string())
            .collect();
        ids.sort();
        ids
    };
    assert_eq!(listed("r"), ["a-1", "n-1", "the-run", "v-1"]);
    assert_eq!(listed("nlp-reader"), ["n-1", "the-run"]);
    assert_eq!(listed("one-run"), ["the-run"]);
    assert_eq!(
        listed("vision-writer"),
        ["v-1"],
        "a write token reads what it writes"
    );
    // Another run is refused (403: run ids are addresses, the data is what is kept), a
    // missing one unknown: detail, series, CSV, config, alerts.
    for path in [
        "",
        "/series?metric=loss",
        "/metrics.csv",
        "/config.json",
        "/alerts",
    ] {
        assert_eq!(
            get(&format!("/api/runs/a-1{path}"), "nlp-reader").status,
            403,
            "{path}"
        );
        assert_eq!(
            get(&format!("/api/runs/no-such-run{path}"), "nlp-reader").status,
            404,
            "{path}"
        );
        assert_eq!(
            get(&format!("/api/runs/n-1{path}"), "nlp-reader").status,
            200,
            "{path}"
        );
        assert_eq!(
            get(&format!("/api/runs/n-1{path}"), "one-run").status,
            403,
            "{path}"
        );
    }
    // The viewer socket: the list holds the token's runs; another run cannot be followed.
    let mut viewer = Viewer::connect_with_token(&hub, "one-run");
    assert!(viewer.pump(Duration::from_secs(5), |v| !v.run_list.is_empty()));
    let ids: Vec<String> = viewer
        .run_list
        .iter()
        .map(|r| r.run_id.to_string())
        .collect();
    assert_eq!(ids, ["the-run"]);
    viewer.subscribe(
        &[RunId::new("a-1").unwrap(), RunId::new("the-run").unwrap()],
        None,
    );
    let the_run = RunId::new("the-run").unwrap();
    assert!(viewer.pump(Duration::from_secs(5), |v| v
        .runs
        .get(&the_run)
        .is_some_and(|s| s.backfill_done)
        && !v.errors.is_empty()));
    assert_eq!(viewer.errors[0].code, ErrorCode::UnknownRun);
    assert!(!viewer.runs.contains_key(&RunId::new("a-1").unwrap()));
    // Live updates of other runs do not reach it either.
    assert!(write("w", "audio", "a-2"));
    std::thread::sleep(Duration::from_millis(300));
    viewer.pump(Duration::from_millis(300), |_| false);
    assert!(
        viewer
            .run_list
            .iter()
            .all(|r| r.run_id.as_str() == "the-run"),
        "{:?}",
        viewer.run_list
    );
}

/// A connection that sends nothing, or its headers a byte at a time, is closed within the
/// hub's header-read timeout (10 s) instead of holding a task forever.
#[test]
fn connections_that_send_nothing_or_only_part_of_a_head_are_closed() {
    use std::io::{Read, Write};
    let hub = Hub::start(&[]);
    let silent = std::net::TcpStream::connect(hub.addr()).unwrap();
    let mut partial = std::net::TcpStream::connect(hub.addr()).unwrap();
    partial
        .write_all(b"GET /api/runs HTTP/1.1\r\nHost: ")
        .unwrap();
    let started = Instant::now();
    for mut s in [silent, partial] {
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut buf = [0u8; 1024];
        // Closed: a read returns 0 (or an error once reset), well before 20 s.
        let closed = loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break started.elapsed(),
                Ok(_) => continue,
            }
        };
        assert!(closed < Duration::from_secs(15), "open for {closed:?}");
    }
    // Whoever sends a whole request is served as before.
    assert_eq!(hub.get("/api/runs").status, 200);
}
