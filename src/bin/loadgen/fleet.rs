//! The fleet: many runs at a fixed rate, viewers on them, loss, latency, hub CPU and memory.

use super::{hub_usage, percentile, pick, values_of, Args};
use anyhow::{bail, Result};
use futures_util::{SinkExt, StreamExt};
use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use stepstream_collector::{Collector, Options, Outcome};
use stepstream_protocol::{unix_now, FromViewer, RunId, Subscribe, ToViewer};

/// What one viewer saw: records per run (live and backfilled, by step), and latencies.
#[derive(Default)]
struct Seen {
    steps: HashMap<RunId, std::collections::HashSet<i64>>,
    doubled: u64,
    latency_ms: Vec<f64>,
}

pub fn fleet(hub: &str, pid: &[u32], args: &Args) -> Result<()> {
    let runs = args.fleet_runs;
    let seconds = args.soak_minutes.map_or(args.fleet_seconds, |m| m * 60.0);
    println!(
        "fleet: {runs} runs x {} steps/s x {} metrics for {seconds:.0} s, {} viewers x {} runs",
        args.fleet_rate, args.fleet_metrics, args.fleet_viewers, args.fleet_viewer_runs
    );
    // The collectors live in a child process of their own session (the scheduler shares
    // the CPU between sessions first): their run ids come back on its stdout, "go" starts
    // the clock, and its report ends it.
    let mut child = std::process::Command::new("setsid")
        .arg(std::env::current_exe()?)
        .args(["--fleet-collectors", "--hub", hub])
        .args(["--fleet-runs", &runs.to_string()])
        .args(["--fleet-rate", &args.fleet_rate.to_string()])
        .args(["--fleet-metrics", &args.fleet_metrics.to_string()])
        .args(["--fleet-seconds", &seconds.to_string()])
        .args(["--fleet-linger-ms", &args.fleet_linger_ms.to_string()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let mut lines = std::io::BufReader::new(child.stdout.take().expect("piped")).lines();
    let mut ids: Vec<RunId> = Vec::new();
    for line in lines.by_ref() {
        let line = line?;
        if line == "ready" {
            break;
        }
        ids.push(RunId::new(line)?);
    }
    if ids.len() != runs {
        bail!(
            "the collectors process started {} runs of {runs}",
            ids.len()
        );
    }
    let stop = Arc::new(AtomicBool::new(false));
    let seen: Vec<Arc<Mutex<Seen>>> = (0..args.fleet_viewers)
        .map(|_| Arc::new(Mutex::new(Seen::default())))
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let mut watching: Vec<Vec<RunId>> = Vec::new();
    for (v, seen) in seen.iter().enumerate() {
        let mine: Vec<RunId> = (0..args.fleet_viewer_runs.min(runs))
            .map(|k| ids[(v * args.fleet_viewer_runs + k) % runs].clone())
            .collect();
        watching.push(mine.clone());
        // Viewers sit on another hub than most of their runs' collectors, when there are
        // several: the cluster's fan-out is part of what is measured.
        let url = format!("{}/ws/viewer", pick(hub, v + 1).trim_end_matches('/'));
        let seen = seen.clone();
        let stop = stop.clone();
        rt.spawn(async move {
            let Ok((mut ws, _)) = tokio_tungstenite::connect_async(url).await else {
                return;
            };
            let sub = FromViewer::Subscribe(Subscribe {
                runs: mine,
                metrics: None,
                from_step: None,
                budget: None,
                after_seq: None,
                items: false,
            });
            let _ = ws
                .send(tokio_tungstenite::tungstenite::Message::Binary(
                    sub.encode().into(),
                ))
                .await;
            while !stop.load(Ordering::Relaxed) {
                let Ok(Some(Ok(msg))) =
                    tokio::time::timeout(Duration::from_secs(1), ws.next()).await
                else {
                    continue;
                };
                let tokio_tungstenite::tungstenite::Message::Binary(bytes) = msg else {
                    continue;
                };
                let now = unix_now();
                let mut s = seen.lock().expect("seen");
                match ToViewer::decode(&bytes) {
                    Ok(ToViewer::Live(live)) => {
                        for r in live.records.iter().filter(|r| r.step >= 0) {
                            s.latency_ms.push((now - r.wall_time) * 1e3);
                            if !s
                                .steps
                                .entry(live.run_id.clone())
                                .or_default()
                                .insert(r.step)
                            {
                                s.doubled += 1;
                            }
                        }
                    }
                    Ok(ToViewer::Backfill(b)) => {
                        if let Some(series) = b.series.first() {
                            let steps = s.steps.entry(b.run_id.clone()).or_default();
                            for &step in series.steps.iter().filter(|&&st| st >= 0) {
                                steps.insert(step);
                            }
                        }
                    }
                    _ => {}
                }
            }
        });
    }
    std::thread::sleep(Duration::from_secs(2));
    let (cpu0, rss0) = hub_usage(pid).unwrap_or((0.0, 0.0));
    let started = Instant::now();
    writeln!(child.stdin.as_mut().expect("piped"), "go")?;
    let total_steps = (seconds * args.fleet_rate) as i64;
    let mut memory = vec![(0.0, rss0)];
    let mut report = String::new();
    // Sample the hub's memory while the collectors run; their report ends the run.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    loop {
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(line) => {
                report = line;
                break;
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                if let Some((_, rss)) = hub_usage(pid) {
                    memory.push((started.elapsed().as_secs_f64(), rss));
                }
            }
            Err(_) => break,
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let (cpu1, rss1) = hub_usage(pid).unwrap_or((0.0, 0.0));
    let _ = child.wait();
    let lost: u64 = report
        .strip_prefix("unacknowledged ")
        .and_then(|n| n.parse().ok())
        .unwrap_or(u64::MAX);
    // Viewers may lag: wait until none received anything for 3 s (at most a minute), so
    // "missed" counts points that never came, not points still on their way.
    let received = || -> usize {
        seen.iter()
            .map(|s| s.lock().expect("seen").latency_ms.len())
            .sum()
    };
    let (mut last, mut quiet_since) = (received(), Instant::now());
    let drain_until = Instant::now() + Duration::from_secs(60);
    while quiet_since.elapsed() < Duration::from_secs(3) && Instant::now() < drain_until {
        std::thread::sleep(Duration::from_millis(500));
        let now = received();
        if now != last {
            (last, quiet_since) = (now, Instant::now());
        }
    }
    stop.store(true, Ordering::Relaxed);
    rt.shutdown_timeout(Duration::from_secs(3));
    let mut latency = Vec::new();
    let (mut missing, mut doubled) = (0u64, 0u64);
    for (s, mine) in seen.iter().zip(&watching) {
        let s = s.lock().expect("seen");
        doubled += s.doubled;
        for id in mine {
            let got = s.steps.get(id).map_or(0, |st| st.len()) as i64;
            missing += (total_steps - got).max(0) as u64;
        }
        latency.extend_from_slice(&s.latency_ms);
    }
    latency.sort_by(f64::total_cmp);
    let records = total_steps as f64 * runs as f64;
    println!(
        "  sent {records:.0} records in {elapsed:.1} s ({:.0}/s); not acknowledged {lost}; \
         viewers missed {missing}, got twice {doubled}",
        records / elapsed
    );
    // CPU and memory over the streaming time (the finish included).
    if !latency.is_empty() {
        println!(
            "  log -> viewer: n={} p50={:.2} ms p99={:.2} ms max={:.2} ms",
            latency.len(),
            percentile(&latency, 0.5),
            percentile(&latency, 0.99),
            latency.last().unwrap_or(&0.0)
        );
    }
    if !pid.is_empty() {
        println!(
            "  hub CPU {:.1}% of one core ({:.2} us per record); memory {rss0:.0} -> {rss1:.0} MB",
            100.0 * (cpu1 - cpu0) / elapsed,
            (cpu1 - cpu0) * 1e6 / records
        );
        // Alerts must keep up too: a judge a whole channel behind skips batches.
        let unjudged: Vec<String> = hub
            .split(',')
            .filter(|h| !h.is_empty())
            .map(|h| unjudged_batches(h).map_or("?".into(), |n| n.to_string()))
            .collect();
        println!("  batches the alert judge skipped: {}", unjudged.join(", "));
        if memory.len() > 2 {
            let samples: Vec<String> = memory
                .iter()
                .map(|(t, m)| format!("{:.0}s:{m:.0}", t))
                .collect();
            println!("  hub memory (MB) over time: {}", samples.join(" "));
        }
    }
    Ok(())
}

/// The fleet's collectors, in their own process: one per run, paced by one thread.
pub fn collectors(hub: &str, args: &Args) -> Result<()> {
    let collectors: Vec<Collector> = (0..args.fleet_runs)
        .map(|r| {
            let mut options = Options::new(&pick(hub, r), "fleet", &format!("run-{r}"));
            options.linger = Duration::from_secs_f64(args.fleet_linger_ms.max(0.0) / 1e3);
            let mut run = Collector::start(options)?;
            run.set_finish_timeout(Duration::from_secs(120));
            run.log(-1, &values_of(0, args.fleet_metrics));
            run.flush();
            Ok(run)
        })
        .collect::<Result<_>>()?;
    for c in &collectors {
        if c.wait_welcome(Duration::from_secs(30)).is_none() {
            bail!("a fleet collector was not welcomed: {:?}", c.last_error());
        }
        println!("{}", c.run_id());
    }
    println!("ready");
    let mut go = String::new();
    std::io::stdin().read_line(&mut go)?;
    let period = Duration::from_secs_f64(1.0 / args.fleet_rate);
    let total_steps = (args.fleet_seconds * args.fleet_rate) as i64;
    let started = Instant::now();
    for step in 0..total_steps {
        let due = started + period * step as u32;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        for c in &collectors {
            c.log(step, &values_of(step, args.fleet_metrics));
        }
    }
    let mut unacked = 0;
    for c in collectors {
        let report = c.finish(Outcome::Finished);
        if !report.delivered || report.dropped > 0 {
            unacked += report.unacked + report.dropped;
        }
    }
    println!("unacknowledged {unacked}");
    Ok(())
}

/// The hub's `stepstream_unjudged_batches_total`, from its `/metrics`.
fn unjudged_batches(hub: &str) -> Option<u64> {
    let base = hub
        .replacen("ws://", "http://", 1)
        .replacen("wss://", "https://", 1);
    let text = ureq::get(&format!("{}/metrics", base.trim_end_matches('/')))
        .timeout(Duration::from_secs(5))
        .call()
        .ok()?
        .into_string()
        .ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("stepstream_unjudged_batches_total "))
        .and_then(|n| n.trim().parse().ok())
}
