//! The lines of one chart, gathered from what the page holds: per selected run and per
//! metric of the chart (one per device on a system chart), in the x of the chosen axis,
//! with the raw points of the zoom window (fetched from the hub) in place of the compacted
//! ones, and smoothed.

use crate::fetch;
use crate::groups::ChartSpec;
use plotters::style::RGBColor;
use std::borrow::Cow;
use std::hash::{Hash, Hasher};
use stepstream_chart::client::Client;
use stepstream_chart::data::{smooth, Series};
use stepstream_chart::scale::Axis;
use stepstream_chart::theme::color_of;
use stepstream_protocol::RunId;

/// What a frame needs to know of the page, read once per frame.
pub struct Scene {
    pub selected: Vec<RunId>,
    pub labels: Vec<String>,
    pub started: Vec<f64>,
    pub axis: Axis,
    pub window: Option<(f64, f64)>,
    pub smoothing: f64,
}

/// One line, borrowing the held points where it can.
pub struct LineData<'a> {
    pub run: RunId,
    pub metric: String,
    pub label: String,
    pub color: RGBColor,
    pub steps: Cow<'a, [i64]>,
    pub xs: Cow<'a, [f64]>,
    pub values: Cow<'a, [f64]>,
    pub times: Cow<'a, [f64]>,
    pub smoothed: Cow<'a, [f64]>,
    pub markers: Vec<f64>,
    /// x of the commands the run's training acted on (notes, checkpoints, stops), with
    /// what to write by each.
    pub notes: Vec<(f64, String)>,
    /// Points that came raw from the hub for the zoom window.
    pub detail_points: usize,
    pub received: u64,
    pub out_of_order: u64,
}

fn xs_of<'a>(axis: Axis, s: &'a Series, started: f64) -> Cow<'a, [f64]> {
    match axis {
        Axis::Step => Cow::Borrowed(&s.xs),
        Axis::Wall => Cow::Borrowed(&s.times),
        Axis::Relative => Cow::Owned(s.times.iter().map(|t| t - started).collect()),
    }
}

/// The lines of `spec` for the selected runs.
pub fn gather<'a>(scene: &Scene, store: &'a Client, spec: &ChartSpec) -> Vec<LineData<'a>> {
    let mut out = Vec::new();
    for (i, id) in scene.selected.iter().enumerate() {
        let Some(run) = store.runs.get(id) else {
            continue;
        };
        for (metric, device) in &spec.metrics {
            let Some(s) = run.series(metric) else {
                continue;
            };
            let started = scene.started[i];
            let label = if device.is_empty() {
                scene.labels[i].clone()
            } else {
                format!("{} {device}", scene.labels[i])
            };
            let color = color_of(&if device.is_empty() {
                id.to_string()
            } else {
                format!("{id}/{device}")
            });
            let at = |steps: Vec<i64>| -> Vec<f64> {
                steps
                    .into_iter()
                    .filter_map(|step| {
                        let k = Series::nearest(&s.xs, step as f64)?;
                        Some(scene.axis.x(step, s.times[k], started))
                    })
                    .collect()
            };
            let markers = at(run.alert_steps());
            let marks = run.command_marks();
            let notes = at(marks.iter().map(|(s, _)| *s).collect())
                .into_iter()
                .zip(marks.into_iter().map(|(_, label)| label))
                .collect();
            let mut line = LineData {
                run: id.clone(),
                metric: metric.clone(),
                label,
                color,
                steps: Cow::Borrowed(&s.steps),
                xs: xs_of(scene.axis, s, started),
                values: Cow::Borrowed(&s.values),
                times: Cow::Borrowed(&s.times),
                smoothed: Cow::Borrowed(&s.smoothed),
                markers,
                notes,
                detail_points: 0,
                received: s.received,
                out_of_order: s.out_of_order,
            };
            if let Some((x0, x1)) = scene.window {
                merge_detail(&mut line, s, scene, started, (x0, x1));
            }
            out.push(line);
        }
    }
    out
}

/// Replaces the held points inside the fetched range by the hub's raw points: one held
/// point before it, the raw ones, then the held (live) points after it up to the window.
fn merge_detail(line: &mut LineData<'_>, s: &Series, scene: &Scene, started: f64, w: (f64, f64)) {
    let merged = fetch::with_detail(&line.run, &line.metric, |d| {
        let a = s.steps.partition_point(|&st| st < d.lo);
        let b = s.steps.partition_point(|&st| st <= d.hi);
        let mut steps = Vec::with_capacity(d.steps.len() + 8);
        let mut values = Vec::with_capacity(d.steps.len() + 8);
        let mut times = Vec::with_capacity(d.steps.len() + 8);
        if a > 0 {
            steps.push(s.steps[a - 1]);
            values.push(s.values[a - 1]);
            times.push(s.times[a - 1]);
        }
        steps.extend_from_slice(&d.steps);
        values.extend_from_slice(&d.values);
        times.extend_from_slice(&d.times);
        let seed = (a > 0).then(|| s.smoothed[a - 1]);
        let mut smoothed = Vec::with_capacity(steps.len());
        if a > 0 {
            smoothed.push(s.smoothed[a - 1]);
        }
        smoothed.extend(smooth(&d.values, scene.smoothing, seed));
        for k in b..s.steps.len() {
            steps.push(s.steps[k]);
            values.push(s.values[k]);
            times.push(s.times[k]);
            smoothed.push(s.smoothed[k]);
            if scene.axis.x(s.steps[k], s.times[k], started) > w.1 {
                break;
            }
        }
        (steps, values, times, smoothed, d.steps.len())
    });
    if let Some((steps, values, times, smoothed, n)) = merged {
        line.xs = Cow::Owned(
            steps
                .iter()
                .zip(&times)
                .map(|(&st, &t)| scene.axis.x(st, t, started))
                .collect(),
        );
        line.steps = Cow::Owned(steps);
        line.values = Cow::Owned(values);
        line.times = Cow::Owned(times);
        line.smoothed = Cow::Owned(smoothed);
        line.detail_points = n;
    }
}

/// The step range of a run's series that the x window covers (with a neighbour each side).
pub fn steps_in(axis: Axis, s: &Series, started: f64, (x0, x1): (f64, f64)) -> Option<(i64, i64)> {
    match axis {
        Axis::Step => Some((x0.floor() as i64, x1.ceil() as i64)),
        _ => {
            // Searched in place: this runs every frame while zoomed, on every line.
            let x = |t: f64| axis.x(0, t, started);
            let last = s.times.len().checked_sub(1)?;
            let a = s.times.partition_point(|&t| x(t) < x0).saturating_sub(1);
            let b = s.times.partition_point(|&t| x(t) <= x1).min(last);
            Some((s.steps[a], s.steps[b.max(a)]))
        }
    }
}

/// Fingerprints of what a chart's pixels depend on (but its size and options): the data it
/// holds, and the view (window, axis, smoothing, selection, the zoom window's raw points).
/// A changed view answers a user's action and is drawn at once; changed data can wait a
/// frame (see `frame.rs`).
pub fn fingerprint(scene: &Scene, store: &Client, spec: &ChartSpec) -> (u64, u64) {
    let mut data = std::collections::hash_map::DefaultHasher::new();
    let mut view = std::collections::hash_map::DefaultHasher::new();
    scene.axis.code().hash(&mut view);
    scene
        .window
        .map(|(a, b)| (a.to_bits(), b.to_bits()))
        .hash(&mut view);
    scene.smoothing.to_bits().hash(&mut view);
    for id in &scene.selected {
        id.hash(&mut view);
        let Some(run) = store.runs.get(id) else {
            continue;
        };
        run.alerts.len().hash(&mut data);
        run.commands.len().hash(&mut data);
        run.command_steps().hash(&mut data);
        for (metric, _) in &spec.metrics {
            if let Some(s) = run.series(metric) {
                // While zoomed, points beyond the window do not change the picture.
                let beyond = scene.window.is_some_and(|(_, x1)| {
                    scene.axis == Axis::Step && s.steps.len() > 2 && s.xs[s.xs.len() - 2] > x1
                });
                if !beyond {
                    s.version.hash(&mut data);
                }
                // A series' first points (the history) are the picture's first.
                s.steps.is_empty().hash(&mut view);
            }
            if scene.window.is_some() {
                fetch::with_detail(id, metric, |d| d.version).hash(&mut view);
            }
        }
    }
    (data.finish(), view.finish())
}
