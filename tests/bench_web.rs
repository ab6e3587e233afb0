//! Browser benchmarks of the web app (not tests: `#[ignore]`, numbers printed). Run them on a
//! release build:
//!
//! ```sh
//! cargo test --release --test e2e bench_web -- --ignored --nocapture --test-threads 1
//! STEPSTREAM_BENCH_MINUTES=10 cargo test --release --test e2e bench_web_memory -- --ignored --nocapture
//! ```
//!
//! Machines differ, so each prints a reference measured in the same page: the time to sort
//! 1,000,000 random floats in JavaScript, and the ratios against it.

use crate::browser::Browser;
use crate::util::*;
use std::time::{Duration, Instant};
use stepstream_collector::{Collector, Options, Outcome};

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn numbers(v: &serde_json::Value) -> Vec<f64> {
    let mut out: Vec<f64> = v
        .as_array()
        .map(|a| a.iter().filter_map(|x| x.as_f64()).collect())
        .unwrap_or_default();
    out.sort_by(f64::total_cmp);
    out
}

/// The page's reference: ms to sort 1,000,000 random floats (median of 5).
pub(crate) fn reference_ms(page: &mut Browser) -> f64 {
    page.eval(
        "(() => { const t = []; for (let k = 0; k < 5; k++) { const a = new Float64Array(1e6); \
         for (let i = 0; i < a.length; i++) a[i] = Math.random(); const t0 = performance.now(); \
         a.sort(); t.push(performance.now() - t0); } t.sort((x, y) => x - y); return t[2]; })()",
    )
    .as_f64()
    .unwrap()
}

const METRICS: [&str; 10] = [
    "loss",
    "lr",
    "grad_norm",
    "samples_per_sec",
    "tokens_per_sec",
    "step_time",
    "ppl",
    "loss_scale",
    "data_wait",
    "eval_loss",
];

fn all_drawn_js(last: i64, n: usize) -> String {
    format!(
        "[...document.querySelectorAll('canvas[data-chart]')].filter(c => c.dataset.lastStep == '{last}').length >= {n}"
    )
}

#[test]
#[ignore]
fn bench_web_million_step_run_first_charts_and_zoom() {
    // `STEPSTREAM_BENCH_STEPS=10000000` for the 10 M-step run of the whole-run targets.
    let steps: i64 = std::env::var("STEPSTREAM_BENCH_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let hub = Hub::start(&[]);
    let big = Collector::start(Options::new(&hub.ws(), "bench", "million")).unwrap();
    let id = big.run_id().to_string();
    let t0 = Instant::now();
    for step in 0..steps {
        let x = step as f64;
        let values: Vec<(&str, f64)> = METRICS
            .iter()
            .enumerate()
            .map(|(i, m)| {
                (
                    *m,
                    2.0 / (1.0 + x * 1e-4) + 0.1 * (x * 1e-3 + i as f64).sin(),
                )
            })
            .collect();
        big.log(step, &values);
    }
    assert!(big.finish(Outcome::Finished).delivered);
    println!(
        "ingest of {steps} steps x 10 metrics: {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    // The whole-run series of each metric from the API (2,000 points), twice.
    for round in 0..2 {
        let mut each = Vec::new();
        for m in METRICS {
            let t = Instant::now();
            let r = hub.get(&format!("/api/runs/{id}/series?metric={m}"));
            assert_eq!(r.status, 200);
            each.push(t.elapsed().as_secs_f64() * 1e3);
        }
        each.sort_by(f64::total_cmp);
        println!(
            "  whole-run series from the API, round {round}: median {:.1} ms, max {:.1} ms per metric",
            percentile(&each, 0.5),
            each[each.len() - 1]
        );
    }
    // The hub's part: a subscription's downsampled history (4,000 points per metric).
    let run_id = stepstream_protocol::RunId::new(id.clone()).unwrap();
    for _ in 0..2 {
        let mut viewer = Viewer::connect(&hub);
        let t = Instant::now();
        viewer.subscribe(std::slice::from_ref(&run_id), Some(4000));
        assert!(viewer.pump(Duration::from_secs(30), |v| v
            .runs
            .get(&run_id)
            .is_some_and(|s| s.backfill_done)));
        println!(
            "  the hub's downsampled history of all 10 metrics: {:.0} ms",
            t.elapsed().as_secs_f64() * 1e3
        );
    }
    let mut page = Browser::open(&format!("http://{}/?lang=en", hub.addr()));
    page.resize(1400, 2400); // every chart on screen: off-screen charts are not drawn
    page.wait(
        "the run listed",
        Duration::from_secs(30),
        "document.querySelectorAll('tr.run').length == 1",
    );
    let reference = reference_ms(&mut page);
    let ms = page.eval(&format!(
        "new Promise(done => {{ const t0 = performance.now(); \
         document.querySelector('tr.run[data-run-id=\"{id}\"]').click(); \
         window.__frames = []; const check = () => {{ const cs = [...document.querySelectorAll('canvas[data-chart]')]; \
         window.__frames.push([Math.round(performance.now() - t0), cs.length, cs.filter(c => c.dataset.lastStep == '{last}').length]); \
         if ({}) done(performance.now() - t0); else requestAnimationFrame(check); }}; check(); }})",
        all_drawn_js(steps - 1, 10),
        last = steps - 1
    ));
    let first = ms.as_f64().unwrap();
    println!(
        "first charts of a {steps}-step run, all 10 drawn: {first:.0} ms (reference {reference:.0} ms, ratio {:.2})",
        first / reference
    );
    println!(
        "  frames after the click [ms, charts, charts drawn whole]: {}",
        page.eval("JSON.stringify(window.__frames)")
            .as_str()
            .unwrap_or_default()
    );
    page.screenshot("bench-million");
    println!(
        "  chart draw times (ms): {}",
        page.eval("[...document.querySelectorAll('canvas[data-chart]')].map(c => c.dataset.drawMs).join(' ')")
    );

    // A 1,100-step window by link, then one wheel notch into about 1,000 steps: the time
    // from the wheel event to the frame that drew every raw point of the new window.
    let mut zooms = Vec::new();
    for k in 0..5i64 {
        let from = steps * 3 / 10 + k * steps / 10;
        page.navigate(&format!(
            "http://{}/?lang=en&runs={id}&x0={from}&x1={}",
            hub.addr(),
            from + 1100
        ));
        page.wait(
            "the window drawn",
            Duration::from_secs(30),
            "(() => { const c = document.querySelector('canvas[data-chart=\"loss\"]'); return c && +c.dataset.detail > 1000 && c.dataset.fetching == '0'; })()",
        );
        let rect = page.eval(
            "(() => { const c = document.querySelector('canvas[data-overlay=\"loss\"]'); const r = c.getBoundingClientRect(); \
             window.__wheelAt = null; c.addEventListener('wheel', e => { window.__wheelAt = performance.now(); }, { once: true }); \
             return [r.left + r.width / 2, r.top + r.height / 2]; })()",
        );
        page.wheel(rect[0].as_f64().unwrap(), rect[1].as_f64().unwrap(), -50.0);
        let took = page.eval(
            "new Promise(done => { const t0 = performance.now(); const check = () => { const c = document.querySelector('canvas[data-chart=\"loss\"]'); \
             const raw = Math.ceil(+c.dataset.x1) - Math.floor(+c.dataset.x0) + 1; \
             if (window.__wheelAt !== null && +c.dataset.x1 - +c.dataset.x0 < 1050 && +c.dataset.detail == raw && c.dataset.fetching == '0') \
               done(performance.now() - window.__wheelAt); \
             else if (performance.now() - t0 > 10000) done(JSON.stringify({ wheel: window.__wheelAt, ...c.dataset })); \
             else requestAnimationFrame(check); }; check(); })",
        );
        zooms.push(
            took.as_f64()
                .unwrap_or_else(|| panic!("the zoom did not complete: {took}")),
        );
    }
    println!(
        "  chart draw times after the zoom (ms): {}",
        page.eval("[...document.querySelectorAll('canvas[data-chart]')].map(c => c.dataset.drawMs).join(' ')")
    );
    zooms.sort_by(f64::total_cmp);
    println!(
        "wheel to every raw point of a ~1,000-step window drawn: median {:.0} ms, max {:.0} ms (5 zooms)",
        percentile(&zooms, 0.5),
        zooms[zooms.len() - 1]
    );
}

/// Streams `n` runs at `rate` steps/s each for `seconds`, 4 metrics per step.
fn stream_runs(
    hub: &Hub,
    n: usize,
    rate: f64,
    seconds: f64,
) -> (Vec<String>, Vec<std::thread::JoinHandle<()>>) {
    let mut ids = Vec::new();
    let mut threads = Vec::new();
    for r in 0..n {
        let run = Collector::start(Options::new(&hub.ws(), "bench", &format!("live-{r}"))).unwrap();
        run.log(
            0,
            &[
                ("loss", 1.0),
                ("lr", 1e-3),
                ("grad_norm", 1.0),
                ("samples_per_sec", 100.0),
            ],
        );
        run.flush();
        ids.push(run.run_id().to_string());
        threads.push(std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(3));
            let t0 = Instant::now();
            let steps = (rate * seconds) as i64;
            for step in 1..=steps {
                let due = t0 + Duration::from_secs_f64(step as f64 / rate);
                if let Some(w) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(w);
                }
                let x = step as f64;
                run.log(
                    step,
                    &[
                        ("loss", 1.0 / x + r as f64 * 0.1),
                        ("lr", 1e-3),
                        ("grad_norm", 1.0 + (x * 0.1).sin()),
                        ("samples_per_sec", 100.0),
                    ],
                );
            }
            run.finish(Outcome::Finished);
        }));
    }
    (ids, threads)
}

#[test]
#[ignore]
fn bench_web_ten_live_runs_frame_time_and_step_to_pixel() {
    let hub = Hub::start(&[]);
    let (ids, threads) = stream_runs(&hub, 10, 100.0, 20.0);
    let mut page = Browser::open(&format!(
        "http://{}/?lang=en&runs={}",
        hub.addr(),
        ids.join(",")
    ));
    page.resize(1400, 1400);
    page.wait(
        "ten runs open",
        Duration::from_secs(30),
        "document.querySelectorAll('tr.run.selected').length == 10",
    );
    let reference = reference_ms(&mut page);
    page.eval("window.__stepstreamFrames = []; window.__stepstreamLatency = []");
    for t in threads {
        t.join().unwrap();
    }
    let frames = numbers(&page.eval("window.__stepstreamFrames"));
    let latency: Vec<f64> = numbers(&page.eval("window.__stepstreamLatency"))
        .iter()
        .map(|s| s * 1e3)
        .collect();
    let draws = page.eval("[...document.querySelectorAll('canvas[data-chart]')].map(c => +c.dataset.frames).reduce((a, b) => a + b, 0)");
    println!(
        "10 runs x 100 steps/s, 4 charts on screen: {} frames that drew ({} chart draws); frame time p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms (reference {reference:.0} ms; p99/reference {:.3})",
        frames.len(),
        draws,
        percentile(&frames, 0.5),
        percentile(&frames, 0.99),
        frames.last().copied().unwrap_or(f64::NAN),
        percentile(&frames, 0.99) / reference
    );
    println!(
        "step-to-pixel with 10 runs at 100 steps/s: p50 {:.1} ms, p99 {:.1} ms ({} samples)",
        percentile(&latency, 0.5),
        percentile(&latency, 0.99),
        latency.len()
    );
    page.screenshot("bench-ten-runs");
    println!(
        "  last chart draws (ms, whole / plotters part): {}",
        page.eval("[...document.querySelectorAll('canvas[data-chart]')].map(c => c.dataset.drawMs + '/' + c.dataset.renderMs).join(' ')")
    );

    // One run at 100 steps/s: the latency from `log` to the frame that drew the point.
    let (ids, threads) = stream_runs(&hub, 1, 100.0, 15.0);
    page.navigate(&format!("http://{}/?lang=en&runs={}", hub.addr(), ids[0]));
    page.wait(
        "the run open",
        Duration::from_secs(30),
        "document.querySelectorAll('tr.run.selected').length == 1",
    );
    page.eval("window.__stepstreamLatency = []");
    for t in threads {
        t.join().unwrap();
    }
    let latency: Vec<f64> = numbers(&page.eval("window.__stepstreamLatency"))
        .iter()
        .map(|s| s * 1e3)
        .collect();
    println!(
        "step-to-pixel, one run at 100 steps/s: p50 {:.1} ms, p99 {:.1} ms ({} samples)",
        percentile(&latency, 0.5),
        percentile(&latency, 0.99),
        latency.len()
    );
}

#[test]
#[ignore]
fn bench_web_memory() {
    let minutes: f64 = std::env::var("STEPSTREAM_BENCH_MINUTES")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(10.0);
    let hub = Hub::start(&[]);
    let (ids, threads) = stream_runs(&hub, 3, 100.0, minutes * 60.0);
    let mut page = Browser::open(&format!(
        "http://{}/?lang=en&runs={}",
        hub.addr(),
        ids.join(",")
    ));
    page.wait(
        "the runs open",
        Duration::from_secs(30),
        "document.querySelectorAll('tr.run.selected').length == 3",
    );
    let heap = "(() => { const m = performance.memory; \
        return { js: m.usedJSHeapSize / 1048576, wasm: (window.__stepstreamWasmBytes ? window.__stepstreamWasmBytes() : 0) / 1048576 }; })()";
    std::thread::sleep(Duration::from_secs(10));
    let start = page.eval(heap);
    let t0 = Instant::now();
    let mut samples = vec![start.clone()];
    for t in threads {
        while !t.is_finished() {
            std::thread::sleep(Duration::from_secs(30));
            samples.push(page.eval(heap));
        }
        t.join().unwrap();
    }
    let end = page.eval(heap);
    println!(
        "page memory over {:.1} min of 3 runs x 100 steps/s: JS heap {:.1} -> {:.1} MiB, wasm memory {:.1} -> {:.1} MiB; samples {}",
        t0.elapsed().as_secs_f64() / 60.0,
        start["js"].as_f64().unwrap_or(f64::NAN),
        end["js"].as_f64().unwrap_or(f64::NAN),
        start["wasm"].as_f64().unwrap_or(f64::NAN),
        end["wasm"].as_f64().unwrap_or(f64::NAN),
        samples.iter().map(|s| format!("{:.1}/{:.1}", s["js"].as_f64().unwrap_or(0.0), s["wasm"].as_f64().unwrap_or(0.0))).collect::<Vec<_>>().join(" ")
    );
}

/// Ms from `trigger` (JavaScript run in the page) to the first frame where `done` (a
/// JavaScript expression) holds, measured in the page.
fn time_to(page: &mut Browser, trigger: &str, done: &str) -> f64 {
    let took = page.eval(&format!(
        "new Promise(finish => {{ const t0 = performance.now(); {trigger}; const check = () => {{ \
         if ({done}) finish(performance.now() - t0); \
         else if (performance.now() - t0 > 30000) finish(null); else requestAnimationFrame(check); }}; check(); }})"
    ));
    took.as_f64()
        .unwrap_or_else(|| panic!("not done within 30 s: {done}"))
}

#[test]
#[ignore]
fn bench_web_views_tokens_axis_and_a_group_of_fifty_runs() {
    let hub = Hub::start(&[]);
    // x = tokens on a 1M-step run: its first draw against the step axis's, alternately.
    let steps = 1_000_000i64;
    let big = Collector::start(Options::new(&hub.ws(), "bench", "tokens")).unwrap();
    let id = big.run_id().to_string();
    for step in 0..steps {
        let x = step as f64;
        big.log(
            step,
            &[
                ("loss", 2.0 / (1.0 + x * 1e-4) + 0.1 * (x * 1e-3).sin()),
                ("tokens_seen", x * 2048.0 * 512.0),
            ],
        );
    }
    assert!(big.finish(Outcome::Finished).delivered);
    let mut page = Browser::open(&format!("http://{}/?lang=en", hub.addr()));
    page.resize(1400, 1400);
    let reference = reference_ms(&mut page);
    let drawn = format!(
        "(() => {{ const c = document.querySelector('canvas[data-chart=\"loss\"]'); \
         return c && c.dataset.lastStep == '{}'; }})()",
        steps - 1
    );
    let mut times: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for round in 0..10 {
        let axis = if round % 2 == 0 {
            "step"
        } else {
            "metric:tokens_seen"
        };
        page.navigate(&format!("http://{}/?lang=en&axis={axis}", hub.addr()));
        page.wait(
            "the run listed",
            Duration::from_secs(30),
            "document.querySelectorAll('tr.run').length == 1",
        );
        let click = format!("document.querySelector('tr.run[data-run-id=\"{id}\"]').click()");
        times[round % 2].push(time_to(&mut page, &click, &drawn));
    }
    for t in &mut times {
        t.sort_by(f64::total_cmp);
    }
    let (step_ms, tokens_ms) = (percentile(&times[0], 0.5), percentile(&times[1], 0.5));
    println!(
        "first draw of a 1M-step run's loss: step axis {step_ms:.0} ms, tokens axis {tokens_ms:.0} ms \
         (medians of 5; ratio {:.2}; reference {reference:.0} ms)",
        tokens_ms / step_ms
    );

    // A group of 50 runs x 100k steps.
    let runs = 50;
    let steps = 100_000i64;
    let ids: Vec<String> = (0..runs)
        .map(|k| {
            let run =
                Collector::start(Options::new(&hub.ws(), "bench", &format!("g-seed{k}"))).unwrap();
            for step in 0..steps {
                let x = step as f64;
                run.log(
                    step,
                    &[(
                        "loss",
                        2.0 / (1.0 + x * 1e-3) + 0.1 * (x * 0.01 + k as f64).sin(),
                    )],
                );
            }
            let id = run.run_id().to_string();
            assert!(run.finish(Outcome::Finished).delivered);
            id
        })
        .collect();
    page.navigate(&format!(
        "http://{}/?lang=en&runs={}",
        hub.addr(),
        ids.join(",")
    ));
    page.wait(
        "fifty runs drawn",
        Duration::from_secs(120),
        &format!(
            "(() => {{ const c = document.querySelector('canvas[data-chart=\"loss\"]'); \
             return c && c.dataset.lines && c.dataset.lines.split('|').length == {runs} && c.dataset.lastStep == '{}'; }})()",
            steps - 1
        ),
    );
    let group = |on: bool| {
        format!(
            "(() => {{ const s = document.querySelector('select.group-by'); s.value = '{}'; \
             s.dispatchEvent(new Event('change', {{ bubbles: true }})); }})()",
            if on { "name" } else { "none" }
        )
    };
    let one_line = "(() => { const c = document.querySelector('canvas[data-chart=\"loss\"]'); \
                    return c.dataset.lines == 'g (50 runs)'; })()";
    let fifty = format!(
        "document.querySelector('canvas[data-chart=\"loss\"]').dataset.lines.split('|').length == {runs}"
    );
    let mut grouped = Vec::new();
    for _ in 0..3 {
        grouped.push(time_to(&mut page, &group(true), one_line));
        time_to(&mut page, &group(false), &fifty);
    }
    grouped.sort_by(f64::total_cmp);
    let draw_ms = page.eval("document.querySelector('canvas[data-chart=\"loss\"]').dataset.drawMs");
    // Zoom to raw: a 1,100-step window by link, then a wheel notch into ~1,000 steps.
    let mut zooms = Vec::new();
    for k in 0..3i64 {
        let from = 20_000 + k * 20_000;
        page.navigate(&format!(
            "http://{}/?lang=en&runs={}&group=name%3A-seed%5Cd%2B&x0={from}&x1={}",
            hub.addr(),
            ids.join(","),
            from + 1100
        ));
        page.wait(
            "the grouped window drawn",
            Duration::from_secs(60),
            "(() => { const c = document.querySelector('canvas[data-chart=\"loss\"]'); \
             return c && +c.dataset.detail > 50000 && c.dataset.fetching == '0' && c.dataset.lines == 'g (50 runs)'; })()",
        );
        let rect = page.eval(
            "(() => { const c = document.querySelector('canvas[data-overlay=\"loss\"]'); const r = c.getBoundingClientRect(); \
             return [r.left + r.width / 2, r.top + r.height / 2]; })()",
        );
        page.eval(
            "window.__wheelAt = null; document.querySelector('canvas[data-overlay=\"loss\"]')\
             .addEventListener('wheel', () => { window.__wheelAt = performance.now(); }, { once: true })",
        );
        page.wheel(rect[0].as_f64().unwrap(), rect[1].as_f64().unwrap(), -50.0);
        let took = page.eval(
            "new Promise(done => { const t0 = performance.now(); const check = () => { \
             const c = document.querySelector('canvas[data-chart=\"loss\"]'); \
             const raw = (Math.ceil(+c.dataset.x1) - Math.floor(+c.dataset.x0) + 1) * 50; \
             if (window.__wheelAt !== null && +c.dataset.x1 - +c.dataset.x0 < 1050 && +c.dataset.detail >= raw && c.dataset.fetching == '0') \
               done(performance.now() - window.__wheelAt); \
             else if (performance.now() - t0 > 20000) done(null); else requestAnimationFrame(check); }; check(); })",
        );
        zooms.push(took.as_f64().expect("the zoom to raw completes"));
    }
    zooms.sort_by(f64::total_cmp);
    println!(
        "a group of {runs} runs x {steps} steps: mean and band drawn {:.0} ms after grouping \
         (median of 3, max {:.0}; chart draw {draw_ms} ms); wheel to every raw point of a \
         ~1,000-step window of the group: median {:.0} ms, max {:.0} ms (3 zooms); reference {reference:.0} ms",
        percentile(&grouped, 0.5),
        grouped[grouped.len() - 1],
        percentile(&zooms, 0.5),
        zooms[zooms.len() - 1]
    );
    page.screenshot("bench-group");
}
