//! `stepstream-loadgen`: measures a real hub.
//!
//! * ingest: several collectors (the real library) log records of 10 metrics as fast as they
//!   can; reports step records per second until the hub acknowledged every one.
//! * latency: one collector logs at a fixed rate while a viewer is subscribed; reports the
//!   time from `log` to the viewer receiving the point (p50/p99), on one clock.
//! * fleet: many runs at a fixed rate each (default 100 runs x 100 steps/s x 10 metrics)
//!   with viewers subscribed (default 20, each to 10 runs): loss (every record must reach the
//!   hub and every viewer of its run), log-to-viewer latency p50/p99, and the hub's CPU;
//!   with `--soak-minutes` it runs that long and samples the hub's memory every 30 s.
//!
//! The hub's CPU time comes from `/proc/PID/stat` of the hub it started.
//! It starts its own hub (the `stepstream` binary beside it, on a temporary database)
//! unless `--hub` names one.

use anyhow::{bail, Context, Result};
use clap::Parser;
use futures_util::{SinkExt, StreamExt};
use std::io::BufRead;
use std::time::{Duration, Instant};
use stepstream_collector::{Collector, Options, Outcome};
use stepstream_protocol::{unix_now, FromViewer, Subscribe, ToViewer};

#[derive(Parser)]
#[command(about = "Load generator for a stepstream hub")]
struct Args {
    /// An existing hub (ws://HOST:PORT), or several hubs of a cluster, comma-separated
    /// (collectors and viewers are spread over them, round robin); by default a fresh one is
    /// started.
    #[arg(long)]
    hub: Option<String>,
    /// The process ids of the `--hub` hubs, comma-separated, for their CPU and memory.
    #[arg(long, value_delimiter = ',')]
    hub_pids: Vec<u32>,
    /// Concurrent collectors in the ingest test.
    #[arg(long, default_value_t = 2)]
    collectors: usize,
    /// Records each collector sends in the ingest test.
    #[arg(long, default_value_t = 500_000)]
    records: i64,
    /// Steps per second in the latency test.
    #[arg(long, default_value_t = 100.0)]
    rate: f64,
    /// Seconds the latency test runs.
    #[arg(long, default_value_t = 20.0)]
    seconds: f64,
    /// Runs in the fleet test (0 skips it).
    #[arg(long, default_value_t = 100)]
    fleet_runs: usize,
    /// Steps per second of each fleet run.
    #[arg(long, default_value_t = 100.0)]
    fleet_rate: f64,
    /// Metrics in each fleet record (10 to 256).
    #[arg(long, default_value_t = 10)]
    fleet_metrics: usize,
    /// Viewers in the fleet test.
    #[arg(long, default_value_t = 20)]
    fleet_viewers: usize,
    /// Runs each fleet viewer subscribes to.
    #[arg(long, default_value_t = 10)]
    fleet_viewer_runs: usize,
    /// Seconds the fleet test runs (unless soaking).
    #[arg(long, default_value_t = 30.0)]
    fleet_seconds: f64,
    /// The fleet collectors' linger (see the collector's `Options::linger`), milliseconds.
    #[arg(long, default_value_t = stepstream_collector::DEFAULT_LINGER.as_secs_f64() * 1e3)]
    fleet_linger_ms: f64,
    /// Run the fleet this many minutes instead, sampling the hub's memory.
    #[arg(long)]
    soak_minutes: Option<f64>,
    /// Skip the ingest and latency tests.
    #[arg(long)]
    fleet_only: bool,
    /// Internal: be the fleet's collectors (a child process in its own session, so its
    /// hundred sender threads do not starve the viewers' thread of CPU).
    #[arg(long, hide = true)]
    fleet_collectors: bool,
}

/// The hub's CPU seconds (user + system) and resident memory in MB, from `/proc`.
fn hub_usage(pids: &[u32]) -> Option<(f64, f64)> {
    if pids.is_empty() {
        return None;
    }
    let (mut cpu, mut rss) = (0.0, 0.0);
    for pid in pids {
        let (c, r) = process_usage(*pid)?;
        cpu += c;
        rss += r;
    }
    Some((cpu, rss))
}

/// One process's CPU seconds and resident memory in MB.
fn process_usage(pid: u32) -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start at `) `.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kb: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    // Linux reports CPU time in clock ticks of 1/100 s (USER_HZ).
    Some((ticks / 100.0, rss_kb / 1024.0))
}

/// The `i`th hub of a comma-separated list, round robin: spreads collectors and viewers
/// over the hubs of a cluster.
fn pick(hubs: &str, i: usize) -> String {
    let list: Vec<&str> = hubs.split(',').filter(|h| !h.is_empty()).collect();
    list[i % list.len()].to_string()
}

const METRICS: [&str; 10] = [
    "loss",
    "lr",
    "grad_norm",
    "samples_per_sec",
    "tokens_per_sec",
    "ppl",
    "loss_scale",
    "step_time",
    "data_wait",
    "mem_gb",
];

struct OwnHub {
    child: std::process::Child,
    _dir: tempfile::TempDir,
    url: String,
}

impl Drop for OwnHub {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_hub() -> Result<OwnHub> {
    let exe = std::env::current_exe()?;
    let bin = exe.with_file_name("stepstream");
    let dir = tempfile::tempdir()?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut child = std::process::Command::new(&bin)
        .args(["serve", "--bind", &format!("127.0.0.1:{port}"), "--db"])
        .arg(dir.path().join("hub.db"))
        // Every simulated rank and viewer connects from this one address.
        .args(["--limit", "connections_per_addr=8192"])
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().context("hub stdout")?).read_line(&mut line)?;
    if !line.contains("listening") {
        bail!("the hub did not start: {line:?}");
    }
    Ok(OwnHub {
        child,
        _dir: dir,
        url: format!("ws://127.0.0.1:{port}"),
    })
}

fn values(step: i64) -> Vec<(&'static str, f64)> {
    values_of(step, METRICS.len())
}

/// `n` metrics: the ten usual names, then `extra_10`, `extra_11`... (a wide record).
fn values_of(step: i64, n: usize) -> Vec<(&'static str, f64)> {
    static EXTRA: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    let extra = EXTRA.get_or_init(|| (METRICS.len()..256).map(|i| format!("extra_{i}")).collect());
    // A loss that decays, like a training run's: no alert storm measured with it.
    METRICS
        .iter()
        .copied()
        .chain(extra.iter().map(String::as_str))
        .take(n.min(256))
        .enumerate()
        .map(|(i, m)| (m, 1.0 / (1.0 + step as f64 * 1e-3) + i as f64))
        .collect()
}

fn ingest(hub: &str, pid: &[u32], collectors: usize, records: i64) -> Result<()> {
    let cpu_before = hub_usage(pid).map(|u| u.0);
    println!(
        "ingest: {collectors} collectors x {records} records x {} metrics",
        METRICS.len()
    );
    let start = Instant::now();
    let threads: Vec<_> = (0..collectors)
        .map(|c| {
            let hub = pick(hub, c);
            std::thread::spawn(
                move || -> Result<(Duration, stepstream_collector::Report)> {
                    let mut run =
                        Collector::start(Options::new(&hub, "loadgen", &format!("ingest-{c}")))?;
                    run.set_finish_timeout(Duration::from_secs(600));
                    let t = Instant::now();
                    for step in 0..records {
                        run.log(step, &values(step));
                    }
                    let logged = t.elapsed();
                    let report = run.finish(Outcome::Finished);
                    Ok((logged, report))
                },
            )
        })
        .collect();
    let mut total = 0u64;
    for t in threads {
        let (logged, report) = t.join().expect("collector thread")?;
        if !report.delivered || report.dropped > 0 {
            bail!("collector did not deliver everything: {report:?}");
        }
        println!(
            "  collector: log() {:.2} us/call, {} records acked",
            logged.as_secs_f64() * 1e6 / records as f64,
            report.acked
        );
        total += report.acked;
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "  ingest: {total} records in {secs:.2} s = {:.0} step records/s (all acknowledged, i.e. stored)",
        total as f64 / secs
    );
    if let (Some(before), Some((after, rss))) = (cpu_before, hub_usage(pid)) {
        println!(
            "  hub CPU: {:.2} s = {:.2} us per record ({:.0}% of one core); hub memory {rss:.0} MB",
            after - before,
            (after - before) * 1e6 / total as f64,
            100.0 * (after - before) / secs
        );
    }
    Ok(())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn latency(hub: &str, rate: f64, seconds: f64) -> Result<()> {
    println!("latency: 1 collector at {rate} steps/s for {seconds} s, 1 viewer");
    let run = Collector::start(Options::new(hub, "loadgen", "latency"))?;
    let run_id = run.run_id().clone();
    run.log(-1, &values(0));
    run.flush();
    // The ingest test just flooded the hub: it asks collectors to linger until its clock
    // has measured a quiet second (`hub/pace.rs`, up to two seconds after the flood). What
    // is measured here is a run on a hub with room, so wait that out.
    std::thread::sleep(Duration::from_millis(3_000));

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let url = format!("{}/ws/viewer", hub.trim_end_matches('/'));
    let (mut ws, _) = rt.block_on(tokio_tungstenite::connect_async(url))?;
    let sub = FromViewer::Subscribe(Subscribe {
        runs: vec![run_id.clone()],
        metrics: None,
        from_step: None,
        budget: None,
        after_seq: None,
        items: false,
    });
    rt.block_on(ws.send(tokio_tungstenite::tungstenite::Message::Binary(
        sub.encode().into(),
    )))?;

    let n = (rate * seconds) as i64;
    let producer = std::thread::spawn(move || {
        let period = Duration::from_secs_f64(1.0 / rate);
        let t0 = Instant::now();
        for step in 0..n {
            let due = t0 + period * step as u32;
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            run.log(step, &values(step));
        }
        run.finish(Outcome::Finished)
    });
    let mut lat_ms = Vec::with_capacity(n as usize);
    rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs_f64(seconds + 30.0);
        while (lat_ms.len() as i64) < n && Instant::now() < deadline {
            let Ok(Some(Ok(msg))) = tokio::time::timeout(Duration::from_secs(5), ws.next()).await
            else {
                break;
            };
            let tokio_tungstenite::tungstenite::Message::Binary(bytes) = msg else {
                continue;
            };
            if let Ok(ToViewer::Live(live)) = ToViewer::decode(&bytes) {
                let now = unix_now();
                for r in live.records.iter().filter(|r| r.step >= 0) {
                    lat_ms.push((now - r.wall_time) * 1e3);
                }
            }
        }
    });
    let report = producer.join().expect("producer");
    if lat_ms.is_empty() {
        bail!("the viewer received nothing");
    }
    lat_ms.sort_by(f64::total_cmp);
    println!(
        "  collector log -> viewer: n={} p50={:.2} ms p99={:.2} ms max={:.2} ms (delivered: {})",
        lat_ms.len(),
        percentile(&lat_ms, 0.5),
        percentile(&lat_ms, 0.99),
        lat_ms.last().unwrap(),
        report.delivered
    );
    Ok(())
}

fn main() -> Result<()> {
    let args = Args::parse();
    let own = match &args.hub {
        _ if args.fleet_collectors => None,
        Some(_) => None,
        None => Some(start_hub()?),
    };
    let hub = args
        .hub
        .clone()
        .unwrap_or_else(|| own.as_ref().expect("own hub").url.clone());
    let pid: Vec<u32> = match &own {
        Some(o) => vec![o.child.id()],
        None => args.hub_pids.clone(),
    };
    if args.fleet_collectors {
        return fleet::collectors(&hub, &args);
    }
    if !args.fleet_only {
        ingest(&hub, &pid, args.collectors, args.records)?;
        latency(&pick(&hub, 0), args.rate, args.seconds)?;
    }
    if args.fleet_runs > 0 {
        fleet::fleet(&hub, &pid, &args)?;
    }
    Ok(())
}

mod fleet;
