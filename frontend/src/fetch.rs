//! What the page asks the hub over HTTP: the raw points of a zoom window (the series
//! endpoint with `from`/`to`), a run's detail (its config), and the run list with configs
//! (for `key=value` search). Answers that arrive after a newer request was made for the
//! same thing are dropped, so a fast wheel never shows an older window.

use serde_json::Value;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use stepstream_protocol::RunId;
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
    match crate::query_param("hub") {
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
    if let Some(t) = crate::page_token() {
        url.push(if url.contains('?') { '&' } else { '?' });
        url.push_str("token=");
        url.push_str(&String::from(js_sys::encode_uri_component(&t)));
    }
    url
}

/// GETs a JSON document.
pub async fn get_json(url: String) -> Result<Value, String> {
    let window = web_sys::window().ok_or("no window")?;
    let resp = JsFuture::from(window.fetch_with_str(&url))
        .await
        .map_err(|e| format!("{e:?}"))?;
    let resp: web_sys::Response = resp.dyn_into().map_err(|_| "not a response")?;
    let text = JsFuture::from(resp.text().map_err(|e| format!("{e:?}"))?)
        .await
        .map_err(|e| format!("{e:?}"))?
        .as_string()
        .unwrap_or_default();
    if !resp.ok() {
        return Err(format!("HTTP {}: {text}", resp.status()));
    }
    serde_json::from_str(&text).map_err(|e| e.to_string())
}

/// A JSON number, or one of the strings the hub writes for non-finite values.
pub fn f64_of(v: &Value) -> f64 {
    match v {
        Value::Number(n) => n.as_f64().unwrap_or(f64::NAN),
        Value::String(s) if s == "Infinity" => f64::INFINITY,
        Value::String(s) if s == "-Infinity" => f64::NEG_INFINITY,
        _ => f64::NAN,
    }
}

/// Asks for the points of `run`'s `metric` in `lo..=hi`, at most `budget` of them, unless
/// that range is already held or asked for. `on_answer` runs when it arrives.
pub fn request(run: &RunId, metric: &str, (lo, hi): (i64, i64), budget: usize, on_answer: fn()) {
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
    WANTED.with(|w| w.borrow_mut().insert(key.clone(), (lo, hi, id)));
    let url = api_url(&format!(
        "/api/runs/{}/series?metric={}&from={lo}&to={hi}&budget={}",
        run.as_str(),
        String::from(js_sys::encode_uri_component(metric)),
        budget.clamp(4, 1_000_000)
    ));
    wasm_bindgen_futures::spawn_local(async move {
        let answer = get_json(url).await;
        let current = WANTED.with(|w| w.borrow().get(&key).is_some_and(|&(_, _, i)| i == id));
        if !current {
            return;
        }
        WANTED.with(|w| w.borrow_mut().remove(&key));
        let v = match answer {
            Ok(v) => v,
            Err(e) => {
                web_sys::console::warn_1(&format!("stepstream: range fetch failed: {e}").into());
                return;
            }
        };
        let arr = |k: &str| v[k].as_array().cloned().unwrap_or_default();
        let detail = Detail {
            lo,
            hi,
            steps: arr("steps").iter().filter_map(Value::as_i64).collect(),
            values: arr("values").iter().map(f64_of).collect(),
            times: arr("times").iter().map(f64_of).collect(),
            downsampled: v["downsampled"].as_bool().unwrap_or(false),
            total: v["total_points"].as_u64().unwrap_or(0),
            version: id,
        };
        if detail.steps.len() == detail.values.len() && detail.times.len() == detail.steps.len() {
            DETAILS.with(|d| d.borrow_mut().insert(key, detail));
            on_answer();
        }
    });
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
