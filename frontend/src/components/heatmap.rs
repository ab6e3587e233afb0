//! Which layer diverged: a family of per-layer metrics (`grad_norm/<layer>`,
//! `weight_norm/<layer>`, as `stepstream.torch.watch` logs them) drawn as a heatmap, one row
//! per layer and one column per pixel over the steps of the charts' window (the whole run
//! when not zoomed), coloured by the log of the largest value in the cell. A cell with a
//! NaN or an infinity is drawn red. Hovering a cell names its layer, step range and value.

use crate::state::{Ctx, STORE};
use leptos::html;
use leptos::prelude::*;
use std::collections::BTreeMap;
use stepstream_protocol::RunId;
use wasm_bindgen::JsCast;

// The families drawn as heatmaps: the prefixes of per-layer metrics.
use crate::groups::LAYER_FAMILIES as FAMILIES;

/// A family's layers (metric names, in the order the run defined them) for `run`.
fn layers(run: &RunId, family: &str) -> Vec<String> {
    STORE.with(|s| {
        let s = s.borrow();
        let Some(d) = s.runs.get(run) else {
            return Vec::new();
        };
        let mut named: Vec<(u32, String)> = d
            .names
            .iter()
            .filter(|(_, n)| n.starts_with(family))
            .map(|(id, n)| (id.0, n.clone()))
            .collect();
        named.sort();
        named.into_iter().map(|(_, n)| n).collect()
    })
}

/// The viridis-like colour of `t` in 0..=1.
fn colour(t: f64) -> String {
    const STOPS: [(f64, f64, f64); 5] = [
        (68.0, 1.0, 84.0),
        (59.0, 82.0, 139.0),
        (33.0, 145.0, 140.0),
        (94.0, 201.0, 98.0),
        (253.0, 231.0, 37.0),
    ];
    let t = t.clamp(0.0, 1.0) * 4.0;
    let i = (t.floor() as usize).min(3);
    let f = t - i as f64;
    let (a, b) = (STOPS[i], STOPS[i + 1]);
    format!(
        "rgb({:.0},{:.0},{:.0})",
        a.0 + (b.0 - a.0) * f,
        a.1 + (b.1 - a.1) * f,
        a.2 + (b.2 - a.2) * f
    )
}

/// Cells: per layer, per pixel column, the largest finite value (or `NaN` for a column with
/// a non-finite one); the steps each column covers.
pub fn cells(
    run: &RunId,
    names: &[String],
    (s0, s1): (f64, f64),
    columns: usize,
) -> Vec<Vec<Option<f64>>> {
    STORE.with(|s| {
        let s = s.borrow();
        let Some(d) = s.runs.get(run) else {
            return Vec::new();
        };
        names
            .iter()
            .map(|name| {
                let mut row: Vec<Option<f64>> = vec![None; columns];
                if let Some(series) = d.series(name) {
                    for (&step, &v) in series.steps.iter().zip(&series.values) {
                        let x = step as f64;
                        if x < s0 || x > s1 {
                            continue;
                        }
                        let c = (((x - s0) / (s1 - s0).max(1e-9)) * columns as f64) as usize;
                        let cell = &mut row[c.min(columns - 1)];
                        *cell = Some(match *cell {
                            _ if !v.is_finite() => f64::NAN,
                            Some(old) if old.is_nan() => old,
                            Some(old) => old.max(v),
                            None => v,
                        });
                    }
                }
                // Fewer steps than columns: each value spans the columns up to the next.
                let mut last = None;
                let end = row.iter().rposition(Option::is_some).unwrap_or(0);
                for cell in row.iter_mut().take(end + 1) {
                    match cell {
                        Some(v) => last = Some(*v),
                        None => *cell = last,
                    }
                }
                row
            })
            .collect()
    })
}

fn draw(canvas: &web_sys::HtmlCanvasElement, ctx: &Ctx, run: &RunId, family: &str) -> Option<()> {
    let names = layers(run, family);
    if names.is_empty() {
        return None;
    }
    let (c2d, w, h) = super::histograms::context(canvas)?;
    let last = STORE.with(|s| s.borrow().runs.get(run).and_then(|d| d.last_step()))? as f64;
    let (s0, s1) = ctx.window.get_untracked().unwrap_or((0.0, last.max(1.0)));
    let left = 110.0;
    let columns = ((w - left - 4.0).max(10.0)) as usize;
    let grid = cells(run, &names, (s0, s1), columns);
    let logs: Vec<f64> = grid
        .iter()
        .flatten()
        .flatten()
        .filter(|v| v.is_finite() && **v > 0.0)
        .map(|v| v.log10())
        .collect();
    let lo = logs.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = logs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let row_h = ((h - 16.0) / names.len() as f64).max(2.0);
    let ink = if ctx.theme.get_untracked().is_dark() {
        "#d1d5db"
    } else {
        "#374151"
    };
    c2d.set_font("11px sans-serif");
    for (r, (name, row)) in names.iter().zip(&grid).enumerate() {
        let y = r as f64 * row_h;
        c2d.set_fill_style_str(ink);
        let label = name.strip_prefix(family).unwrap_or(name);
        let _ = c2d.fill_text(label, 2.0, y + row_h.min(14.0) - 2.0);
        for (c, cell) in row.iter().enumerate() {
            let Some(v) = cell else {
                continue;
            };
            let fill = if !v.is_finite() {
                "#dc2626".to_string()
            } else if *v <= 0.0 || hi.partial_cmp(&lo) != Some(std::cmp::Ordering::Greater) {
                colour(0.0)
            } else {
                colour((v.log10() - lo) / (hi - lo))
            };
            c2d.set_fill_style_str(&fill);
            c2d.fill_rect(left + c as f64, y, 1.0, row_h - 1.0);
        }
    }
    c2d.set_fill_style_str(ink);
    let _ = c2d.fill_text(&format!("{s0:.0}"), left, h - 3.0);
    let _ = c2d.fill_text(&format!("{s1:.0}"), w - 50.0, h - 3.0);
    let legend = if hi > lo {
        format!("log10: {lo:.1} .. {hi:.1}")
    } else {
        String::new()
    };
    let _ = c2d.fill_text(&legend, w / 2.0 - 40.0, h - 3.0);
    let _ = canvas.set_attribute("data-layers", &names.len().to_string());
    let _ = canvas.set_attribute("data-columns", &columns.to_string());
    Some(())
}

/// Heatmaps of the per-layer families the selected runs log, one per run and family.
#[component]
pub fn LayerHeatmaps(ctx: Ctx) -> impl IntoView {
    let found = Memo::new(move |_| {
        ctx.charts.track();
        let mut out: BTreeMap<(String, RunId), usize> = BTreeMap::new();
        for run in ctx.selected.get() {
            for family in FAMILIES {
                let n = layers(&run, family).len();
                if n >= 2 {
                    out.insert((family.to_string(), run.clone()), n);
                }
            }
        }
        out.into_iter().collect::<Vec<_>>()
    });
    let holder: NodeRef<html::Div> = NodeRef::new();
    // Redrawn with the points (the page's frame loop marks the charts dirty), the window
    // and the theme.
    Effect::new(move |_| {
        ctx.window.track();
        ctx.theme.track();
        ctx.now.track();
        ctx.drawn.track();
        let Some(div) = holder.get() else {
            return;
        };
        let div: web_sys::Element = div.into();
        for ((family, run), _) in found.get() {
            let selector = format!("canvas[data-family=\"{family}\"][data-run=\"{run}\"]");
            let canvas = div
                .query_selector(&selector)
                .ok()
                .flatten()
                .and_then(|c| c.dyn_into::<web_sys::HtmlCanvasElement>().ok());
            if let Some(canvas) = canvas {
                draw(&canvas, &ctx, &run, &family);
            }
        }
    });
    view! {
        <div class="heatmaps" node_ref=holder>
            {move || found.get().into_iter().map(|((family, run), n)| {
                let title = format!("{}* · {}", family, ctx.label(&run));
                // At least the 120 px a canvas is drawn at (`chart::fit`).
                let height = format!("height:{}px", (n * 14 + 18).clamp(120, 420));
                view! {
                    <figure class="heatmap">
                        <figcaption>{title}</figcaption>
                        <canvas data-family=family.clone() data-run=run.to_string() style=height></canvas>
                    </figure>
                }
            }).collect_view()}
        </div>
    }
}
