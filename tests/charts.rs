//! The web app's charts for long runs, in headless Chromium: zoom to every raw point (wheel,
//! box, pan, follow), smoothing, log scale, outliers, axes, the synchronised crosshair,
//! themes, HiDPI, downloads, the run panel and config diff, the run list's search, sort and
//! grouping, distributed jobs, and the view in the URL.

use crate::browser::Browser;
use crate::util::*;
use serde_json::Value;
use std::time::Duration;
use stepstream_collector::{Collector, Options, Outcome};

const LONG: Duration = Duration::from_secs(60);
const SHORT: Duration = Duration::from_secs(15);

/// A chart canvas's test hooks, as numbers where they are numbers.
pub(crate) fn hooks(page: &mut Browser, chart: &str) -> Value {
    page.eval(&format!(
        "(() => {{ const c = document.querySelector('canvas[data-chart=\"{chart}\"]'); \
         if (!c || !c.dataset.points) return null; const r = c.getBoundingClientRect(); \
         const o = {{ left: r.left, top: r.top, cssWidth: c.clientWidth, width: c.width }}; \
         for (const [k, v] of Object.entries(c.dataset)) o[k] = (v !== '' && !isNaN(+v)) ? +v : v; \
         return o; }})()"
    ))
}

pub(crate) fn wait_hooks(page: &mut Browser, what: &str, chart: &str, cond: &str) -> Value {
    page.wait(
        what,
        LONG,
        &format!(
            "(() => {{ const c = document.querySelector('canvas[data-chart=\"{chart}\"]'); \
             if (!c || !c.dataset.points) return null; const h = {{}}; \
             for (const [k, v] of Object.entries(c.dataset)) h[k] = (v !== '' && !isNaN(+v)) ? +v : v; \
             return ({cond}) ? h : null; }})()"
        ),
    );
    hooks(page, chart)
}

/// Page coordinates of an x value (and the plot's vertical middle) on a chart.
pub(crate) fn at_x(h: &Value, x: f64) -> (f64, f64) {
    let f = |k: &str| h[k].as_f64().unwrap_or_else(|| panic!("hook {k} in {h}"));
    let t = (x - f("x0")) / (f("x1") - f("x0"));
    let px = f("left") + f("plotLeft") + t * (f("plotRight") - f("plotLeft"));
    (px, f("top") + (f("plotTop") + f("plotBottom")) / 2.0)
}

fn ink_hash(page: &mut Browser, chart: &str) -> Value {
    page.eval(&format!(
        "(() => {{ const c = document.querySelector('canvas[data-chart=\"{chart}\"]'); \
         const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; \
         let h = 0; for (let i = 0; i < d.length; i += 4) h = (h * 31 + d[i] + d[i+1] * 7 + d[i+2] * 13) % 1000000007; \
         return h; }})()"
    ))
}

pub(crate) fn open_run(hub: &Hub, ids: &[&str], extra: &str) -> Browser {
    let mut page = Browser::open(&format!(
        "http://{}/?lang=en&runs={}{extra}",
        hub.addr(),
        ids.join(",")
    ));
    page.wait(
        "the runs open",
        LONG,
        &format!(
            "document.querySelectorAll('tr.run.selected').length == {}",
            ids.len()
        ),
    );
    page
}

pub(crate) fn tooltip(page: &mut Browser) -> String {
    page.wait(
        "the tooltip",
        SHORT,
        "(() => { const t = document.querySelector('[data-testid=tooltip]'); return t ? t.textContent : ''; })()",
    )
    .as_str()
    .unwrap()
    .to_string()
}

/// The value at the spike step and at the step whose value only the raw data holds.
const SPIKE: i64 = 654_321;
const HIDDEN: i64 = 700_123;

fn million_value(step: i64) -> f64 {
    match step {
        SPIKE => 100.0,
        HIDDEN => 1.2345678,
        s => 1.0 + 0.5 * (s as f64 * 0.01).sin(),
    }
}

#[test]
fn zoom_into_a_million_step_run_shows_every_raw_point_and_the_url_reproduces_it() {
    let hub = Hub::start(&[]);
    let run = Collector::start(Options::new(&hub.ws(), "charts", "million")).unwrap();
    let id = run.run_id().to_string();
    for step in 0..1_000_000i64 {
        run.log(step, &[("loss", million_value(step))]);
    }
    assert!(run.finish(Outcome::Finished).delivered);
    let mut page = open_run(&hub, &[&id], "");

    // The whole-run view kept the spike (the hub's M4 and the page's both keep extremes).
    let whole = wait_hooks(&mut page, "the whole run", "loss", "h.lastStep == 999999");
    assert!(
        whole["y1"].as_f64().unwrap() >= 100.0,
        "the spike sets the range: {whole}"
    );
    assert!(
        whole["drawn"].as_u64().unwrap() < 20_000,
        "decimated: {whole}"
    );
    page.screenshot("charts-million-whole");

    // Wheel in around the hidden step until the window is under 1,000 steps (fewer than
    // four per pixel column: the hub answers every raw point).
    for _ in 0..80 {
        let h = hooks(&mut page, "loss");
        if h["x1"].as_f64().unwrap() - h["x0"].as_f64().unwrap() < 1000.0 {
            break;
        }
        let (x, y) = at_x(&h, HIDDEN as f64);
        page.wheel(x, y, -120.0);
        std::thread::sleep(Duration::from_millis(30));
    }
    let zoomed = wait_hooks(
        &mut page,
        "every raw point of the window",
        "loss",
        "h.x1 - h.x0 < 1000 && h.detail > 0 && h.fetching == 0",
    );
    let (x0, x1) = (
        zoomed["x0"].as_f64().unwrap(),
        zoomed["x1"].as_f64().unwrap(),
    );
    assert!(
        x0 <= HIDDEN as f64 && HIDDEN as f64 <= x1,
        "zoomed around it: {zoomed}"
    );
    let raw = (x1.ceil() - x0.floor()) as u64 + 1;
    assert_eq!(
        zoomed["detail"], raw,
        "every raw step of the window came from the hub"
    );
    assert!(
        zoomed["drawn"].as_u64().unwrap() >= raw - 2,
        "and was drawn: {zoomed}"
    );
    assert_eq!(
        page.eval("document.querySelector('button.follow').dataset.following"),
        "false"
    );
    page.screenshot("charts-million-zoomed");

    // The address now holds the window: opened afresh, it shows the same view.
    let url = page.eval("location.href").as_str().unwrap().to_string();
    assert!(url.contains("x0=") && url.contains(&id), "{url}");
    // A narrow window by link, then hover the hidden step: its raw value is shown.
    page.navigate(&format!(
        "http://{}/?lang=en&runs={id}&x0={}&x1={}",
        hub.addr(),
        HIDDEN - 5,
        HIDDEN + 5
    ));
    let narrow = wait_hooks(
        &mut page,
        "the linked window",
        "loss",
        "h.detail >= 11 && h.x0 > 700000",
    );
    assert_eq!(narrow["x0"], (HIDDEN - 5) as f64);
    let (x, y) = at_x(&narrow, HIDDEN as f64);
    page.mouse_move(x, y);
    let tip = tooltip(&mut page);
    assert!(
        tip.contains(&format!("step {HIDDEN}")) && tip.contains("1.2346"),
        "{tip}"
    );
    page.screenshot("charts-million-hidden-point");

    // Back: the earlier view (the wider zoom) returns.
    page.eval("history.back()");
    page.wait(
        "the earlier view",
        SHORT,
        "(() => { const c = document.querySelector('canvas[data-chart=\"loss\"]'); return c && +c.dataset.x1 - +c.dataset.x0 > 20; })()",
    );
}

/// Streams `loss` and `lr` forever (until the returned flag is set), one step per 20 ms.
fn live_run(
    hub: &Hub,
    name: &str,
) -> (
    String,
    std::sync::Arc<std::sync::atomic::AtomicBool>,
    std::thread::JoinHandle<()>,
) {
    let run = Collector::start(Options::new(&hub.ws(), "charts", name)).unwrap();
    let id = run.run_id().to_string();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    let t = std::thread::spawn(move || {
        let mut step = 0i64;
        while !flag.load(std::sync::atomic::Ordering::Relaxed) {
            run.log(
                step,
                &[("loss", 2.0 / (1.0 + step as f64 * 0.01)), ("lr", 1e-3)],
            );
            run.flush();
            step += 1;
            std::thread::sleep(Duration::from_millis(20));
        }
        run.finish(Outcome::Finished);
    });
    (id, stop, t)
}

#[test]
fn zoomed_charts_keep_their_window_while_points_arrive_and_follow_resumes() {
    let hub = Hub::start(&[]);
    let (id, stop, producer) = live_run(&hub, "live");
    let mut page = open_run(&hub, &[&id], "");
    let h = wait_hooks(&mut page, "some points", "loss", "h.lastStep > 100");
    // Drag a box over the middle half: the window becomes that range.
    let (a, y) = at_x(
        &h,
        h["x0"].as_f64().unwrap() + (h["x1"].as_f64().unwrap() - h["x0"].as_f64().unwrap()) * 0.25,
    );
    let (b, _) = at_x(
        &h,
        h["x0"].as_f64().unwrap() + (h["x1"].as_f64().unwrap() - h["x0"].as_f64().unwrap()) * 0.75,
    );
    page.drag((a, y), (b, y), "left", 0);
    let boxed = wait_hooks(
        &mut page,
        "the box zoom",
        "loss",
        "h.x1 - h.x0 < 0.8 * h.lastStep",
    );
    let (bx0, bx1) = (boxed["x0"].as_f64().unwrap(), boxed["x1"].as_f64().unwrap());
    let last_list = |page: &mut Browser| {
        page.eval(&format!(
            "+document.querySelector('tr.run[data-run-id=\"{id}\"] td:nth-child(5)').textContent"
        ))
        .as_f64()
        .unwrap()
    };
    let before = last_list(&mut page);
    page.wait(
        "points arriving",
        SHORT,
        &format!(
            "+document.querySelector('tr.run[data-run-id=\"{id}\"] td:nth-child(5)').textContent > {}",
            before + 40.0
        ),
    );
    let still = hooks(&mut page, "loss");
    assert_eq!(
        (still["x0"].as_f64().unwrap(), still["x1"].as_f64().unwrap()),
        (bx0, bx1),
        "the window stays"
    );
    // Every other chart shares the window.
    assert_eq!(hooks(&mut page, "lr")["x0"].as_f64().unwrap(), bx0);

    // Shift-drag pans by the dragged distance.
    let (m, _) = at_x(&still, (bx0 + bx1) / 2.0);
    page.drag((m, y), (m + 100.0, y), "left", 8);
    let panned = wait_hooks(&mut page, "the pan", "loss", &format!("h.x0 < {bx0} - 1"));
    let width = |h: &Value| h["x1"].as_f64().unwrap() - h["x0"].as_f64().unwrap();
    assert!(
        (width(&panned) - (bx1 - bx0)).abs() < 1e-6,
        "panning keeps the width"
    );
    // The middle button pans too.
    page.drag((m, y), (m - 50.0, y), "middle", 0);
    wait_hooks(
        &mut page,
        "the middle-button pan",
        "loss",
        &format!("h.x0 > {} + 1", panned["x0"]),
    );
    page.screenshot("charts-live-zoomed");

    // Double-click: follow the live edge again.
    page.double_click(m, y);
    let following = wait_hooks(
        &mut page,
        "following again",
        "loss",
        &format!("h.x1 > {bx1} + 40 && h.lastStep >= h.x1 - 1"),
    );
    assert_eq!(following["x0"], 0.0);
    assert_eq!(
        page.eval("document.querySelector('button.follow').dataset.following"),
        "true"
    );
    // The wheel zooms, the follow button returns.
    let (cx, cy) = at_x(&following, following["x1"].as_f64().unwrap() * 0.5);
    page.wheel(cx, cy, -300.0);
    wait_hooks(&mut page, "wheel zoom", "loss", "h.x0 > 0");
    page.eval("document.querySelector('button.follow').click()");
    wait_hooks(&mut page, "follow button", "loss", "h.x0 == 0");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    producer.join().unwrap();
}

#[test]
fn smoothing_log_scale_outliers_axes_crosshair_theme_and_downloads() {
    let hub = Hub::start(&[]);
    let run = Collector::start(Options::new(&hub.ws(), "charts", "noisy")).unwrap();
    let id = run.run_id().to_string();
    for step in 0..1000i64 {
        let noise = ((step * 7919) % 101) as f64 / 100.0 - 0.5;
        let loss = if step == 400 {
            50.0
        } else {
            (-(step as f64) / 300.0).exp() * (1.0 + 0.6 * noise) + 0.05
        };
        run.log(
            step,
            &[("loss", loss), ("lr", 1e-3), ("grad_norm", 1.0 + noise)],
        );
        if step % 100 == 0 {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    assert!(run.finish(Outcome::Finished).delivered);
    let mut page = open_run(&hub, &[&id], "");
    let raw = wait_hooks(&mut page, "the loss chart", "loss", "h.points == 1000");
    let before = ink_hash(&mut page, "loss");

    // Smoothing: the drawn line changes, the raw points are still all drawn (faintly).
    page.eval(
        "(() => { const s = document.querySelector('[data-testid=smoothing]'); s.value = '0.9'; \
         s.dispatchEvent(new Event('input', { bubbles: true })); })()",
    );
    let smooth = wait_hooks(&mut page, "smoothed", "loss", "h.smoothing == 0.9");
    assert_eq!(smooth["drawn"], raw["drawn"], "the raw line stays");
    assert_ne!(
        ink_hash(&mut page, "loss"),
        before,
        "the smoothed line is drawn"
    );
    page.screenshot("charts-smoothed");

    // Ignore outliers: the spike no longer sets the range and is marked at the edge.
    assert!(raw["y1"].as_f64().unwrap() > 50.0);
    page.eval("document.querySelector('[data-chart-card=\"loss\"] input.robust').click()");
    let robust = wait_hooks(&mut page, "outliers ignored", "loss", "h.robust == 'true'");
    assert!(robust["y1"].as_f64().unwrap() < 5.0, "{robust}");
    assert!(robust["clipped"].as_u64().unwrap() >= 1, "{robust}");
    page.eval("document.querySelector('[data-chart-card=\"loss\"] input.robust').click()");
    // Log scale: the axis spans the logs of the values.
    page.eval("document.querySelector('[data-chart-card=\"loss\"] input.log').click()");
    let log = wait_hooks(
        &mut page,
        "log scale",
        "loss",
        "h.log == 'true' && h.robust == 'false'",
    );
    let y1 = log["y1"].as_f64().unwrap();
    assert!((1.7..2.2).contains(&y1), "log10(50) plus padding: {log}");
    page.screenshot("charts-log");

    // Hover one chart: every chart draws the crosshair at the same x. (In view first: the
    // page below the charts grew.)
    page.eval("document.querySelector('canvas[data-chart=\"grad_norm\"]').scrollIntoView({ block: 'center' })");
    // Drawn once in view (a chart off screen is not drawn).
    let h = wait_hooks(&mut page, "grad_norm in view", "grad_norm", "true");
    let (x, y) = at_x(&h, 500.0);
    page.mouse_move(x, y);
    let tip = tooltip(&mut page);
    assert!(
        tip.contains("step") && tip.contains("noisy") && tip.contains("raw"),
        "{tip}"
    );
    let xs = page.wait(
        "crosshairs on every chart",
        SHORT,
        "(() => { const o = [...document.querySelectorAll('canvas[data-overlay]')].map(c => c.dataset.hoverX); \
         return o.length == 3 && o.every(x => x && x == o[0]) ? o : null; })()",
    );
    let hx: f64 = xs[0].as_str().unwrap().parse().unwrap();
    assert!((hx - 500.0).abs() < 5.0, "{xs}");
    page.screenshot("charts-crosshair");

    // Wall-time axis, and time since the start.
    page.eval(
        "(() => { const s = document.querySelector('select.axis'); s.value = 'wall'; \
         s.dispatchEvent(new Event('change', { bubbles: true })); })()",
    );
    let wall = wait_hooks(&mut page, "wall-time axis", "loss", "h.axis == 'wall'");
    assert!(wall["x0"].as_f64().unwrap() > 1.7e9, "unix seconds: {wall}");
    page.eval(
        "(() => { const s = document.querySelector('select.axis'); s.value = 'relative'; \
         s.dispatchEvent(new Event('change', { bubbles: true })); })()",
    );
    let rel = wait_hooks(&mut page, "relative axis", "loss", "h.axis == 'relative'");
    assert!((0.0..60.0).contains(&rel["x0"].as_f64().unwrap()), "{rel}");
    assert!(page
        .eval("location.search")
        .as_str()
        .unwrap()
        .contains("axis=relative"));

    // Enlarge one chart to the full panel.
    page.eval("document.querySelector('[data-chart-card=\"loss\"] button.enlarge').click()");
    let big = wait_hooks(&mut page, "enlarged", "loss", "true");
    page.wait(
        "enlarged",
        SHORT,
        "document.querySelector('canvas[data-chart=\"loss\"]').clientHeight > 400",
    );
    assert!(big["cssWidth"].as_f64().unwrap() > 700.0, "{big}");
    page.eval("document.querySelector('[data-chart-card=\"loss\"] button.enlarge').click()");

    // Dark theme: switchable, remembered, and the charts redraw dark.
    for _ in 0..3 {
        if page.eval("document.documentElement.dataset.theme") == "dark" {
            break;
        }
        page.eval("document.querySelector('button.theme').click()");
    }
    page.wait(
        "dark theme",
        SHORT,
        "document.documentElement.dataset.theme == 'dark'",
    );
    page.wait(
        "a dark chart",
        SHORT,
        "(() => { const c = document.querySelector('canvas[data-chart=\"lr\"]'); \
         const p = c.getContext('2d').getImageData(3, 3, 1, 1).data; return p[0] < 60 && p[1] < 60; })()",
    );
    page.screenshot("charts-dark");
    page.navigate(&format!("http://{}/?lang=en&runs={id}", hub.addr()));
    page.wait(
        "the theme remembered",
        LONG,
        "document.documentElement.dataset.theme == 'dark'",
    );

    // Downloads: the chart as PNG, the run as CSV and as Parquet.
    let downloads = tempfile::tempdir().unwrap();
    page.allow_downloads(downloads.path());
    wait_hooks(&mut page, "the chart again", "loss", "h.points == 1000");
    page.eval("document.querySelector('[data-chart-card=\"loss\"] button.png').click()");
    page.eval("document.querySelector('.run-panel a.csv').click()");
    page.eval("document.querySelector('.run-panel a.parquet').click()");
    let files = wait_for("the three downloads", SHORT, || {
        let names: Vec<String> = std::fs::read_dir(downloads.path())
            .ok()?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| !n.ends_with(".crdownload"))
            .collect();
        (names.len() == 3).then_some(names)
    });
    let parquet = files
        .iter()
        .find(|n| n.ends_with("_metrics.parquet"))
        .expect("the run's Parquet");
    let bytes = std::fs::read(downloads.path().join(parquet)).unwrap();
    assert!(bytes.starts_with(b"PAR1") && bytes.ends_with(b"PAR1"));
    let png = files.iter().find(|n| n.ends_with(".png")).expect("a PNG");
    let bytes = std::fs::read(downloads.path().join(png)).unwrap();
    assert_eq!(&bytes[1..4], b"PNG");
    let csv = files
        .iter()
        .find(|n| n.ends_with("_metrics.csv"))
        .expect("the run's CSV");
    let text = std::fs::read_to_string(downloads.path().join(csv)).unwrap();
    assert_eq!(text.lines().count(), 1001, "a header and every step");
}

#[test]
fn hidpi_canvases_are_backed_by_device_pixels() {
    let hub = Hub::start(&[]);
    let run = Collector::start(Options::new(&hub.ws(), "charts", "crisp")).unwrap();
    let id = run.run_id().to_string();
    for step in 0..100 {
        run.log(step, &[("loss", 1.0 / (1.0 + step as f64))]);
    }
    assert!(run.finish(Outcome::Finished).delivered);
    let mut page = Browser::open_scaled(&format!("http://{}/?lang=en&runs={id}", hub.addr()), 2.0);
    let h = wait_hooks(&mut page, "the chart", "loss", "h.points == 100");
    assert_eq!(
        h["width"].as_f64().unwrap(),
        2.0 * h["cssWidth"].as_f64().unwrap(),
        "{h}"
    );
    page.screenshot("charts-hidpi");
}

fn config_run(hub: &Hub, project: &str, name: &str, config: Value) -> String {
    let mut o = Options::new(&hub.ws(), project, name);
    o.config_json = config.to_string();
    o.framework = "pytorch".into();
    let run = Collector::start(o).unwrap();
    for step in 0..50 {
        run.log(step, &[("loss", 1.0 / (1.0 + step as f64))]);
    }
    let id = run.run_id().to_string();
    assert!(run.finish(Outcome::Finished).delivered);
    id
}

#[test]
fn run_panel_config_diff_search_sort_grouping_and_a_four_rank_job() {
    let hub = Hub::start(&[]);
    let a = config_run(
        &hub,
        "nlp",
        "alpha",
        serde_json::json!({"lr": 0.001, "model": {"layers": 4}, "seed": 1}),
    );
    let b = config_run(
        &hub,
        "nlp",
        "beta",
        serde_json::json!({"lr": 0.0003, "model": {"layers": 4}, "seed": 1}),
    );
    let c = config_run(
        &hub,
        "vision",
        "gamma",
        serde_json::json!({"lr": 0.001, "model": {"layers": 50}}),
    );
    // One distributed job: four ranks, the same job identity, rank 2 slower.
    let ranks: Vec<Collector> = (0..4u32)
        .map(|r| {
            let mut o = Options::new(&hub.ws(), "dist", "llama");
            o.job = Some("launch-9".into());
            o.rank = r;
            o.world_size = 4;
            Collector::start(o).unwrap()
        })
        .collect();
    for step in 0..60i64 {
        for (r, c) in ranks.iter().enumerate() {
            let t = if r == 2 { 0.3 } else { 0.1 };
            c.log(step, &[("loss", 1.0), ("step_time", t)]);
        }
    }
    for r in ranks {
        assert!(r.finish(Outcome::Finished).delivered);
    }
    let mut page = Browser::open(&format!("http://{}/?lang=en", hub.addr()));
    page.wait("the runs and the job", LONG, "document.querySelectorAll('tr.run').length == 3 && document.querySelectorAll('tr.job').length == 1");
    assert_eq!(
        page.eval("document.querySelector('tr.job').dataset.ranks"),
        "4"
    );
    page.eval("document.querySelector('tr.job button.expand').click()");
    page.wait(
        "its ranks",
        SHORT,
        "document.querySelectorAll('tr.run.nested[data-job=\"launch-9\"]').length == 4",
    );
    // The job's row selects every rank: one line per rank on the step time chart.
    page.eval("document.querySelector('tr.job').click()");
    let st = wait_hooks(
        &mut page,
        "per-rank step time",
        "step_time",
        "h.points == 240",
    );
    let lines = st["lines"].as_str().unwrap();
    for r in 0..4 {
        assert!(lines.contains(&format!("llama r{r}")), "{lines}");
    }
    page.screenshot("charts-job-ranks");
    page.eval("document.querySelector('tr.job').click()");

    // One run: its panel.
    let row = |id: &str| format!("document.querySelector('tr.run[data-run-id=\"{id}\"]').click()");
    page.eval(&row(&a));
    let panel = page.wait(
        "the run panel",
        SHORT,
        "(() => { const p = document.querySelector('[data-testid=run-panel]'); \
         const k = p && p.querySelector('tr[data-key=\"model.layers\"]'); return k ? p.textContent : null; })()",
    );
    let panel = panel.as_str().unwrap();
    assert!(
        panel.contains("pytorch") && panel.contains("finished") && panel.contains("0 / 1"),
        "{panel}"
    );
    // Its embed snippet names the run, its loss and this hub; the iframe link draws it.
    let snippet = page.eval("document.querySelector('[data-field=snippet]').value");
    let snippet = snippet.as_str().unwrap();
    assert!(
        snippet.contains(&format!("data-stepstream-run=\"{a}\""))
            && snippet.contains("data-metric=\"loss\"")
            && snippet.contains(&format!("src=\"http://{}/embed.js\"", hub.addr())),
        "{snippet}"
    );
    let frame = page.eval("document.querySelector('[data-field=iframe]').href");
    assert_eq!(
        frame.as_str().unwrap(),
        format!("http://{}/embed?run={a}&metric=loss", hub.addr())
    );
    // Two: the config table with the differing key highlighted.
    page.eval(&row(&b));
    page.wait(
        "the comparison",
        SHORT,
        "document.querySelector('tr[data-key=\"lr\"][data-diff=true]') != null",
    );
    // Keys both runs share are not marked.
    assert_eq!(
        page.eval(
            "document.querySelector('.config-diff tr[data-key=\"model.layers\"]').dataset.diff"
        ),
        "false"
    );
    page.screenshot("charts-compare");
    page.eval("document.querySelector('input.only-diff').click()");
    page.wait("only differing keys", SHORT, "document.querySelector('.config-diff tr[data-key=\"model.layers\"]') == null && document.querySelector('.config-diff tr[data-key=\"lr\"]') != null");
    // The colours of a run agree: list swatch, legend and chart.
    let colors = page.eval(&format!(
        "[document.querySelector('tr.run[data-run-id=\"{a}\"]').dataset.color, \
          document.querySelector('.legend .item[data-run-id=\"{a}\"]').dataset.color, \
          document.querySelector('canvas[data-chart=\"loss\"]').dataset.colors.split('|')[0]]"
    ));
    assert!(colors[0] == colors[1] && colors[1] == colors[2], "{colors}");

    // Search by config, by name; status filter; sort; group by project.
    let search = |page: &mut Browser, q: &str| {
        page.eval(&format!(
            "(() => {{ const s = document.querySelector('input.search'); s.value = '{q}'; \
             s.dispatchEvent(new Event('input', {{ bubbles: true }})); }})()"
        ));
    };
    let visible = "[...document.querySelectorAll('tr.run, tr.job')].map(r => r.dataset.runId || r.dataset.job).sort().join(',')";
    search(&mut page, "lr=0.001");
    let mut want = [a.clone(), c.clone()];
    want.sort();
    page.wait(
        "config search",
        SHORT,
        &format!("{visible} == '{}'", want.join(",")),
    );
    search(&mut page, "vision");
    page.wait("name search", SHORT, &format!("{visible} == '{c}'"));
    search(&mut page, "");
    page.eval("document.querySelector('th[data-sort=name]').click()");
    let names = "[...document.querySelectorAll('tr.run:not(.nested), tr.job')].map(r => r.children[2].textContent.split(' ')[0]).join(',')";
    page.wait(
        "sorted by name",
        SHORT,
        &format!("{names} == 'alpha,beta,gamma,llama'"),
    );
    page.eval("document.querySelector('th[data-sort=name]').click()");
    page.wait(
        "reversed",
        SHORT,
        &format!("{names} == 'llama,gamma,beta,alpha'"),
    );
    page.eval("document.querySelector('label.by-project input').click()");
    page.wait("grouped by project", SHORT, "[...document.querySelectorAll('tr.project-row')].map(r => r.dataset.project).join(',') == 'dist,nlp,vision'");
    page.screenshot("charts-run-list");
}
