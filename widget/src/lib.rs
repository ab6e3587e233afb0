//! The embeddable stepstream chart: live curves of one or several runs in any page, a
//! notebook cell or an iframe. Its own small WASM bundle (no Leptos, no web-app code): the
//! drawing, the points and the socket come from `stepstream-chart`, shared with the web app,
//! so a widget draws exactly what the app draws (decimation, smoothing, log scale, NaN
//! markers, theme).
//!
//! * `options` — what a widget shows, from `data-*` attributes or a JS object.
//! * `connection` — one socket per hub, shared by the page's widgets.
//! * `view` — one widget: its element, its state, drawing.
//!
//! The hub serves this bundle as `embed.js` (the wasm-bindgen glue and a loader in one
//! classic script) and `embed-HASH.wasm`; the loader calls [`mount`] for every
//! `[data-stepstream-run]` element, now and as they are added, and offers
//! `stepstream.chart(element, options)` to pages that build elements themselves.

pub mod connection;
pub mod options;
pub mod view;

use options::{Options, NAMES};
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use view::View;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use web_sys::HtmlElement;

thread_local! {
    static VIEWS: RefCell<Vec<Rc<View>>> = const { RefCell::new(Vec::new()) };
    static NEXT_ID: Cell<u32> = const { Cell::new(0) };
    static LOOP: Cell<bool> = const { Cell::new(false) };
}

/// A mounted widget, as JS holds it.
#[wasm_bindgen]
pub struct Widget(Option<Rc<View>>);

#[wasm_bindgen]
impl Widget {
    /// Stops the widget; the shared socket closes with its last widget.
    pub fn close(&self) {
        if let Some(v) = &self.0 {
            v.close();
            VIEWS.with(|vs| vs.borrow_mut().retain(|x| x.id != v.id));
        }
    }

    /// `loading`, `live`, `stale`, `finished`, `failed`, `killed`, `snapshot`,
    /// `not-found`, `refused`, `unreachable` or `error`.
    pub fn state(&self) -> String {
        self.0
            .as_ref()
            .map_or("error".into(), |v| v.state.borrow().clone())
    }

    /// Points received so far, over all lines.
    pub fn points(&self) -> f64 {
        self.0.as_ref().map_or(0.0, |v| v.points.get() as f64)
    }
}

/// The text of option `name` from a JS object (a list may be an array).
fn from_object(obj: &JsValue, name: &str) -> Option<String> {
    let v = js_sys::Reflect::get(obj, &name.into()).ok()?;
    if v.is_undefined() || v.is_null() {
        return None;
    }
    if let Some(a) = v.dyn_ref::<js_sys::Array>() {
        return Some(
            a.iter()
                .filter_map(|x| x.as_string())
                .collect::<Vec<_>>()
                .join(","),
        );
    }
    if let Some(b) = v.as_bool() {
        return Some(b.to_string());
    }
    if let Some(n) = v.as_f64() {
        return Some(n.to_string());
    }
    v.as_string()
}

/// The text of option `name` from the element's attributes.
fn from_element(el: &HtmlElement, name: &str) -> Option<String> {
    let attr = if name == "run" {
        "data-stepstream-run".to_string()
    } else {
        format!("data-{name}")
    };
    el.get_attribute(&attr)
}

/// Mounts a widget into `element`: options from `options` (a JS object) where given, else
/// from the element's `data-*` attributes; `default_hub` is where the script came from.
/// Bad options are shown in the element, and thrown.
#[wasm_bindgen]
pub fn mount(element: HtmlElement, options: JsValue, default_hub: &str) -> Result<Widget, JsValue> {
    let parsed = if options.is_object() {
        Options::parse(|n| from_object(&options, n), default_hub)
    } else {
        Options::parse(|n| from_element(&element, n), default_hub)
    };
    let opts = match parsed {
        Ok(o) => o,
        Err(e) => {
            view::show_error(&element, &e);
            return Err(JsValue::from_str(&e));
        }
    };
    // A second mount on one element replaces the first.
    VIEWS.with(|vs| {
        vs.borrow_mut().retain(|v| {
            let same = v.root_is(&element);
            if same {
                v.close();
            }
            !same
        })
    });
    let id = NEXT_ID.with(|n| {
        n.set(n.get() + 1);
        n.get()
    });
    let view = Rc::new(View::new(id, element, opts));
    VIEWS.with(|vs| vs.borrow_mut().push(view.clone()));
    start_loop();
    Ok(Widget(Some(view)))
}

/// The option names the loader looks for (`data-` + name; the run is `data-stepstream-run`).
#[wasm_bindgen]
pub fn option_names() -> Vec<String> {
    NAMES.iter().map(|s| s.to_string()).collect()
}

/// Sockets this page holds to hubs (several widgets share one).
#[wasm_bindgen]
pub fn sockets() -> u32 {
    connection::count() as u32
}

/// One animation-frame loop for every widget; widgets whose element left the page are
/// closed, so removing a notebook cell's output frees its socket share.
fn start_loop() {
    if LOOP.with(|l| l.replace(true)) {
        return;
    }
    type Frame = Closure<dyn FnMut()>;
    let f: Rc<RefCell<Option<Frame>>> = Rc::new(RefCell::new(None));
    let g = f.clone();
    *g.borrow_mut() = Some(Closure::new(move || {
        let now = js_sys::Date::now();
        let views: Vec<Rc<View>> = VIEWS.with(|vs| vs.borrow().clone());
        for v in &views {
            if v.is_attached() {
                v.frame(now);
            } else {
                v.close();
            }
        }
        VIEWS.with(|vs| vs.borrow_mut().retain(|v| !v.closed.get()));
        if let (Some(w), Some(cb)) = (web_sys::window(), f.borrow().as_ref()) {
            let _ = w.request_animation_frame(cb.as_ref().unchecked_ref());
        }
    }));
    let first = g.borrow();
    if let (Some(w), Some(cb)) = (web_sys::window(), first.as_ref()) {
        let _ = w.request_animation_frame(cb.as_ref().unchecked_ref());
    }
}
