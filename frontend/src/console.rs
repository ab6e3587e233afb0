//! The console lines the page holds for the selected runs: the tail read over HTTP when a run
//! is selected, lines around a step when the page jumps there, and the live lines of every
//! batch the client applied, all keyed by `(seq, idx)`, so the history and the live stream
//! meet without a gap or a repeat. Outside the reactive system like the points; the frame
//! loop bumps [`Ctx::console`] when they changed.

use crate::state::Ctx;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use stepstream_protocol::{ItemBody, RunId, Stream};

/// Lines the page keeps per run, at most (the newest).
const KEPT: usize = 20_000;
/// Lines asked for when a run is selected, and around a step.
const PAGE: usize = 2_000;

/// One console line of one run.
#[derive(Clone, Debug, PartialEq)]
pub struct Line {
    pub run: RunId,
    pub seq: u64,
    pub idx: u32,
    pub step: i64,
    pub wall_time: f64,
    pub stderr: bool,
    pub text: String,
}

#[derive(Default)]
struct Log {
    lines: BTreeMap<(u64, u32), Line>,
    /// Lines the hub dropped (its cap), as its last answer said.
    dropped: u64,
    asked: bool,
}

thread_local! {
    static LOGS: RefCell<HashMap<RunId, Log>> = RefCell::new(HashMap::new());
    static CHANGED: Cell<bool> = const { Cell::new(false) };
}

fn insert(run: &RunId, lines: impl IntoIterator<Item = Line>) {
    LOGS.with(|logs| {
        let mut logs = logs.borrow_mut();
        let log = logs.entry(run.clone()).or_default();
        for l in lines {
            log.lines.insert((l.seq, l.idx), l);
        }
        while log.lines.len() > KEPT {
            log.lines.pop_first();
        }
    });
    CHANGED.with(|c| c.set(true));
}

/// The live lines of batches the client applied (their samples are the sample panels').
pub fn live(fresh: &[(RunId, u64, Vec<stepstream_protocol::Item>)]) {
    for (run, seq, items) in fresh {
        let (run, seq) = (run.clone(), *seq);
        let lines: Vec<Line> = items
            .iter()
            .enumerate()
            .filter_map(|(idx, item)| match &item.body {
                ItemBody::Line { stream, text } => Some(Line {
                    run: run.clone(),
                    seq,
                    idx: idx as u32,
                    step: item.step,
                    wall_time: item.wall_time,
                    stderr: *stream == Stream::Stderr,
                    text: text.clone(),
                }),
                _ => None,
            })
            .collect();
        let watched = LOGS.with(|l| l.borrow().contains_key(&run));
        if watched && !lines.is_empty() {
            insert(&run, lines);
        }
    }
}

/// Whether the lines changed since the last call (the frame loop asks once per frame).
pub fn take_changed() -> bool {
    CHANGED.with(|c| c.replace(false))
}

/// Reads `query` of the run's console over HTTP and keeps its lines.
fn ask(run: RunId, query: String) {
    let url = crate::fetch::api_url(&format!("/api/runs/{}/console?{query}", run.as_str()));
    wasm_bindgen_futures::spawn_local(async move {
        let Ok(v) = crate::fetch::get_json(url).await else {
            return;
        };
        let lines: Vec<Line> = v["lines"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|l| Line {
                run: run.clone(),
                seq: l["seq"].as_u64().unwrap_or(0),
                idx: l["idx"].as_u64().unwrap_or(0) as u32,
                step: l["step"].as_i64().unwrap_or(0),
                wall_time: l["wall_time"].as_f64().unwrap_or(0.0),
                stderr: l["stream"] == "stderr",
                text: l["text"].as_str().unwrap_or("").to_string(),
            })
            .collect();
        let dropped = v["dropped"].as_u64().unwrap_or(0);
        LOGS.with(|logs| {
            if let Some(log) = logs.borrow_mut().get_mut(&run) {
                log.dropped = dropped;
            }
        });
        insert(&run, lines);
    });
}

/// Follows the selected runs' consoles: the tail of each newly selected run is read once;
/// the others are let go.
pub fn watch(selected: &[RunId]) {
    let fresh: Vec<RunId> = LOGS.with(|logs| {
        let mut logs = logs.borrow_mut();
        logs.retain(|run, _| selected.contains(run));
        selected
            .iter()
            .filter(|r| {
                let log = logs.entry((*r).clone()).or_default();
                !std::mem::replace(&mut log.asked, true)
            })
            .cloned()
            .collect()
    });
    for run in fresh {
        ask(run, format!("limit={PAGE}"));
    }
    CHANGED.with(|c| c.set(true));
}

/// Makes sure the lines at `step` are held: a run whose held lines start after it reads
/// the lines from there.
pub fn load_at(step: i64) {
    let older: Vec<RunId> = LOGS.with(|logs| {
        logs.borrow()
            .iter()
            .filter(|(_, log)| {
                log.lines
                    .values()
                    .map(|l| l.step)
                    .min()
                    .is_none_or(|lo| lo > step)
            })
            .map(|(run, _)| run.clone())
            .collect()
    });
    for run in older {
        ask(run, format!("from_step={step}&limit={PAGE}"));
    }
}

/// What the panel shows: lines of the selected runs that pass the filters, in time order,
/// `most` of them: the newest, or those around the first line at step `around`; and the
/// lines dropped by the hub, summed.
pub fn shown(
    pattern: Option<&regex_lite::Regex>,
    stream: &str,
    run: &str,
    most: usize,
    around: Option<i64>,
) -> (Vec<Line>, u64) {
    LOGS.with(|logs| {
        let logs = logs.borrow();
        let mut out: Vec<Line> = logs
            .iter()
            .filter(|(id, _)| run.is_empty() || id.as_str() == run)
            .flat_map(|(_, log)| log.lines.values())
            .filter(|l| match stream {
                "stdout" => !l.stderr,
                "stderr" => l.stderr,
                _ => true,
            })
            .filter(|l| pattern.is_none_or(|p| p.is_match(&l.text)))
            .cloned()
            .collect();
        out.sort_by(|a, b| {
            a.wall_time
                .total_cmp(&b.wall_time)
                .then(a.run.cmp(&b.run))
                .then((a.seq, a.idx).cmp(&(b.seq, b.idx)))
        });
        if out.len() > most {
            let start = match around.and_then(|s| out.iter().position(|l| l.step >= s)) {
                Some(i) => i.saturating_sub(most / 4).min(out.len() - most),
                None => out.len() - most,
            };
            out.drain(..start);
            out.truncate(most);
        }
        let dropped = logs.values().map(|l| l.dropped).sum();
        (out, dropped)
    })
}

/// The frame loop's part: tell the panel when lines changed.
pub fn publish(ctx: &Ctx) {
    if take_changed() {
        use leptos::prelude::Update;
        ctx.console.update(|n| *n += 1);
    }
}
