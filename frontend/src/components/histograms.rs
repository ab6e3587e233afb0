//! Distributions over steps: a histogram key's samples drawn as TensorBoard-style bands (the
//! 0/7/16/31/50/69/84/93/100th percentiles of each step, darker towards the median) with a
//! marker at the chosen step, and the chosen step's histogram of every selected run overlaid
//! as outlined bars. Plain 2D canvas; redrawn when the samples, the step or the theme change.

use crate::state::Ctx;
use leptos::html;
use leptos::prelude::*;
use stepstream_chart::theme::{color_of, css};
use stepstream_protocol::{Histogram, RunId};
use wasm_bindgen::JsCast;

/// The percentiles the bands join, outermost pairs first; the middle one is the median line.
const PERCENTILES: [f64; 9] = [0.0, 0.07, 0.16, 0.31, 0.5, 0.69, 0.84, 0.93, 1.0];

/// The value below which fraction `q` of the histogram's finite values lie (linear within a
/// bin); `None` for an empty histogram.
pub fn percentile(h: &Histogram, q: f64) -> Option<f64> {
    let total: f64 = h.counts.iter().sum();
    if total <= 0.0 {
        return None;
    }
    let width = (h.hi - h.lo) / h.counts.len() as f64;
    let want = q.clamp(0.0, 1.0) * total;
    let mut seen = 0.0;
    for (i, &c) in h.counts.iter().enumerate() {
        if c > 0.0 && seen + c >= want {
            let within = ((want - seen) / c).clamp(0.0, 1.0);
            return Some(h.lo + width * (i as f64 + within));
        }
        seen += c;
    }
    Some(h.hi)
}

/// The canvas fitted to its box and cleared, its 2D context scaled to CSS pixels, and its
/// width and height in them (what the histograms and the heatmaps draw on).
pub(super) fn context(
    canvas: &web_sys::HtmlCanvasElement,
) -> Option<(web_sys::CanvasRenderingContext2d, f64, f64)> {
    let dpr = stepstream_chart::fit(canvas);
    let c2d = canvas
        .get_context("2d")
        .ok()??
        .dyn_into::<web_sys::CanvasRenderingContext2d>()
        .ok()?;
    let _ = c2d.set_transform(dpr, 0.0, 0.0, dpr, 0.0, 0.0);
    let (w, h) = (canvas.width() as f64 / dpr, canvas.height() as f64 / dpr);
    c2d.clear_rect(0.0, 0.0, w, h);
    Some((c2d, w, h))
}

const PAD: f64 = 36.0;

/// Bands of one run's histograms over its steps, and a marker at `step`.
fn draw_bands(
    canvas: &web_sys::HtmlCanvasElement,
    run: &RunId,
    series: &[(i64, Histogram)],
    step: i64,
    dark: bool,
) {
    let Some((c2d, w, h)) = context(canvas) else {
        return;
    };
    let rows: Vec<(i64, Vec<f64>)> = series
        .iter()
        .filter_map(|(s, hist)| {
            let p: Option<Vec<f64>> = PERCENTILES.iter().map(|&q| percentile(hist, q)).collect();
            p.map(|p| (*s, p))
        })
        .collect();
    let (Some(first), Some(last)) = (rows.first(), rows.last()) else {
        return;
    };
    let (s0, s1) = (first.0 as f64, (last.0 as f64).max(first.0 as f64 + 1.0));
    let lo = rows.iter().map(|r| r.1[0]).fold(f64::INFINITY, f64::min);
    let hi = rows
        .iter()
        .map(|r| r.1[8])
        .fold(f64::NEG_INFINITY, f64::max);
    let (lo, hi) = if hi > lo {
        (lo, hi)
    } else {
        (lo - 0.5, lo + 0.5)
    };
    let x = |s: f64| PAD + (s - s0) / (s1 - s0) * (w - PAD - 8.0);
    let y = |v: f64| 8.0 + (hi - v) / (hi - lo) * (h - 24.0);
    let color = css(color_of(run.as_str()));
    c2d.set_fill_style_str(&color);
    // Pairs (0,8), (1,7), (2,6), (3,5): each band a polygon, more opaque inwards.
    for band in 0..4 {
        c2d.set_global_alpha(0.12 + 0.12 * band as f64);
        c2d.begin_path();
        for (i, (s, p)) in rows.iter().enumerate() {
            let (px, py) = (x(*s as f64), y(p[8 - band]));
            if i == 0 {
                c2d.move_to(px, py);
            } else {
                c2d.line_to(px, py);
            }
        }
        for (s, p) in rows.iter().rev() {
            c2d.line_to(x(*s as f64), y(p[band]));
        }
        c2d.close_path();
        c2d.fill();
    }
    c2d.set_global_alpha(1.0);
    c2d.set_stroke_style_str(&color);
    c2d.begin_path();
    for (i, (s, p)) in rows.iter().enumerate() {
        if i == 0 {
            c2d.move_to(x(*s as f64), y(p[4]));
        } else {
            c2d.line_to(x(*s as f64), y(p[4]));
        }
    }
    c2d.stroke();
    let ink = if dark { "#d1d5db" } else { "#374151" };
    c2d.set_fill_style_str(ink);
    c2d.set_font("11px sans-serif");
    let _ = c2d.fill_text(&stepstream_chart::scale::value(hi), 2.0, 16.0);
    let _ = c2d.fill_text(&stepstream_chart::scale::value(lo), 2.0, h - 16.0);
    let _ = c2d.fill_text(&format!("{}", first.0), PAD, h - 3.0);
    let _ = c2d.fill_text(&format!("{}", last.0), w - 40.0, h - 3.0);
    c2d.set_stroke_style_str(ink);
    c2d.set_line_width(1.0);
    c2d.begin_path();
    let m = x(step as f64).round() + 0.5;
    c2d.move_to(m, 4.0);
    c2d.line_to(m, h - 14.0);
    c2d.stroke();
}

/// The histograms at the chosen step, one outline per run, on one shared value axis.
fn draw_overlay(canvas: &web_sys::HtmlCanvasElement, at: &[(RunId, Histogram)], dark: bool) {
    let Some((c2d, w, h)) = context(canvas) else {
        return;
    };
    let lo = at.iter().map(|(_, h)| h.lo).fold(f64::INFINITY, f64::min);
    let hi = at
        .iter()
        .map(|(_, h)| h.hi)
        .fold(f64::NEG_INFINITY, f64::max);
    if !(lo.is_finite() && hi.is_finite()) {
        return;
    }
    let (lo, hi) = if hi > lo {
        (lo, hi)
    } else {
        (lo - 0.5, lo + 0.5)
    };
    let top = at
        .iter()
        .flat_map(|(_, h)| h.counts.iter().copied())
        .fold(0.0, f64::max)
        .max(1.0);
    let x = |v: f64| PAD + (v - lo) / (hi - lo) * (w - PAD - 8.0);
    let y = |c: f64| h - 16.0 - c / top * (h - 24.0);
    for (run, hist) in at {
        let width = (hist.hi - hist.lo) / hist.counts.len() as f64;
        c2d.set_stroke_style_str(&css(color_of(run.as_str())));
        c2d.set_line_width(1.5);
        c2d.begin_path();
        c2d.move_to(x(hist.lo), y(0.0));
        for (i, &c) in hist.counts.iter().enumerate() {
            let a = hist.lo + width * i as f64;
            c2d.line_to(x(a), y(c));
            c2d.line_to(x(a + width), y(c));
        }
        c2d.line_to(x(hist.hi), y(0.0));
        c2d.stroke();
    }
    let ink = if dark { "#d1d5db" } else { "#374151" };
    c2d.set_fill_style_str(ink);
    c2d.set_font("11px sans-serif");
    let _ = c2d.fill_text(&stepstream_chart::scale::value(lo), PAD, h - 3.0);
    let _ = c2d.fill_text(&stepstream_chart::scale::value(hi), w - 50.0, h - 3.0);
    let _ = c2d.fill_text(&stepstream_chart::scale::value(top), 2.0, 16.0);
}

/// One histogram key: bands per selected run, and the chosen step's overlay.
#[component]
pub fn HistogramView(
    ctx: Ctx,
    key: StoredValue<String>,
    step: Signal<Option<i64>>,
) -> impl IntoView {
    let overlay: NodeRef<html::Canvas> = NodeRef::new();
    let bands: NodeRef<html::Div> = NodeRef::new();
    Effect::new(move |_| {
        ctx.samples.track();
        let dark = ctx.theme.get().is_dark();
        let runs = ctx.selected.get();
        let Some(step) = step.get() else {
            return;
        };
        let key = key.get_value();
        let all = crate::samples::histograms(&runs, &key);
        if let Some(div) = bands.get() {
            let div: web_sys::Element = div.into();
            let canvases = div.query_selector_all("canvas").ok();
            for (i, (run, series)) in all.iter().enumerate() {
                let canvas = canvases
                    .as_ref()
                    .and_then(|c| c.item(i as u32))
                    .and_then(|n| n.dyn_into::<web_sys::HtmlCanvasElement>().ok());
                if let Some(canvas) = canvas {
                    draw_bands(&canvas, run, series, step, dark);
                }
            }
        }
        let at: Vec<(RunId, Histogram)> = all
            .into_iter()
            .filter_map(|(run, series)| {
                let h = series.into_iter().rev().find(|(s, _)| *s <= step)?;
                Some((run, h.1))
            })
            .collect();
        if let Some(c) = overlay.get() {
            draw_overlay(&c, &at, dark);
        }
    });
    view! {
        <div class="histograms">
            <div class="histogram-bands" node_ref=bands>
                {move || ctx.selected.get().into_iter().map(|run| {
                    let label = ctx.label(&run);
                    view! { <figure><figcaption>{label}</figcaption>
                        <canvas class="histogram-band" data-run=run.to_string()></canvas></figure> }
                }).collect_view()}
            </div>
            <figure><figcaption>"at the chosen step"</figcaption>
                <canvas class="histogram-overlay" node_ref=overlay></canvas></figure>
        </div>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_walk_the_bins() {
        let h = Histogram {
            lo: 0.0,
            hi: 4.0,
            counts: vec![1.0, 1.0, 1.0, 1.0],
            nan: 3.0,
            pos_inf: 0.0,
            neg_inf: 0.0,
        };
        assert_eq!(percentile(&h, 0.5), Some(2.0));
        assert_eq!(percentile(&h, 0.0), Some(0.0));
        assert_eq!(percentile(&h, 1.0), Some(4.0));
        let empty = Histogram {
            counts: vec![0.0; 4],
            ..h
        };
        assert_eq!(percentile(&empty, 0.5), None);
    }
}
