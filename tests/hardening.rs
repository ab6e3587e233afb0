//! Never stuck, never lost: each test drives the real binary into a corner a review found
//! (wide records, resumes, a second writer, a hub that lost data, a damaged spool, slow
//! readers, limits) and checks that nothing acknowledged is lost and nothing wedges.

use crate::util::*;
use std::time::{Duration, Instant};
use stepstream_collector::{Collector, Options, Outcome};
use stepstream_protocol::*;

fn options(hub: &Hub, name: &str) -> Options {
    Options::new(&hub.ws(), "tests", name)
}

fn series_len(hub: &Hub, run: &RunId, metric: &str) -> usize {
    let s = hub.json(&format!(
        "/api/runs/{run}/series?metric={metric}&budget=100000"
    ));
    s["steps"].as_array().map_or(0, |a| a.len())
}

/// ~700+ metrics per record once made a backlog batch bigger than the frame limit: the
/// collector reconnected every 100 ms forever. Batches are now sealed by size too.
#[test]
fn a_wide_backlog_after_an_outage_is_delivered_without_a_reconnect_loop() {
    let port = free_port();
    let mut o = Options::new(&format!("ws://127.0.0.1:{port}"), "tests", "wide");
    o.memory_records = 1_000_000;
    let run = Collector::start(o).unwrap();
    let id = run.run_id().clone();
    let names: Vec<String> = (0..800).map(|i| format!("layer{i}/grad_norm")).collect();
    for step in 0..2500i64 {
        let values: Vec<(&str, f64)> = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.as_str(), (step + i as i64) as f64))
            .collect();
        run.log(step, &values);
    }
    // 2,500 records x 800 values is ~26 MB: one count-sealed batch would pass the 16 MiB
    // frame limit.
    let hub = Hub::start_on(port, &[]);
    let report = run.finish_shared(Outcome::Finished, Duration::from_secs(120));
    assert!(report.delivered, "{report:?} {:?}", run.last_error());
    let detail = hub.run_json(id.as_str()).unwrap();
    assert_eq!(detail["records"], 2500, "{report:?}");
    assert_eq!(series_len(&hub, &id, "layer799%2Fgrad_norm"), 2500);
}

/// A 260-metric run's history once overflowed one frame and the page showed nothing.
#[test]
fn a_wide_runs_history_reaches_a_viewer_in_bounded_chunks() {
    let hub = Hub::start(&[]);
    let run = Collector::start(options(&hub, "wide-history")).unwrap();
    let id = run.run_id().clone();
    let names: Vec<String> = (0..300).map(|i| format!("m{i}")).collect();
    for step in 0..4000i64 {
        let values: Vec<(&str, f64)> = names.iter().map(|n| (n.as_str(), step as f64)).collect();
        run.log(step, &values);
    }
    assert!(run.finish(Outcome::Finished).delivered);
    // Budgeted (the web app's way) and raw: every frame decodes (the harness panics on one
    // above the frame limit) and every point arrives once.
    for budget in [Some(4000), None] {
        let mut viewer = Viewer::connect(&hub);
        viewer.subscribe(std::slice::from_ref(&id), budget);
        assert!(viewer.pump(Duration::from_secs(60), |v| v
            .runs
            .get(&id)
            .is_some_and(|s| s.backfill_done)));
        let seen = &viewer.runs[&id];
        assert_eq!(
            seen.most_series_per_backfill, 1,
            "one metric per history frame"
        );
        assert_eq!(seen.points.len(), 300, "{budget:?}");
        assert!(seen.points.values().all(|p| p.len() == 4000), "{budget:?}");
        assert!(names.iter().all(|n| seen.duplicates(n).is_empty()));
    }
}

/// A resumed run whose metrics first appear in another order used to be refused
/// ("metric id redefined") and reconnect in a loop.
#[test]
fn a_resumed_run_with_metrics_in_another_order_continues() {
    let hub = Hub::start(&[]);
    let first = Collector::start(options(&hub, "resume")).unwrap();
    let id = first.run_id().clone();
    for step in 0..10 {
        first.log(step, &[("loss", 1.0), ("lr", 0.1)]);
    }
    assert!(first.finish(Outcome::Finished).delivered);
    let mut o = options(&hub, "resume");
    o.run_id = Some(id.clone());
    let second = Collector::start(o).unwrap();
    for step in 10..20 {
        second.log(step, &[("acc", 0.5), ("lr", 0.01), ("loss", 2.0)]);
    }
    let report = second.finish_shared(Outcome::Finished, Duration::from_secs(20));
    assert!(report.delivered, "{report:?} {:?}", second.last_error());
    let loss = hub.json(&format!("/api/runs/{id}/series?metric=loss"));
    let values: Vec<f64> = serde_json::from_value(loss["values"].clone()).unwrap();
    assert_eq!(values.len(), 20);
    assert_eq!(
        (values[9], values[10]),
        (1.0, 2.0),
        "each value under its own name"
    );
    let lr = hub.json(&format!("/api/runs/{id}/series?metric=lr"));
    assert_eq!(lr["values"][15], 0.01);
    assert_eq!(series_len(&hub, &id, "acc"), 10);
}

/// Two collectors on one run id both reported "all acknowledged" while one lost its data.
#[test]
fn a_second_live_writer_is_refused_and_says_why() {
    let hub = Hub::start(&[]);
    let first = Collector::start(options(&hub, "one")).unwrap();
    let id = first.run_id().clone();
    first.log(0, &[("loss", 1.0)]);
    first.flush();
    assert!(first.wait_welcome(Duration::from_secs(10)).is_some());
    let mut o = options(&hub, "two");
    o.run_id = Some(id.clone());
    let second = Collector::start(o).unwrap();
    second.log(0, &[("loss", 99.0)]);
    let report = second.finish_shared(Outcome::Finished, Duration::from_secs(3));
    assert!(
        !report.delivered,
        "a second writer must not be told all is stored"
    );
    let why = second.last_error().unwrap_or_default();
    assert!(why.contains("another collector"), "{why}");
    for step in 1..50 {
        first.log(step, &[("loss", 1.0)]);
    }
    assert!(first.finish(Outcome::Finished).delivered);
    let loss = hub.json(&format!("/api/runs/{id}/series?metric=loss"));
    let values: Vec<f64> = serde_json::from_value(loss["values"].clone()).unwrap();
    assert_eq!(values.len(), 50);
    assert!(
        values.iter().all(|&v| v == 1.0),
        "the second writer's data is not mixed in"
    );
}

/// A hub whose database was replaced (restored from an older copy, or lost) used to wedge
/// the collector: it resent from its last acknowledged batch and got `SequenceGap` forever.
#[test]
fn a_hub_that_lost_acknowledged_data_says_so_and_the_collector_continues() {
    let mut hub = Hub::start(&[]);
    let run = Collector::start(options(&hub, "restored")).unwrap();
    let id = run.run_id().clone();
    for step in 0..100 {
        run.log(step, &[("loss", step as f64)]);
    }
    run.flush();
    wait_for("the first 100 stored", Duration::from_secs(10), || {
        (hub.run_json(id.as_str())?["records"] == 100).then_some(())
    });
    // A copy of the database as it is now (the file and its write-ahead log).
    let backup = hub.dir.path().join("backup");
    std::fs::create_dir(&backup).unwrap();
    let db = hub.db.clone();
    let files = |dir: &std::path::Path| {
        ["hub.db", "hub.db-wal"].map(|f| (db.with_file_name(f), dir.join(f)))
    };
    for (live, copy) in files(&backup) {
        std::fs::copy(live, copy).unwrap();
    }
    for step in 100..200 {
        run.log(step, &[("loss", step as f64)]);
    }
    run.flush();
    wait_for(
        "200 stored and acknowledged",
        Duration::from_secs(10),
        || {
            (hub.run_json(id.as_str())?["records"] == 200 && run.acknowledged() == 200)
                .then_some(())
        },
    );
    // The hub dies and comes back on the older copy: batches it acknowledged are gone.
    hub.kill9();
    let _ = std::fs::remove_file(db.with_file_name("hub.db-shm"));
    for (live, copy) in files(&backup) {
        std::fs::copy(copy, live).unwrap();
    }
    hub.restart();
    for step in 200..300 {
        run.log(step, &[("loss", step as f64)]);
    }
    let report = run.finish_shared(Outcome::Finished, Duration::from_secs(30));
    assert!(report.delivered, "{report:?} {:?}", run.last_error());
    assert!(run.last_error().unwrap_or_default().contains("lost"));
    let loss = hub.json(&format!("/api/runs/{id}/series?metric=loss"));
    let steps: Vec<i64> = serde_json::from_value(loss["steps"].clone()).unwrap();
    assert_eq!(steps.len(), 200, "what the collector still held arrived");
    assert_eq!((steps[99], steps[100]), (99, 200));
    let alerts = wait_for("the data-loss alert", Duration::from_secs(10), || {
        let a = hub.json(&format!("/api/runs/{id}/alerts"));
        let list = a["alerts"].as_array()?.clone();
        list.into_iter().find(|a| a["rule"] == "data_loss")
    });
    assert!(alerts["message"].as_str().unwrap().contains("lost"));
}

/// A spool read error used to drop the spooled batches and leave a sequence gap that the
/// hub refused forever. Now the loss is counted and said, and the rest is delivered.
#[test]
fn a_damaged_spool_loses_only_itself_and_never_wedges_the_sender() {
    let port = free_port();
    let spool_dir = tempfile::tempdir().unwrap();
    let mut o = Options::new(&format!("ws://127.0.0.1:{port}"), "tests", "spool");
    o.memory_records = 100;
    o.max_batch = 50;
    o.spool_dir = Some(spool_dir.path().to_path_buf());
    let run = Collector::start(o).unwrap();
    let id = run.run_id().clone();
    for step in 0..1000 {
        run.log(step, &[("loss", step as f64)]);
    }
    let spool = wait_for("a spool file", Duration::from_secs(10), || {
        let e = std::fs::read_dir(spool_dir.path()).ok()?.flatten().next()?;
        (e.metadata().ok()?.len() > 10_000).then(|| e.path())
    });
    let len = std::fs::metadata(&spool).unwrap().len() as usize;
    std::fs::write(&spool, vec![0xA5; len]).unwrap();
    let hub = Hub::start_on(port, &[]);
    for step in 1000..1100 {
        run.log(step, &[("loss", step as f64)]);
    }
    let report = run.finish_shared(Outcome::Finished, Duration::from_secs(30));
    assert!(report.delivered, "{report:?} {:?}", run.last_error());
    assert!(report.lost > 0, "{report:?}");
    assert!(run.last_error().unwrap_or_default().contains("spool"));
    let detail = hub.run_json(id.as_str()).unwrap();
    assert_eq!(
        detail["records"].as_u64().unwrap() + report.lost,
        1100,
        "everything not in the damaged spool arrived"
    );
}

/// Viewers that never read once pinned a blocking thread and a read transaction each, then
/// cost ~10.7 MB each (an 8 MiB queue, a history page of 50,000 points and the socket's
/// write buffer on top): now at most 8 MiB each, all told.
#[test]
fn viewers_that_never_read_cost_at_most_8_mib_each_and_block_nobody() {
    let hub = Hub::start(&[]);
    let run = Collector::start(options(&hub, "big")).unwrap();
    let id = run.run_id().clone();
    let names: Vec<String> = (0..10).map(|i| format!("m{i}")).collect();
    for step in 0..100_000i64 {
        let values: Vec<(&str, f64)> = names.iter().map(|n| (n.as_str(), step as f64)).collect();
        run.log(step, &values);
    }
    assert!(
        run.finish_shared(Outcome::Finished, Duration::from_secs(60))
            .delivered
    );
    let pid = hub.pid();
    let before = rss_mb(pid);
    // Forty viewers ask for the raw history (~25 MB of frames each) and never read.
    let mut stuck = Vec::new();
    for _ in 0..40 {
        let mut s = std::net::TcpStream::connect(hub.addr()).unwrap();
        raw_subscribe(&mut s, &hub, &id);
        stuck.push(s);
    }
    // They fill their queues (a few seconds of reading on two cores), then stall: from then
    // on the hub is idle however long they stay, and answers everyone else at once.
    wait_until_idle(pid, Duration::from_secs(30));
    let t = Instant::now();
    let list = hub.get("/api/runs");
    assert_eq!(list.status, 200);
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    let mut reader = Viewer::connect(&hub);
    reader.subscribe(std::slice::from_ref(&id), None);
    assert!(reader.pump(Duration::from_secs(60), |v| v
        .runs
        .get(&id)
        .is_some_and(|s| s.backfill_done)));
    assert_eq!(reader.runs[&id].count("m9"), 100_000);
    let grown = rss_mb(pid) - before;
    eprintln!(
        "hub RSS grew {grown:.1} MB for 40 viewers that never read: {:.2} MB each",
        grown / 40.0
    );
    // Unbounded queues held each viewer's whole history: ~1 GB here.
    let mib = 1024.0 * 1024.0 / 1e6;
    assert!(
        grown / 40.0 < 8.0 * mib,
        "hub memory grew {grown:.0} MB for 40 stuck viewers"
    );
    drop(stuck);
}

/// A client that asks for a long answer (a CSV download, a series at a large budget) and
/// stops reading once held the connection, and everything its answer holds, for ever: now
/// the hub closes it once it has taken nothing for the write stall (`--limit
/// write_stall_s`, 2 s here), and the client never gets the rest.
#[test]
fn a_client_that_stops_reading_an_answer_is_dropped_after_the_write_stall() {
    use std::io::{Read, Write};
    let hub = Hub::start(&["--limit", "write_stall_s=2"]);
    let run = Collector::start(options(&hub, "long")).unwrap();
    let id = run.run_id().clone();
    for step in 0..300_000i64 {
        let v = step as f64 * 1.000_001;
        run.log(
            step,
            &[("m0", v), ("m1", -v), ("m2", v / 3.0), ("m3", v / 7.0)],
        );
    }
    assert!(
        run.finish_shared(Outcome::Finished, Duration::from_secs(60))
            .delivered
    );
    for path in [
        format!("/api/runs/{id}/metrics.csv"),
        format!("/api/runs/{id}/series?metric=m0&budget=1000000"),
    ] {
        // What a reader that keeps reading gets.
        let whole = hub.get(&path);
        assert_eq!(whole.status, 200);
        let full = whole.body.len();
        assert!(full > 10_000_000, "{path}: {full} bytes only");
        let mut s = std::net::TcpStream::connect(hub.addr()).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            hub.addr()
        )
        .unwrap();
        std::thread::sleep(Duration::from_secs(6));
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut got = Vec::new();
        let outcome = s.read_to_end(&mut got);
        assert!(
            got.len() < full,
            "{path}: a reader that stalled for 6 s still got all {} bytes ({outcome:?})",
            got.len()
        );
    }
}

/// CPU ticks (user + system) a process has used.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // After the command name's closing parenthesis: state is field 3; utime, stime 14, 15.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// Waits (at most `limit`) until the process used under a tenth of a core for half a second:
/// its stuck clients have stopped costing it anything.
fn wait_until_idle(pid: u32, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let before = cpu_ticks(pid);
        std::thread::sleep(Duration::from_millis(500));
        // 100 ticks per second: 5 ticks in 0.5 s is a tenth of a core.
        let used = cpu_ticks(pid) - before;
        assert!(
            Instant::now() < deadline,
            "the hub stays busy: {used} ticks per 0.5 s"
        );
        if used < 5 {
            return;
        }
    }
}

fn rss_mb(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<f64>()
        .unwrap()
        / 1024.0
}

/// A viewer socket opened by hand (a WebSocket handshake and one Subscribe frame) whose
/// reader never reads.
fn raw_subscribe(s: &mut std::net::TcpStream, hub: &Hub, run: &RunId) {
    use std::io::{Read, Write};
    write!(
        s,
        "GET /ws/viewer HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        hub.addr()
    )
    .unwrap();
    let mut head = [0u8; 12];
    s.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 101");
    let payload = FromViewer::Subscribe(Subscribe {
        runs: vec![run.clone()],
        metrics: None,
        from_step: None,
        budget: None,
        after_seq: None,
        items: false,
    })
    .encode();
    // A masked binary frame (clients must mask); the mask is zero, so bytes go as they are.
    let mut frame = vec![0x82u8];
    if payload.len() < 126 {
        frame.push(0x80 | payload.len() as u8);
    } else {
        frame.push(0x80 | 126);
        frame.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    }
    frame.extend_from_slice(&[0, 0, 0, 0]);
    frame.extend_from_slice(&payload);
    s.write_all(&frame).unwrap();
}

#[test]
fn connection_and_budget_limits_are_refused_with_reasons() {
    let hub = Hub::start(&[
        "--limit",
        "connections_per_addr=3",
        "--limit",
        "viewer_budget=500",
    ]);
    let mut viewers: Vec<Viewer> = (0..3).map(|_| Viewer::connect(&hub)).collect();
    let host = [("Host", hub.addr())];
    let host: Vec<(&str, &str)> = host.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let status = http_status(&hub.addr(), "/ws/viewer", &host, true);
    assert_eq!(status, 429, "a fourth socket from one address is refused");
    let v = &mut viewers[0];
    v.subscribe(&[RunId::new("x").unwrap()], Some(100_000));
    assert!(v.pump(Duration::from_secs(5), |v| !v.errors.is_empty()));
    assert_eq!(v.errors[0].code, ErrorCode::Limit);
    assert!(v.errors[0].message.contains("viewer_budget"));
    drop(viewers);
    // Freed slots are usable again.
    wait_for("a free slot", Duration::from_secs(5), || {
        (http_status(&hub.addr(), "/ws/viewer", &host, true) == 101).then_some(())
    });
}

#[test]
fn bad_durations_are_refused_at_start_not_panicked_on() {
    for (flag, value) in [
        ("--stale-after", "inf"),
        ("--fail-after", "NaN"),
        ("--stale-after", "-1"),
    ] {
        let out = std::process::Command::new(BIN)
            .args(["serve", "--bind", "127.0.0.1:0", &format!("{flag}={value}")])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{flag} {value}: {err}");
        assert!(err.contains(flag) && !err.contains("panicked"), "{err}");
    }
}

/// A hub refusing the run (a limit below the collector's) must not make `finish` hang or the
/// collector spin: it backs off and `finish` returns by its timeout.
#[test]
fn finish_returns_by_its_timeout_in_every_state() {
    let hub = Hub::start(&["--limit", "name_bytes=4"]);
    let mut o = options(&hub, "a-name-longer-than-four-bytes");
    o.queue_capacity = 16;
    let run = Collector::start(o).unwrap();
    for step in 0..10_000 {
        run.log(step, &[("loss", 1.0)]);
    }
    let t = Instant::now();
    let report = run.finish_shared(Outcome::Finished, Duration::from_millis(800));
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    assert!(!report.delivered);
    assert!(run.last_error().unwrap_or_default().contains("name_bytes"));
}

/// A filesystem of its own, unmounted when dropped.
struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    /// `None` where mounting is not allowed (not root): the caller says it skipped.
    fn mount(size: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(Tmpfs(dir))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .args(["-l"])
            .arg(self.0.path())
            .status();
    }
}

/// Disk full: the hub stops acknowledging and says why, keeps serving reads; the collector
/// keeps its data; when space returns ingestion resumes with nothing lost.
#[test]
fn a_full_disk_stops_acknowledging_keeps_reading_and_loses_nothing() {
    let Some(fs) = Tmpfs::mount("24m") else {
        eprintln!("SKIPPED a_full_disk_...: cannot mount a tmpfs here (needs root)");
        return;
    };
    let db = fs.0.path().join("hub.db");
    let hub = Hub::start_with(free_port(), db, tempfile::tempdir().unwrap(), &[]);
    let run = Collector::start(options(&hub, "disk")).unwrap();
    let id = run.run_id().clone();
    let names: Vec<String> = (0..20).map(|i| format!("m{i}")).collect();
    let log = |from: i64, to: i64| {
        for step in from..to {
            let values: Vec<(&str, f64)> =
                names.iter().map(|n| (n.as_str(), step as f64)).collect();
            run.log(step, &values);
        }
        run.flush();
    };
    log(0, 1000);
    wait_for("the first records stored", Duration::from_secs(20), || {
        (hub.run_json(id.as_str())?["records"] == 1000).then_some(())
    });
    // Fill the filesystem to the last byte.
    let filler = fs.0.path().join("filler");
    let _ = std::process::Command::new("dd")
        .args(["if=/dev/zero", "bs=1M"])
        .arg(format!("of={}", filler.display()))
        .stderr(std::process::Stdio::null())
        .status();
    log(1000, 30_000);
    let refused = wait_for("a storage refusal", Duration::from_secs(30), || {
        let e = run.last_error()?;
        e.contains("Storage").then_some(e)
    });
    assert!(
        refused.contains("not stored") || refused.contains("database"),
        "{refused}"
    );
    let stored = hub.run_json(id.as_str()).unwrap()["records"]
        .as_u64()
        .unwrap();
    assert!(
        stored < 30_000,
        "everything fit; the test did not fill the disk"
    );
    // Reads go on while writes fail.
    assert_eq!(hub.get("/api/runs").status, 200);
    assert_eq!(series_len(&hub, &id, "m0").min(1000), 1000);
    std::fs::remove_file(&filler).unwrap();
    let report = run.finish_shared(Outcome::Finished, Duration::from_secs(90));
    assert!(report.delivered, "{report:?} {:?}", run.last_error());
    assert_eq!(hub.run_json(id.as_str()).unwrap()["records"], 30_000);
    assert_eq!(series_len(&hub, &id, "m19"), 30_000);
    drop(hub);
    drop(fs);
}

/// SIGKILLs of the hub at random moments while four collectors stream: every record arrives
/// exactly once. `STEPSTREAM_KILLS` sets the count (default 25 here; `scripts/kill-test`
/// runs 1,000).
#[test]
fn sigkill_storm_loses_and_doubles_nothing() {
    let kills: u32 = std::env::var("STEPSTREAM_KILLS")
        .ok()
        .and_then(|k| k.parse().ok())
        .unwrap_or(25);
    let mut hub = Hub::start(&[]);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let run = Collector::start(options(&hub, &format!("storm-{w}"))).unwrap();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut step = 0i64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    run.log(step, &[("loss", 1.0 / (1.0 + step as f64)), ("lr", 1e-3)]);
                    step += 1;
                    if step % 10 == 0 {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
                (run, step)
            })
        })
        .collect();
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    println!("sigkill storm: {kills} kills, seed {seed}");
    let started = Instant::now();
    for _ in 0..kills {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        std::thread::sleep(Duration::from_millis(20 + seed % 280));
        hub.restart();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        let (run, steps) = w.join().unwrap();
        let id = run.run_id().clone();
        let report = run.finish_shared(Outcome::Finished, Duration::from_secs(60));
        assert!(report.delivered, "{report:?} {:?}", run.last_error());
        assert_eq!(report.dropped, 0);
        let detail = hub.run_json(id.as_str()).unwrap();
        assert_eq!(detail["records"], steps, "{id}: stored records");
        // Every stored row, in storage order: each step once, none missing.
        let csv = hub.get(&format!("/api/runs/{id}/metrics.csv"));
        let (_, rows) = parse_csv(&csv.text());
        let got: Vec<i64> = rows.iter().map(|r| r[0].parse().unwrap()).collect();
        assert_eq!(got.len() as i64, steps, "{id}: rows stored");
        if let Some(i) = (0..got.len()).find(|&i| got[i] != i as i64) {
            panic!(
                "{id}: row {i} holds step {} (a step lost or doubled)",
                got[i]
            );
        }
    }
    println!(
        "sigkill storm: {kills} kills in {:.0} s, nothing lost or doubled",
        started.elapsed().as_secs_f64()
    );
}

/// A connection's batches go to the store before the earlier ones commit. A batch refused
/// amid them must leave exactly the batches before it stored and acknowledged, none after;
/// a connection dropped with batches in flight must leave the run's tail what is stored, so
/// the resend that follows is taken exactly once.
#[test]
fn batches_in_flight_are_stored_in_order_and_nothing_after_a_refused_one() {
    let hub = Hub::start(&[]);
    let now = unix_now();
    let batch = |seq: u64, metric: u32| {
        ToHub::Batch(Batch {
            seq,
            records: vec![StepRecord {
                step: seq as i64,
                wall_time: now,
                values: vec![(MetricId(metric), seq as f64)],
            }],
            items: Vec::new(),
        })
    };
    let connect = |last: u64| {
        let mut c = RawCollector::connect(&hub);
        c.send(hello("pipelined", None));
        let Some(FromHub::Welcome(w)) = c.recv() else {
            panic!("no welcome")
        };
        assert!(w.last_seq <= last, "{} > {last}", w.last_seq);
        c.send(ToHub::DefineMetrics(DefineMetrics {
            metrics: vec![MetricDef {
                id: MetricId(0),
                name: "loss".into(),
            }],
        }));
        (c, w.last_seq)
    };
    // Until the hub closes: the highest acknowledgement, and the error.
    let read_all = |c: &mut RawCollector| {
        let (mut acked, mut error) = (0, None);
        while let Some(frame) = c.recv() {
            match frame {
                FromHub::Ack(a) => acked = acked.max(a.through_seq),
                FromHub::HubError(e) => error = Some(e),
                FromHub::FinishAck(_) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        (acked, error)
    };

    // 40 batches without waiting; the 21st names a metric never defined.
    let (mut c, _) = connect(0);
    for seq in 1..=40 {
        c.send(batch(seq, if seq == 21 { 9 } else { 0 }));
    }
    let (acked, error) = read_all(&mut c);
    let error = error.expect("the refusal");
    assert!(
        error.fatal && error.message.contains("batch 21"),
        "{error:?}"
    );
    assert_eq!(
        acked, 20,
        "everything before the refused batch, acknowledged"
    );
    assert_eq!(hub.run_json("pipelined").unwrap()["records"], 20);

    // 21..=80 sent, and the socket dropped at once with whatever is in flight.
    let (mut c, last) = connect(20);
    assert_eq!(last, 20);
    for seq in 21..=80 {
        c.send(batch(seq, 0));
    }
    drop(c);
    // The collector resends from what the hub says it has: each batch is stored once.
    let (mut c, last) = wait_for("a welcome after the drop", Duration::from_secs(10), || {
        let (c, last) = connect(80);
        Some((c, last))
    });
    for seq in last + 1..=80 {
        c.send(batch(seq, 0));
    }
    c.send(ToHub::Finish(Finish {
        status: FinishStatus::Finished,
        wall_time: now,
    }));
    let (acked, error) = read_all(&mut c);
    assert!(error.is_none(), "{error:?}");
    assert!(acked == 80 || last == 80, "acknowledged through {acked}");
    let run = hub.run_json("pipelined").unwrap();
    assert_eq!(run["records"], 80);
    assert_eq!(run["status"], "finished");
    let loss = hub.json("/api/runs/pipelined/series?metric=loss&budget=100000");
    let steps = series_steps(&loss);
    assert_eq!(
        steps,
        (1..=80).collect::<Vec<i64>>(),
        "each batch once, in order"
    );
}

/// A collector socket opened by hand, up to its 101 (the handshake's response read whole).
fn raw_collector_socket(hub: &Hub) -> std::net::TcpStream {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(hub.addr()).unwrap();
    write!(
        s,
        "GET /ws/collector HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        hub.addr()
    )
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    s
}

/// Sockets that each send a little less than the per-socket pre-hello limit, as one
/// fragmented message of small frames, could add up to a gigabyte (4,096 of 256 KiB): now
/// they share one budget (`--limit prehello_bytes`, 4 MiB here); the socket past it is
/// refused with the reason, its bytes are given back when it closes, and the hub's memory
/// stays near the budget.
#[test]
fn sockets_sending_small_frames_before_a_hello_share_one_budget() {
    use std::io::{Read, Write};
    let hub = Hub::start(&[
        "--write-token",
        "w",
        "--read-token",
        "r",
        "--limit",
        "prehello_bytes=4194304",
    ]);
    let pid = hub.pid();
    let before = rss_mb(pid);
    // A binary message begun and never finished: frames of 1,000 bytes, the first without
    // FIN, then continuations; 200 frames per socket (~200 KiB, under the 256 KiB limit).
    let frame = |opcode: u8| {
        let mut f = vec![opcode, 0x80 | 126];
        f.extend_from_slice(&1000u16.to_be_bytes());
        f.extend_from_slice(&[0, 0, 0, 0]);
        f.extend(std::iter::repeat_n(b'x', 1000));
        f
    };
    let mut message = frame(0x02);
    for _ in 1..200 {
        message.extend(frame(0x00));
    }
    let mut socks = Vec::new();
    let mut refused = None;
    for i in 0..60 {
        let mut s = raw_collector_socket(&hub);
        let _ = s.write_all(&message);
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let mut reply = [0u8; 512];
        if let Ok(n @ 1..) = s.read(&mut reply) {
            let text = String::from_utf8_lossy(&reply[..n]).to_string();
            if refused.is_none() && text.contains("prehello_bytes") {
                refused = Some(i);
            }
        }
        socks.push(s);
    }
    let refused = refused.expect("no socket was refused for the shared pre-hello budget");
    // 4 MiB of ~200 KiB messages: about the twenty-first is the first refused.
    assert!(
        (15..=25).contains(&refused),
        "the first refused was socket {refused}"
    );
    let grown = rss_mb(pid) - before;
    eprintln!("hub RSS grew {grown:.1} MB with 60 sockets of ~200 KiB each before a hello");
    assert!(grown < 40.0, "hub memory grew {grown:.0} MB");
    // Their bytes are given back as they close: a collector gets in.
    drop(socks);
    std::thread::sleep(Duration::from_millis(500));
    let mut o = options(&hub, "after-budget");
    o.token = Some("w".into());
    let run = Collector::start(o).unwrap();
    run.log(0, &[("loss", 1.0)]);
    assert!(run.finish(Outcome::Finished).delivered);
    let stored = http_get(&hub.addr(), "/api/runs", Some("r"));
    assert!(stored.text().contains("after-budget"));
}

/// Forty sockets that each began a 15 MiB frame once made the hub hold ~630 MB before any
/// hello: now a frame announcing more than a hello needs is refused as its header arrives,
/// with the reason, and a thousand such sockets cost the hub little.
#[test]
fn sockets_starting_huge_frames_before_a_hello_are_refused_at_the_header() {
    use std::io::{Read, Write};
    let hub = Hub::start(&["--write-token", "w", "--read-token", "r"]);
    let pid = hub.pid();
    let before = rss_mb(pid);
    // A 16 MiB masked binary frame's header and its first 64 KiB.
    let mut start = vec![0x82u8, 0x80 | 127];
    start.extend_from_slice(&(16u64 << 20).to_be_bytes());
    start.extend_from_slice(&[0, 0, 0, 0]);
    start.extend(std::iter::repeat_n(0u8, 64 * 1024));
    let mut socks = Vec::new();
    let mut most = 0f64;
    for i in 0..1000 {
        let mut s = raw_collector_socket(&hub);
        // The header alone first: the refusal must not wait for the payload.
        s.write_all(&start[..14]).unwrap();
        if i == 0 {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut reply = [0u8; 512];
            let n = s.read(&mut reply).expect("a refusal before any payload");
            let text = String::from_utf8_lossy(&reply[..n]);
            assert!(text.contains("before an accepted hello"), "{text:?}");
        }
        let _ = s.write_all(&start[14..]);
        socks.push(s);
        if i % 100 == 99 {
            most = most.max(rss_mb(pid));
        }
    }
    let grown = most.max(rss_mb(pid)) - before;
    eprintln!("hub RSS {before:.1} MB before, at most {:.1} MB with 1,000 sockets each starting a 16 MiB frame", before + grown);
    assert!(grown < 100.0, "hub memory grew {grown:.0} MB");
    // The hub still serves everyone else.
    drop(socks);
    let mut o = options(&hub, "after");
    o.token = Some("w".into());
    let run = Collector::start(o).unwrap();
    run.log(0, &[("loss", 1.0)]);
    assert!(run.finish(Outcome::Finished).delivered);
}

/// "History goes out in chunks of one metric and at most 25,000 points": the raw path cut
/// pages at whole batches, so one batch of 80,000 records of one metric went out as one
/// series of 80,000 points.
#[test]
fn one_wide_batch_reaches_a_viewer_in_chunks_of_at_most_25000_points() {
    let hub = Hub::start(&[]);
    let mut c = RawCollector::connect(&hub);
    c.send(hello("wide-batch", None));
    assert!(matches!(c.recv(), Some(FromHub::Welcome(_))));
    c.send(ToHub::DefineMetrics(DefineMetrics {
        metrics: vec![MetricDef {
            id: MetricId(0),
            name: "loss".into(),
        }],
    }));
    let records: Vec<StepRecord> = (0..80_000)
        .map(|s| StepRecord {
            step: s,
            wall_time: 1_764_700_000.0 + s as f64,
            values: vec![(MetricId(0), s as f64)],
        })
        .collect();
    c.send(ToHub::Batch(Batch {
        seq: 1,
        records,
        items: Vec::new(),
    }));
    assert!(matches!(c.recv(), Some(FromHub::Ack(_))));
    let id = RunId::new("wide-batch").unwrap();
    let mut v = Viewer::connect(&hub);
    v.subscribe(std::slice::from_ref(&id), None);
    assert!(v.pump(Duration::from_secs(20), |v| v
        .runs
        .get(&id)
        .is_some_and(|s| s.backfill_done)));
    let seen = &v.runs[&id];
    assert_eq!(seen.count("loss"), 80_000);
    assert!(
        seen.most_points_per_series <= 25_000,
        "{}",
        seen.most_points_per_series
    );
}

/// `runs` runs named `{prefix}-N`, each of 50 metrics (the first `loss`) and one record,
/// streamed by hand (no acknowledgement awaited: a closed socket's batches in flight are
/// settled all the same), returned once the hub lists every one stored.
fn fill_runs(hub: &Hub, prefix: &str, runs: usize, within: Duration) {
    let metrics: Vec<MetricDef> = (0..50)
        .map(|i| MetricDef {
            id: MetricId(i),
            name: if i == 0 {
                "loss".into()
            } else {
                format!("metric_{i}")
            },
        })
        .collect();
    for r in 0..runs {
        let mut c = RawCollector::connect(hub);
        c.send(hello(&format!("{prefix}-{r}"), None));
        assert!(matches!(c.recv(), Some(FromHub::Welcome(_))));
        c.send(ToHub::DefineMetrics(DefineMetrics {
            metrics: metrics.clone(),
        }));
        c.send(ToHub::Batch(Batch {
            seq: 1,
            records: vec![StepRecord {
                step: 0,
                wall_time: 1_764_700_000.0,
                values: metrics.iter().map(|m| (m.id, 1.0)).collect(),
            }],
            items: Vec::new(),
        }));
    }
    wait_for("every run stored", within, || {
        let listed = hub.json("/api/runs");
        let all = listed["runs"].as_array()?;
        (all.len() == runs && all.iter().all(|r| r["records"] == 1)).then_some(())
    });
}

/// A viewer's run list was one frame of every run with all its last values: ten thousand runs
/// of fifty metrics are megabytes, more than a viewer's queue holds. It comes in pages of a
/// thousand runs with their headline values (loss-like names and lr).
#[test]
fn a_long_run_list_reaches_a_viewer_in_bounded_pages() {
    let hub = Hub::start(&[]);
    const RUNS: usize = 2_500;
    fill_runs(&hub, "list", RUNS, Duration::from_secs(60));
    let mut v = Viewer::connect(&hub);
    assert!(v.pump(Duration::from_secs(60), |v| v.run_lists > 0));
    assert_eq!(v.run_list.len(), RUNS);
    assert!(v.most_runs_per_page <= 1000, "{}", v.most_runs_per_page);
    let r = &v.run_list[0];
    assert_eq!(
        r.last_values,
        [("loss".to_string(), 1.0)],
        "headline values only"
    );
    // The full last values stay in the API.
    let detail = hub.json("/api/runs/list-0");
    assert_eq!(detail["last_values"].as_object().unwrap().len(), 50);
}

/// The run list's cost (not a test: `#[ignore]`, numbers printed), on a release build:
///
/// ```sh
/// cargo test --release --test e2e bench_run_list -- --ignored --nocapture
/// ```
///
/// 10,000 runs of 50 metrics, listed to 20 viewers connecting at once: the hub's CPU time and
/// memory for it, and each viewer's time to its whole list.
#[test]
#[ignore]
fn bench_run_list_of_10000_runs_to_20_viewers() {
    let hub = Hub::start(&[]);
    let pid = hub.pid();
    const RUNS: usize = 10_000;
    fill_runs(&hub, "bench", RUNS, Duration::from_secs(300));
    wait_until_idle(pid, Duration::from_secs(60));
    let (ticks, rss) = (cpu_ticks(pid), rss_mb(pid));
    let started = Instant::now();
    let viewers: Vec<_> = (0..20)
        .map(|_| {
            let hub_port = hub.port;
            std::thread::spawn(move || {
                let mut v = Viewer::connect_url(format!("ws://127.0.0.1:{hub_port}/ws/viewer"));
                let t = Instant::now();
                assert!(v.pump(Duration::from_secs(120), |v| v.run_lists > 0));
                assert_eq!(v.run_list.len(), RUNS);
                (t.elapsed(), v)
            })
        })
        .collect();
    let mut most = Duration::ZERO;
    let mut held = Vec::new();
    for v in viewers {
        let (took, v) = v.join().unwrap();
        most = most.max(took);
        held.push(v);
    }
    let wall = started.elapsed();
    let cpu_s = (cpu_ticks(pid) - ticks) as f64 / 100.0;
    eprintln!(
        "run list: {RUNS} runs x 50 metrics to 20 viewers: hub CPU {cpu_s:.2} s in {:.2} s of wall \
         time, RSS {rss:.1} -> {:.1} MB; slowest viewer had its whole list after {:.0} ms",
        wall.as_secs_f64(),
        rss_mb(pid),
        most.as_secs_f64() * 1000.0
    );
}

/// A viewer socket opened by hand with an `X-Forwarded-For`; its status line's code.
fn viewer_with_forwarded(hub: &Hub, forwarded: &str) -> (u16, std::net::TcpStream) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(hub.addr()).unwrap();
    write!(
        s,
        "GET /ws/viewer HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
         X-Forwarded-For: {forwarded}\r\n\r\n",
        hub.addr()
    )
    .unwrap();
    let mut head = [0u8; 12];
    s.read_exact(&mut head).unwrap();
    let code = String::from_utf8_lossy(&head[9..12]).parse().unwrap();
    (code, s)
}

/// Behind a proxy every client shares the proxy's address, and a forwarded address is only
/// a claim: the per-address limit keys on `X-Forwarded-For` from `--trusted-proxy`
/// addresses only.
#[test]
fn the_per_address_limit_trusts_forwarded_addresses_only_from_trusted_proxies() {
    let untrusting = Hub::start(&["--limit", "connections_per_addr=2"]);
    let mut held = Vec::new();
    for (forwarded, code) in [("10.0.0.1", 101), ("10.0.0.2", 101), ("10.0.0.3", 429)] {
        let (got, s) = viewer_with_forwarded(&untrusting, forwarded);
        assert_eq!(got, code, "{forwarded} claimed by an untrusted peer");
        held.push(s);
    }
    let trusting = Hub::start(&[
        "--limit",
        "connections_per_addr=2",
        "--trusted-proxy",
        "127.0.0.1",
    ]);
    for (forwarded, code) in [
        ("10.0.0.1", 101),
        ("10.0.0.2", 101),
        ("10.0.0.3", 101),
        // The proxy appends the address it saw: the last entry is the one that counts.
        ("192.0.2.9, 10.0.0.1", 101),
        ("10.0.0.1", 429),
    ] {
        let (got, s) = viewer_with_forwarded(&trusting, forwarded);
        assert_eq!(got, code, "{forwarded} through a trusted proxy");
        held.push(s);
    }
}
