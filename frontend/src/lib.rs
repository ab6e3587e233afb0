//! The stepstream web app: a live run list and, for the runs you pick, their charts, moving
//! as points arrive over the viewer WebSocket. It never polls; zooming asks the hub for the
//! raw points of the window.
//!
//! * `fetch` — zoom windows over the socket, details over HTTP.
//! * `state` — the reactive state and what the client says changed; `socket` — the page's one
//!   viewer socket; `config`, `pointer` — a run's config flattened, the drag in progress.
//! * `stepstream_chart` (re-exported as `chart`, `client`, `data`, `ws`), shared with the embeddable
//!   widget: the viewer client and the points it holds, the self-healing socket, drawing.
//! * `view` — the view in the URL (runs, zoom, smoothing, axis, theme, language).
//! * `groups` — which charts, in which group; `lines` — a chart's lines from the data.
//! * `console` — the selected runs' console lines (history and live, keyed by batch).
//! * `samples` — the selected runs' text and table samples, by key and step.
//! * `frame` — the animation-frame loop; `interact` — zoom, pan and the crosshair.
//! * `components` — the page's parts; `i18n` — English, Chinese.
//! * `write` — what the page writes to the hub (commands, acknowledgements, rules), with a
//!   write token asked for once where the hub guards writes.
//!
//! Each chart canvas carries test hooks (`data-points`, `data-drawn`, `data-last-step`,
//! `data-out-of-order`, `data-x0`/`data-x1`, `data-detail`, ...; see `frame.rs`).

pub mod bands;
pub mod components;
pub mod config;
pub mod console;
pub mod fetch;
pub mod frame;
pub mod groups;
pub mod i18n;
pub mod interact;
pub mod lines;
pub mod page;
pub mod pointer;
pub mod samples;
pub mod segments;
pub mod socket;
pub mod state;
pub mod table;
pub mod view;
pub mod write;

pub use stepstream_chart as chart;
pub use stepstream_chart::{client, data, ws};

use components::charts::{ChartGroups, Toolbar, Tooltip};
use components::console::ConsolePanel;
use components::header::{AlertList, Header, Legend, StaleBanner};
use components::heatmap::LayerHeatmaps;
use components::hparams::HyperParams;
use components::panel::RunPanel;
use components::runs::RunList;
use components::samples::SamplePanels;
use i18n::{t, Text};
use leptos::prelude::*;
use state::{mark_dirty, Ctx};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

pub use frame::every_frame;

pub use page::{location_search, now_ms, page_token, query_param};

#[wasm_bindgen(start)]
pub fn start() {
    leptos::mount::mount_to_body(App);
    expose_memory();
}

/// For the memory benchmark: `window.__stepstreamWasmBytes()`, the module's linear memory.
fn expose_memory() {
    let size = Closure::<dyn Fn() -> f64>::new(|| {
        wasm_bindgen::memory()
            .dyn_into::<js_sys::WebAssembly::Memory>()
            .ok()
            .and_then(|m| m.buffer().dyn_into::<js_sys::ArrayBuffer>().ok())
            .map_or(0.0, |b| b.byte_length() as f64)
    });
    if let Some(w) = web_sys::window() {
        let _ = js_sys::Reflect::set(&w, &"__stepstreamWasmBytes".into(), size.as_ref());
    }
    size.forget();
}

/// Calls `f` on a window event for the life of the page.
fn on_window(event: &str, f: impl FnMut() + 'static) {
    let f = Closure::<dyn FnMut()>::new(f);
    if let Some(w) = web_sys::window() {
        let _ = w.add_event_listener_with_callback(event, f.as_ref().unchecked_ref());
    }
    f.forget();
}

#[component]
fn App() -> impl IntoView {
    // Before anything reads or writes the address bar: the token leaves it now.
    let _ = page_token();
    let ctx = Ctx::from_location();
    let socket = ws::Socket::open(
        ws::viewer_url(query_param("hub").as_deref(), page_token().as_deref()),
        ws::Handlers {
            on_open: Box::new(state::on_open),
            on_message: Box::new(move |msg| ctx.on_message(msg)),
            on_state: Box::new(move |link: ws::Link| {
                if !link.is_open() {
                    fetch::lost();
                    state::on_lost();
                }
                ctx.live.set(link.is_open())
            }),
        },
    );
    socket::set(socket);
    every_frame(move || {
        // The console lines and samples of the batches the client applied, to their panels.
        let fresh = state::STORE.with(|s| std::mem::take(&mut s.borrow_mut().items));
        if !fresh.is_empty() {
            console::live(&fresh);
            samples::live(&fresh);
        }
        console::publish(&ctx);
        samples::publish(&ctx);
        if frame::frame(&ctx) {
            // What draws from the points outside the charts (the heatmaps) follows them, at
            // most four times a second.
            let now = now_ms();
            if now - ctx.drawn.get_untracked().1 > 250.0 {
                ctx.drawn.update(|(n, at)| {
                    *n += 1;
                    *at = now;
                });
            }
        }
    });
    let tick = Closure::<dyn FnMut()>::new(move || ctx.now.set(now_ms()));
    if let Some(w) = web_sys::window() {
        let _ = w.set_interval_with_callback_and_timeout_and_arguments_0(
            tick.as_ref().unchecked_ref(),
            1000,
        );
    }
    tick.forget();
    on_window("resize", mark_dirty);
    on_window("scroll", mark_dirty);
    on_window("popstate", move || ctx.restore_view());
    // The selected runs' consoles and samples follow the selection.
    Effect::new(move |_| {
        let runs = ctx.selected.get();
        console::watch(&runs);
        samples::watch(&runs);
    });
    ctx.publish_view();

    // The theme (and the system's, when following it) and the language on <html>.
    let dark_now = RwSignal::new(ctx.theme.get_untracked().is_dark());
    if let Some(mq) =
        web_sys::window().and_then(|w| w.match_media("(prefers-color-scheme: dark)").ok().flatten())
    {
        let f = Closure::<dyn FnMut()>::new(move || {
            dark_now.set(ctx.theme.get_untracked().is_dark());
            mark_dirty();
        });
        let _ = mq.add_event_listener_with_callback("change", f.as_ref().unchecked_ref());
        f.forget();
    }
    let lang = ctx.lang;
    Effect::new(move |_| {
        let dark = ctx.theme.get().is_dark();
        dark_now.track();
        if let Some(root) = web_sys::window()
            .and_then(|w| w.document())
            .and_then(|d| d.document_element())
        {
            let _ = root.set_attribute("lang", lang.get().code());
            let _ = root.set_attribute("data-theme", if dark { "dark" } else { "light" });
        }
        mark_dirty();
    });

    view! {
        <Header ctx=ctx/>
        <StaleBanner ctx=ctx/>
        <main class:has-enlarged=move || ctx.enlarged.with(Option::is_some)>
            <section class="runs">
                <h2>{move || t(lang.get(), Text::Runs)}</h2>
                <RunList ctx=ctx/>
                <RunPanel ctx=ctx/>
            </section>
            <section class="charts">
                <Show when=move || ctx.selected.with(|s| !s.is_empty())
                    fallback=move || view! { <p class="hint">{move || t(lang.get(), Text::PickRun)}</p> }>
                    <Toolbar ctx=ctx/>
                    <Legend ctx=ctx/>
                    <AlertList ctx=ctx/>
                </Show>
                <ChartGroups ctx=ctx/>
                <Show when=move || ctx.selected.with(|s| !s.is_empty())>
                    <LayerHeatmaps ctx=ctx/>
                    <HyperParams ctx=ctx/>
                    <SamplePanels ctx=ctx/>
                    <ConsolePanel ctx=ctx/>
                </Show>
            </section>
        </main>
        <Tooltip ctx=ctx/>
    }
}
