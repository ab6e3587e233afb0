//! Three hubs as one: Debian's PostgreSQL (a throw-away cluster from `initdb`), Debian's
//! `nats-server`, and nginx balancing collectors over the hubs, as
//! `docs/cluster/nginx.conf` does. A collector streams through nginx to hub A, a viewer
//! watches on hub B; A is SIGKILLed mid-stream and the collector continues through another
//! hub; every point arrives once; one hub judges a silent run stale, so one alert is sent,
//! not three; hub C lists every run.

use crate::util::*;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use stepstream_collector::{Collector, Options, Outcome};
use stepstream_protocol::*;

const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

/// A throw-away PostgreSQL cluster in a temporary folder, stopped on drop.
pub struct Postgres {
    dir: tempfile::TempDir,
    pub port: u16,
}

/// Runs a PostgreSQL tool as the `postgres` user when we are root (`initdb` refuses root).
fn pg_command(tool: &str) -> Command {
    let bin = format!("{PG_BIN}/{tool}");
    assert!(
        Path::new(&bin).exists(),
        "{bin} is missing: scripts/test installs Debian's `postgresql` package"
    );
    let root = std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false);
    if root {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--", &bin]);
        c
    } else {
        Command::new(bin)
    }
}

impl Postgres {
    pub fn start() -> Postgres {
        let dir = tempfile::Builder::new().prefix("pg").tempdir().unwrap();
        // The server runs as `postgres` when we are root: it must own its folder.
        let _ = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(dir.path())
            .status();
        let data = dir.path().join("data");
        let ok = pg_command("initdb")
            .args(["-A", "trust", "-U", "postgres", "-E", "UTF8", "-D"])
            .arg(&data)
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(ok.success(), "initdb failed");
        let port = free_port();
        let opts = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c \
             max_connections=200",
            dir.path().display()
        );
        let ok = pg_command("pg_ctl")
            .args(["-w", "-D"])
            .arg(&data)
            .args(["-o", &opts, "-l"])
            .arg(dir.path().join("log"))
            .arg("start")
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(ok.success(), "pg_ctl start failed");
        Postgres { dir, port }
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Restarts the server (`pg_ctl restart -m fast`: every connection is cut).
    pub fn restart(&self) {
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200",
            self.port,
            self.dir.path().display()
        );
        let ok = pg_command("pg_ctl")
            .args(["-w", "-m", "fast", "-D"])
            .arg(self.dir.path().join("data"))
            .args(["-o", &opts, "-l"])
            .arg(self.dir.path().join("log"))
            .arg("restart")
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(ok.success(), "pg_ctl restart failed");
    }

    /// Runs one SQL statement with psql.
    pub fn sql(&self, statement: &str) {
        let ok = pg_command("psql")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                "-c",
            ])
            .arg(statement)
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(ok.success(), "psql {statement}");
    }

    /// One value a query returns, as psql prints it (`-At`).
    pub fn value(&self, query: &str) -> String {
        let out = pg_command("psql")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                "-At",
                "-c",
            ])
            .arg(query)
            .output()
            .unwrap();
        assert!(out.status.success(), "psql {query}");
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = pg_command("pg_ctl")
            .args(["-D"])
            .arg(self.dir.path().join("data"))
            .args(["-m", "immediate", "stop"])
            .stdout(Stdio::null())
            .status();
    }
}

/// Debian's `nats-server` on a free port, killed on drop.
pub struct Nats {
    child: Child,
    pub port: u16,
}

impl Nats {
    pub fn start() -> Nats {
        Nats::start_on(free_port())
    }

    pub fn start_on(port: u16) -> Nats {
        Nats::start_with(port, &[])
    }

    /// With extra arguments (`--user`, `--pass`: a server that wants credentials).
    pub fn start_with(port: u16, extra: &[&str]) -> Nats {
        // Debian puts it in /usr/sbin, which a non-root PATH may lack.
        let bin = ["/usr/sbin/nats-server", "/usr/bin/nats-server"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .unwrap_or("nats-server");
        let child = Command::new(bin)
            .args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server: scripts/test installs Debian's `nats-server` package");
        wait_for("nats-server", Duration::from_secs(10), || {
            TcpStream::connect(("127.0.0.1", port)).ok()
        });
        Nats { child, port }
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// nginx on `port` in front of `hubs`: the first takes every connection while it is up, the
/// others are its backups (so the test knows which hub the collector starts on).
fn balancer(port: u16, hubs: &[u16]) -> Nginx {
    let servers: Vec<String> = hubs
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let backup = if i == 0 { "" } else { " backup" };
            format!("    server 127.0.0.1:{p} max_fails=1 fail_timeout=30s{backup};")
        })
        .collect();
    nginx(port, &servers.join("\n"))
}

const STEPS: i64 = 6_000;

/// A collector streaming `STEPS` steps to `url` for a few seconds, on its own thread.
fn stream(url: &str, name: &str) -> (RunId, std::thread::JoinHandle<stepstream_collector::Report>) {
    let run = Collector::start(Options::new(url, "fleet", name)).unwrap();
    assert!(run.wait_welcome(Duration::from_secs(30)).is_some());
    let run_id = run.run_id().clone();
    let writer = std::thread::spawn(move || {
        for step in 0..STEPS {
            run.log(step, &[("loss", 1.0 / (1.0 + step as f64)), ("lr", 1e-3)]);
            if step % 20 == 0 {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        run.finish(Outcome::Finished)
    });
    (run_id, writer)
}

/// A viewer on `hub` subscribed to a run just created through another hub: at once, not
/// waiting for this hub to have heard of it (it looks in the shared store).
fn watch(hub: &Hub, run_id: &RunId) -> Viewer {
    let mut viewer = Viewer::connect(hub);
    viewer.subscribe(std::slice::from_ref(run_id), None);
    viewer
}

#[test]
fn three_hubs_share_postgres_and_nats_and_survive_losing_one() {
    let pg = Postgres::start();
    let nats = Nats::start();
    let hook = crate::rules::Receiver::start();
    let dir = tempfile::tempdir().unwrap();
    let alerts = dir.path().join("alerts.toml");
    std::fs::write(
        &alerts,
        format!(
            "[[channels]]\nkind = \"webhook\"\nurl = \"http://127.0.0.1:{}/hook\"\n",
            hook.port
        ),
    )
    .unwrap();
    let lb_port = free_port();
    let lb_host = format!("127.0.0.1:{lb_port}");
    let (store, bus) = (pg.url(), nats.url());
    let args: Vec<String> = [
        "--store",
        &store,
        "--nats",
        &bus,
        "--stale-after",
        "2",
        "--fail-after",
        "12",
        "--alerts",
        alerts.to_str().unwrap(),
        "--allow-host",
        &lb_host,
    ]
    .map(String::from)
    .to_vec();
    // Three hubs starting at once create the schema once (an advisory lock).
    let starts: Vec<_> = (0..3)
        .map(|_| {
            let args = args.clone();
            std::thread::spawn(move || {
                Hub::start_logged(&args.iter().map(String::as_str).collect::<Vec<_>>())
            })
        })
        .collect();
    let mut hubs: Vec<Hub> = starts.into_iter().map(|t| t.join().unwrap()).collect();
    let c = hubs.pop().unwrap();
    let b = hubs.pop().unwrap();
    let mut a = hubs.pop().unwrap();
    let _lb = balancer(lb_port, &[a.port, b.port, c.port]);

    // A collector streams through the balancer, which sends it to hub A.
    let (run_id, writer) = stream(&format!("ws://{lb_host}"), "through-a");
    // Hub B learns of the run through NATS; a viewer there takes history, then live.
    let mut viewer = watch(&b, &run_id);
    wait_for("the run a third in", Duration::from_secs(60), || {
        let last = b.run_json(run_id.as_str())?["last_step"].as_i64()?;
        (last >= STEPS / 3).then_some(())
    });
    assert!(
        a.logged().contains(run_id.as_str()),
        "the collector started on hub A"
    );
    a.kill9();
    let report = writer.join().unwrap();
    assert!(report.delivered, "{report:?}");
    assert_eq!(report.acked, STEPS as u64);

    // Every point once on hub B's viewer (its `Live` check refuses a repeated batch).
    let all = viewer.pump(Duration::from_secs(60), |v| {
        v.runs.get(&run_id).is_some_and(|s| {
            s.count("loss") == STEPS as usize && s.status == Some(RunStatus::Finished)
        })
    });
    let seen = &viewer.runs[&run_id];
    assert!(
        all,
        "hub B's viewer has {} of {STEPS} points, status {:?}",
        seen.count("loss"),
        seen.status
    );
    assert!(seen.duplicates("loss").is_empty());
    assert_eq!(seen.duplicates("lr"), Vec::<i64>::new());
    assert!(viewer.errors.is_empty(), "{:?}", viewer.errors);

    // Hub C, which no collector used, serves the whole run from the shared store, once it
    // has heard of the run's last batch (it learns of batches through NATS, after B).
    wait_for(
        "hub C to know the whole run",
        Duration::from_secs(30),
        || {
            let step = c.run_json(run_id.as_str())?["last_step"].as_i64()?;
            (step == STEPS - 1).then_some(())
        },
    );
    let csv = c.get(&format!("/api/runs/{run_id}/metrics.csv"));
    let (_, rows) = parse_csv(&csv.text());
    let steps: Vec<i64> = rows.iter().map(|r| r[0].parse().unwrap()).collect();
    assert_eq!(steps, (0..STEPS).collect::<Vec<_>>(), "every step once");

    // Range reads (zooming) on PostgreSQL are exact at the edges, across batch cuts.
    for (from, to) in [(63, 129), (0, 0), (STEPS - 1, STEPS - 1), (2_000, 4_000)] {
        let v = c.json(&format!(
            "/api/runs/{run_id}/series?metric=loss&from={from}&to={to}&budget=1000000"
        ));
        let steps = series_steps(&v);
        assert_eq!(steps, (from..=to).collect::<Vec<_>>(), "{from}..={to}");
        assert_eq!(v["downsampled"], false);
    }

    // A run whose collector on hub B sends only heartbeats: hub B judges it (the others
    // never see its heartbeats), so it stays running; silent, it turns stale once: one alert
    // stored and sent, not one per hub.
    let mut quiet = RawCollector::connect(&b);
    quiet.send(hello("quiet", None));
    assert!(matches!(quiet.recv(), Some(FromHub::Welcome(_))));
    for _ in 0..12 {
        std::thread::sleep(Duration::from_millis(500));
        quiet.send(ToHub::Heartbeat(Heartbeat {
            wall_time: unix_now(),
        }));
    }
    // A second collector on that live run, through another hub, is refused.
    let mut second = RawCollector::connect(&c);
    let ToHub::Hello(mut other) = hello("quiet", None) else {
        unreachable!()
    };
    other.writer = 8;
    second.send(ToHub::Hello(other));
    match second.recv() {
        Some(FromHub::HubError(e)) => assert_eq!(e.code, ErrorCode::Conflict, "{e:?}"),
        other => panic!("a second writer through hub C got {other:?}"),
    }
    let stale_alerts = |hub: &Hub| {
        let stored = hub.json("/api/runs/quiet/alerts");
        stored["alerts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["rule"] == "stale" && a["state"] == "fired")
            .count()
    };
    assert_eq!(c.run_json("quiet").unwrap()["status"], "running");
    assert_eq!(
        stale_alerts(&c),
        0,
        "a hub without the heartbeats judged the run"
    );
    wait_for(
        "the silent run stale on hub C",
        Duration::from_secs(20),
        || (c.run_json("quiet")?["status"] == "stale").then_some(()),
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(stale_alerts(&c), 1);
    assert_eq!(hook.count("stale", "fired"), 1, "stale notices sent");

    // Its judge dies: hub C takes the lease over and judges it failed at 12 s of silence.
    let mut b = b;
    b.kill9();
    wait_for(
        "hub C to judge the run failed",
        Duration::from_secs(30),
        || (c.run_json("quiet")?["status"] == "failed").then_some(()),
    );
    assert!(c.logged().contains("runs this hub judges"));

    // The web app served by hub C lists the runs written through A and B.
    let mut page = crate::browser::Browser::open(&format!("http://{}/?lang=en", c.addr()));
    page.wait(
        "both runs in hub C's run list",
        Duration::from_secs(20),
        &format!(
            "!!document.querySelector('tr.run[data-run-id=\"{run_id}\"]') && \
             !!document.querySelector('tr.run[data-run-id=\"quiet\"]')"
        ),
    );
    drop(quiet);

    // A restarted hub migrates nothing twice and serves the same runs.
    let mut c = c;
    c.restart();
    let listed = c.json("/api/runs")["runs"].as_array().unwrap().len();
    assert_eq!(listed, 2);
}

/// NATS goes away mid-stream and comes back: the viewer on the other hub still gets every
/// point exactly once (the hub reads what it missed from PostgreSQL).
#[test]
fn a_nats_outage_loses_no_point_for_viewers_on_other_hubs() {
    let pg = Postgres::start();
    let mut nats = Nats::start();
    let (store, bus) = (pg.url(), nats.url());
    let args = ["--store", &store, "--nats", &bus];
    let a = Hub::start(&args);
    let b = Hub::start(&args);
    let (run_id, writer) = stream(&a.ws(), "nats-outage");
    let mut viewer = watch(&b, &run_id);
    wait_for("the run a quarter in", Duration::from_secs(60), || {
        let last = a.run_json(run_id.as_str())?["last_step"].as_i64()?;
        (last >= STEPS / 4).then_some(())
    });
    let port = nats.port;
    drop(nats);
    std::thread::sleep(Duration::from_millis(1500));
    nats = Nats::start_on(port);
    let report = writer.join().unwrap();
    assert!(report.delivered, "{report:?}");
    let all = viewer.pump(Duration::from_secs(60), |v| {
        v.runs.get(&run_id).is_some_and(|s| {
            s.count("loss") == STEPS as usize && s.status == Some(RunStatus::Finished)
        })
    });
    let seen = &viewer.runs[&run_id];
    assert!(all, "hub B's viewer has {} of {STEPS}", seen.count("loss"));
    assert!(seen.duplicates("loss").is_empty());
    assert!(viewer.errors.is_empty(), "{:?}", viewer.errors);
    drop(nats);
}

/// A NATS server that wants credentials: the hub presents them from files (never from its
/// command line), and neither the password in a `nats://user:password@` URL nor one from a
/// file reaches its log or its error.
#[test]
fn hubs_authenticate_to_nats_and_keep_its_secrets_out_of_their_logs() {
    let pg = Postgres::start();
    let port = free_port();
    let _nats = Nats::start_with(port, &["--user", "hub", "--pass", "n4ts-s3cret"]);
    let dir = tempfile::tempdir().unwrap();
    let password = dir.path().join("nats-password");
    std::fs::write(&password, "n4ts-s3cret\n").unwrap();
    let store = pg.url();
    let bus = format!("nats://127.0.0.1:{port}");
    // From files: it joins, and a run streams through it.
    let a = Hub::start_logged(&[
        "--store",
        &store,
        "--nats",
        &bus,
        "--nats-user",
        "hub",
        "--nats-password-file",
        password.to_str().unwrap(),
    ]);
    // In the URL: it joins too, and says so without the password.
    let with_userinfo = format!("nats://hub:n4ts-s3cret@127.0.0.1:{port}");
    let b = Hub::start_logged(&["--store", &store, "--nats", &with_userinfo]);
    let (run_id, writer) = stream(&a.ws(), "nats-auth");
    assert!(writer.join().unwrap().delivered);
    let mut viewer = watch(&b, &run_id);
    assert!(viewer.pump(Duration::from_secs(30), |v| v
        .runs
        .get(&run_id)
        .is_some_and(|s| s.count("loss") == STEPS as usize)));
    for hub in [&a, &b] {
        let log = hub.logged();
        assert!(log.contains("joining the cluster through NATS"), "{log}");
        assert!(!log.contains("n4ts-s3cret"), "{log}");
    }
    // A wrong password: the hub does not start, and its error names no secret.
    let wrong = Command::new("timeout")
        .args([
            "60",
            BIN,
            "serve",
            "--bind",
            "127.0.0.1:0",
            "--store",
            &store,
        ])
        .args(["--nats", &format!("nats://hub:wr0ng-pw@127.0.0.1:{port}")])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&wrong.stderr);
    assert!(!wrong.status.success(), "{said}");
    assert!(!said.contains("wr0ng-pw"), "{said}");
}

/// The PostgreSQL writer once kept its dead connection after a server restart and refused
/// every write after it. Now it connects again (with backoff), `/api/health` says while it
/// cannot write, and nothing acknowledged is lost: its backends terminated, then the server
/// restarted, under a collector's load.
#[test]
fn a_restarted_postgres_loses_nothing_acknowledged_and_ingestion_resumes() {
    let pg = Postgres::start();
    let store = pg.url();
    let hub = Hub::start(&["--store", &store]);
    const N: i64 = 3_000;
    let mut run = Collector::start(Options::new(&hub.ws(), "fleet", "pg-restart")).unwrap();
    run.set_finish_timeout(Duration::from_secs(60));
    let run_id = run.run_id().clone();
    let writer = std::thread::spawn(move || {
        for step in 0..N {
            run.log(step, &[("loss", 1.0 / (1.0 + step as f64))]);
            std::thread::sleep(Duration::from_millis(4));
        }
        run.finish(Outcome::Finished)
    });
    let stored = || {
        hub.run_json(run_id.as_str())
            .and_then(|r| r["records"].as_i64())
            .unwrap_or(0)
    };
    wait_for("a quarter stored", Duration::from_secs(60), || {
        (stored() >= N / 4).then_some(())
    });
    pg.sql(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> pg_backend_pid() \
         AND datname = 'postgres'",
    );
    wait_for("half stored", Duration::from_secs(60), || {
        (stored() >= N / 2).then_some(())
    });
    pg.restart();
    let mut unhealthy = false;
    let report = loop {
        if hub.get("/api/health").status == 503 {
            unhealthy = true;
        }
        if writer.is_finished() {
            break writer.join().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(report.delivered, "{report:?}");
    assert_eq!(stored(), N, "every record stored");
    let series = hub.json(&format!(
        "/api/runs/{run_id}/series?metric=loss&budget=1000000"
    ));
    let steps = series_steps(&series);
    assert_eq!(steps, (0..N).collect::<Vec<_>>());
    let health = hub.get("/api/health");
    assert_eq!(health.status, 200, "{}", health.text());
    eprintln!("the hub reported itself unwritable during the restart: {unhealthy}");
}

/// Publishes `frame` on the hubs' NATS subject, speaking NATS's text protocol by hand (as a
/// stranger on the bus would).
fn publish_on_bus(nats: &Nats, frame: &[u8]) {
    let mut s = TcpStream::connect(("127.0.0.1", nats.port)).unwrap();
    let mut greeting = String::new();
    BufReader::new(s.try_clone().unwrap())
        .read_line(&mut greeting)
        .unwrap();
    assert!(greeting.starts_with("INFO"), "{greeting}");
    s.write_all(b"CONNECT {\"verbose\":false}\r\n").unwrap();
    s.write_all(format!("PUB stepstream.peer {}\r\n", frame.len()).as_bytes())
        .unwrap();
    s.write_all(frame).unwrap();
    s.write_all(b"\r\nPING\r\n").unwrap();
    let mut pong = String::new();
    BufReader::new(s).read_line(&mut pong).unwrap();
    assert!(pong.starts_with("PONG"), "{pong}");
}

/// The bus is not trusted: a forged batch for a run (the next sequence number, values never
/// stored) once moved another hub's tail, showed its points to that hub's viewers, and made a
/// collector resuming through it drop a batch it had not had stored; a forged metric name,
/// failure or alert was shown as said. Peer messages are hints; what is applied and told is
/// read from PostgreSQL.
#[test]
fn a_forged_peer_batch_neither_shows_points_nor_moves_a_resuming_collectors_position() {
    let pg = Postgres::start();
    let nats = Nats::start();
    let (store, bus) = (pg.url(), nats.url());
    let args = ["--store", &store, "--nats", &bus];
    let a = Hub::start(&args);
    let b = Hub::start(&args);
    let mut c = RawCollector::connect(&a);
    c.send(hello("forged-run", None));
    assert!(matches!(c.recv(), Some(FromHub::Welcome(_))));
    c.send(ToHub::DefineMetrics(DefineMetrics {
        metrics: vec![MetricDef {
            id: MetricId(0),
            name: "loss".into(),
        }],
    }));
    let record = |step: i64, v: f64| StepRecord {
        step,
        wall_time: 1_764_700_000.0 + step as f64,
        values: vec![(MetricId(0), v)],
    };
    c.send(ToHub::Batch(Batch {
        seq: 1,
        records: vec![record(0, 1.0)],
        items: Vec::new(),
    }));
    assert!(matches!(c.recv(), Some(FromHub::Ack(_))));
    let id = RunId::new("forged-run").unwrap();
    let mut viewer = watch(&b, &id);
    assert!(viewer.pump(Duration::from_secs(20), |v| v
        .runs
        .get(&id)
        .is_some_and(|s| s.count("loss") == 1)));
    // A stranger announces batch 2 with a value nobody stored.
    publish_on_bus(
        &nats,
        &ToPeer::PeerBatch(PeerBatch {
            hub: 12345,
            run_id: id.clone(),
            seq: 2,
            records: vec![record(1, 666.0)],
        })
        .encode(),
    );
    // ... and a metric, a failure and an alert nobody stored.
    for forged in [
        ToPeer::PeerMetrics(PeerMetrics {
            hub: 12345,
            run_id: id.clone(),
            metrics: vec![MetricDef {
                id: MetricId(7),
                name: "phantom".into(),
            }],
        }),
        ToPeer::PeerRun(PeerRun {
            hub: 12345,
            run_id: id.clone(),
            change: Some(StatusChange {
                run_id: id.clone(),
                status: RunStatus::Failed,
                message: Some("forged".into()),
                at: unix_now(),
            }),
        }),
        ToPeer::PeerAlert(PeerAlert {
            hub: 12345,
            alert: Alert {
                run_id: id.clone(),
                rule: "forged".into(),
                fired: true,
                step: 0,
                value: 1.0,
                message: "forged".into(),
                at: unix_now(),
            },
        }),
    ] {
        publish_on_bus(&nats, &forged.encode());
    }
    viewer.pump(Duration::from_secs(2), |_| false);
    assert_eq!(viewer.runs[&id].count("loss"), 1, "no forged point shown");
    assert_eq!(b.run_json("forged-run").unwrap()["records"], 1);
    assert!(
        !viewer.runs[&id].names.values().any(|n| n == "phantom"),
        "a forged metric name shown"
    );
    assert_ne!(
        viewer.runs[&id].status,
        Some(RunStatus::Failed),
        "a forged failure shown"
    );
    assert_eq!(b.run_json("forged-run").unwrap()["status"], "running");
    assert!(
        viewer.alerts.is_empty(),
        "a forged alert shown: {:?}",
        viewer.alerts
    );
    // The writer's collector resumes through hub B: it is told what is stored, batch 1.
    drop(c);
    std::thread::sleep(Duration::from_millis(300));
    let mut resumed = RawCollector::connect(&b);
    let ToHub::Hello(mut h) = hello("forged-run", None) else {
        unreachable!()
    };
    h.acked_through = 1;
    resumed.send(ToHub::Hello(h));
    match resumed.recv() {
        Some(FromHub::Welcome(w)) => assert_eq!(w.last_seq, 1, "the stored position"),
        other => panic!("{other:?}"),
    }
}

/// Range reads on PostgreSQL find every batch by its span class, also after the migration
/// from schema version 1 (one widest span per run) fills the classes of stored batches.
#[test]
fn range_reads_on_postgres_find_batches_of_every_span_also_after_migrating() {
    let pg = Postgres::start();
    let store = pg.url();
    let hub = Hub::start(&["--store", &store]);
    crate::range::batches_that_go_backwards_are_found(&hub);
    // Its batches were packed as they came (`store::pack`): 2,504 batches in a few rows.
    let rows: i64 = pg.value("SELECT count(*) FROM batches").parse().unwrap();
    let packs: i64 = pg
        .value("SELECT count(seq_end) FROM batches")
        .parse()
        .unwrap();
    assert!(packs >= 1 && rows < 1_000, "{rows} rows, {packs} packs");
    // Each pack has its summaries at both widths.
    let summaries = || -> i64 { pg.value("SELECT count(*) FROM summaries").parse().unwrap() };
    let with_steps: i64 = pg
        .value("SELECT count(*) FROM batches WHERE seq_end IS NOT NULL AND lo_step IS NOT NULL")
        .parse()
        .unwrap();
    assert_eq!(summaries(), 2 * with_steps);
    drop(hub);
    // What version 1 wrote: no span classes, the step index; and packs without summaries
    // (version 6), which the hub summarises once started.
    pg.sql(
        "DROP INDEX batches_by_span; ALTER TABLE batches DROP COLUMN span_class; \
         ALTER TABLE runs DROP COLUMN writer_seen; \
         CREATE INDEX batches_by_step ON batches (run_key, lo_step, hi_step); \
         DROP TABLE summaries; UPDATE stepstream_schema SET version = 1",
    );
    let hub = Hub::start(&["--store", &store]);
    wait_for("the packs summarised", Duration::from_secs(20), || {
        (summaries() == 2 * with_steps).then_some(())
    });
    let steps = |from: i64, to: i64| -> Vec<i64> {
        hub.json(&format!(
            "/api/runs/backwards/series?metric=loss&from={from}&to={to}&budget=1000000"
        ))["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_i64().unwrap())
            .collect()
    };
    assert_eq!(steps(3, 4), vec![3, 4, 3, 4]);
    assert_eq!(steps(40_000, 60_000), vec![50_000, 50_001, 60_000]);
    assert_eq!(steps(i64::MIN, 0), vec![0, i64::MIN + 1]);
    assert_eq!(steps(61_001, 61_002), vec![61_001, 61_002]);
}

/// Two hubs of one cluster, the second's clock a minute ahead (libfaketime): the writer
/// claim once compared the run's last activity, written on the first hub's clock, with the
/// claiming hub's clock, so a second collector through the hub ahead took a run its live
/// writer was still writing. Silence is measured on the database's clock now.
#[test]
fn a_hub_whose_clock_runs_ahead_does_not_take_a_live_writers_run() {
    const FAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
    assert!(
        Path::new(FAKETIME).exists(),
        "{FAKETIME} is missing: scripts/test installs Debian's `libfaketime`"
    );
    let pg = Postgres::start();
    let store = pg.url();
    let a = Hub::start(&["--store", &store]);
    let ahead = Hub::start_with_env(
        &[
            ("LD_PRELOAD", FAKETIME),
            ("FAKETIME", "+60s"),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ],
        &["--store", &store],
    );
    let clock = ahead.json("/api/runs")["now"].as_f64().unwrap();
    assert!(clock - unix_now() > 50.0, "the hub's clock is not ahead");
    let mut writer = RawCollector::connect(&a);
    writer.send(hello("held-run", None));
    match writer.recv() {
        Some(FromHub::Welcome(_)) => {}
        other => panic!("{other:?}"),
    }
    // A second collector process (another writer id) claims the run through the hub ahead.
    let mut second = RawCollector::connect(&ahead);
    let ToHub::Hello(mut h) = hello("held-run", None) else {
        unreachable!()
    };
    h.writer = 8;
    second.send(ToHub::Hello(h));
    match second.recv() {
        Some(FromHub::HubError(e)) => {
            assert!(e.message.contains("another collector"), "{}", e.message)
        }
        other => panic!("the live writer's run was taken: {other:?}"),
    }
    // The first writer still writes it.
    writer.send(ToHub::Heartbeat(Heartbeat {
        wall_time: unix_now(),
    }));
    writer.send(ToHub::DefineMetrics(DefineMetrics {
        metrics: vec![MetricDef {
            id: MetricId(0),
            name: "loss".into(),
        }],
    }));
    writer.send(ToHub::Batch(Batch {
        seq: 1,
        records: vec![StepRecord {
            step: 0,
            wall_time: unix_now(),
            values: vec![(MetricId(0), 1.0)],
        }],
        items: Vec::new(),
    }));
    assert!(matches!(writer.recv(), Some(FromHub::Ack(_))));
}

/// The other ways a hub presents itself to NATS, each against a real nats-server that
/// wants it: a token (from a file) over TLS signed by a private CA (`--nats-ca`), and an
/// nkey seed (from a file). Two hubs join through each and a run streams across them; a
/// wrong token or a server certificate from another CA keeps a hub from starting.
/// (`--nats-creds`: `hubs_authenticate_to_nats_with_a_creds_file`.)
#[test]
fn hubs_authenticate_to_nats_with_a_token_over_tls_and_with_an_nkey() {
    let pg = Postgres::start();
    let store = pg.url();
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = crate::tls::pki(&dir.path().join("pki"));
    let (other_ca, _, _) = crate::tls::pki(&dir.path().join("other"));
    let secret = |name: &str, value: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, format!("{value}\n")).unwrap();
        path.to_str().unwrap().to_string()
    };
    let token = secret("nats-token", "t0ken-s3cret");
    let wrong_token = secret("wrong-token", "n0t-it");
    let pair = nkeys::KeyPair::new_user();
    let seed = secret("nkey-seed", &pair.seed().unwrap());
    let conf = dir.path().join("nkey.conf");
    std::fs::write(
        &conf,
        format!(
            "authorization {{ users = [ {{ nkey: {} }} ] }}\n",
            pair.public_key()
        ),
    )
    .unwrap();
    let tls_port = free_port();
    let _tls_nats = Nats::start_with(
        tls_port,
        &[
            "--auth",
            "t0ken-s3cret",
            "--tls",
            "--tlscert",
            cert.to_str().unwrap(),
            "--tlskey",
            key.to_str().unwrap(),
        ],
    );
    let nkey_port = free_port();
    let _nkey_nats = Nats::start_with(nkey_port, &["-c", conf.to_str().unwrap()]);
    let tls_bus = format!("tls://127.0.0.1:{tls_port}");
    let nkey_bus = format!("nats://127.0.0.1:{nkey_port}");
    let ca = ca.to_str().unwrap();
    let ways: [(&str, Vec<&str>); 2] = [
        (&tls_bus, vec!["--nats-token-file", &token, "--nats-ca", ca]),
        (&nkey_bus, vec!["--nats-nkey-file", &seed]),
    ];
    for (i, (bus, how)) in ways.iter().enumerate() {
        let mut args = vec!["--store", &store, "--nats", bus];
        args.extend(how.iter().copied());
        let (a, b) = a_run_crosses_between_two_hubs(&args, &format!("nats-way-{i}"));
        for hub in [&a, &b] {
            let log = hub.logged();
            assert!(log.contains("connected to NATS"), "{log}");
            assert!(
                !log.contains("t0ken-s3cret") && !log.contains(&*pair.seed().unwrap()),
                "{log}"
            );
        }
    }
    // A wrong token, and a server certificate the CA given did not sign: no start.
    let other_ca = other_ca.to_str().unwrap();
    for how in [
        ["--nats-token-file", wrong_token.as_str(), "--nats-ca", ca],
        ["--nats-token-file", token.as_str(), "--nats-ca", other_ca],
    ] {
        let mut args = vec!["--store", &store, "--nats", &tls_bus];
        args.extend(how);
        let said = refused_to_start(&args);
        assert!(!said.contains("t0ken-s3cret"), "{said}");
    }
}

/// A NATS JWT (`ed25519-nkey`) for `subject`, signed by `issuer`, with these `nats` claims.
fn nats_jwt(issuer: &nkeys::KeyPair, subject: &str, name: &str, nats: serde_json::Value) -> String {
    use base64::Engine;
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    let header = b64(br#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let claims = serde_json::json!({
        "jti": format!("{:X}", unix_now().to_bits()),
        "iat": unix_now() as i64,
        "iss": issuer.public_key(),
        "name": name,
        "sub": subject,
        "nats": nats,
    });
    let payload = b64(claims.to_string().as_bytes());
    let signed = format!("{header}.{payload}");
    let signature = b64(&issuer.sign(signed.as_bytes()).unwrap());
    format!("{signed}.{signature}")
}

/// `--nats-creds`: a NATS server in operator mode (an operator, an account, a user, each a
/// signed JWT) and a hub that presents the user's `.creds` file joins and streams a run to
/// another; a creds file the account did not sign keeps a hub from starting.
#[test]
fn hubs_authenticate_to_nats_with_a_creds_file() {
    let pg = Postgres::start();
    let store = pg.url();
    let dir = tempfile::tempdir().unwrap();
    let operator = nkeys::KeyPair::new_operator();
    let account = nkeys::KeyPair::new_account();
    let user = nkeys::KeyPair::new_user();
    let unlimited = serde_json::json!({"subs": -1, "data": -1, "payload": -1});
    let operator_jwt = nats_jwt(
        &operator,
        &operator.public_key(),
        "op",
        serde_json::json!({"type": "operator", "version": 2}),
    );
    let account_jwt = nats_jwt(
        &operator,
        &account.public_key(),
        "hubs",
        serde_json::json!({"type": "account", "version": 2, "limits": {
            "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
            "wildcards": true, "conn": -1, "leaf": -1}}),
    );
    let mut user_claims = unlimited.clone();
    user_claims["type"] = "user".into();
    user_claims["version"] = 2.into();
    let creds = |signer: &nkeys::KeyPair, name: &str| {
        let jwt = nats_jwt(signer, &user.public_key(), "hub", user_claims.clone());
        let path = dir.path().join(name);
        std::fs::write(
            &path,
            format!(
                "-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n\
                 -----BEGIN USER NKEY SEED-----\n{}\n------END USER NKEY SEED------\n",
                user.seed().unwrap()
            ),
        )
        .unwrap();
        path.to_str().unwrap().to_string()
    };
    let good = creds(&account, "hub.creds");
    let forged = creds(&nkeys::KeyPair::new_account(), "forged.creds");
    let conf = dir.path().join("operator.conf");
    std::fs::write(
        &conf,
        format!(
            "operator: \"{operator_jwt}\"\nresolver: MEMORY\nresolver_preload: {{\n  {}: \"{account_jwt}\"\n}}\n",
            account.public_key()
        ),
    )
    .unwrap();
    let port = free_port();
    let _nats = Nats::start_with(port, &["-c", conf.to_str().unwrap()]);
    let bus = format!("nats://127.0.0.1:{port}");
    let args = ["--store", &store, "--nats", &bus, "--nats-creds", &good];
    let (a, _b) = a_run_crosses_between_two_hubs(&args, "nats-creds");
    assert!(a.logged().contains("connected to NATS"), "{}", a.logged());
    let said = refused_to_start(&["--store", &store, "--nats", &bus, "--nats-creds", &forged]);
    assert!(!said.contains("SUA"), "a seed in the error: {said}");
    assert!(said.to_lowercase().contains("authoriz"), "{said}");
}

/// Two hubs started with `args` (joining NATS): a run streamed through the first reaches
/// a viewer of the second, whole. Returns them, for their logs.
fn a_run_crosses_between_two_hubs(args: &[&str], name: &str) -> (Hub, Hub) {
    let a = Hub::start_logged(args);
    let b = Hub::start_logged(args);
    let (run_id, writer) = stream(&a.ws(), name);
    assert!(writer.join().unwrap().delivered);
    let mut viewer = watch(&b, &run_id);
    assert!(
        viewer.pump(Duration::from_secs(30), |v| v
            .runs
            .get(&run_id)
            .is_some_and(|s| s.count("loss") == STEPS as usize)),
        "{name}: the run did not cross to the other hub"
    );
    (a, b)
}

/// `stepstream serve` with `args` fails to start (within a minute); what it said.
fn refused_to_start(args: &[&str]) -> String {
    let refused = Command::new("timeout")
        .args(["60", BIN, "serve", "--bind", "127.0.0.1:0"])
        .args(args)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&refused.stderr).into_owned();
    assert!(!refused.status.success(), "{args:?}: {said}");
    said
}

/// A command sent through hub B reaches the collector connected to hub A (NATS tells A; A
/// reads it from the shared store), the answer goes back through A, and a viewer on B sees
/// the command honoured and the run stopped.
#[test]
fn a_command_sent_through_one_hub_reaches_a_collector_on_another() {
    let pg = Postgres::start();
    let nats = Nats::start();
    let (store, bus) = (pg.url(), nats.url());
    let args = ["--store", &store, "--nats", &bus];
    let a = Hub::start(&args);
    let b = Hub::start(&args);
    let run = Collector::start(Options::new(&a.ws(), "fleet", "commanded")).unwrap();
    assert!(run.wait_welcome(Duration::from_secs(30)).is_some());
    run.log(0, &[("loss", 1.0)]);
    run.flush();
    let run_id = run.run_id().clone();
    let mut viewer = watch(&b, &run_id);
    wait_for("the run on hub B", Duration::from_secs(30), || {
        b.run_json(run_id.as_str())
    });
    let (status, body) = crate::commands::command(
        &b.addr(),
        run_id.as_str(),
        r#"{"action":"stop","by":"ops","reason":"through B"}"#,
        None,
    );
    assert_eq!(status, 201, "{body}");
    let id = body["commands"][0]["id"].as_u64().unwrap();
    let mut taken = Vec::new();
    let mut step = 1;
    wait_for(
        "the stop at the collector on hub A",
        Duration::from_secs(20),
        || {
            run.log(step, &[("loss", 1.0)]);
            step += 1;
            taken.extend(run.take_commands());
            std::thread::sleep(Duration::from_millis(20));
            (!taken.is_empty()).then_some(())
        },
    );
    assert_eq!(taken.len(), 1);
    assert_eq!((taken[0].id, taken[0].by.as_str()), (id, "ops"));
    run.command_done(id, true, "stopped");
    assert!(
        run.finish(Outcome::Stopped("stopped by ops: through B".into()))
            .delivered
    );
    assert!(
        viewer.pump(Duration::from_secs(20), |v| {
            v.commands(&run_id, id).contains(&CommandState::Honoured)
                && v.runs
                    .get(&run_id)
                    .is_some_and(|s| s.status == Some(RunStatus::Stopped))
        }),
        "hub B's viewer: {:?}",
        viewer.commands(&run_id, id)
    );
    let listed = b.json(&format!("/api/runs/{run_id}/commands"));
    assert_eq!(listed["commands"][0]["state"], "honoured", "{listed}");
}

/// A rule made in the page through hub B is in force on hub A, which judges the run (NATS
/// tells A to read the rules again from PostgreSQL); its alert reaches a real receiver; an
/// acknowledgement made through B is read by A.
#[test]
fn a_page_rule_added_through_one_hub_is_judged_by_another_on_postgres() {
    let pg = Postgres::start();
    let nats = Nats::start();
    let hook = crate::rules::Receiver::start();
    let dir = tempfile::tempdir().unwrap();
    let alerts = dir.path().join("alerts.toml");
    std::fs::write(
        &alerts,
        format!(
            "[[channels]]\nkind = \"webhook\"\nurl = \"http://127.0.0.1:{}/hook\"\n",
            hook.port
        ),
    )
    .unwrap();
    let (store, bus) = (pg.url(), nats.url());
    let args = [
        "--store",
        &store,
        "--nats",
        &bus,
        "--alerts",
        alerts.to_str().unwrap(),
    ];
    let a = Hub::start(&args);
    let b = Hub::start(&args);
    let run = Collector::start(Options::new(&a.ws(), "fleet", "ruled")).unwrap();
    assert!(run.wait_welcome(Duration::from_secs(30)).is_some());
    let run_id = run.run_id().to_string();
    for step in 0..10 {
        run.log(step, &[("loss", 1.0)]);
    }
    run.flush();
    wait_for("the run on B", Duration::from_secs(30), || {
        b.run_json(&run_id)
    });
    let body = r#"{"rule":{"name":"too high","metric":"loss","when":{"above":5}},"by":"ops"}"#;
    let r = http_request_body(
        &b.addr(),
        "POST",
        "/api/projects/fleet/rules",
        &[("Content-Type", "application/json")],
        body.as_bytes(),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    // In force on A (which judges the run) within a second or so of being told.
    let mut step = 10;
    wait_for(
        "the rule's alert at the receiver",
        Duration::from_secs(20),
        || {
            run.log(step, &[("loss", 9.0)]);
            run.flush();
            step += 1;
            std::thread::sleep(Duration::from_millis(50));
            hook.find("custom:too high", "fired")
        },
    );
    let listed = a.json("/api/projects/fleet/rules");
    assert_eq!(listed["rules"][0]["rule"]["name"], "too high", "{listed}");
    let ack = http_request_body(
        &b.addr(),
        "POST",
        &format!("/api/runs/{run_id}/alerts/custom:too%20high/ack"),
        &[("Content-Type", "application/json")],
        br#"{"by":"ops","mute_hours":2}"#,
    );
    assert_eq!(ack.status, 200, "{}", ack.text());
    let acks = a.json(&format!("/api/runs/{run_id}/alerts"))["acks"].clone();
    assert_eq!(acks[0]["by"], "ops", "{acks}");
    assert!(run.finish(Outcome::Finished).delivered);
}

/// A run deleted through hub B leaves hub A as well: A's viewer of it is told, A's API and
/// run list no longer have it, and PostgreSQL holds no row of it.
#[test]
fn a_run_deleted_through_one_hub_leaves_the_others_and_the_shared_store() {
    let pg = Postgres::start();
    let nats = Nats::start();
    let (store, bus) = (pg.url(), nats.url());
    let args = ["--store", &store, "--nats", &bus];
    let a = Hub::start(&args);
    let b = Hub::start(&args);
    let (run_id, writer) = stream(&a.ws(), "doomed");
    assert!(writer.join().unwrap().delivered);
    let mut on_a = watch(&a, &run_id);
    assert!(on_a.pump(Duration::from_secs(20), |v| v
        .runs
        .get(&run_id)
        .is_some_and(|s| s.count("loss") == STEPS as usize)));
    wait_for("the run on hub B", Duration::from_secs(30), || {
        b.run_json(run_id.as_str())
    });
    let key = pg.value(&format!("SELECT key FROM runs WHERE run_id = '{run_id}'"));
    assert!(
        pg.value(&format!(
            "SELECT count(*) FROM batches WHERE run_key = {key}"
        )) != "0"
    );
    let r = http_request(
        &b.addr(),
        "DELETE",
        &format!("/api/runs/{run_id}?by=ops"),
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        on_a.pump(Duration::from_secs(10), |v| v
            .deleted
            .iter()
            .any(|d| d.run_id == run_id && d.by == "ops")),
        "hub A's viewer was not told"
    );
    wait_for("the run gone from hub A", Duration::from_secs(10), || {
        (a.get(&format!("/api/runs/{run_id}")).status == 404).then_some(())
    });
    assert!(!a.json("/api/runs").to_string().contains(run_id.as_str()));
    for table in [
        "runs",
        "batches",
        "summaries",
        "metrics",
        "alerts",
        "items",
        "judges",
    ] {
        let column = if table == "runs" { "key" } else { "run_key" };
        let left = pg.value(&format!(
            "SELECT count(*) FROM {table} WHERE {column} = {key}"
        ));
        assert_eq!(left, "0", "{table}");
    }
}

/// Retention on a cluster: both hubs keep the same rule; the run's judge (one hub, whichever
/// it is) deletes each run beyond it once, every hub forgets it, the shared store keeps none
/// of its rows, and a running run is not counted out until it ends.
#[test]
fn retention_on_two_hubs_deletes_each_run_beyond_the_rule_once_from_the_shared_store() {
    let pg = Postgres::start();
    let nats = Nats::start();
    let (store, bus) = (pg.url(), nats.url());
    let args = ["--store", &store, "--nats", &bus, "--retain", "fleet=2"];
    let a = Hub::start(&args);
    let b = Hub::start(&args);
    let mut on_b = Viewer::connect(&b);
    let live = Collector::start(Options::new(&b.ws(), "fleet", "live")).unwrap();
    assert!(live.wait_welcome(Duration::from_secs(30)).is_some());
    live.log(0, &[("loss", 1.0)]);
    live.flush();
    let mut ended = Vec::new();
    for (i, hub) in [&a, &b, &a].into_iter().enumerate() {
        let (run_id, writer) = stream(&hub.ws(), &format!("ended-{i}"));
        assert!(writer.join().unwrap().delivered);
        ended.push(run_id);
        std::thread::sleep(Duration::from_millis(300));
    }
    let listed = |hub: &Hub| hub.json("/api/runs").to_string();
    let first = ended[0].as_str();
    wait_for(
        "the first run gone from both hubs",
        Duration::from_secs(30),
        || (!listed(&a).contains(first) && !listed(&b).contains(first)).then_some(()),
    );
    for hub in [&a, &b] {
        let now = listed(hub);
        assert!(
            now.contains(ended[1].as_str())
                && now.contains(ended[2].as_str())
                && now.contains(live.run_id().as_str()),
            "{now}"
        );
    }
    assert_eq!(
        pg.value(&format!(
            "SELECT count(*) FROM runs WHERE run_id = '{first}'"
        )),
        "0"
    );
    assert_eq!(pg.value("SELECT count(*) FROM runs"), "3");
    // Deleted once, by the retention, whichever hub judged it.
    assert!(on_b.pump(Duration::from_secs(10), |v| v
        .deleted
        .iter()
        .any(|d| d.run_id.as_str() == first)));
    on_b.pump(Duration::from_secs(2), |_| false);
    let notices: Vec<_> = on_b
        .deleted
        .iter()
        .filter(|d| d.run_id.as_str() == first)
        .collect();
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert_eq!(notices[0].by, "retention");

    // The running run ends: the oldest of the three ended ones goes.
    assert!(live.finish(Outcome::Finished).delivered);
    let second = ended[1].as_str();
    wait_for(
        "the second run gone from both hubs",
        Duration::from_secs(30),
        || (!listed(&a).contains(second) && !listed(&b).contains(second)).then_some(()),
    );
    assert_eq!(pg.value("SELECT count(*) FROM runs"), "2");
}
