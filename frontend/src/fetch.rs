//! What the page asks the hub besides its subscriptions: the points of a zoom window (over
//! the viewer socket, a [`Zoom`] answered by a [`Zoomed`]: one way in from the hub for every
//! point the page draws), and over HTTP a run's detail (its config) and the run list with
//! configs (for `key=value` search). Answers that arrive after a newer request was made for
//! the same window are dropped, so a fast wheel never shows an older window.

use serde_json::Value;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use stepstream_protocol::{FromViewer, RunId, Zoom, Zoomed};
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;

/// The raw points of one run's metric over a step range, as the hub answered.
#[derive(Clone, Debug, Default)]
pub struct Detail {
    pub lo: i64,
    pub hi: i64,
    pub steps: Vec<i64>,
    pub values: Vec<f64>,
    pub times: Vec<f64>,
    /// The hub thinned the range to the budget (wider than the pixels).
    pub downsampled: bool,
    pub total: u64,
    /// Bumped on each answer, so charts redraw.
    pub version: u64,
}

type Key = (RunId, String);

thread_local! {
    static DETAILS: RefCell<HashMap<Key, Detail>> = RefCell::new(HashMap::new());
    static WANTED: RefCell<HashMap<Key, (i64, i64, u64)>> = RefCell::new(HashMap::new());
    static NEXT: Cell<u64> = const { Cell::new(1) };
}

/// `http(s)://hub` for the page's `?hub=` (a ws:// or http:// address), else the page's own
/// origin (an empty prefix).
pub fn api_base() -> String {
    match crate::page::query_param("hub") {
        Some(h) => h
            .trim_end_matches('/')
            .replacen("ws://", "http://", 1)
            .replacen("wss://", "https://", 1),
        None => String::new(),
    }
}

/// An API path with the page's read token, if it has one.
pub fn api_url(path_and_query: &str) -> String {
    let mut url = format!("{}{path_and_query}", api_base());
    if let Some(t) = crate::page::page_token() {
        url.push(if url.contains('?') { '&' } else { '?' });
        url.push_str("token=");
        url.push_str(&String::from(js_sys::encode_uri_component(&t)));
    }
    url
}

/// A fetch's response, awaited: its status and its body as text.
pub async fn answered(fetching: js_sys::Promise) -> Result<(u16, String), String> {
    let resp = JsFuture::from(fetching)
        .await
        .map_err(|e| format!("{e:?}"))?;
    let resp: web_sys::Response = resp.dyn_into().map_err(|_| "not a response")?;
    let text = JsFuture::from(resp.text().map_err(|e| format!("{e:?}"))?)
        .await
        .map_err(|e| format!("{e:?}"))?
        .as_string()
        .unwrap_or_default();
    Ok((resp.status(), text))
}

/// GETs a JSON document.
pub async fn get_json(url: String) -> Result<Value, String> {
    let window = web_sys::window().ok_or("no window")?;
    let (status, text) = answered(window.fetch_with_str(&url)).await?;
    if !(200..300).contains(&status) {
        return Err(format!("HTTP {status}: {text}"));
    }
    serde_json::from_str(&text).map_err(|e| e.to_string())
}

/// Points a zoom window asks for, at most (the hub's own limit for one answer).
const ZOOM_MOST: usize = 100_000;

/// Asks for the points of `run`'s `metric` in `lo..=hi`, at most `budget` of them, unless
/// that range is already held or asked for; [`answer`] takes the reply.
pub fn request(run: &RunId, metric: &str, (lo, hi): (i64, i64), budget: usize) {
    let key = (run.clone(), metric.to_string());
    let held = DETAILS.with(|d| {
        d.borrow()
            .get(&key)
            .is_some_and(|x| x.lo == lo && x.hi == hi)
    });
    let asked = WANTED.with(|w| {
        w.borrow()
            .get(&key)
            .is_some_and(|&(a, b, _)| (a, b) == (lo, hi))
    });
    if held || asked {
        return;
    }
    let id = NEXT.with(|n| n.replace(n.get() + 1));
    WANTED.with(|w| w.borrow_mut().insert(key, (lo, hi, id)));
    crate::socket::send(FromViewer::Zoom(Zoom {
        id,
        run_id: run.clone(),
        metric: metric.to_string(),
        from: lo,
        to: hi,
        budget: budget.clamp(4, ZOOM_MOST) as u32,
    }));
}

/// A zoom window's points from the hub: kept if they answer the newest request for that
/// window (`true`: the charts should redraw).
pub fn answer(z: Zoomed) -> bool {
    let key = (z.run_id, z.metric);
    let Some((lo, hi, id)) = WANTED.with(|w| w.borrow().get(&key).copied()) else {
        return false;
    };
    if id != z.id {
        return false;
    }
    WANTED.with(|w| w.borrow_mut().remove(&key));
    if z.steps.len() != z.values.len() || z.times.len() != z.steps.len() {
        return false;
    }
    let detail = Detail {
        lo,
        hi,
        steps: z.steps,
        values: z.values,
        times: z.times,
        downsampled: z.downsampled,
        total: z.total_points,
        version: id,
    };
    DETAILS.with(|d| d.borrow_mut().insert(key, detail));
    true
}

/// The socket was lost: its requests will not be answered, and are asked again.
pub fn lost() {
    WANTED.with(|w| w.borrow_mut().clear());
}

/// Calls `f` with the detail held for `run`'s `metric`, if any.
pub fn with_detail<T>(run: &RunId, metric: &str, f: impl FnOnce(&Detail) -> T) -> Option<T> {
    DETAILS.with(|d| d.borrow().get(&(run.clone(), metric.to_string())).map(f))
}

/// Forgets every window (back to following the live edge), or those of one run.
pub fn forget(run: Option<&RunId>) {
    let keep = |k: &Key| run.is_some_and(|r| &k.0 != r);
    DETAILS.with(|d| d.borrow_mut().retain(|k, _| keep(k)));
    WANTED.with(|w| w.borrow_mut().retain(|k, _| keep(k)));
}

/// Whether a range of `run`'s `metric` was asked for and not answered yet (a test hook:
/// a chart's `data-fetching`).
pub fn pending(run: &RunId, metric: &str) -> bool {
    WANTED.with(|w| w.borrow().contains_key(&(run.clone(), metric.to_string())))
}
