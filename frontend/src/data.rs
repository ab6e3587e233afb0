//! The points the page holds, per run and metric, and how hub messages change them.
//!
//! Kept outside the reactive system: points arrive by the thousand and are read only when a
//! frame is drawn. A series is compacted (M4 per bucket) once it grows past
//! [`COMPACT_ABOVE`], so drawing costs what the pixels cost however long the run.

use std::collections::{BTreeMap, HashMap};
use stepstream_protocol::{Alert, Backfill, Live, MetricDef, MetricId, RunId};

/// Points per series above which it is compacted to [`COMPACT_TO`] buckets.
pub const COMPACT_ABOVE: usize = 40_000;
const COMPACT_TO: usize = 4_000;

#[derive(Default, Clone)]
pub struct Series {
    pub steps: Vec<i64>,
    pub values: Vec<f64>,
    /// Points ever received, compaction notwithstanding.
    pub received: u64,
    /// Points that arrived at or below the last step held (duplicates or a resumed run).
    pub out_of_order: u64,
}

impl Series {
    fn push(&mut self, step: i64, value: f64) {
        if self.steps.last().is_some_and(|&last| step <= last) {
            self.out_of_order += 1;
        }
        self.steps.push(step);
        self.values.push(value);
        self.received += 1;
        if self.steps.len() > COMPACT_ABOVE {
            self.compact();
        }
    }

    /// M4 over equal step buckets: first, last, min and max of each survive.
    fn compact(&mut self) {
        let (lo, hi) = (self.steps[0], *self.steps.last().expect("non-empty"));
        let span = (hi - lo + 1).max(1) as f64;
        let mut keep = Vec::with_capacity(COMPACT_TO * 4);
        let mut bucket = usize::MAX;
        let (mut first, mut min, mut max, mut last) = (0, 0, 0, 0);
        let flush = |keep: &mut Vec<usize>, f: usize, mn: usize, mx: usize, l: usize| {
            let mut four = [f, mn, mx, l];
            four.sort_unstable();
            for i in four {
                if keep.last() != Some(&i) {
                    keep.push(i);
                }
            }
        };
        for i in 0..self.steps.len() {
            let b = (((self.steps[i] - lo) as f64 / span) * COMPACT_TO as f64) as usize;
            if b != bucket {
                if bucket != usize::MAX {
                    flush(&mut keep, first, min, max, last);
                }
                bucket = b;
                (first, min, max) = (i, i, i);
            }
            let v = self.values[i];
            // NaN compares false both ways; keep it visible by treating it as the extreme.
            if v < self.values[min] || v.is_nan() {
                min = i;
            }
            if v > self.values[max] || v.is_infinite() {
                max = i;
            }
            last = i;
        }
        flush(&mut keep, first, min, max, last);
        self.steps = keep.iter().map(|&i| self.steps[i]).collect();
        self.values = keep.iter().map(|&i| self.values[i]).collect();
    }

    pub fn last_step(&self) -> Option<i64> {
        self.steps.last().copied()
    }
}

#[derive(Default)]
pub struct RunData {
    pub names: HashMap<MetricId, String>,
    pub series: BTreeMap<String, Series>,
    /// Highest batch sequence number applied; live batches at or below it are skipped.
    pub through_seq: u64,
    pub backfilled: bool,
    /// `Date.now()` when the last point arrived (or, at subscribe, when the hub last had one).
    pub last_point_ms: f64,
    /// Wall time (unix seconds) of the newest point drawn, for latency measurements.
    pub newest_wall_time: f64,
    /// The run's alerts, fired and resolved, without repeats.
    pub alerts: Vec<Alert>,
}

impl RunData {
    pub fn define(&mut self, defs: &[MetricDef]) {
        for d in defs {
            self.names.insert(d.id, d.name.clone());
            self.series.entry(d.name.clone()).or_default();
        }
    }

    pub fn backfill(&mut self, b: &Backfill) {
        for s in &b.series {
            let Some(name) = self.names.get(&s.metric).cloned() else {
                continue;
            };
            let series = self.series.entry(name).or_default();
            for (&step, &v) in s.steps.iter().zip(&s.values) {
                series.push(step, v);
            }
        }
        self.through_seq = b.through_seq;
        if b.done {
            self.backfilled = true;
        }
    }

    /// Applies a live batch unless it is already held; returns whether it was applied.
    pub fn live(&mut self, l: &Live, now_ms: f64) -> bool {
        if l.seq <= self.through_seq {
            return false;
        }
        self.through_seq = l.seq;
        for r in &l.records {
            for &(id, v) in &r.values {
                if let Some(name) = self.names.get(&id) {
                    self.series.entry(name.clone()).or_default().push(r.step, v);
                }
            }
            self.newest_wall_time = self.newest_wall_time.max(r.wall_time);
        }
        self.last_point_ms = now_ms;
        true
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

    /// Steps where an alert fired, for chart markers.
    pub fn alert_steps(&self) -> Vec<i64> {
        self.alerts
            .iter()
            .filter(|a| a.fired)
            .map(|a| a.step)
            .collect()
    }
}

/// Every subscribed run's data.
#[derive(Default)]
pub struct Store {
    pub runs: BTreeMap<RunId, RunData>,
}

impl Store {
    /// Metric names across the given runs, in a stable order (training metrics first).
    pub fn metric_names(&self, runs: &[RunId]) -> Vec<String> {
        let mut names: Vec<String> = runs
            .iter()
            .filter_map(|r| self.runs.get(r))
            .flat_map(|d| d.series.keys().cloned())
            .collect();
        names.sort_by_key(|n| (rank(n), n.clone()));
        names.dedup();
        names
    }
}

fn rank(name: &str) -> usize {
    const ORDER: [&str; 6] = [
        "loss",
        "lr",
        "grad_norm",
        "samples_per_sec",
        "tokens_per_sec",
        "ppl",
    ];
    ORDER.iter().position(|&o| o == name).unwrap_or(ORDER.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compaction_keeps_extremes_and_bounds_size() {
        let mut s = Series::default();
        for i in 0..(COMPACT_ABOVE as i64 + 1) {
            s.push(i, if i == 12_345 { 99.0 } else { (i as f64).sin() });
        }
        assert!(s.steps.len() <= COMPACT_TO * 4);
        assert!(s.values.contains(&99.0));
        assert_eq!(s.received, COMPACT_ABOVE as u64 + 1);
        assert_eq!(s.out_of_order, 0);
    }
}
