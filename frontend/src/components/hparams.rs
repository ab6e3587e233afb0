//! Hyper-parameter views of the selected runs: parallel coordinates (one axis per config key
//! whose value differs between them, then a summary of a chosen metric: its last, lowest or
//! highest value), where dragging along an axis brushes a range and the runs through every
//! brushed range can become the selection; and a scatter of that summary against any config
//! key. Configs come from the run list's (`Ctx::configs`), summaries from the points the
//! page holds (their compaction keeps each bucket's extremes, so lowest and highest are
//! exact). Plain 2D canvas.

use crate::state::{mark_dirty, Config, Ctx, STORE};
use leptos::html;
use leptos::prelude::*;
use std::collections::HashMap;
use stepstream_chart::scale::{tick, value};
use stepstream_chart::theme::{color_of, css, DARK, LIGHT};
use stepstream_protocol::RunId;

/// Which value of a metric's series stands for the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Summary {
    #[default]
    Last,
    Min,
    Max,
}

impl Summary {
    fn of(self, values: &[f64]) -> Option<f64> {
        let mut finite = values.iter().copied().filter(|v| v.is_finite());
        match self {
            Summary::Last => finite.next_back(),
            Summary::Min => finite.reduce(f64::min),
            Summary::Max => finite.reduce(f64::max),
        }
    }

    fn code(self) -> &'static str {
        match self {
            Summary::Last => "last",
            Summary::Min => "min",
            Summary::Max => "max",
        }
    }
}

/// One axis: a value per run (`None`: the run has none), its range, and for a key whose
/// values are not numbers the names of the categories its values index.
#[derive(Clone, Debug, PartialEq)]
pub struct PAxis {
    pub name: String,
    pub values: Vec<Option<f64>>,
    pub lo: f64,
    pub hi: f64,
    pub categories: Option<Vec<String>>,
}

impl PAxis {
    fn new(name: String, values: Vec<Option<f64>>, categories: Option<Vec<String>>) -> PAxis {
        let present = values.iter().flatten().copied();
        let (lo, hi) = present.fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(v), b.max(v)));
        let (lo, hi) = match (lo <= hi, hi - lo) {
            (false, _) => (0.0, 1.0),
            (true, d) if d < 1e-12 => (lo - 0.5, hi + 0.5),
            _ => (lo, hi),
        };
        PAxis {
            name,
            values,
            lo,
            hi,
            categories,
        }
    }

    /// `v` as a fraction of the axis, 0 at the bottom.
    pub fn frac(&self, v: f64) -> f64 {
        (v - self.lo) / (self.hi - self.lo)
    }

    fn label(&self, v: f64) -> String {
        match &self.categories {
            Some(c) => c.get(v.round() as usize).cloned().unwrap_or_default(),
            None => tick(v, self.hi - self.lo),
        }
    }
}

/// The config keys whose values differ between `runs`, as axes (numbers as they are, other
/// values as sorted categories).
pub fn config_axes(runs: &[RunId], configs: &HashMap<RunId, Config>) -> Vec<PAxis> {
    let mut keys: Vec<&String> = runs
        .iter()
        .filter_map(|r| configs.get(r))
        .flat_map(|c| c.iter().map(|(k, _)| k))
        .collect();
    keys.sort();
    keys.dedup();
    let mut out = Vec::new();
    for key in keys {
        let raw: Vec<Option<&str>> = runs
            .iter()
            .map(|r| {
                let c = configs.get(r)?;
                c.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
            })
            .collect();
        let mut distinct: Vec<&str> = raw.iter().flatten().copied().collect();
        distinct.sort_unstable();
        distinct.dedup();
        if distinct.len() < 2 {
            continue;
        }
        let numbers: Option<Vec<Option<f64>>> = raw
            .iter()
            .map(|v| match v {
                None => Some(None),
                Some(s) => s.parse::<f64>().ok().filter(|x| x.is_finite()).map(Some),
            })
            .collect();
        out.push(match numbers {
            Some(values) => PAxis::new(key.clone(), values, None),
            None => {
                let values = raw
                    .iter()
                    .map(|v| {
                        v.and_then(|s| distinct.iter().position(|d| *d == s))
                            .map(|i| i as f64)
                    })
                    .collect();
                let names = distinct.iter().map(|s| s.to_string()).collect();
                PAxis::new(key.clone(), values, Some(names))
            }
        });
    }
    out
}

/// The runs (indices) whose values lie in every brushed range (`(axis name, lo, hi)`).
pub fn brushed(axes: &[PAxis], brushes: &[(String, f64, f64)], n: usize) -> Vec<usize> {
    (0..n)
        .filter(|&r| {
            brushes.iter().all(|(name, lo, hi)| {
                axes.iter()
                    .find(|a| &a.name == name)
                    .and_then(|a| a.values[r])
                    .is_some_and(|v| (*lo..=*hi).contains(&v))
            })
        })
        .collect()
}

/// The selected runs' summary of `metric`, from the points the page holds.
fn summaries(runs: &[RunId], metric: &str, summary: Summary) -> Vec<Option<f64>> {
    STORE.with(|s| {
        let s = s.borrow();
        runs.iter()
            .map(|r| summary.of(&s.runs.get(r)?.series(metric)?.values))
            .collect()
    })
}

/// The metrics the selected runs log (per-layer ones aside), sorted.
fn metric_names(ctx: &Ctx) -> Vec<String> {
    ctx.charts.with(|c| crate::groups::x_candidates(c)).1
}

const TOP: f64 = 34.0;
const BOTTOM: f64 = 22.0;
const SIDE: f64 = 60.0;

/// Where the axes stand on a canvas `w` wide.
fn axis_xs(n: usize, w: f64) -> Vec<f64> {
    let span = (w - 2.0 * SIDE).max(1.0);
    (0..n)
        .map(|i| {
            if n == 1 {
                w / 2.0
            } else {
                SIDE + span * i as f64 / (n - 1) as f64
            }
        })
        .collect()
}

fn draw_parallel(
    canvas: &web_sys::HtmlCanvasElement,
    axes: &[PAxis],
    runs: &[RunId],
    picked: &[usize],
    brushes: &[(String, f64, f64)],
    dark: bool,
) -> Option<()> {
    let (c2d, w, h) = super::histograms::context(canvas)?;
    let theme = if dark { DARK } else { LIGHT };
    let xs = axis_xs(axes.len(), w);
    let y = |a: &PAxis, v: f64| h - BOTTOM - a.frac(v) * (h - TOP - BOTTOM);
    // Runs not picked first and faint, so the picked ones lie on top.
    let brushing = !brushes.is_empty();
    let mut order: Vec<usize> = (0..runs.len()).collect();
    order.sort_by_key(|r| picked.contains(r));
    for r in order {
        let on = !brushing || picked.contains(&r);
        c2d.set_global_alpha(if on { 0.95 } else { 0.15 });
        c2d.set_stroke_style_str(&css(color_of(runs[r].as_str())));
        c2d.set_line_width(if on { 2.0 } else { 1.0 });
        c2d.begin_path();
        let mut pen = false;
        for (a, x) in axes.iter().zip(&xs) {
            match a.values[r] {
                Some(v) if pen => c2d.line_to(*x, y(a, v)),
                Some(v) => {
                    c2d.move_to(*x, y(a, v));
                    pen = true;
                }
                None => pen = false,
            }
        }
        c2d.stroke();
    }
    c2d.set_global_alpha(1.0);
    let text = css(theme.text);
    for (a, x) in axes.iter().zip(&xs) {
        c2d.set_stroke_style_str(&css(theme.axis));
        c2d.set_line_width(1.0);
        c2d.begin_path();
        c2d.move_to(*x, TOP);
        c2d.line_to(*x, h - BOTTOM);
        c2d.stroke();
        c2d.set_fill_style_str(&text);
        c2d.set_font("11px sans-serif");
        c2d.set_text_align("center");
        let _ = c2d.fill_text(&a.name, *x, 14.0);
        let _ = c2d.fill_text(&a.label(a.hi), *x, TOP - 6.0);
        let _ = c2d.fill_text(&a.label(a.lo), *x, h - 6.0);
        if let Some((_, lo, hi)) = brushes.iter().find(|b| b.0 == a.name) {
            c2d.set_fill_style_str(theme.selection);
            let (top, bottom) = (y(a, *hi), y(a, *lo));
            c2d.fill_rect(x - 7.0, top, 14.0, bottom - top);
        }
    }
    let set = |k: &str, v: String| {
        let _ = canvas.set_attribute(k, &v);
    };
    set(
        "data-axes",
        axes.iter()
            .map(|a| a.name.clone())
            .collect::<Vec<_>>()
            .join("|"),
    );
    set(
        "data-axis-xs",
        xs.iter()
            .map(|x| format!("{x:.1}"))
            .collect::<Vec<_>>()
            .join(","),
    );
    set(
        "data-ranges",
        axes.iter()
            .map(|a| format!("{}:{}", a.lo, a.hi))
            .collect::<Vec<_>>()
            .join("|"),
    );
    set("data-top", TOP.to_string());
    set("data-bottom", (h - BOTTOM).to_string());
    set(
        "data-picked",
        picked
            .iter()
            .map(|&r| runs[r].to_string())
            .collect::<Vec<_>>()
            .join(","),
    );
    Some(())
}

fn draw_scatter(
    canvas: &web_sys::HtmlCanvasElement,
    x: &PAxis,
    y: &PAxis,
    runs: &[RunId],
    labels: &[String],
    dark: bool,
) -> Option<()> {
    let (c2d, w, h) = super::histograms::context(canvas)?;
    let theme = if dark { DARK } else { LIGHT };
    let (left, right, top, bottom) = (SIDE, w - 20.0, 16.0, h - 30.0);
    // Points kept off the axes and clear of the right edge (their labels go right).
    let px = |v: f64| left + 10.0 + x.frac(v) * (right - left - 80.0);
    let py = |v: f64| bottom - 8.0 - y.frac(v) * (bottom - top - 16.0);
    c2d.set_stroke_style_str(&css(theme.axis));
    c2d.set_line_width(1.0);
    c2d.begin_path();
    c2d.move_to(left, top);
    c2d.line_to(left, bottom);
    c2d.line_to(right, bottom);
    c2d.stroke();
    c2d.set_fill_style_str(&css(theme.text));
    c2d.set_font("11px sans-serif");
    c2d.set_text_align("left");
    let _ = c2d.fill_text(&x.label(x.lo), left, h - 14.0);
    c2d.set_text_align("right");
    let _ = c2d.fill_text(&x.label(x.hi), right, h - 14.0);
    c2d.set_text_align("center");
    let _ = c2d.fill_text(&x.name, (left + right) / 2.0, h - 2.0);
    c2d.set_text_align("right");
    let _ = c2d.fill_text(&y.label(y.hi), left - 4.0, top + 8.0);
    let _ = c2d.fill_text(&y.label(y.lo), left - 4.0, bottom);
    let _ = c2d.fill_text(&y.name, left - 4.0, (top + bottom) / 2.0);
    let mut shown = Vec::new();
    for (r, run) in runs.iter().enumerate() {
        let (Some(a), Some(b)) = (x.values[r], y.values[r]) else {
            continue;
        };
        c2d.set_fill_style_str(&css(color_of(run.as_str())));
        c2d.begin_path();
        let _ = c2d.arc(px(a), py(b), 5.0, 0.0, std::f64::consts::TAU);
        c2d.fill();
        c2d.set_fill_style_str(&css(theme.text));
        c2d.set_text_align("left");
        let _ = c2d.fill_text(&labels[r], px(a) + 7.0, py(b) - 4.0);
        shown.push(format!("{}:{}:{}", labels[r], value(a), value(b)));
    }
    let _ = canvas.set_attribute("data-points", &shown.join("|"));
    Some(())
}

/// The panel: shown for two runs or more.
#[component]
pub fn HyperParams(ctx: Ctx) -> impl IntoView {
    let open = RwSignal::new(false);
    let metric = RwSignal::new(String::new());
    let summary = RwSignal::new(Summary::Last);
    let scatter_x = RwSignal::new(String::new());
    let brushes: RwSignal<Vec<(String, f64, f64)>> = RwSignal::new(Vec::new());
    let drag: RwSignal<Option<(usize, f64, f64)>> = RwSignal::new(None);
    let parallel: NodeRef<html::Canvas> = NodeRef::new();
    let scatter: NodeRef<html::Canvas> = NodeRef::new();
    let metrics = Memo::new(move |_| metric_names(&ctx));
    // The target metric: the chosen one, else the loss, else the first.
    let target = move || {
        let names = metrics.get();
        let chosen = metric.get();
        if names.contains(&chosen) {
            return Some(chosen);
        }
        ["val_loss", "eval_loss", "loss"]
            .iter()
            .map(|s| s.to_string())
            .find(|m| names.contains(m))
            .or_else(|| names.first().cloned())
    };
    // Axes and the runs they cover, from the configs and the held points.
    let model = move || -> (Vec<RunId>, Vec<PAxis>) {
        ctx.drawn.track();
        let runs = ctx.selected.get();
        let mut axes = ctx.configs.with(|c| {
            c.as_ref()
                .map(|c| config_axes(&runs, c))
                .unwrap_or_default()
        });
        if let Some(m) = target() {
            let s = summary.get();
            axes.push(PAxis::new(
                format!("{m} ({})", s.code()),
                summaries(&runs, &m, s),
                None,
            ));
        }
        (runs, axes)
    };
    let picked = move || {
        let (runs, axes) = model();
        brushed(&axes, &brushes.get(), runs.len())
    };
    Effect::new(move |_| {
        if !open.get() {
            return;
        }
        if ctx.configs.with_untracked(Option::is_none) {
            ctx.load_configs();
        }
        let dark = ctx.theme.get().is_dark();
        let (runs, axes) = model();
        let chosen = picked();
        if let Some(c) = parallel.get() {
            draw_parallel(&c, &axes, &runs, &chosen, &brushes.get(), dark);
        }
        let Some(c) = scatter.get() else {
            return;
        };
        let (Some(y), configs) = (axes.last(), &axes[..axes.len().saturating_sub(1)]) else {
            return;
        };
        let wanted = scatter_x.get();
        if let Some(x) = configs
            .iter()
            .find(|a| a.name == wanted)
            .or(configs.first())
        {
            let labels: Vec<String> = runs.iter().map(|r| ctx.label(r)).collect();
            draw_scatter(&c, x, y, &runs, &labels, dark);
        }
    });
    // Brushing: a drag along an axis (within 15 px of it) sets its range; a click clears it.
    let axis_at = move |x: f64, w: f64| -> Option<usize> {
        let n = model().1.len();
        axis_xs(n, w).iter().position(|a| (a - x).abs() < 15.0)
    };
    let value_at = move |axis: usize, y: f64, h: f64| -> Option<(String, f64)> {
        let axes = model().1;
        let a = axes.get(axis)?;
        let f = ((h - BOTTOM - y) / (h - TOP - BOTTOM)).clamp(0.0, 1.0);
        Some((a.name.clone(), a.lo + f * (a.hi - a.lo)))
    };
    let size = move || {
        parallel.get().map(|c| {
            let c: &web_sys::HtmlCanvasElement = &c;
            (c.client_width() as f64, c.client_height() as f64)
        })
    };
    let down = move |ev: web_sys::MouseEvent| {
        let Some((w, _)) = size() else { return };
        let (x, y) = (ev.offset_x() as f64, ev.offset_y() as f64);
        if let Some(axis) = axis_at(x, w) {
            drag.set(Some((axis, y, y)));
        }
    };
    let moved = move |ev: web_sys::MouseEvent| {
        if let Some((axis, from, _)) = drag.get_untracked() {
            drag.set(Some((axis, from, ev.offset_y() as f64)));
        }
    };
    let up = move |_: web_sys::MouseEvent| {
        let (Some((axis, from, to)), Some((_, h))) = (drag.get_untracked(), size()) else {
            return;
        };
        drag.set(None);
        let (Some((name, a)), Some((_, b))) = (value_at(axis, from, h), value_at(axis, to, h))
        else {
            return;
        };
        brushes.update(|bs| {
            bs.retain(|x| x.0 != name);
            if (from - to).abs() >= 3.0 {
                bs.push((name, a.min(b), a.max(b)));
            }
        });
    };
    let select_picked = move |_| {
        let (runs, _) = model();
        let keep: Vec<RunId> = picked().into_iter().map(|i| runs[i].clone()).collect();
        if !keep.is_empty() {
            brushes.set(Vec::new());
            ctx.selected.set(keep);
            mark_dirty();
        }
    };
    view! {
        <Show when=move || ctx.selected.with(|s| s.len() >= 2)>
            <details class="hparams" prop:open=move || open.get()
                on:toggle=move |ev| {
                    let el: web_sys::HtmlDetailsElement = event_target(&ev);
                    open.set(el.open());
                }>
                <summary>"Hyper-parameters"</summary>
                <div class="hparams-bar">
                    <label>"metric "
                        <select class="hp-metric" on:change=move |ev| metric.set(event_target_value(&ev))>
                            {move || {
                                let t = target();
                                metrics.get().into_iter().map(|m| {
                                    let selected = t.as_ref() == Some(&m);
                                    view! { <option value=m.clone() selected=selected>{m.clone()}</option> }
                                }).collect_view()
                            }}
                        </select>
                    </label>
                    <select class="hp-summary" on:change=move |ev| summary.set(match event_target_value(&ev).as_str() {
                        "min" => Summary::Min,
                        "max" => Summary::Max,
                        _ => Summary::Last,
                    })>
                        <option value="last">"last"</option>
                        <option value="min">"lowest"</option>
                        <option value="max">"highest"</option>
                    </select>
                    <button class="hp-select" disabled=move || brushes.with(Vec::is_empty) on:click=select_picked>
                        {move || format!("select the {} brushed runs", if brushes.with(Vec::is_empty) { 0 } else { picked().len() })}
                    </button>
                    <button class="hp-clear" on:click=move |_| brushes.set(Vec::new())>"clear brushes"</button>
                </div>
                <canvas class="hp-parallel" node_ref=parallel
                    on:mousedown=down on:mousemove=moved on:mouseup=up></canvas>
                <div class="hparams-bar">
                    <label>"scatter: x "
                        <select class="hp-scatter-x" on:change=move |ev| scatter_x.set(event_target_value(&ev))>
                            {move || {
                                let (_, axes) = model();
                                let n = axes.len().saturating_sub(1);
                                axes.into_iter().take(n).map(|a| view! { <option value=a.name.clone()>{a.name.clone()}</option> }).collect_view()
                            }}
                        </select>
                    </label>
                </div>
                <canvas class="hp-scatter" node_ref=scatter></canvas>
            </details>
        </Show>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> RunId {
        RunId::new(s).unwrap()
    }

    #[test]
    fn keys_that_differ_become_axes_numbers_or_categories() {
        let runs = [id("a"), id("b"), id("c")];
        let cfg = |lr: &str, opt: &str| {
            vec![
                ("lr".to_string(), lr.to_string()),
                ("opt".into(), opt.into()),
                ("same".into(), "1".into()),
            ]
        };
        let configs: HashMap<RunId, Config> = [
            (runs[0].clone(), cfg("0.1", "adam")),
            (runs[1].clone(), cfg("0.3", "sgd")),
            (runs[2].clone(), cfg("0.2", "adam")),
        ]
        .into_iter()
        .collect();
        let axes = config_axes(&runs, &configs);
        assert_eq!(
            axes.iter().map(|a| a.name.as_str()).collect::<Vec<_>>(),
            ["lr", "opt"]
        );
        assert_eq!(axes[0].values, [Some(0.1), Some(0.3), Some(0.2)]);
        assert_eq!((axes[0].lo, axes[0].hi), (0.1, 0.3));
        assert_eq!(axes[1].values, [Some(0.0), Some(1.0), Some(0.0)]);
        assert_eq!(axes[1].label(1.0), "sgd");
        // Brushing lr over [0.15, 0.35]: b and c; and opt = adam as well: c.
        let b = vec![("lr".to_string(), 0.15, 0.35)];
        assert_eq!(brushed(&axes, &b, 3), [1, 2]);
        let b2 = vec![b[0].clone(), ("opt".to_string(), -0.1, 0.1)];
        assert_eq!(brushed(&axes, &b2, 3), [2]);
    }

    #[test]
    fn summaries_skip_non_finite_values() {
        let v = [3.0, f64::NAN, 1.0, 2.0, f64::INFINITY];
        assert_eq!(Summary::Last.of(&v), Some(2.0));
        assert_eq!(Summary::Min.of(&v), Some(1.0));
        assert_eq!(Summary::Max.of(&v), Some(3.0));
        assert_eq!(Summary::Last.of(&[]), None);
    }
}
