//! Point budgets for history and range answers, over the one M4 decimation of
//! `stepstream_protocol::decimate` (the same routine the web app draws with), and the one
//! window read both the series endpoint and a viewer's zoom answer with ([`window`]).

use crate::store::{summary, Part, RunKey, Store, StoreError};
use std::collections::{BTreeMap, HashSet};
use std::ops::ControlFlow;
use std::sync::Arc;
use stepstream_protocol::decimate::{StepM4, M4};
use stepstream_protocol::MetricId;

/// A point as the hub answers it: step, value, record wall time.
pub type Point = (i64, f64, f64);

/// Keeps points exactly while they fit the budget and switches to M4 (`budget / 4` buckets
/// over the step range) once they do not, so a short series is never thinned and a long one
/// never held whole.
pub struct Budgeted {
    budget: usize,
    range: (i64, i64),
    raw: Vec<Point>,
    m4: Option<M4<(i64, f64)>>,
}

impl Budgeted {
    pub fn new(budget: usize, range: (i64, i64)) -> Budgeted {
        Budgeted {
            budget: budget.max(4),
            range,
            raw: Vec::new(),
            m4: None,
        }
    }

    pub fn push(&mut self, step: i64, value: f64, time: f64) {
        if let Some(m4) = &mut self.m4 {
            m4.push(step as f64, value, (step, time));
            return;
        }
        self.raw.push((step, value, time));
        if self.raw.len() > self.budget {
            let mut m4 = M4::for_steps(self.budget / 4, self.range.0, self.range.1);
            for (s, v, t) in self.raw.drain(..) {
                m4.push(s as f64, v, (s, t));
            }
            self.m4 = Some(m4);
        }
    }

    fn into_m4(self) -> M4<(i64, f64)> {
        self.m4.unwrap_or_else(|| {
            let mut m4 = M4::for_steps(self.budget / 4, self.range.0, self.range.1);
            for (s, v, t) in self.raw {
                m4.push(s as f64, v, (s, t));
            }
            m4
        })
    }

    /// Joins the points pushed after this one's (same budget and range): the same answer
    /// as pushing them all into one.
    pub fn merge(mut self, later: Budgeted) -> Budgeted {
        if self.m4.is_none()
            && later.m4.is_none()
            && self.raw.len() + later.raw.len() <= self.budget
        {
            self.raw.extend(later.raw);
            return self;
        }
        let (budget, range) = (self.budget, self.range);
        Budgeted {
            budget,
            range,
            raw: Vec::new(),
            m4: Some(self.into_m4().merge(later.into_m4())),
        }
    }

    /// Steps, values and times, and whether they were thinned.
    pub fn finish(self) -> (Vec<i64>, Vec<f64>, Vec<f64>, bool) {
        let (points, thinned): (Vec<Point>, bool) = match self.m4 {
            Some(m4) => (
                m4.finish()
                    .into_iter()
                    .map(|((s, t), v)| (s, v, t))
                    .collect(),
                true,
            ),
            None => (self.raw, false),
        };
        let mut steps = Vec::with_capacity(points.len());
        let mut values = Vec::with_capacity(points.len());
        let mut times = Vec::with_capacity(points.len());
        for (s, v, t) in points {
            steps.push(s);
            values.push(v);
            times.push(t);
        }
        (steps, values, times, thinned)
    }
}

/// Per metric, the M4 of its points over step buckets aligned to `width` (`StepM4`), fed
/// alike by raw records and by packs' summaries at a width dividing it (summaries nest, so
/// the answer is the M4 of the raw points), and how many points it stands for.
pub struct Aligned {
    width: i64,
    range: (i64, i64),
    wanted: Arc<HashSet<MetricId>>,
    metrics: BTreeMap<MetricId, (u64, StepM4<(i64, f64)>)>,
}

impl Aligned {
    pub fn new(width: i64, range: (i64, i64), wanted: Arc<HashSet<MetricId>>) -> Aligned {
        Aligned {
            width,
            range,
            wanted,
            metrics: BTreeMap::new(),
        }
    }

    fn slot(&mut self, id: MetricId) -> Option<&mut (u64, StepM4<(i64, f64)>)> {
        if !self.wanted.contains(&id) {
            return None;
        }
        let width = self.width;
        Some(
            self.metrics
                .entry(id)
                .or_insert_with(|| (0, StepM4::new(width))),
        )
    }

    /// A raw point (outside the range: skipped).
    pub fn push(&mut self, id: MetricId, step: i64, value: f64, time: f64) {
        let (lo, hi) = self.range;
        if (lo..=hi).contains(&step) {
            if let Some((total, m4)) = self.slot(id) {
                *total += 1;
                m4.push(step, value, (step, time));
            }
        }
    }

    /// A part of the run, in sequence order.
    pub fn add(&mut self, part: Part<'_>) {
        match part {
            Part::Summary(summary) => {
                for (metric, count, points) in summary.metrics() {
                    if let Some((total, m4)) = self.slot(metric) {
                        *total += count;
                        for (step, time, value) in points {
                            m4.push(step, value, (step, time));
                        }
                    }
                }
            }
            Part::Records(records) => {
                for r in records {
                    for &(id, v) in &r.values {
                        self.push(id, r.step, v, r.wall_time);
                    }
                }
            }
        }
    }

    /// Each metric's kept points (steps, values, times) and how many it stood for.
    pub fn finish(self) -> Vec<(MetricId, u64, Columns)> {
        self.metrics
            .into_iter()
            .map(|(id, (total, m4))| {
                let kept = m4.finish();
                let mut steps = Vec::with_capacity(kept.len());
                let mut values = Vec::with_capacity(kept.len());
                let mut times = Vec::with_capacity(kept.len());
                for ((s, t), v) in kept {
                    steps.push(s);
                    values.push(v);
                    times.push(t);
                }
                (id, total, (steps, values, times))
            })
            .collect()
    }
}

/// Metrics `wanted` of the run over `range` in about `budget` points each, from the packs'
/// summaries (`store::summary`) where the range is long enough for one of their widths:
/// each metric's points stored in the range and its answer. `None` when it is
/// not (the range is short, or a metric has no more points than the budget, which must come
/// whole): read the raw points instead.
pub async fn summarized(
    store: &Store,
    key: RunKey,
    through_seq: u64,
    range: (i64, i64),
    budget: usize,
    wanted: Arc<HashSet<MetricId>>,
) -> Result<Option<Vec<(MetricId, u64, Answer)>>, StoreError> {
    let Some((level, width)) = summary::width_for(range, budget.max(4) / 4) else {
        return Ok(None);
    };
    let aligned = store
        .scan_summarized(
            key,
            summary::WIDTHS[level],
            range,
            through_seq,
            Aligned::new(width, range, wanted),
            |aligned, part| aligned.add(part),
        )
        .await?;
    let mut out = Vec::new();
    for (id, total, (steps, values, times)) in aligned.finish() {
        let thinned = (steps.len() as u64) < total;
        if thinned && total <= budget as u64 {
            return Ok(None);
        }
        out.push((id, total, (steps, values, times, thinned)));
    }
    Ok(Some(out))
}

/// Steps, values and times of kept points.
pub type Columns = (Vec<i64>, Vec<f64>, Vec<f64>);

/// Steps, values, times, and whether they were thinned.
pub type Answer = (Vec<i64>, Vec<f64>, Vec<f64>, bool);

/// One metric over a step window, as the series endpoint and a viewer's zoom answer it.
pub struct Window {
    /// The window's steps (the run's whole range when none was given).
    pub from: i64,
    pub to: i64,
    pub steps: Vec<i64>,
    pub values: Vec<f64>,
    pub times: Vec<f64>,
    pub downsampled: bool,
    /// Points stored in the window, before any thinning.
    pub total: u64,
}

/// Reads `metric` of the run `key` (its batches through `through_seq`) over `from..=to`
/// (default: the run's whole step range) through the step index, every raw point while
/// they fit `budget`, else M4-thinned to it. `None` for an empty range (`to < from`).
pub async fn window(
    store: &Store,
    key: RunKey,
    through_seq: u64,
    metric: MetricId,
    (from, to): (Option<i64>, Option<i64>),
    budget: usize,
) -> Result<Option<Window>, StoreError> {
    let bounds = store.step_bounds(key).await?;
    let lo = from.or(bounds.map(|b| b.0)).unwrap_or(0);
    let hi = to.or(bounds.map(|b| b.1)).unwrap_or(lo);
    if hi < lo {
        return Ok(None);
    }
    // A long range reads the packs' summaries, not their values.
    let wanted = Arc::new(HashSet::from([metric]));
    let summarized = summarized(store, key, through_seq, (lo, hi), budget, wanted).await?;
    let (total, (steps, values, times, downsampled)) = match summarized {
        Some(mut answer) => answer
            .pop()
            .map(|(_, total, a)| (total, a))
            .unwrap_or_default(),
        None => {
            let (points, total) = store
                .scan_steps(
                    key,
                    (lo, hi),
                    through_seq,
                    (Budgeted::new(budget, (lo, hi)), 0u64),
                    move |(points, total), _, records| {
                        for r in records.iter().filter(|r| (lo..=hi).contains(&r.step)) {
                            if let Some(&(_, v)) = r.values.iter().find(|(m, _)| *m == metric) {
                                points.push(r.step, v, r.wall_time);
                                *total += 1;
                            }
                        }
                        ControlFlow::Continue(())
                    },
                )
                .await?;
            (total, points.finish())
        }
    };
    Ok(Some(Window {
        from: lo,
        to: hi,
        steps,
        values,
        times,
        downsampled,
        total,
    }))
}

/// One [`Budgeted`] per metric of a run, found by the metric's id without a map lookup per
/// value (ids are small and dense: the collector numbers them from 0).
pub struct PerMetric {
    budget: usize,
    range: (i64, i64),
    dense: Vec<Option<Budgeted>>,
    sparse: BTreeMap<MetricId, Budgeted>,
}

/// Ids below this index a vector; any above (a hand-made collector) go to a map.
const DENSE_IDS: u32 = 4096;

impl PerMetric {
    pub fn new(budget: usize, range: (i64, i64)) -> PerMetric {
        PerMetric {
            budget,
            range,
            dense: Vec::new(),
            sparse: BTreeMap::new(),
        }
    }

    pub fn push(&mut self, id: MetricId, step: i64, value: f64, time: f64) {
        let (budget, range) = (self.budget, self.range);
        let slot = if id.0 < DENSE_IDS {
            let i = id.0 as usize;
            if i >= self.dense.len() {
                self.dense.resize_with(i + 1, || None);
            }
            self.dense[i].get_or_insert_with(|| Budgeted::new(budget, range))
        } else {
            self.sparse
                .entry(id)
                .or_insert_with(|| Budgeted::new(budget, range))
        };
        slot.push(step, value, time);
    }

    /// Joins the points pushed after this one's, metric by metric.
    pub fn merge(self, later: PerMetric) -> PerMetric {
        let (budget, range) = (self.budget, self.range);
        let mut all: BTreeMap<MetricId, Budgeted> = self.finish().into_iter().collect();
        for (id, b) in later.finish() {
            let joined = match all.remove(&id) {
                Some(a) => a.merge(b),
                None => b,
            };
            all.insert(id, joined);
        }
        let mut out = PerMetric::new(budget, range);
        out.sparse = all;
        out
    }

    /// Each metric's points, by id.
    pub fn finish(self) -> Vec<(MetricId, Budgeted)> {
        self.dense
            .into_iter()
            .enumerate()
            .filter_map(|(i, b)| Some((MetricId(i as u32), b?)))
            .chain(self.sparse)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_merged_are_the_whole() {
        for (budget, n) in [(1000, 600), (1000, 900), (400, 100_000)] {
            let mut whole = PerMetric::new(budget, (0, n - 1));
            let (mut a, mut b) = (
                PerMetric::new(budget, (0, n - 1)),
                PerMetric::new(budget, (0, n - 1)),
            );
            for s in 0..n {
                for m in [0, 1, 5000] {
                    let v = ((s * (m + 3)) as f64 * 0.01).sin();
                    whole.push(MetricId(m as u32), s, v, s as f64);
                    let half = if s < n / 2 { &mut a } else { &mut b };
                    half.push(MetricId(m as u32), s, v, s as f64);
                }
            }
            type Answer = (Vec<i64>, Vec<f64>, Vec<f64>, bool);
            let finish = |p: PerMetric| -> Vec<(MetricId, Answer)> {
                p.finish()
                    .into_iter()
                    .map(|(id, b)| (id, b.finish()))
                    .collect()
            };
            assert_eq!(
                finish(a.merge(b)),
                finish(whole),
                "budget {budget}, {n} points"
            );
        }
    }

    fn run(budget: usize, n: i64, spike: Option<i64>) -> (Vec<i64>, Vec<f64>, Vec<f64>, bool) {
        let mut b = Budgeted::new(budget, (0, n - 1));
        for s in 0..n {
            let v = if Some(s) == spike {
                50.0
            } else {
                (s as f64 * 0.01).sin()
            };
            b.push(s, v, 1000.0 + s as f64);
        }
        b.finish()
    }

    #[test]
    fn exact_until_the_budget_then_thinned_with_extremes_and_times() {
        let (s, v, t, thinned) = run(1000, 1000, None);
        assert!(!thinned);
        assert_eq!(s, (0..1000).collect::<Vec<_>>());
        assert_eq!((v.len(), t[999]), (1000, 1999.0));
        let (s, v, t, thinned) = run(400, 100_000, Some(31_337));
        assert!(thinned && s.len() <= 400, "{}", s.len());
        assert!(s.windows(2).all(|w| w[0] < w[1]));
        let i = s.iter().position(|&x| x == 31_337).expect("spike kept");
        assert_eq!((v[i], t[i]), (50.0, 1000.0 + 31_337.0));
        assert_eq!((s[0], *s.last().unwrap()), (0, 99_999));
    }
}
