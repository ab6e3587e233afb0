//! The mouse on a chart: wheel to zoom around the pointer, drag a box to zoom into it, drag
//! with Shift or the middle button to pan, double-click to follow the live edge again, and
//! hover for the crosshair that every chart shows at the same x.

use crate::frame::{self, geometry};
use crate::pointer::{Drag, DRAG};
use crate::state::{mark_dirty, Ctx, Hover, STORE};
use leptos::prelude::*;
use stepstream_chart::scale::Axis;

fn offset_x(ev: &web_sys::MouseEvent) -> f64 {
    ev.offset_x() as f64
}

fn current_window(ctx: &Ctx, chart: &str) -> Option<(f64, f64)> {
    ctx.window
        .get_untracked()
        .or_else(|| geometry(chart).map(|g| (g.x0, g.x1)))
}

fn set_window(ctx: &Ctx, (a, b): (f64, f64)) {
    // Steps are whole: no window narrower than a few steps. A metric may be a fraction
    // (epoch): only a window too narrow for floats to tell its edges apart is widened.
    let min = match ctx.axis.get_untracked() {
        Axis::Step => 4.0,
        Axis::Metric => a.abs().max(b.abs()).max(1.0) * 1e-9,
        _ => 1.0,
    };
    let (a, b) = if b - a < min {
        let mid = (a + b) / 2.0;
        (mid - min / 2.0, mid + min / 2.0)
    } else {
        (a, b)
    };
    ctx.window.set(Some((a, b)));
    mark_dirty();
}

pub fn wheel(ctx: &Ctx, chart: &str, ev: &web_sys::WheelEvent) {
    let Some(g) = geometry(chart) else {
        return;
    };
    ev.prevent_default();
    let Some((x0, x1)) = current_window(ctx, chart) else {
        return;
    };
    let at = g.x_clamped(offset_x(ev));
    let factor = (ev.delta_y() * 0.002).clamp(-0.5, 0.5).exp();
    set_window(ctx, (at - (at - x0) * factor, at + (x1 - at) * factor));
}

pub fn down(ctx: &Ctx, chart: &str, ev: &web_sys::MouseEvent) {
    let x = offset_x(ev);
    let drag = if ev.button() == 1 || ev.shift_key() {
        ev.prevent_default();
        current_window(ctx, chart).map(|window| Drag::Pan { start: x, window })
    } else if ev.button() == 0 {
        Some(Drag::Box { start: x, now: x })
    } else {
        None
    };
    DRAG.with(|d| *d.borrow_mut() = drag.map(|g| (chart.to_string(), g)));
}

pub fn up(ctx: &Ctx, chart: &str) {
    let done = DRAG.with(|d| d.borrow_mut().take());
    if let (Some((c, Drag::Box { start, now })), Some(g)) = (done, geometry(chart)) {
        if c == chart && (now - start).abs() > 4.0 {
            let (a, b) = (g.x_clamped(start.min(now)), g.x_clamped(start.max(now)));
            set_window(ctx, (a, b));
        } else if c == chart {
            // A click: the console goes to the nearest point's step.
            if let Some(step) = g
                .x_at(start)
                .and_then(|x| nearest(ctx, chart, x))
                .map(|h| h.0)
            {
                ctx.console_step.set(Some(step));
            }
        }
    }
    frame::overlay_dirty();
}

/// The step and time of the point nearest `x` on the chart's lines.
fn nearest(ctx: &Ctx, chart: &str, x: f64) -> Option<(i64, f64)> {
    let scene = frame::scene(ctx);
    let specs = ctx.charts.get_untracked();
    let spec = specs.iter().find(|s| s.key == chart)?;
    STORE.with(|store| {
        let store = store.borrow();
        crate::bands::drawn(&scene, &store, spec)
            .iter()
            .find_map(|l| crate::lines::nearest(l, x).map(|i| (l.steps[i], l.times[i])))
    })
}

pub fn moved(ctx: &Ctx, chart: &str, ev: &web_sys::MouseEvent) {
    let x = offset_x(ev);
    let dragging = DRAG.with(|d| {
        let mut d = d.borrow_mut();
        match d.as_mut() {
            Some((c, Drag::Box { now, .. })) if c == chart => {
                *now = x;
                None
            }
            Some((c, Drag::Pan { start, window })) if c == chart => Some((*start, *window)),
            _ => None,
        }
    });
    if let (Some((start, (a, b))), Some(g)) = (dragging, geometry(chart)) {
        let per_px = (b - a) / (g.right - g.left).max(1.0);
        let shift = (start - x) * per_px;
        set_window(ctx, (a + shift, b + shift));
    }
    hover(ctx, chart, ev);
}

pub fn leave(ctx: &Ctx) {
    DRAG.with(|d| d.borrow_mut().take());
    ctx.hover.set(None);
    frame::overlay_dirty();
}

/// The crosshair at the pointer's x, and the tooltip: step, time and each line's value,
/// smoothed and raw.
fn hover(ctx: &Ctx, chart: &str, ev: &web_sys::MouseEvent) {
    let Some(x) = geometry(chart).and_then(|g| g.x_at(offset_x(ev))) else {
        ctx.hover.set(None);
        frame::overlay_dirty();
        return;
    };
    let scene = frame::scene(ctx);
    let specs = ctx.charts.get_untracked();
    let text = specs.iter().find(|s| s.key == chart).and_then(|spec| {
        STORE.with(|store| {
            let store = store.borrow();
            let mut rows = Vec::new();
            let mut head = None;
            for l in crate::bands::drawn(&scene, &store, spec) {
                let i = crate::lines::nearest(&l, x)?;
                head.get_or_insert((l.steps[i], l.times[i], l.xs[i]));
                let raw = stepstream_chart::scale::value(l.values[i]);
                // A group: its band at that point, `[low .. high]`.
                let mut band = l.band.as_ref().map_or(String::new(), |(lo, hi)| {
                    let v = stepstream_chart::scale::value;
                    format!(" [{} .. {}]", v(lo[i]), v(hi[i]))
                });
                if let Some((n, counted)) = &l.counted {
                    if counted[i] < *n {
                        band.push_str(&format!(" · {} of {n} runs here", counted[i]));
                    }
                }
                rows.push(if scene.smoothing > 0.0 {
                    format!(
                        "{}: {} (raw {raw}){band}",
                        l.label,
                        stepstream_chart::scale::value(l.smoothed[i])
                    )
                } else {
                    format!("{}: {raw}{band}", l.label)
                });
            }
            let (step, time, at) = head?;
            let x = if scene.axis == Axis::Metric {
                format!(
                    "{} {} · ",
                    scene.x_metric,
                    stepstream_chart::scale::value(at)
                )
            } else {
                String::new()
            };
            Some(format!(
                "{x}step {step} · {} · {}\n{}",
                stepstream_chart::scale::clock(time),
                spec.key,
                rows.join("\n")
            ))
        })
    });
    ctx.hover.set(Some(Hover {
        x,
        chart: chart.to_string(),
        text: text.unwrap_or_default(),
        page_x: ev.page_x() as f64,
        page_y: ev.page_y() as f64,
    }));
    frame::overlay_dirty();
}
