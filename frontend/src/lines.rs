//! The lines of one chart, gathered from what the page holds: per selected run and per
//! metric of the chart (one per device on a system chart), in the x of the chosen axis,
//! with the raw points of the zoom window (fetched from the hub) in place of the compacted
//! ones, and smoothed.
//!
//! On a metric axis (tokens seen, samples, epoch) a point's x is that metric's value at the
//! point's step: joined by step, interpolated between the x metric's neighbouring points
//! (either may be sparse or compacted), and the point left out where the run has no x
//! around its step. An x that goes back (a restart counting tokens again) is drawn as it
//! goes, not sorted.

use crate::fetch;
use crate::groups::ChartSpec;
use crate::segments;
use plotters::style::RGBColor;
use std::borrow::Cow;
use std::hash::{Hash, Hasher};
use stepstream_chart::client::Client;
use stepstream_chart::data::{smooth, RunData, Series};
use stepstream_chart::scale::Axis;
use stepstream_chart::theme::color_of;
use stepstream_protocol::RunId;

/// What a frame needs to know of the page, read once per frame.
pub struct Scene {
    pub selected: Vec<RunId>,
    pub labels: Vec<String>,
    pub started: Vec<f64>,
    pub axis: Axis,
    /// The metric on the x axis when `axis` is `Axis::Metric`.
    pub x_metric: String,
    pub grouping: crate::view::Grouping,
    /// Draw each segment of a resumed run as a line of its own.
    pub all_segments: bool,
    /// Each selected run's group under `grouping` (`None`: it stands alone).
    pub group_keys: Vec<(RunId, Option<String>)>,
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
    /// Whether `xs` ascends (a metric axis may go back).
    pub ordered: bool,
    pub values: Cow<'a, [f64]>,
    pub times: Cow<'a, [f64]>,
    pub smoothed: Cow<'a, [f64]>,
    /// A group's band (lower, upper), parallel to `xs`.
    pub band: Option<(Vec<f64>, Vec<f64>)>,
    /// A group's size and, parallel to `xs`, how many of its runs have a point there (a run
    /// behind the others has none yet at the live edge).
    pub counted: Option<(u32, Vec<u32>)>,
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
        Axis::Step | Axis::Metric => Cow::Borrowed(&s.xs),
        Axis::Wall => Cow::Borrowed(&s.times),
        Axis::Relative => Cow::Owned(s.times.iter().map(|t| t - started).collect()),
    }
}

/// The run's series of the x metric, on a metric axis.
pub fn x_series<'a>(scene: &Scene, run: &'a RunData) -> Option<&'a Series> {
    (scene.axis == Axis::Metric)
        .then(|| run.series(&scene.x_metric))
        .flatten()
}

/// A run's x metric by step: its held points, with the zoom window's raw points in place of
/// the held ones inside the fetched range. Steps ascend; non-finite values are left out.
pub struct XMap<'a> {
    steps: Cow<'a, [i64]>,
    xs: Cow<'a, [f64]>,
}

impl<'a> XMap<'a> {
    fn of(run: &RunId, metric: &str, held: &'a Series) -> XMap<'a> {
        let detail = fetch::with_detail(run, metric, |d| {
            (d.lo, d.hi, d.steps.clone(), d.values.clone())
        });
        // A resumed run's x metric: its latest segment where segments overlap, as drawn.
        let keep = segments::kept(&held.steps);
        // Borrowed as held while nothing needs replacing or leaving out (a whole-run view).
        if detail.is_none() && keep.is_none() && held.values.iter().all(|v| v.is_finite()) {
            return XMap {
                steps: Cow::Borrowed(&held.steps),
                xs: Cow::Borrowed(&held.values),
            };
        }
        let (held_steps, held_values) = match &keep {
            Some(k) => (
                Cow::Owned(segments::pick(&held.steps, k)),
                Cow::Owned(segments::pick(&held.values, k)),
            ),
            None => (
                Cow::Borrowed(&held.steps[..]),
                Cow::Borrowed(&held.values[..]),
            ),
        };
        let mut pairs: Vec<(i64, f64)> = match &detail {
            None => held_steps
                .iter()
                .copied()
                .zip(held_values.iter().copied())
                .collect(),
            Some((lo, hi, steps, values)) => {
                let kept = segments::kept(steps);
                let (steps, values) = match &kept {
                    Some(k) => (segments::pick(steps, k), segments::pick(values, k)),
                    None => (steps.clone(), values.clone()),
                };
                let a = held_steps.partition_point(|&s| s < *lo);
                let b = held_steps.partition_point(|&s| s <= *hi);
                let before = held_steps[..a].iter().zip(&held_values[..a]);
                let after = held_steps[b..].iter().zip(&held_values[b..]);
                before
                    .chain(steps.iter().zip(values.iter()))
                    .chain(after)
                    .map(|(&s, &v)| (s, v))
                    .collect()
            }
        };
        pairs.retain(|p| p.1.is_finite());
        XMap {
            steps: Cow::Owned(pairs.iter().map(|p| p.0).collect()),
            xs: Cow::Owned(pairs.iter().map(|p| p.1).collect()),
        }
    }

    /// The x at `step`: the x metric's value there, or between its neighbouring points
    /// (linear in the step); `None` outside its steps.
    pub fn at(&self, step: i64) -> Option<f64> {
        let i = self.steps.partition_point(|&s| s < step);
        match (self.steps.get(i), i.checked_sub(1)) {
            (Some(&s), _) if s == step => Some(self.xs[i]),
            (Some(&s1), Some(j)) => {
                let (s0, x0, x1) = (self.steps[j], self.xs[j], self.xs[i]);
                Some(x0 + (x1 - x0) * (step - s0) as f64 / (s1 - s0) as f64)
            }
            _ => None,
        }
    }
}

/// Puts a line on the metric axis: each point at its step's x, those without one left out.
fn join(line: &mut LineData<'_>, x: &XMap<'_>) {
    let n = line.steps.len();
    let (mut steps, mut xs, mut values, mut times, mut smoothed) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    for k in 0..n {
        if let Some(at) = x.at(line.steps[k]) {
            steps.push(line.steps[k]);
            xs.push(at);
            values.push(line.values[k]);
            times.push(line.times[k]);
            smoothed.push(line.smoothed[k]);
        }
    }
    line.ordered = xs.windows(2).all(|w| w[0] <= w[1]);
    line.steps = Cow::Owned(steps);
    line.xs = Cow::Owned(xs);
    line.values = Cow::Owned(values);
    line.times = Cow::Owned(times);
    line.smoothed = Cow::Owned(smoothed);
}

/// Where `step` of `run` is on `axis` (on a metric axis, the run's x metric there).
pub fn x_at_step(
    axis: Axis,
    x_metric: &str,
    run: &RunId,
    step: i64,
    time: f64,
    started: f64,
) -> Option<f64> {
    if axis != Axis::Metric {
        return Some(axis.x(step, time, started));
    }
    crate::state::STORE.with(|store| {
        let store = store.borrow();
        let held = store.runs.get(run)?.series(x_metric)?;
        XMap::of(run, x_metric, held).at(step)
    })
}

/// The index of a line's point nearest `x` (searched in order when its x goes back).
pub fn nearest(line: &LineData<'_>, x: f64) -> Option<usize> {
    if line.ordered {
        return Series::nearest(&line.xs, x);
    }
    (0..line.xs.len()).min_by(|&a, &b| (line.xs[a] - x).abs().total_cmp(&(line.xs[b] - x).abs()))
}

/// The lines of `spec` for the selected runs.
pub fn gather<'a>(scene: &Scene, store: &'a Client, spec: &ChartSpec) -> Vec<LineData<'a>> {
    let mut out = Vec::new();
    for (i, id) in scene.selected.iter().enumerate() {
        let Some(run) = store.runs.get(id) else {
            continue;
        };
        // A run without the x metric has no place on its axis.
        let x_map = match x_series(scene, run) {
            Some(held) => Some(XMap::of(id, &scene.x_metric, held)),
            None if scene.axis == Axis::Metric => continue,
            None => None,
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
                        if let Some(x) = &x_map {
                            return x.at(step);
                        }
                        let k = Series::nearest(&s.xs, step as f64)?;
                        Some(scene.axis.x(step, s.times[k], started))
                    })
                    .collect()
            };
            let markers = at(run.alert_steps());
            let marks = run.command_marks();
            let mut notes: Vec<(f64, String)> = at(marks.iter().map(|(s, _)| *s).collect())
                .into_iter()
                .zip(marks.into_iter().map(|(_, label)| label))
                .collect();
            // A run resumed from a checkpoint: each resume marked where it took up again.
            let resumes: Vec<i64> = segments::starts(&s.steps)
                .into_iter()
                .map(|i| s.steps[i])
                .collect();
            for step in &resumes {
                if let Some(x) = at(vec![*step]).first() {
                    notes.push((*x, format!("resumed at step {step}")));
                }
            }
            if !resumes.is_empty() && scene.all_segments {
                // Every segment as a line of its own, as held (earlier ones fainter).
                let xs = xs_of(scene.axis, s, started);
                let parts = segments::ranges(&s.steps);
                let n = parts.len();
                for (k, r) in parts.into_iter().enumerate() {
                    let fade = 0.55 * (n - 1 - k) as f64 / n as f64;
                    let mix = |c: u8| (c as f64 + (255.0 - c as f64) * fade).round() as u8;
                    let mut line = LineData {
                        run: id.clone(),
                        metric: metric.clone(),
                        label: format!("{label} · segment {}", k + 1),
                        color: RGBColor(mix(color.0), mix(color.1), mix(color.2)),
                        steps: Cow::Borrowed(&s.steps[r.clone()]),
                        xs: Cow::Owned(xs[r.clone()].to_vec()),
                        ordered: true,
                        values: Cow::Borrowed(&s.values[r.clone()]),
                        times: Cow::Borrowed(&s.times[r.clone()]),
                        smoothed: Cow::Borrowed(&s.smoothed[r.clone()]),
                        band: None,
                        counted: None,
                        markers: if k + 1 == n {
                            markers.clone()
                        } else {
                            Vec::new()
                        },
                        notes: if k + 1 == n {
                            notes.clone()
                        } else {
                            Vec::new()
                        },
                        detail_points: 0,
                        received: if k + 1 == n { s.received } else { 0 },
                        out_of_order: 0,
                    };
                    if let Some(x) = &x_map {
                        join(&mut line, x);
                    }
                    out.push(line);
                }
                continue;
            }
            let mut line = LineData {
                run: id.clone(),
                metric: metric.clone(),
                label,
                color,
                steps: Cow::Borrowed(&s.steps),
                xs: xs_of(scene.axis, s, started),
                ordered: true,
                values: Cow::Borrowed(&s.values),
                times: Cow::Borrowed(&s.times),
                smoothed: Cow::Borrowed(&s.smoothed),
                band: None,
                counted: None,
                markers,
                notes,
                detail_points: 0,
                received: s.received,
                out_of_order: s.out_of_order,
            };
            if let Some(keep) = segments::kept(&s.steps) {
                line.xs = Cow::Owned(segments::pick(&line.xs, &keep));
                line.steps = Cow::Owned(segments::pick(&s.steps, &keep));
                line.values = Cow::Owned(segments::pick(&s.values, &keep));
                line.times = Cow::Owned(segments::pick(&s.times, &keep));
                line.smoothed = Cow::Owned(segments::pick(&s.smoothed, &keep));
            }
            if let Some((x0, x1)) = scene.window {
                merge_detail(&mut line, scene, started, (x0, x1));
            }
            if let Some(x) = &x_map {
                join(&mut line, x);
            }
            out.push(line);
        }
    }
    out
}

/// A zoom window's raw points, superseded ones left out.
struct Raw<'a> {
    lo: i64,
    hi: i64,
    steps: Cow<'a, [i64]>,
    values: Cow<'a, [f64]>,
    times: Cow<'a, [f64]>,
}

/// Replaces the held points inside the fetched range by the hub's raw points: one held
/// point before it, the raw ones, then the held (live) points after it up to the window.
fn merge_detail(line: &mut LineData<'_>, scene: &Scene, started: f64, w: (f64, f64)) {
    let merged = fetch::with_detail(&line.run, &line.metric, |raw| {
        let s = &*line;
        // The hub's raw points of a resumed run come as they were logged: superseded too.
        let picked = segments::kept(&raw.steps);
        let d = match &picked {
            None => (
                Cow::Borrowed(&raw.steps[..]),
                Cow::Borrowed(&raw.values[..]),
                Cow::Borrowed(&raw.times[..]),
            ),
            Some(k) => (
                Cow::Owned(segments::pick(&raw.steps, k)),
                Cow::Owned(segments::pick(&raw.values, k)),
                Cow::Owned(segments::pick(&raw.times, k)),
            ),
        };
        let d = Raw {
            lo: raw.lo,
            hi: raw.hi,
            steps: d.0,
            values: d.1,
            times: d.2,
        };
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
            // (On a metric axis the x of a step is known after the join: all are kept.)
            if scene.axis != Axis::Metric && scene.axis.x(s.steps[k], s.times[k], started) > w.1 {
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

/// The step range of a run's series that the x window covers (with a neighbour each side);
/// on a metric axis, that of the run's x metric `x` (whose x may go back: every point inside
/// counts), the same for every metric of the run.
pub fn steps_in(
    axis: Axis,
    s: &Series,
    x: Option<&Series>,
    started: f64,
    (x0, x1): (f64, f64),
) -> Option<(i64, i64)> {
    match axis {
        Axis::Step => Some((x0.floor() as i64, x1.ceil() as i64)),
        Axis::Metric => {
            let x = x?;
            let inside = |k: &usize| (x0..=x1).contains(&x.values[*k]);
            let last = x.values.len().checked_sub(1)?;
            let (a, b) = match (0..=last).find(inside) {
                Some(a) => (a, (0..=last).rev().find(inside).unwrap_or(a)),
                // The window between two points: those two.
                None => {
                    let k = (0..last).find(|&k| {
                        let (p, q) = (x.values[k], x.values[k + 1]);
                        p.min(q) <= x0 && p.max(q) >= x1
                    })?;
                    (k, k + 1)
                }
            };
            Some((x.steps[a.saturating_sub(1)], x.steps[(b + 1).min(last)]))
        }
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
    if scene.axis == Axis::Metric {
        scene.x_metric.hash(&mut view);
    }
    format!("{:?}", scene.grouping).hash(&mut view);
    scene.all_segments.hash(&mut view);
    scene.group_keys.hash(&mut view);
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
        if let Some(x) = x_series(scene, run) {
            x.version.hash(&mut data);
            if scene.window.is_some() {
                fetch::with_detail(id, &scene.x_metric, |d| d.version).hash(&mut view);
            }
        }
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
