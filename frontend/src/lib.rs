//! The stepstream web app: a live run list and, for the runs you pick, one chart per metric
//! that moves as points arrive over the viewer WebSocket. It never polls.
//!
//! * `ws` — the self-healing viewer socket.
//! * `data` — the points held per run and metric.
//! * `chart` — drawing with plotters on canvas, decimated per pixel column.
//! * `widget` — `ChartWidget`, one chart to embed in another page.
//! * `i18n` — English and Chinese.
//!
//! Charts are drawn from a `requestAnimationFrame` loop only when data changed, so bursts of
//! points cost one frame. Each chart canvas carries test hooks: `data-points` (points
//! received), `data-drawn` (points drawn after decimation), `data-last-step`,
//! `data-out-of-order` (points at or below a step already held: duplicates).

pub mod chart;
pub mod data;
pub mod i18n;
pub mod widget;
pub mod ws;

use chart::Geometry;
use data::{RunData, Store};
use i18n::{t, Lang, Text};
use leptos::prelude::*;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use stepstream_protocol::{
    FromViewer, RunId, RunStatus, RunSummary, Subscribe, ToViewer, Unsubscribe,
};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

/// History points per metric asked of the hub on subscribe (it downsamples above that).
const HISTORY_BUDGET: u32 = 4000;

thread_local! {
    static STORE: RefCell<Store> = RefCell::new(Store::default());
    static DIRTY: Cell<bool> = const { Cell::new(true) };
    static GEOMETRY: RefCell<HashMap<String, Geometry>> = RefCell::new(HashMap::new());
    static SOCKET: RefCell<Option<ws::Socket>> = const { RefCell::new(None) };
    static MEASURED: RefCell<HashMap<RunId, f64>> = RefCell::new(HashMap::new());
    static OPENED: Cell<bool> = const { Cell::new(false) };
}

pub fn query_param(name: &str) -> Option<String> {
    let search = web_sys::window()?.location().search().ok()?;
    web_sys::UrlSearchParams::new_with_str(&search)
        .ok()?
        .get(name)
}

fn now_ms() -> f64 {
    js_sys::Date::now()
}

fn clock(ms: f64) -> String {
    let d = js_sys::Date::new(&JsValue::from_f64(ms));
    format!(
        "{:02}:{:02}:{:02}",
        d.get_hours(),
        d.get_minutes(),
        d.get_seconds()
    )
}

fn mark_dirty() {
    DIRTY.with(|d| d.set(true));
}

fn send(msg: FromViewer) {
    SOCKET.with(|s| {
        if let Some(s) = s.borrow().as_ref() {
            s.send(&msg);
        }
    });
}

/// The subscription that continues what the page holds for `run` (after a reconnect), or
/// starts it afresh.
fn subscription(run: &RunId) -> FromViewer {
    let last = STORE.with(|s| s.borrow().runs.get(run).and_then(|d| d.last_step()));
    FromViewer::Subscribe(Subscribe {
        runs: vec![run.clone()],
        metrics: None,
        from_step: last.map(|s| s + 1),
        budget: if last.is_some() {
            None
        } else {
            Some(HISTORY_BUDGET)
        },
    })
}

#[wasm_bindgen(start)]
pub fn start() {
    let embedded = web_sys::window()
        .and_then(|w| w.document())
        .and_then(|d| d.body())
        .is_some_and(|b| b.has_attribute("data-stepstream-embed"));
    if !embedded {
        leptos::mount::mount_to_body(App);
    }
}

/// Everything the views share.
#[derive(Clone, Copy)]
struct Ctx {
    runs: RwSignal<Vec<RunSummary>>,
    selected: RwSignal<Vec<RunId>>,
    metrics: RwSignal<Vec<String>>,
    live: RwSignal<bool>,
    lang: RwSignal<Lang>,
    now: RwSignal<f64>,
    /// Hub clock minus page clock, seconds.
    hub_offset: RwSignal<f64>,
    hover: RwSignal<Option<(String, f64, f64)>>,
    /// Bumped when any watched run's alerts change.
    alerts: RwSignal<u64>,
    stale_after: f64,
}

impl Ctx {
    fn refresh_metrics(&self) {
        let selected = self.selected.get_untracked();
        let names = STORE.with(|s| s.borrow().metric_names(&selected));
        if names != self.metrics.get_untracked() {
            self.metrics.set(names);
        }
        mark_dirty();
    }

    fn toggle(&self, run: RunId) {
        let on = self.selected.get_untracked().contains(&run);
        if on {
            self.selected.update(|s| s.retain(|r| r != &run));
            STORE.with(|s| s.borrow_mut().runs.remove(&run));
            send(FromViewer::Unsubscribe(Unsubscribe { runs: vec![run] }));
        } else {
            let summary = self
                .runs
                .get_untracked()
                .into_iter()
                .find(|r| r.run_id == run);
            let offset = self.hub_offset.get_untracked();
            let data = RunData {
                last_point_ms: summary
                    .and_then(|s| s.last_point_at)
                    .map_or(now_ms(), |t| (t - offset) * 1000.0),
                ..RunData::default()
            };
            STORE.with(|s| s.borrow_mut().runs.insert(run.clone(), data));
            self.selected.update(|s| s.push(run.clone()));
            send(subscription(&run));
        }
        self.refresh_metrics();
    }

    fn on_message(&self, msg: ToViewer) {
        match msg {
            ToViewer::RunList(list) => {
                self.hub_offset.set(list.now - now_ms() / 1000.0);
                self.runs.set(list.runs);
                // `?run=ID[,ID]` (the links in alert messages) opens those runs once.
                if let Some(wanted) = query_param("run") {
                    if self.selected.get_untracked().is_empty() && !OPENED.with(|o| o.replace(true))
                    {
                        for id in wanted.split(',').filter_map(|id| RunId::new(id).ok()) {
                            if self.runs.get_untracked().iter().any(|r| r.run_id == id) {
                                self.toggle(id);
                            }
                        }
                    }
                }
            }
            ToViewer::RunUpdate(u) => {
                self.hub_offset.set(u.now - now_ms() / 1000.0);
                self.runs.update(
                    |runs| match runs.iter_mut().find(|r| r.run_id == u.run.run_id) {
                        Some(r) => *r = u.run,
                        None => runs.push(u.run),
                    },
                );
            }
            ToViewer::Metrics(m) => {
                STORE.with(|s| {
                    if let Some(d) = s.borrow_mut().runs.get_mut(&m.run_id) {
                        d.define(&m.metrics);
                    }
                });
                self.refresh_metrics();
            }
            ToViewer::Backfill(b) => {
                STORE.with(|s| {
                    if let Some(d) = s.borrow_mut().runs.get_mut(&b.run_id) {
                        d.backfill(&b);
                    }
                });
                mark_dirty();
            }
            ToViewer::Live(l) => {
                let applied = STORE.with(|s| {
                    s.borrow_mut()
                        .runs
                        .get_mut(&l.run_id)
                        .is_some_and(|d| d.live(&l, now_ms()))
                });
                if applied {
                    mark_dirty();
                }
            }
            ToViewer::StatusChange(c) => {
                self.runs.update(|runs| {
                    if let Some(r) = runs.iter_mut().find(|r| r.run_id == c.run_id) {
                        r.status = c.status;
                        r.status_message = c.message.clone();
                    }
                });
            }
            ToViewer::Alert(a) => {
                let added = STORE.with(|s| {
                    s.borrow_mut()
                        .runs
                        .get_mut(&a.run_id)
                        .is_some_and(|d| d.alert(a.clone()))
                });
                if added {
                    self.alerts.update(|n| *n += 1);
                    mark_dirty();
                }
            }
            ToViewer::Resync(_) => {}
            ToViewer::HubError(e) => {
                web_sys::console::warn_1(
                    &format!("stepstream hub: {:?}: {}", e.code, e.message).into(),
                );
            }
        }
    }

    /// Runs that are meant to be training but have sent nothing for the threshold.
    fn stale_runs(&self) -> Vec<(RunSummary, f64, f64)> {
        let now = self.now.get();
        let selected = self.selected.get();
        self.runs
            .get()
            .into_iter()
            .filter(|r| selected.contains(&r.run_id))
            .filter_map(|r| {
                let last =
                    STORE.with(|s| s.borrow().runs.get(&r.run_id).map(|d| d.last_point_ms))?;
                let quiet = (now - last) / 1000.0;
                let alive = matches!(r.status, RunStatus::Running | RunStatus::Stale);
                (alive && (r.status == RunStatus::Stale || quiet >= self.stale_after))
                    .then_some((r, quiet, last))
            })
            .collect()
    }
}

/// Draws every chart whose data changed since the last frame.
fn draw_frame(ctx: &Ctx) {
    if !DIRTY.with(|d| d.replace(false)) {
        return;
    }
    let Some(doc) = web_sys::window().and_then(|w| w.document()) else {
        return;
    };
    let Ok(canvases) = doc.query_selector_all("canvas[data-metric]") else {
        return;
    };
    let selected = ctx.selected.get_untracked();
    let runs = ctx.runs.get_untracked();
    let label = |id: &RunId| {
        runs.iter()
            .find(|r| &r.run_id == id)
            .map_or(id.to_string(), |r| r.name.clone())
    };
    STORE.with(|store| {
        let store = store.borrow();
        for i in 0..canvases.length() {
            let Some(canvas) = canvases
                .item(i)
                .and_then(|n| n.dyn_into::<web_sys::HtmlCanvasElement>().ok())
            else {
                continue;
            };
            let metric = canvas.get_attribute("data-metric").unwrap_or_default();
            let labels: Vec<String> = selected.iter().map(label).collect();
            let markers: Vec<Vec<i64>> = selected
                .iter()
                .map(|id| {
                    store
                        .runs
                        .get(id)
                        .map(|d| d.alert_steps())
                        .unwrap_or_default()
                })
                .collect();
            let mut received = 0;
            let mut out_of_order = 0;
            let lines: Vec<chart::Line<'_>> = selected
                .iter()
                .enumerate()
                .filter_map(|(i, id)| {
                    let series = store.runs.get(id)?.series.get(&metric)?;
                    received += series.received;
                    out_of_order += series.out_of_order;
                    Some(chart::Line {
                        label: &labels[i],
                        color: i,
                        series,
                        markers: &markers[i],
                    })
                })
                .collect();
            if let Some(drawn) = chart::draw(&canvas, &metric, &lines) {
                GEOMETRY.with(|g| g.borrow_mut().insert(metric.clone(), drawn.geometry));
                let _ = canvas.set_attribute("data-points", &received.to_string());
                let _ = canvas.set_attribute("data-drawn", &drawn.drawn.to_string());
                let _ = canvas.set_attribute(
                    "data-last-step",
                    &drawn.last_step.map_or(String::new(), |s| s.to_string()),
                );
                let _ = canvas.set_attribute("data-out-of-order", &out_of_order.to_string());
                let _ = canvas.set_attribute("data-markers", &drawn.markers.to_string());
                let _ = canvas.set_attribute("data-frames", &frames(&canvas).to_string());
            }
        }
        record_latency(&store);
    });
}

fn frames(canvas: &web_sys::HtmlCanvasElement) -> u64 {
    canvas
        .get_attribute("data-frames")
        .and_then(|f| f.parse::<u64>().ok())
        .unwrap_or(0)
        + 1
}

/// For benchmarks: seconds from a point's `log` to the frame that drew it, appended to
/// `window.__stepstreamLatency` for the newest point of each run drawn in this frame.
fn record_latency(store: &Store) {
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
    let now = now_ms() / 1000.0;
    MEASURED.with(|m| {
        let mut m = m.borrow_mut();
        for (id, d) in &store.runs {
            if d.newest_wall_time > 0.0 && m.get(id).is_none_or(|&w| d.newest_wall_time > w) {
                m.insert(id.clone(), d.newest_wall_time);
                list.push(&JsValue::from_f64(now - d.newest_wall_time));
            }
        }
    });
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

fn hover_text(ctx: &Ctx, metric: &str, step: f64) -> Option<String> {
    let selected = ctx.selected.get_untracked();
    let runs = ctx.runs.get_untracked();
    STORE.with(|store| {
        let store = store.borrow();
        let mut lines = Vec::new();
        let mut at = None;
        for id in &selected {
            let Some(series) = store.runs.get(id).and_then(|d| d.series.get(metric)) else {
                continue;
            };
            if series.steps.is_empty() {
                continue;
            }
            let i = series.steps.partition_point(|&s| (s as f64) < step);
            let i = match i {
                0 => 0,
                n if n >= series.steps.len() => series.steps.len() - 1,
                n if (series.steps[n] as f64 - step) < (step - series.steps[n - 1] as f64) => n,
                n => n - 1,
            };
            let name = runs
                .iter()
                .find(|r| &r.run_id == id)
                .map_or(id.to_string(), |r| r.name.clone());
            at.get_or_insert(series.steps[i]);
            lines.push(format!("{name}: {}", fmt_value(series.values[i])));
        }
        Some(format!("step {} · {metric}\n{}", at?, lines.join("\n")))
    })
}

fn fmt_value(v: f64) -> String {
    if !v.is_finite() {
        format!("{v}")
    } else if v != 0.0 && (v.abs() >= 1e5 || v.abs() < 1e-3) {
        format!("{v:.4e}")
    } else {
        format!("{v:.5}")
    }
}

#[component]
fn App() -> impl IntoView {
    let ctx = Ctx {
        runs: RwSignal::new(Vec::new()),
        selected: RwSignal::new(Vec::new()),
        metrics: RwSignal::new(Vec::new()),
        live: RwSignal::new(false),
        lang: RwSignal::new(Lang::detect()),
        now: RwSignal::new(now_ms()),
        hub_offset: RwSignal::new(0.0),
        hover: RwSignal::new(None),
        alerts: RwSignal::new(0),
        stale_after: query_param("stale")
            .and_then(|s| s.parse::<f64>().ok())
            .filter(|s| *s > 0.0)
            .unwrap_or(30.0),
    };
    let socket = ws::Socket::open(
        ws::viewer_url(query_param("hub").as_deref()),
        ws::Handlers {
            on_open: Box::new(move || {
                ctx.selected
                    .get_untracked()
                    .iter()
                    .map(subscription)
                    .collect()
            }),
            on_message: Box::new(move |msg| ctx.on_message(msg)),
            on_state: Box::new(move |live| ctx.live.set(live)),
        },
    );
    SOCKET.with(|s| *s.borrow_mut() = Some(socket));
    every_frame(move || draw_frame(&ctx));
    let tick = Closure::<dyn FnMut()>::new(move || ctx.now.set(now_ms()));
    if let Some(w) = web_sys::window() {
        let _ = w.set_interval_with_callback_and_timeout_and_arguments_0(
            tick.as_ref().unchecked_ref(),
            1000,
        );
        let resize = Closure::<dyn FnMut()>::new(mark_dirty);
        let _ = w.add_event_listener_with_callback("resize", resize.as_ref().unchecked_ref());
        resize.forget();
    }
    tick.forget();

    let lang = ctx.lang;
    Effect::new(move |_| {
        if let Some(root) = web_sys::window()
            .and_then(|w| w.document())
            .and_then(|d| d.document_element())
        {
            let _ = root.set_attribute("lang", lang.get().code());
        }
    });

    view! {
        <header>
            <h1>"stepstream"</h1>
            <span class="conn" data-conn=move || if ctx.live.get() { "live" } else { "reconnecting" }
                class:live=move || ctx.live.get()>
                {move || t(lang.get(), if ctx.live.get() { Text::Live } else { Text::Reconnecting })}
            </span>
            <button class="lang" data-lang=move || lang.get().code()
                on:click=move |_| lang.update(|l| *l = l.other())>
                {move || t(lang.get(), Text::SwitchLanguage)}
            </button>
        </header>
        <StaleBanner ctx=ctx/>
        <main>
            <section class="runs">
                <h2>{move || t(lang.get(), Text::Runs)}</h2>
                <RunTable ctx=ctx/>
            </section>
            <section class="charts">
                <Show when=move || ctx.selected.with(|s| !s.is_empty())
                    fallback=move || view! { <p class="hint">{move || t(lang.get(), Text::PickRun)}</p> }>
                    <Legend ctx=ctx/>
                    <AlertList ctx=ctx/>
                </Show>
                <div class="grid">
                    <For each=move || ctx.metrics.get() key=|m| m.clone() let:metric>
                        <ChartCard ctx=ctx metric=metric/>
                    </For>
                </div>
            </section>
        </main>
        <Tooltip ctx=ctx/>
    }
}

#[component]
fn StaleBanner(ctx: Ctx) -> impl IntoView {
    let stale = Memo::new(move |_| ctx.stale_runs());
    view! {
        <Show when=move || stale.with(|s| !s.is_empty())>
            <div class="banner" data-testid="stale-banner"
                data-runs=move || stale.with(|s| s.iter().map(|(r, _, _)| r.run_id.to_string()).collect::<Vec<_>>().join(","))>
                {move || stale.get().into_iter().map(|(r, quiet, last)| {
                    view! { <p>{i18n::stale(ctx.lang.get(), &r.name, quiet, &clock(last))}</p> }
                }).collect_view()}
            </div>
        </Show>
    }
}

#[component]
fn RunTable(ctx: Ctx) -> impl IntoView {
    let lang = ctx.lang;
    view! {
        <Show when=move || ctx.runs.with(|r| !r.is_empty())
            fallback=move || view! { <p class="hint">{move || t(lang.get(), Text::NoRuns)}</p> }>
            <table>
                <thead><tr>
                    <th></th>
                    <th>{move || t(lang.get(), Text::Project)}</th>
                    <th>{move || t(lang.get(), Text::Name)}</th>
                    <th>{move || t(lang.get(), Text::Status)}</th>
                    <th>{move || t(lang.get(), Text::LastStep)}</th>
                    <th>{move || t(lang.get(), Text::LastLoss)}</th>
                    <th>{move || t(lang.get(), Text::Age)}</th>
                </tr></thead>
                <tbody>
                    {move || {
                        let now = ctx.now.get() / 1000.0 + ctx.hub_offset.get();
                        let mut runs = ctx.runs.get();
                        runs.sort_by(|a, b| b.started_at.total_cmp(&a.started_at));
                        let selected = ctx.selected.get();
                        runs.into_iter().map(|r| {
                            let id = r.run_id.clone();
                            let on = selected.contains(&id);
                            let color = selected.iter().position(|s| s == &id).map(chart::css_color);
                            let loss = r.last_values.iter().find(|(k, _)| k == "loss").map(|(_, v)| fmt_value(*v));
                            let age = r.last_point_at.map(|t| i18n::age(lang.get(), now - t));
                            let status = r.status;
                            view! {
                                <tr class="run" class:selected=on data-run-id=id.to_string()
                                    data-status=status.as_str()
                                    on:click=move |_| ctx.toggle(id.clone())>
                                    <td><span class="swatch" style=color.map(|c| format!("background:{c}")).unwrap_or_default()></span>
                                        <input type="checkbox" prop:checked=on/></td>
                                    <td>{r.project.clone()}</td>
                                    <td title=r.run_id.to_string()>{r.name.clone()}</td>
                                    <td class=format!("status {}", status.as_str())
                                        title=r.status_message.clone().unwrap_or_default()>
                                        {i18n::status(lang.get(), status)}
                                    </td>
                                    <td class="num">{r.last_step.map(|s| s.to_string()).unwrap_or_default()}</td>
                                    <td class="num">{loss.unwrap_or_default()}</td>
                                    <td class="num">{age.unwrap_or_default()}</td>
                                </tr>
                            }
                        }).collect_view()
                    }}
                </tbody>
            </table>
        </Show>
    }
}

#[component]
fn Legend(ctx: Ctx) -> impl IntoView {
    view! {
        <div class="legend">
            {move || {
                let runs = ctx.runs.get();
                ctx.selected.get().into_iter().enumerate().map(|(i, id)| {
                    let name = runs.iter().find(|r| r.run_id == id).map_or(id.to_string(), |r| r.name.clone());
                    view! { <span class="item"><span class="swatch" style=format!("background:{}", chart::css_color(i))></span>{name}</span> }
                }).collect_view()
            }}
        </div>
    }
}

#[component]
fn AlertList(ctx: Ctx) -> impl IntoView {
    let items = move || {
        ctx.alerts.get();
        let selected = ctx.selected.get();
        let runs = ctx.runs.get_untracked();
        let mut items: Vec<(String, stepstream_protocol::Alert)> = STORE.with(|s| {
            let s = s.borrow();
            selected
                .iter()
                .filter_map(|id| s.runs.get(id).map(|d| (id, d)))
                .flat_map(|(id, d)| {
                    let name = runs
                        .iter()
                        .find(|r| &r.run_id == id)
                        .map_or(id.to_string(), |r| r.name.clone());
                    d.alerts.iter().map(move |a| (name.clone(), a.clone()))
                })
                .collect()
        });
        items.sort_by(|a, b| b.1.at.total_cmp(&a.1.at));
        items
    };
    view! {
        <Show when=move || !items().is_empty()>
            <ul class="alerts" data-testid="alerts">
                {move || items().into_iter().map(|(name, a)| {
                    let state = if a.fired { "fired" } else { "resolved" };
                    view! {
                        <li class=format!("alert {state}") data-rule=a.rule.clone() data-step=a.step.to_string() data-state=state>
                            <b>{a.rule.clone()}</b>" · "{name}" · step "{a.step}" · "{a.message.clone()}
                        </li>
                    }
                }).collect_view()}
            </ul>
        </Show>
    }
}

#[component]
fn ChartCard(ctx: Ctx, metric: String) -> impl IntoView {
    let m = metric.clone();
    let on_move = move |ev: web_sys::MouseEvent| {
        let Some(canvas) = ev
            .target()
            .and_then(|t| t.dyn_into::<web_sys::HtmlCanvasElement>().ok())
        else {
            return;
        };
        let rect = canvas.get_bounding_client_rect();
        let px = ev.client_x() as f64 - rect.left();
        let step = GEOMETRY.with(|g| g.borrow().get(&m).and_then(|g| g.step_at(px)));
        let text = step.and_then(|s| hover_text(&ctx, &m, s));
        ctx.hover
            .set(text.map(|t| (t, ev.page_x() as f64, ev.page_y() as f64)));
    };
    mark_dirty();
    view! {
        <div class="chart">
            <canvas data-metric=metric on:mousemove=on_move on:mouseleave=move |_| ctx.hover.set(None)></canvas>
        </div>
    }
}

#[component]
fn Tooltip(ctx: Ctx) -> impl IntoView {
    view! {
        <Show when=move || ctx.hover.with(|h| h.is_some())>
            <div class="tooltip" data-testid="tooltip"
                style=move || ctx.hover.with(|h| h.as_ref().map_or(String::new(), |(_, x, y)| format!("left:{}px;top:{}px", x + 12.0, y + 12.0)))>
                {move || ctx.hover.with(|h| h.as_ref().map(|(t, _, _)| t.clone()).unwrap_or_default())}
            </div>
        </Show>
    }
}
