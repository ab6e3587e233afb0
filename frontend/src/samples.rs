//! The text and table samples the page holds for the selected runs, per run and key, by
//! step: the newest of each key read over HTTP when a run is selected (then all of a key
//! when its panel opens), and those of every live batch. Outside the reactive system; the
//! frame loop bumps [`Ctx::samples`] when they changed.

use crate::state::Ctx;
use serde_json::Value;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use stepstream_protocol::{Cell as TableCell, Histogram, Item, ItemBody, RunId};

/// Samples of one key asked for at once, at most (the newest).
const PAGE: usize = 1_000;

/// A sample's content.
#[derive(Clone, Debug, PartialEq)]
pub enum Body {
    Text(String),
    Table {
        columns: Vec<String>,
        rows: Vec<Vec<String>>,
    },
    Histogram(Histogram),
    /// An image: where the hub serves its file, and its caption.
    Image {
        src: String,
        caption: String,
        width: u32,
        height: u32,
    },
}

/// Where the hub serves an image: by its batch and its place there.
fn image_src(run: &RunId, seq: u64, idx: u32) -> String {
    format!("/api/runs/{}/image?seq={seq}&idx={idx}", run.as_str())
}

#[derive(Default)]
struct Held {
    /// By run, key and step (a step logged twice keeps its last).
    by: HashMap<RunId, BTreeMap<String, BTreeMap<i64, Body>>>,
    /// Keys read whole, per run.
    whole: BTreeSet<(RunId, String)>,
}

thread_local! {
    static HELD: RefCell<Held> = RefCell::new(Held::default());
    static CHANGED: Cell<bool> = const { Cell::new(false) };
}

fn cell_text(c: &TableCell) -> String {
    match c {
        TableCell::Text(t) => t.clone(),
        TableCell::Number(n) => stepstream_chart::scale::value(*n),
    }
}

fn put(run: &RunId, key: String, step: i64, body: Body) {
    HELD.with(|h| {
        h.borrow_mut()
            .by
            .entry(run.clone())
            .or_default()
            .entry(key)
            .or_default()
            .insert(step, body);
    });
    CHANGED.with(|c| c.set(true));
}

/// The samples of batches the client applied, each with its place in its batch (console
/// lines are the console's).
pub fn live(fresh: &[(RunId, u64, Vec<Item>)]) {
    for (run, seq, items) in fresh {
        if HELD.with(|h| h.borrow().by.contains_key(run)) {
            live_batch(run, *seq, items);
        }
    }
}

fn live_batch(run: &RunId, seq: u64, items: &[Item]) {
    for (idx, item) in items.iter().cloned().enumerate() {
        let idx = idx as u32;
        let body = match item.body {
            ItemBody::Text(t) => Body::Text(t),
            ItemBody::Table { columns, rows } => Body::Table {
                columns,
                rows: rows
                    .iter()
                    .map(|r| r.iter().map(cell_text).collect())
                    .collect(),
            },
            ItemBody::Histogram(h) => Body::Histogram(h),
            ItemBody::Image(i) => Body::Image {
                src: image_src(run, seq, idx),
                caption: i.caption,
                width: i.width,
                height: i.height,
            },
            ItemBody::Line { .. } => continue,
        };
        put(run, item.key, item.step, body);
    }
}

fn body_of(kind: &str, v: &Value) -> Option<Body> {
    match kind {
        "text" => Some(Body::Text(v.as_str()?.to_string())),
        "table" => {
            let columns = v["columns"]
                .as_array()?
                .iter()
                .map(|c| c.as_str().unwrap_or("").to_string())
                .collect();
            let rows = v["rows"]
                .as_array()?
                .iter()
                .map(|r| {
                    r.as_array()
                        .into_iter()
                        .flatten()
                        .map(|c| match c {
                            Value::String(s) => s.clone(),
                            Value::Number(n) => {
                                stepstream_chart::scale::value(n.as_f64().unwrap_or(f64::NAN))
                            }
                            other => other.to_string(),
                        })
                        .collect()
                })
                .collect();
            Some(Body::Table { columns, rows })
        }
        "image" => Some(Body::Image {
            src: v["src"].as_str()?.to_string(),
            caption: v["caption"].as_str().unwrap_or("").to_string(),
            width: v["width"].as_u64().unwrap_or(0) as u32,
            height: v["height"].as_u64().unwrap_or(0) as u32,
        }),
        "histogram" => {
            let num = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
            let count = |k: &str| v[k].as_f64().unwrap_or(0.0);
            Some(Body::Histogram(Histogram {
                lo: num("lo"),
                hi: num("hi"),
                counts: v["counts"]
                    .as_array()?
                    .iter()
                    .map(|c| c.as_f64().unwrap_or(0.0))
                    .collect(),
                nan: count("nan"),
                pos_inf: count("pos_inf"),
                neg_inf: count("neg_inf"),
            }))
        }
        _ => None,
    }
}

fn ask(run: RunId, query: String) {
    let url = crate::fetch::api_url(&format!("/api/runs/{}/samples?{query}", run.as_str()));
    wasm_bindgen_futures::spawn_local(async move {
        let Ok(v) = crate::fetch::get_json(url).await else {
            return;
        };
        for s in v["samples"].as_array().into_iter().flatten() {
            let (Some(kind), Some(key), Some(step)) =
                (s["kind"].as_str(), s["key"].as_str(), s["step"].as_i64())
            else {
                continue;
            };
            if let Some(body) = body_of(kind, &s["body"]) {
                put(&run, key.to_string(), step, body);
            }
        }
        CHANGED.with(|c| c.set(true));
    });
}

/// Follows the selected runs' samples: the newest of a newly selected run are read once.
pub fn watch(selected: &[RunId]) {
    let fresh: Vec<RunId> = HELD.with(|h| {
        let mut h = h.borrow_mut();
        h.by.retain(|run, _| selected.contains(run));
        h.whole.retain(|(run, _)| selected.contains(run));
        let fresh: Vec<RunId> = selected
            .iter()
            .filter(|r| !h.by.contains_key(*r))
            .cloned()
            .collect();
        for r in &fresh {
            h.by.insert(r.clone(), BTreeMap::new());
        }
        fresh
    });
    for run in fresh {
        ask(run, format!("limit={PAGE}"));
    }
    CHANGED.with(|c| c.set(true));
}

/// Reads every sample of `key` of the selected runs (once), for its step slider.
pub fn load_key(key: &str) {
    let runs: Vec<RunId> = HELD.with(|h| {
        let mut h = h.borrow_mut();
        let runs: Vec<RunId> = h.by.keys().cloned().collect();
        runs.into_iter()
            .filter(|r| h.whole.insert((r.clone(), key.to_string())))
            .collect()
    });
    for run in runs {
        ask(
            run,
            format!("key={}&limit={PAGE}", js_sys::encode_uri_component(key)),
        );
    }
}

/// Every key of the selected runs, sorted.
pub fn keys() -> Vec<String> {
    HELD.with(|h| {
        let set: BTreeSet<String> = h
            .borrow()
            .by
            .values()
            .flat_map(|m| m.keys().cloned())
            .collect();
        set.into_iter().collect()
    })
}

/// The steps at which any selected run has a sample of `key`, ascending.
pub fn steps(key: &str) -> Vec<i64> {
    HELD.with(|h| {
        let set: BTreeSet<i64> = h
            .borrow()
            .by
            .values()
            .filter_map(|m| m.get(key))
            .flat_map(|s| s.keys().copied())
            .collect();
        set.into_iter().collect()
    })
}

/// Each selected run's sample of `key` at `step` or the last one before it, with its step.
pub fn at(runs: &[RunId], key: &str, step: i64) -> Vec<(RunId, Option<(i64, Body)>)> {
    HELD.with(|h| {
        let h = h.borrow();
        runs.iter()
            .map(|r| {
                let found =
                    h.by.get(r)
                        .and_then(|m| m.get(key))
                        .and_then(|s| s.range(..=step).next_back())
                        .map(|(s, b)| (*s, b.clone()));
                (r.clone(), found)
            })
            .collect()
    })
}

/// Each run's histograms of `key`, by step.
pub fn histograms(runs: &[RunId], key: &str) -> Vec<(RunId, Vec<(i64, Histogram)>)> {
    HELD.with(|h| {
        let h = h.borrow();
        runs.iter()
            .map(|r| {
                let series =
                    h.by.get(r)
                        .and_then(|m| m.get(key))
                        .map(|s| {
                            s.iter()
                                .filter_map(|(step, b)| match b {
                                    Body::Histogram(h) => Some((*step, h.clone())),
                                    _ => None,
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                (r.clone(), series)
            })
            .collect()
    })
}

/// Whether `key`'s samples are histograms.
pub fn is_histogram(key: &str) -> bool {
    HELD.with(|h| {
        h.borrow()
            .by
            .values()
            .filter_map(|m| m.get(key))
            .flat_map(|s| s.values())
            .any(|b| matches!(b, Body::Histogram(_)))
    })
}

/// The frame loop's part: tell the panels when samples changed.
pub fn publish(ctx: &Ctx) {
    if CHANGED.with(|c| c.replace(false)) {
        use leptos::prelude::Update;
        ctx.samples.update(|n| *n += 1);
    }
}

/// A line diff of two texts: each line of either with `-` (only in `a`), `+` (only in `b`)
/// or ` ` (both), in order (longest common subsequence of lines; texts past 2,000 lines
/// are compared in their first 2,000).
pub fn diff(a: &str, b: &str) -> Vec<(char, String)> {
    let a: Vec<&str> = a.lines().take(2000).collect();
    let b: Vec<&str> = b.lines().take(2000).collect();
    let (n, m) = (a.len(), b.len());
    // lcs[i][j]: the common lines of a[i..] and b[j..].
    let mut lcs = vec![vec![0u32; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    let mut out = Vec::new();
    while i < n || j < m {
        if i < n && j < m && a[i] == b[j] {
            out.push((' ', a[i].to_string()));
            i += 1;
            j += 1;
        } else if i < n && (j == m || lcs[i + 1][j] >= lcs[i][j + 1]) {
            out.push(('-', a[i].to_string()));
            i += 1;
        } else {
            out.push(('+', b[j].to_string()));
            j += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::diff;

    #[test]
    fn a_diff_keeps_common_lines_and_marks_the_rest() {
        let d = diff(
            "the cat\nsat on\nthe mat",
            "the cat\nlay on\nthe mat\nat noon",
        );
        let shown: Vec<String> = d.iter().map(|(c, l)| format!("{c}{l}")).collect();
        assert_eq!(
            shown,
            [" the cat", "-sat on", "+lay on", " the mat", "+at noon"]
        );
        assert!(diff("", "").is_empty());
    }
}
