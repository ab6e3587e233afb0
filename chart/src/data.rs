//! The points the page holds, per run and metric, and how hub messages change them.
//!
//! Kept outside the reactive system: points arrive by the thousand and are read only when a
//! frame is drawn. A series is compacted (the protocol's M4) once it grows past
//! [`COMPACT_ABOVE`], so drawing costs what the pixels cost however long the run; zooming in
//! fetches the raw points of the window back from the hub (`fetch`).
//!
//! Each series also keeps its smoothed values (TensorBoard's debiased exponential moving
//! average), updated as points arrive, so a frame never recomputes them.

use std::collections::{BTreeMap, HashMap};
use stepstream_protocol::decimate::M4;
use stepstream_protocol::{Alert, Backfill, Live, MetricDef, MetricId};

/// Points per series above which it is compacted to [`COMPACT_TO`] buckets.
pub const COMPACT_ABOVE: usize = 40_000;
const COMPACT_TO: usize = 4_000;

/// TensorBoard's debiased EMA: the running state of one smoothed line.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ema {
    weight: f64,
    last: f64,
    n: i32,
}

impl Ema {
    pub fn new(weight: f64) -> Ema {
        Ema {
            weight: weight.clamp(0.0, 0.999),
            last: 0.0,
            n: 0,
        }
    }

    /// Continues from a smoothed value already reached (a zoom window inside a longer line).
    pub fn seeded(weight: f64, value: f64) -> Ema {
        let mut e = Ema::new(weight);
        if value.is_finite() {
            e.last = value;
            e.n = i32::MAX;
        }
        e
    }

    /// The smoothed value after `v`; a non-finite value passes through and does not move the
    /// average (TensorBoard does the same).
    pub fn next(&mut self, v: f64) -> f64 {
        if !v.is_finite() {
            return v;
        }
        self.last = self.last * self.weight + (1.0 - self.weight) * v;
        self.n = self.n.saturating_add(1);
        let debias = if self.n == i32::MAX {
            1.0
        } else {
            1.0 - self.weight.powi(self.n)
        };
        if debias > 0.0 {
            self.last / debias
        } else {
            v
        }
    }
}

/// Smoothed values of `values` with `weight` (0: none).
pub fn smooth(values: &[f64], weight: f64, seed: Option<f64>) -> Vec<f64> {
    let mut e = seed.map_or(Ema::new(weight), |s| Ema::seeded(weight, s));
    values.iter().map(|&v| e.next(v)).collect()
}

#[derive(Default, Clone)]
pub struct Series {
    pub steps: Vec<i64>,
    /// The steps as floats: the x of the step axis, borrowed by every frame.
    pub xs: Vec<f64>,
    pub values: Vec<f64>,
    /// Wall time of each point, unix seconds.
    pub times: Vec<f64>,
    /// Smoothed values with `ema`'s weight, parallel to `values`.
    pub smoothed: Vec<f64>,
    ema: Ema,
    /// Points ever received, compaction notwithstanding.
    pub received: u64,
    /// Points that arrived at or below the last step held (duplicates or a resumed run).
    pub out_of_order: u64,
    /// Bumped on every change, so a chart redraws only when one of its lines changed.
    pub version: u64,
    /// Whether compaction (here or the hub's downsampled history) dropped points.
    pub compacted: bool,
}

impl Series {
    pub fn push(&mut self, step: i64, value: f64, time: f64) {
        if self.steps.last().is_some_and(|&last| step <= last) {
            self.out_of_order += 1;
        }
        self.steps.push(step);
        self.xs.push(step as f64);
        self.values.push(value);
        self.times.push(time);
        self.smoothed.push(self.ema.next(value));
        self.received += 1;
        self.version += 1;
        if self.steps.len() > COMPACT_ABOVE {
            self.compact();
        }
    }

    /// Re-smooths every point with a new weight.
    pub fn set_smoothing(&mut self, weight: f64) {
        if self.ema.weight == weight.clamp(0.0, 0.999) && self.smoothed.len() == self.values.len() {
            return;
        }
        self.ema = Ema::new(weight);
        let mut e = self.ema;
        self.smoothed = self.values.iter().map(|&v| e.next(v)).collect();
        self.ema = e;
        self.version += 1;
    }

    /// M4 over equal step buckets: first, last, min, max and non-finite values survive.
    fn compact(&mut self) {
        let lo = self.steps.iter().copied().min().unwrap_or(0);
        let hi = self.steps.iter().copied().max().unwrap_or(0);
        let mut m4 = M4::for_steps(COMPACT_TO, lo, hi);
        for (i, (&s, &v)) in self.steps.iter().zip(&self.values).enumerate() {
            m4.push(s as f64, v, i);
        }
        let keep: Vec<usize> = m4.finish().into_iter().map(|(i, _)| i).collect();
        let pick = |v: &[f64]| keep.iter().map(|&i| v[i]).collect::<Vec<f64>>();
        self.values = pick(&self.values);
        self.times = pick(&self.times);
        self.smoothed = pick(&self.smoothed);
        self.xs = pick(&self.xs);
        self.steps = keep.iter().map(|&i| self.steps[i]).collect();
        self.compacted = true;
    }

    pub fn last_step(&self) -> Option<i64> {
        self.steps.last().copied()
    }

    /// Index of the point nearest to `x` in `xs` (sorted ascending).
    pub fn nearest(xs: &[f64], x: f64) -> Option<usize> {
        if xs.is_empty() {
            return None;
        }
        let i = xs.partition_point(|&v| v < x);
        Some(match i {
            0 => 0,
            n if n >= xs.len() => xs.len() - 1,
            n if (xs[n] - x) < (x - xs[n - 1]) => n,
            n => n - 1,
        })
    }
}

#[derive(Default)]
pub struct RunData {
    /// Each metric's name, kept once: points arrive by id and go to their series by id.
    pub names: HashMap<MetricId, String>,
    series: HashMap<MetricId, Series>,
    /// Metric names in order, for lookups by name (a chart is of a name across runs).
    by_name: BTreeMap<String, MetricId>,
    /// Highest batch sequence number applied; live batches at or below it are skipped.
    pub through_seq: u64,
    pub backfilled: bool,
    /// `Date.now()` when the last point arrived (or, at subscribe, when the hub last had one).
    pub last_point_ms: f64,
    /// Wall time (unix seconds) of the newest point drawn, for latency measurements.
    pub newest_wall_time: f64,
    /// The run's alerts, fired and resolved, without repeats.
    pub alerts: Vec<Alert>,
    /// Commands for the run's training, each at the furthest state told (by id).
    pub commands: std::collections::BTreeMap<u64, stepstream_protocol::CommandEvent>,
    /// Smoothing weight applied to new series.
    pub smoothing: f64,
}

impl RunData {
    pub fn define(&mut self, defs: &[MetricDef]) {
        for d in defs {
            self.names.insert(d.id, d.name.clone());
            self.by_name.insert(d.name.clone(), d.id);
            let w = self.smoothing;
            self.series.entry(d.id).or_insert_with(|| {
                let mut s = Series::default();
                s.set_smoothing(w);
                s
            });
        }
    }

    /// The series of a defined metric (points of an undefined id are not kept).
    fn series_mut(&mut self, id: MetricId) -> Option<&mut Series> {
        self.series.get_mut(&id)
    }

    /// The metric named `name`, if the run defined it.
    pub fn series(&self, name: &str) -> Option<&Series> {
        self.series.get(self.by_name.get(name)?)
    }

    /// The run's metric names, sorted.
    pub fn metric_names(&self) -> impl Iterator<Item = &String> {
        self.by_name.keys()
    }

    pub fn backfill(&mut self, b: &Backfill) {
        for s in &b.series {
            let Some(series) = self.series_mut(s.metric) else {
                continue;
            };
            series.compacted |= b.downsampled;
            for (i, (&step, &v)) in s.steps.iter().zip(&s.values).enumerate() {
                series.push(step, v, s.times.get(i).copied().unwrap_or(f64::NAN));
            }
        }
        // Held only once the whole history is: a socket lost mid-backfill must not leave a
        // resubscription continuing after batches the page never got.
        if b.done {
            self.through_seq = b.through_seq;
            self.backfilled = true;
        }
    }

    /// The batches held, for a resubscription to continue after (`Subscribe::after_seq`);
    /// `None` before any history arrived.
    pub fn held_seq(&self) -> Option<u64> {
        self.backfilled.then_some(self.through_seq)
    }

    /// Applies a live batch unless it is already held; returns whether it was applied.
    pub fn live(&mut self, l: &Live, now_ms: f64) -> bool {
        if l.seq <= self.through_seq {
            return false;
        }
        self.through_seq = l.seq;
        for r in &l.records {
            for &(id, v) in &r.values {
                if let Some(series) = self.series.get_mut(&id) {
                    series.push(r.step, v, r.wall_time);
                }
            }
            self.newest_wall_time = self.newest_wall_time.max(r.wall_time);
        }
        self.last_point_ms = now_ms;
        true
    }

    pub fn set_smoothing(&mut self, weight: f64) {
        self.smoothing = weight;
        for s in self.series.values_mut() {
            s.set_smoothing(weight);
        }
    }

    pub fn last_step(&self) -> Option<i64> {
        self.series.values().filter_map(Series::last_step).max()
    }

    /// Keeps an alert unless it is already held (history and live may overlap).
    pub fn alert(&mut self, a: Alert) -> bool {
        let known = self
            .alerts
            .iter()
            .any(|b| b.rule == a.rule && b.step == a.step && b.fired == a.fired);
        if !known {
            self.alerts.push(a);
        }
        !known
    }

    /// A command's state as told; `false` when it says nothing new (a repeat, or an older
    /// state arriving after a newer one).
    pub fn command(&mut self, e: stepstream_protocol::CommandEvent) -> bool {
        match self.commands.get(&e.command.id) {
            Some(known) if known.state >= e.state => false,
            _ => {
                self.commands.insert(e.command.id, e);
                true
            }
        }
    }

    /// Where the training acted on a command, and what to write by its marker: the note's
    /// text, else the action.
    pub fn command_marks(&self) -> Vec<(i64, String)> {
        self.commands
            .values()
            .filter(|c| c.state == stepstream_protocol::CommandState::Honoured)
            .filter_map(|c| {
                let label = match &c.command.action {
                    stepstream_protocol::Action::Note { text } => text.clone(),
                    other => other.name().to_string(),
                };
                Some((c.step?, label))
            })
            .collect()
    }

    /// Steps where the training acted on a command (a note shown, a checkpoint saved, a stop),
    /// for chart markers.
    pub fn command_steps(&self) -> Vec<i64> {
        self.commands
            .values()
            .filter(|c| c.state == stepstream_protocol::CommandState::Honoured)
            .filter_map(|c| c.step)
            .collect()
    }

    /// Steps where an alert fired, for chart markers.
    pub fn alert_steps(&self) -> Vec<i64> {
        self.alerts
            .iter()
            .filter(|a| a.fired)
            .map(|a| a.step)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compaction_keeps_extremes_times_and_bounds_size() {
        let mut s = Series::default();
        for i in 0..(COMPACT_ABOVE as i64 + 1) {
            let v = if i == 12_345 { 99.0 } else { (i as f64).sin() };
            s.push(i, v, 1000.0 + i as f64);
        }
        assert!(s.steps.len() <= COMPACT_TO * 4);
        let at = s
            .values
            .iter()
            .position(|&v| v == 99.0)
            .expect("spike kept");
        assert_eq!((s.steps[at], s.times[at]), (12_345, 13_345.0));
        assert_eq!(s.received, COMPACT_ABOVE as u64 + 1);
        assert_eq!((s.out_of_order, s.smoothed.len()), (0, s.values.len()));
        assert!(s.compacted);
    }

    #[test]
    fn ema_is_tensorboards_debiased_average() {
        // The first smoothed value is the first value (debiasing), then it lags.
        let out = smooth(&[1.0, 3.0, f64::NAN, 3.0], 0.5, None);
        assert_eq!(out[0], 1.0);
        assert!((out[1] - (0.5 * 0.5 + 0.5 * 3.0) / 0.75).abs() < 1e-12);
        assert!(out[2].is_nan());
        assert!(out[3] > out[1] && out[3] < 3.0);
        assert_eq!(smooth(&[2.0, 5.0], 0.0, None), vec![2.0, 5.0]);
        // Seeded: continues from a reached value without the start-up correction.
        assert_eq!(smooth(&[3.0], 0.5, Some(1.0)), vec![2.0]);
    }

    #[test]
    fn changing_the_weight_resmooths_every_point() {
        let mut s = Series::default();
        for i in 0..10 {
            s.push(i, i as f64, 0.0);
        }
        assert_eq!(s.smoothed, s.values);
        s.set_smoothing(0.9);
        assert!(s.smoothed[9] < 9.0);
        assert_eq!(s.smoothed, smooth(&s.values, 0.9, None));
    }
}
