//! The frame loop: on each animation frame, redraw the charts whose picture changed (data,
//! view, size or theme), only those on screen, oldest first within a time budget so a
//! stream of points never makes a long frame; then the crosshair overlays. While zoomed, it
//! asks the hub for the raw points of the window (`fetch`).

use crate::lines::{self, Scene};
use crate::state::{self, ChartOpts, Ctx, STORE};
use leptos::prelude::*;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use stepstream_chart::client::Client;
use stepstream_chart::{self as chart, theme, Geometry};
use stepstream_protocol::RunId;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

/// Milliseconds of drawing per frame before the rest waits for the next frame.
const FRAME_BUDGET_MS: f64 = 4.0;

/// A chart to draw in this frame: urgent (a first picture, or what a user did), when last
/// drawn, its canvas, its fingerprint and its CSS size.
type Due = (
    bool,
    f64,
    web_sys::HtmlCanvasElement,
    (u64, u64),
    (i32, i32),
);

struct Drawn {
    /// Of the data, and of the view, size, options and theme (see `lines::fingerprint`).
    fingerprint: (u64, u64),
    geometry: Geometry,
    at: f64,
    /// Drawn with no point: its first points are a first picture, drawn at once.
    empty: bool,
}

thread_local! {
    static CHARTS: RefCell<HashMap<String, Drawn>> = RefCell::new(HashMap::new());
    static OVERLAY_DIRTY: Cell<bool> = const { Cell::new(true) };
    static MEASURED: RefCell<HashMap<stepstream_protocol::RunId, f64>> = RefCell::new(HashMap::new());
    /// Since when each selected run's history has been arriving.
    static LOADING: RefCell<HashMap<stepstream_protocol::RunId, f64>> = RefCell::new(HashMap::new());
}

/// The longest the charts wait for a history to arrive whole before drawing what came.
const HISTORY_WAIT_MS: f64 = 500.0;

/// Whether a selected run's history is still arriving (for less than [`HISTORY_WAIT_MS`]):
/// its chunks come one metric at a time, and drawing as they come drew the charts over
/// several frames, each slowing the next chunk; once whole, every chart is drawn in one.
fn history_arriving(scene: &Scene, store: &Client, now: f64) -> bool {
    LOADING.with(|l| {
        let mut l = l.borrow_mut();
        l.retain(|id, _| scene.selected.contains(id));
        scene.selected.iter().any(|id| {
            let arriving = store.runs.get(id).is_some_and(|r| !r.backfilled);
            if !arriving {
                l.remove(id);
                return false;
            }
            now - *l.entry(id.clone()).or_insert(now) < HISTORY_WAIT_MS
        })
    })
}

pub fn overlay_dirty() {
    OVERLAY_DIRTY.with(|d| d.set(true));
}

/// Where a chart was drawn, to map the mouse.
pub fn geometry(key: &str) -> Option<Geometry> {
    CHARTS.with(|c| c.borrow().get(key).map(|d| d.geometry))
}

fn now() -> f64 {
    web_sys::window()
        .and_then(|w| w.performance())
        .map_or(0.0, |p| p.now())
}

/// Each selected run's group. Configs are read from the run list's (asked for again, at
/// most every 5 s, while a selected run started after they were read).
pub fn group_keys(
    ctx: &Ctx,
    grouping: &crate::view::Grouping,
    selected: &[RunId],
    runs: &[stepstream_protocol::RunSummary],
) -> Vec<(RunId, Option<String>)> {
    use crate::bands::key_of;
    use crate::view::GroupBy;
    if grouping.by == GroupBy::None {
        return Vec::new();
    }
    let by_config = matches!(grouping.by, GroupBy::Config(_));
    ctx.configs.with_untracked(|configs| {
        let missing = configs
            .as_ref()
            .is_none_or(|c| selected.iter().any(|id| !c.contains_key(id)));
        if by_config && missing {
            thread_local! { static ASKED: std::cell::Cell<f64> = const { std::cell::Cell::new(-1e9) }; }
            if ASKED.with(|a| now() - a.get() > 5_000.0) {
                ASKED.with(|a| a.set(now()));
                ctx.load_configs();
            }
        }
        selected
            .iter()
            .map(|id| {
                let run = runs.iter().find(|r| &r.run_id == id);
                let config = configs.as_ref().and_then(|c| c.get(id)).map(|c| &c[..]);
                let (job, name) = run.map_or(("", ""), |r| (r.job.as_str(), r.name.as_str()));
                (id.clone(), key_of(&grouping.by, job, config, name))
            })
            .collect()
    })
}

/// The scene of this frame, from the reactive state (untracked: the loop is not reactive).
pub fn scene(ctx: &Ctx) -> Scene {
    let selected = ctx.selected.get_untracked();
    let runs = ctx.runs.get_untracked();
    let started = selected
        .iter()
        .map(|id| {
            runs.iter()
                .find(|r| &r.run_id == id)
                .map_or(0.0, |r| r.started_at)
        })
        .collect();
    let grouping = ctx.grouping.get_untracked();
    let group_keys = group_keys(ctx, &grouping, &selected, &runs);
    Scene {
        labels: selected.iter().map(|id| ctx.label(id)).collect(),
        started,
        selected,
        axis: ctx.axis.get_untracked(),
        x_metric: ctx.x_metric.get_untracked(),
        grouping,
        group_keys,
        all_segments: ctx.all_segments.get_untracked(),
        window: ctx.window.get_untracked(),
        smoothing: ctx.smoothing.get_untracked(),
    }
}

fn on_screen(el: &web_sys::Element) -> bool {
    let r = el.get_bounding_client_rect();
    let h = web_sys::window()
        .and_then(|w| w.inner_height().ok())
        .and_then(|h| h.as_f64())
        .unwrap_or(1e9);
    r.width() > 0.0 && r.bottom() > 0.0 && r.top() < h
}

fn canvases(selector: &str) -> Vec<web_sys::HtmlCanvasElement> {
    let Some(list) = web_sys::window()
        .and_then(|w| w.document())
        .and_then(|d| d.query_selector_all(selector).ok())
    else {
        return Vec::new();
    };
    (0..list.length())
        .filter_map(|i| list.item(i)?.dyn_into().ok())
        .collect()
}

/// One animation frame; whether it drew anything.
pub fn frame(ctx: &Ctx) -> bool {
    let redraw = state::take_dirty();
    let overlays = OVERLAY_DIRTY.with(|d| d.replace(false));
    if !redraw && !overlays {
        return false;
    }
    let t0 = now();
    let scene = scene(ctx);
    let specs = ctx.charts.get_untracked();
    let opts = ctx.chart_opts.get_untracked();
    let dark = ctx.theme.get_untracked().is_dark();
    let style = if dark { &theme::DARK } else { &theme::LIGHT };
    let dpr = web_sys::window().map_or(1.0, |w| w.device_pixel_ratio());
    if redraw {
        STORE.with(|store| {
            let store = store.borrow();
            if scene.window.is_some() {
                fetch_windows(&scene, &store, &specs);
            }
            if history_arriving(&scene, &store, t0) {
                state::mark_dirty();
                return;
            }
            // Every canvas's size is read before any is drawn: drawing resizes canvases, and
            // a read after that lays the page out again.
            let mut due: Vec<Due> = Vec::new();
            for canvas in canvases("canvas[data-chart]") {
                let key = canvas.get_attribute("data-chart").unwrap_or_default();
                let Some(spec) = specs.iter().find(|s| s.key == key) else {
                    continue;
                };
                if !on_screen(&canvas) {
                    continue;
                }
                let o = opts.get(&key).copied().unwrap_or_default();
                let (data, mut view) = lines::fingerprint(&scene, &store, spec);
                let css = (canvas.client_width(), canvas.client_height());
                view ^= ((css.0 as u64) << 20)
                    ^ ((css.1 as u64) << 40)
                    ^ (dpr.to_bits() >> 3)
                    ^ ((o.log as u64) << 1)
                    ^ ((o.robust as u64) << 2)
                    ^ ((dark as u64) << 3);
                let fp = (data, view);
                let last =
                    CHARTS.with(|c| c.borrow().get(&key).map(|d| (d.fingerprint, d.at, d.empty)));
                match last {
                    Some((old, _, _)) if old == fp => {}
                    Some((old, at, empty)) => {
                        due.push((empty || old.1 != view, at, canvas, fp, css))
                    }
                    None => due.push((true, 0.0, canvas, fp, css)),
                }
            }
            // What a user did (a first picture, also a chart's first points: a run just
            // opened, zoom, axis, options) is drawn in this frame; new data, oldest picture first, only while the frame's budget lasts, so under a
            // stream every chart gets its turn and no frame runs long.
            due.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.total_cmp(&b.1)));
            for (urgent, _, canvas, fp, css) in due {
                if !urgent && now() - t0 > FRAME_BUDGET_MS {
                    state::mark_dirty();
                    break;
                }
                let key = canvas.get_attribute("data-chart").unwrap_or_default();
                let Some(spec) = specs.iter().find(|s| s.key == key) else {
                    continue;
                };
                let o = opts.get(&key).copied().unwrap_or_default();
                let t = now();
                draw_chart(&canvas, spec, &scene, &store, o, style, (fp, css));
                let _ = canvas.set_attribute("data-draw-ms", &format!("{:.2}", now() - t));
            }
            if scene.window.is_some() {
                // Charts drawn for the first time in this frame (a page opened on a window,
                // whose history came before its first frame) have a geometry only now: ask
                // for their windows too (what was asked above is not asked again).
                fetch_windows(&scene, &store, &specs);
            }
            record_latency(&store);
        });
    }
    if overlays {
        for canvas in canvases("canvas[data-overlay]") {
            if on_screen(&canvas) {
                draw_overlay(ctx, &canvas, style);
            }
        }
    }
    record_frame_time(now() - t0);
    true
}

/// While zoomed: asks for the raw points of the window of every drawn line.
fn fetch_windows(scene: &Scene, store: &Client, specs: &[crate::groups::ChartSpec]) {
    let Some(window) = scene.window else {
        return;
    };
    for spec in specs {
        let width = CHARTS.with(|c| {
            c.borrow()
                .get(&spec.key)
                .map(|d| d.geometry.right - d.geometry.left)
        });
        let Some(width) = width else {
            continue;
        };
        let dpr = web_sys::window().map_or(1.0, |w| w.device_pixel_ratio());
        // Four points per pixel column: M4 of the answer is exact per column.
        let budget = ((width * dpr).max(50.0) as usize) * 4;
        for (i, id) in scene.selected.iter().enumerate() {
            let Some(run) = store.runs.get(id) else {
                continue;
            };
            let x_series = lines::x_series(scene, run);
            for (metric, _) in &spec.metrics {
                if let Some(s) = run.series(metric) {
                    let range = lines::steps_in(scene.axis, s, x_series, scene.started[i], window);
                    if let Some(range) = range {
                        crate::fetch::request(id, metric, range, budget);
                        // The x metric's own raw points, to place the line's in the window.
                        if x_series.is_some() {
                            crate::fetch::request(id, &scene.x_metric, range, budget);
                        }
                    }
                }
            }
        }
    }
}

fn draw_chart(
    canvas: &web_sys::HtmlCanvasElement,
    spec: &crate::groups::ChartSpec,
    scene: &Scene,
    store: &Client,
    o: ChartOpts,
    style: &theme::Theme,
    (fingerprint, css_size): ((u64, u64), (i32, i32)),
) {
    let lines = crate::bands::drawn(scene, store, spec);
    let smoothing = scene.smoothing > 0.0;
    let chart_lines: Vec<chart::Line<'_>> = lines
        .iter()
        .map(|l| chart::Line {
            label: &l.label,
            color: l.color,
            xs: &l.xs,
            ordered: l.ordered,
            steps: &l.steps,
            values: &l.values,
            smoothed: smoothing.then_some(&l.smoothed[..]),
            band: l.band.as_ref().map(|(lo, hi)| (&lo[..], &hi[..])),
            markers: &l.markers,
            notes: &l.notes,
        })
        .collect();
    let options = chart::Options {
        css_size: Some(css_size),
        title: &spec.key,
        window: scene.window,
        axis: scene.axis,
        log: o.log,
        robust: o.robust,
        theme: style,
        // A legend inside the chart (for PNG downloads) while it stays small; the page's own
        // legend names every run.
        legend: (2..=4).contains(&lines.len()),
    };
    let Some(drawn) = chart::draw(canvas, &chart_lines, &options) else {
        return;
    };
    CHARTS.with(|c| {
        c.borrow_mut().insert(
            spec.key.clone(),
            Drawn {
                fingerprint,
                geometry: drawn.geometry,
                at: now(),
                empty: drawn.last_step.is_none(),
            },
        )
    });
    let set = |k: &str, v: String| {
        let _ = canvas.set_attribute(k, &v);
    };
    let g = drawn.geometry;
    let total = |f: fn(&lines::LineData<'_>) -> u64| lines.iter().map(f).sum::<u64>().to_string();
    set("data-points", total(|l| l.received));
    set("data-out-of-order", total(|l| l.out_of_order));
    set("data-drawn", drawn.drawn.to_string());
    set(
        "data-last-step",
        drawn.last_step.map_or(String::new(), |s| s.to_string()),
    );
    set("data-markers", drawn.markers.to_string());
    set("data-notes", drawn.notes.to_string());
    set("data-clipped", drawn.clipped.to_string());
    set("data-non-finite", drawn.non_finite.to_string());
    set("data-detail", total(|l| l.detail_points as u64));
    set("data-plot-left", g.left.to_string());
    set("data-plot-right", g.right.to_string());
    set("data-plot-top", g.top.to_string());
    set("data-plot-bottom", g.bottom.to_string());
    set("data-axis", scene.axis.code().to_string());
    set("data-smoothing", scene.smoothing.to_string());
    set("data-log", o.log.to_string());
    set("data-robust", o.robust.to_string());
    set(
        "data-fetching",
        lines
            .iter()
            .filter(|l| crate::fetch::pending(&l.run, &l.metric))
            .count()
            .to_string(),
    );
    set("data-x0", g.x0.to_string());
    set("data-x1", g.x1.to_string());
    set("data-y0", g.y0.to_string());
    set("data-y1", g.y1.to_string());
    set(
        "data-lines",
        lines
            .iter()
            .map(|l| l.label.as_str())
            .collect::<Vec<_>>()
            .join("|"),
    );
    set(
        "data-colors",
        lines
            .iter()
            .map(|l| theme::css(l.color))
            .collect::<Vec<_>>()
            .join("|"),
    );
    let frames = canvas
        .get_attribute("data-frames")
        .and_then(|f| f.parse::<u64>().ok())
        .unwrap_or(0);
    set("data-frames", (frames + 1).to_string());
    overlay_dirty();
}

/// The crosshair at the hovered x (on every chart), the box being dragged, and a dot on
/// each line at its nearest point.
fn draw_overlay(ctx: &Ctx, canvas: &web_sys::HtmlCanvasElement, style: &theme::Theme) {
    let key = canvas.get_attribute("data-overlay").unwrap_or_default();
    let dpr = chart::fit(canvas);
    let Ok(Some(c2d)) = canvas.get_context("2d") else {
        return;
    };
    let Ok(c2d) = c2d.dyn_into::<web_sys::CanvasRenderingContext2d>() else {
        return;
    };
    let _ = c2d.set_transform(dpr, 0.0, 0.0, dpr, 0.0, 0.0);
    c2d.clear_rect(0.0, 0.0, canvas.width() as f64, canvas.height() as f64);
    let Some(g) = geometry(&key) else {
        return;
    };
    if let Some((a, b)) = crate::pointer::selection(&key) {
        c2d.set_fill_style_str(style.selection);
        c2d.fill_rect(a.min(b), g.top, (b - a).abs(), g.bottom - g.top);
    }
    let hover = ctx.hover.get_untracked();
    let Some(h) = hover else {
        let _ = canvas.remove_attribute("data-hover-x");
        return;
    };
    if h.x < g.x0 || h.x > g.x1 {
        let _ = canvas.remove_attribute("data-hover-x");
        return;
    }
    let px = g.px(h.x);
    c2d.set_stroke_style_str(style.crosshair);
    c2d.set_line_width(1.0);
    c2d.begin_path();
    c2d.move_to(px.round() + 0.5, g.top);
    c2d.line_to(px.round() + 0.5, g.bottom);
    c2d.stroke();
    let _ = canvas.set_attribute("data-hover-x", &h.x.to_string());
    let scene = scene(ctx);
    let specs = ctx.charts.get_untracked();
    let Some(spec) = specs.iter().find(|s| s.key == key) else {
        return;
    };
    STORE.with(|store| {
        let store = store.borrow();
        for l in crate::bands::drawn(&scene, &store, spec) {
            let Some(i) = lines::nearest(&l, h.x) else {
                continue;
            };
            let v = if scene.smoothing > 0.0 {
                l.smoothed[i]
            } else {
                l.values[i]
            };
            if let Some(py) = g.py(v) {
                c2d.set_fill_style_str(&theme::css(l.color));
                c2d.begin_path();
                let _ = c2d.arc(g.px(l.xs[i]), py, 3.5, 0.0, std::f64::consts::TAU);
                c2d.fill();
            }
        }
    });
}

/// For benchmarks: seconds from a point's `log` to the frame that drew it, appended to
/// `window.__stepstreamLatency` for the newest point of each run drawn in this frame.
fn record_latency(store: &Client) {
    let Some(window) = web_sys::window() else {
        return;
    };
    let key = JsValue::from_str("__stepstreamLatency");
    let list = match js_sys::Reflect::get(&window, &key) {
        Ok(v) if v.is_instance_of::<js_sys::Array>() => v.unchecked_into::<js_sys::Array>(),
        _ => {
            let a = js_sys::Array::new();
            let _ = js_sys::Reflect::set(&window, &key, &a);
            a
        }
    };
    let now = crate::page::now_ms() / 1000.0;
    MEASURED.with(|m| {
        let mut m = m.borrow_mut();
        for (id, d) in &store.runs {
            if d.newest_wall_time > 0.0 && m.get(id).is_none_or(|&w| d.newest_wall_time > w) {
                m.insert(id.clone(), d.newest_wall_time);
                // Bounded: a benchmark reads and clears it; a page left open keeps the last.
                if list.length() >= 100_000 {
                    list.shift();
                }
                list.push(&JsValue::from_f64(now - d.newest_wall_time));
            }
        }
    });
}

/// For benchmarks: the duration in ms of each frame that drew something, into
/// `window.__stepstreamFrames` once a benchmark created it (bounded).
fn record_frame_time(ms: f64) {
    let Some(window) = web_sys::window() else {
        return;
    };
    let key = JsValue::from_str("__stepstreamFrames");
    if let Ok(v) = js_sys::Reflect::get(&window, &key) {
        if let Some(a) = v.dyn_ref::<js_sys::Array>() {
            if a.length() >= 100_000 {
                a.shift();
            }
            a.push(&JsValue::from_f64(ms));
        }
    }
}

/// Calls `f` on every animation frame, for the life of the page.
pub fn every_frame(mut f: impl FnMut() + 'static) {
    type Frame = Closure<dyn FnMut()>;
    let slot: std::rc::Rc<RefCell<Option<Frame>>> = std::rc::Rc::new(RefCell::new(None));
    let again = slot.clone();
    let request = |frame: &Frame| {
        if let Some(w) = web_sys::window() {
            let _ = w.request_animation_frame(frame.as_ref().unchecked_ref());
        }
    };
    *slot.borrow_mut() = Some(Closure::new(move || {
        f();
        if let Some(frame) = again.borrow().as_ref() {
            request(frame);
        }
    }));
    let first = slot.borrow();
    if let Some(frame) = first.as_ref() {
        request(frame);
    }
}
