//! Rolling windows of recent values and their robust statistics.

use std::collections::VecDeque;

pub(super) fn median(values: impl Iterator<Item = f64>) -> Option<f64> {
    let mut v: Vec<f64> = values.filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

/// A bounded window of recent finite values, with its median and MAD recomputed every
/// [`REFRESH`] values (a sort per record would cost the hub more than storing it).
#[derive(Default, Debug)]
pub(super) struct Window {
    values: VecDeque<f64>,
    /// Values pushed, finite or not (for warm-ups).
    pub(super) seen: usize,
    stale: usize,
    cached: Option<(f64, f64)>,
}

const REFRESH: usize = 16;

impl Window {
    pub(super) fn push(&mut self, v: f64, cap: usize) {
        self.seen += 1;
        if v.is_finite() {
            self.values.push_back(v);
            while self.values.len() > cap.max(1) {
                self.values.pop_front();
            }
            self.stale += 1;
        }
    }

    /// Median and median absolute deviation of the window.
    pub(super) fn stats(&mut self) -> Option<(f64, f64)> {
        if self.cached.is_none() || self.stale >= REFRESH {
            self.stale = 0;
            self.cached = median(self.values.iter().copied()).map(|m| {
                let mad = median(self.values.iter().map(|v| (v - m).abs())).unwrap_or(0.0);
                (m, mad)
            });
        }
        self.cached
    }

    pub(super) fn median(&mut self) -> Option<f64> {
        self.stats().map(|(m, _)| m)
    }

    pub(super) fn mean(&self) -> Option<f64> {
        (!self.values.is_empty())
            .then(|| self.values.iter().sum::<f64>() / self.values.len() as f64)
    }
}
