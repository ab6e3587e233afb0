//! `stepstream watch` in a real terminal: tmux runs it against a hub with live runs; the
//! test reads the screen (`capture-pane`) and types (`send-keys`). The list follows the run,
//! the chart's last value is the API's, zoom, resizing and quit work, in colour and in
//! monochrome, and a hub that wants a read token gets the one in `--token-file`.

use crate::util::*;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use stepstream_collector::{Collector, Options, Outcome};
use stepstream_protocol::RunId;

/// A tmux session of its own (its own server socket), killed when dropped.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn start(width: u16, height: u16, command: &str) -> Tmux {
        let socket = format!("stepstream-test-{}-{}", std::process::id(), free_port());
        let tmux = Tmux { socket };
        // The shell waits after the command, so the test can read how it exited.
        let line = format!("{command}; echo \"watch exited $?\"; sleep 60");
        tmux.run(&[
            "new-session",
            "-d",
            "-s",
            "w",
            "-x",
            &width.to_string(),
            "-y",
            &height.to_string(),
            &line,
        ]);
        tmux
    }

    fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .args(["-L", &self.socket, "-f", "/dev/null"])
            .args(args)
            .env("TERM", "xterm-256color")
            .output()
            .expect("tmux (apt-get install tmux)");
        assert!(out.status.success(), "tmux {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn screen(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", "w"])
    }

    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "w"];
        args.extend_from_slice(keys);
        self.run(&args);
    }

    /// Waits until the screen shows what `f` looks for.
    fn wait<T>(&self, what: &str, f: impl Fn(&str) -> Option<T>) -> T {
        let mut last = String::new();
        for _ in 0..200 {
            last = self.screen();
            if let Some(v) = f(&last) {
                return v;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the screen never showed {what}:\n{last}");
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .output();
    }
}

/// The step a run's list row shows (columns: status, run, project, step, loss, age).
fn listed_step(screen: &str, name: &str) -> Option<i64> {
    let line = screen.lines().find(|l| l.contains(name))?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|w| *w == name)?;
    words.get(at + 2)?.parse().ok()
}

/// The legend's `METRIC VALUE at step STEP` for a run.
fn legend(screen: &str, name: &str, metric: &str) -> Option<(f64, i64)> {
    let line = screen
        .lines()
        .find(|l| l.contains(name) && l.contains(" at step "))?;
    let rest = &line[line.find(&format!(" {metric} "))? + metric.len() + 2..];
    let (value, step) = rest.split_once(" at step ")?;
    Some((value.trim().parse().ok()?, step.trim().parse().ok()?))
}

/// A run logging a point every 20 ms until `stop`; the collector and its last step.
fn streaming(
    hub: &Hub,
    project: &str,
    name: &str,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<(Collector, i64)> {
    let mut opts = Options::new(&hub.ws(), project, name);
    opts.run_id = Some(RunId::new(name).unwrap());
    let run = Collector::start(opts).unwrap();
    std::thread::spawn(move || {
        let mut step = 0;
        while !stop.load(Ordering::Relaxed) {
            let loss = 2.0 / (1.0 + step as f64 * 0.05) + (step % 7) as f64 * 0.01;
            run.log(step, &[("loss", loss), ("lr", 0.001)]);
            step += 1;
            std::thread::sleep(Duration::from_millis(20));
        }
        run.flush();
        (run, step - 1)
    })
}

#[test]
fn watch_follows_a_live_run_in_tmux_zooms_resizes_and_quits() {
    let hub = Hub::start(&[]);
    let stop = Arc::new(AtomicBool::new(false));
    let live = streaming(&hub, "tui", "watched-1", stop.clone());
    let elsewhere = streaming(&hub, "other", "elsewhere-1", stop.clone());
    wait_for("both runs", Duration::from_secs(10), || {
        (hub.run_json("watched-1").is_some() && hub.run_json("elsewhere-1").is_some()).then_some(())
    });
    let tmux = Tmux::start(80, 24, &format!("{BIN} watch --hub {} tui", hub.ws()));
    // The list follows the run as it streams; the other project's run is not listed.
    let first = tmux.wait("the run listed", |s| listed_step(s, "watched-1"));
    let later = tmux.wait("its step moving on", |s| {
        listed_step(s, "watched-1").filter(|&n| n > first)
    });
    assert!(later > first);
    assert!(!tmux.screen().contains("elsewhere-1"), "{}", tmux.screen());
    assert!(tmux.screen().contains("q quit"), "the keys at the bottom");
    // The run stops: the chart's last value is the API's.
    stop.store(true, Ordering::Relaxed);
    let (run, last) = live.join().unwrap();
    let (other, _) = elsewhere.join().unwrap();
    let api = wait_for("the last step stored", Duration::from_secs(10), || {
        let r = hub.run_json("watched-1")?;
        let step = r["last_step"].as_i64().filter(|&s| s == last)?;
        let loss = r["last_values"]["loss"].as_f64()?;
        Some((loss, step))
    });
    let shown = tmux.wait("the API's last value in the legend", |s| {
        legend(s, "watched-1", "loss").filter(|l| l.1 == api.1)
    });
    assert!(
        (shown.0 - api.0).abs() <= api.0.abs() * 1e-5,
        "shown {shown:?}, API {api:?}"
    );
    // Zoom in (the window's steps in the title), back to the whole run, another metric.
    tmux.keys(&["+"]);
    let window = tmux.wait("the zoom window", |s| {
        let at = s.find("zoom steps ")?;
        let (a, b) = s[at + 11..].split_whitespace().next()?.split_once("..")?;
        Some((a.parse::<i64>().ok()?, b.parse::<i64>().ok()?))
    });
    assert!(
        window.0 > 0 && window.1 < api.1,
        "{window:?} of 0..{}",
        api.1
    );
    tmux.keys(&["0", "]"]);
    tmux.wait("the whole run and the next metric", |s| {
        (!s.contains("zoom steps") && legend(s, "watched-1", "lr").is_some()).then_some(())
    });
    // Resized: drawn again at the new size.
    tmux.run(&["resize-window", "-t", "w", "-x", "120", "-y", "40"]);
    tmux.wait("a redraw at 120 columns", |s| {
        s.lines()
            .any(|l| l.chars().count() > 100 && l.contains('─'))
            .then_some(())
    });
    tmux.keys(&["q"]);
    tmux.wait("watch to exit cleanly", |s| {
        s.contains("watch exited 0").then_some(())
    });
    assert!(run.finish(Outcome::Finished).delivered);
    assert!(other.finish(Outcome::Finished).delivered);
}

#[test]
fn watch_in_monochrome_uses_the_read_token_from_its_file() {
    let hub = Hub::start_with_tokens("", &[]);
    let mut opts = Options::new(&hub.ws(), "p", "guarded-1");
    opts.run_id = Some(RunId::new("guarded-1").unwrap());
    opts.token = Some("w".into());
    let run = Collector::start(opts).unwrap();
    for step in 0..50 {
        run.log(step, &[("loss", 1.0 / (step + 1) as f64)]);
    }
    run.flush();
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("read.token");
    std::fs::write(&token, "r\n").unwrap();
    let bare = Tmux::start(80, 24, &format!("{BIN} watch --hub {} --mono", hub.ws()));
    bare.wait("the hub asking for a token", |s| {
        s.contains("wants a read token").then_some(())
    });
    let tmux = Tmux::start(
        80,
        24,
        &format!(
            "NO_COLOR=1 {BIN} watch --hub http://{} --token-file {} guarded-1",
            hub.addr(),
            token.display()
        ),
    );
    let shown = tmux.wait("the run's last point", |s| legend(s, "guarded-1", "loss"));
    assert_eq!(shown.1, 49);
    assert!((shown.0 - 0.02).abs() < 1e-9, "{shown:?}");
    // In monochrome the legend marks a run with its line's marker, not a colour.
    let colours = tmux.run(&["capture-pane", "-p", "-e", "-t", "w"]);
    assert!(!colours.contains("\x1b[36m"), "no cyan in monochrome");
    tmux.keys(&["q"]);
    tmux.wait("watch to exit", |s| {
        s.contains("watch exited 0").then_some(())
    });
    assert!(run.finish(Outcome::Finished).delivered);
}

/// CPU seconds (user + system) a process used so far, from `/proc/PID/stat`.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}

/// Benchmark (ignored; numbers printed): `watch` following 10 live runs (10 metrics each, 100
/// steps/s), all 10 charted at 160x50, against the hub's own CPU over the same seconds as the
/// reference. `WATCH_BIN` picks another build of the binary (a release one).
#[test]
#[ignore]
fn bench_watch_cpu_following_ten_live_runs() {
    let bin = std::env::var("WATCH_BIN").unwrap_or_else(|_| BIN.to_string());
    let hub = Hub::start(&[]);
    let stop = Arc::new(AtomicBool::new(false));
    let runs: Vec<_> = (0..10)
        .map(|i| {
            let mut opts = Options::new(&hub.ws(), "bench", &format!("run-{i}"));
            opts.run_id = Some(RunId::new(format!("run-{i}")).unwrap());
            let run = Collector::start(opts).unwrap();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let names: Vec<String> = (0..10).map(|m| format!("m{m}")).collect();
                let mut step = 0i64;
                let started = std::time::Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    let values: Vec<(&str, f64)> = names
                        .iter()
                        .enumerate()
                        .map(|(m, n)| (n.as_str(), (step as f64 * 0.01 + m as f64).sin()))
                        .collect();
                    run.log(step, &values);
                    step += 1;
                    let due = started + Duration::from_millis(step as u64 * 10);
                    std::thread::sleep(due.saturating_duration_since(std::time::Instant::now()));
                }
                run
            })
        })
        .collect();
    wait_for("ten runs", Duration::from_secs(10), || {
        (hub.json("/api/runs")["runs"].as_array()?.len() == 10).then_some(())
    });
    let tmux = Tmux::start(160, 50, &format!("{bin} watch --hub {} bench", hub.ws()));
    tmux.wait("the list", |s| s.contains("run-9").then_some(()));
    for _ in 0..9 {
        tmux.keys(&["j", "Space"]);
    }
    tmux.wait("ten runs charted", |s| {
        (s.lines()
            .filter(|l| l.contains(" m0 ") || l.contains(" loss "))
            .count()
            >= 1)
            .then_some(())
    });
    let shell: u32 = tmux
        .run(&["display", "-p", "-t", "w", "#{pane_pid}"])
        .trim()
        .parse()
        .unwrap();
    let watch: u32 = String::from_utf8(
        Command::new("pgrep")
            .args(["-P", &shell.to_string()])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
    .lines()
    .next()
    .unwrap()
    .parse()
    .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let (w0, h0, t0) = (
        cpu_seconds(watch),
        cpu_seconds(hub.pid()),
        std::time::Instant::now(),
    );
    std::thread::sleep(Duration::from_secs(10));
    let (w1, h1, wall) = (
        cpu_seconds(watch),
        cpu_seconds(hub.pid()),
        t0.elapsed().as_secs_f64(),
    );
    let (w, h) = ((w1 - w0) / wall * 100.0, (h1 - h0) / wall * 100.0);
    println!(
        "watch following 10 runs x 100 steps/s x 10 metrics, all charted at 160x50: \
         watch {w:.1}% of a core, hub {h:.1}% (ratio watch/hub {:.2})",
        w / h
    );
    stop.store(true, Ordering::Relaxed);
    for r in runs {
        let run = r.join().unwrap();
        assert!(run.finish(Outcome::Finished).delivered);
    }
}
