//! Rolling windows of recent values and their robust statistics.

use std::collections::VecDeque;

pub(super) fn median(values: impl Iterator<Item = f64>) -> Option<f64> {
    median_in(values, &mut Vec::new())
}

/// [`median`] with a scratch buffer the caller keeps, so a refresh allocates nothing.
fn median_in(values: impl Iterator<Item = f64>, v: &mut Vec<f64>) -> Option<f64> {
    v.clear();
    v.extend(values.filter(|x| x.is_finite()));
    middle(v)
}

/// The middle element of `v` where a sort would put it, in linear time (reorders `v`).
fn middle(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mid = v.len() / 2;
    Some(*v.select_nth_unstable_by(mid, f64::total_cmp).1)
}

/// A bounded window of recent finite values, with its median and MAD recomputed after
/// [`REFRESH`] new values or a quarter of the window, whichever is more (recomputing per
/// record would cost the hub more than storing it; a baseline a few steps old judges a spike
/// the same).
#[derive(Default, Debug)]
pub(super) struct Window {
    values: VecDeque<f64>,
    /// Values pushed, finite or not (for warm-ups).
    pub(super) seen: usize,
    stale: usize,
    /// The median and, once asked for, the MAD, as of the last refresh.
    cached: Option<(f64, Option<f64>)>,
    scratch: Vec<f64>,
    /// The sum of `values`, kept as they come and go (summed afresh every window's worth of
    /// values, so rounding cannot drift).
    sum: f64,
    since_sum: usize,
}

const REFRESH: usize = 16;

impl Window {
    pub(super) fn push(&mut self, v: f64, cap: usize) {
        self.seen += 1;
        if v.is_finite() {
            self.values.push_back(v);
            self.sum += v;
            while self.values.len() > cap.max(1) {
                self.sum -= self.values.pop_front().unwrap_or(0.0);
            }
            self.stale += 1;
            self.since_sum += 1;
            if self.since_sum >= self.values.len() {
                self.since_sum = 0;
                self.sum = self.values.iter().sum();
            }
        }
    }

    /// Median and median absolute deviation of the window.
    pub(super) fn stats(&mut self) -> Option<(f64, f64)> {
        self.refresh();
        let (m, mad) = self.cached?;
        let mad = match mad {
            Some(mad) => mad,
            None => {
                let (a, b) = self.values.as_slices();
                let deviations = a.iter().chain(b).map(|v| (v - m).abs());
                let mad = median_in(deviations, &mut self.scratch).unwrap_or(0.0);
                self.cached = Some((m, Some(mad)));
                mad
            }
        };
        Some((m, mad))
    }

    /// The window's median (without its MAD, which only the spike rule reads).
    pub(super) fn median(&mut self) -> Option<f64> {
        self.refresh();
        self.cached.map(|(m, _)| m)
    }

    /// Recomputes the median when it is due (the MAD then follows on demand).
    fn refresh(&mut self) {
        if self.cached.is_none() || self.stale >= REFRESH.max(self.values.len() / 4) {
            self.stale = 0;
            let scratch = &mut self.scratch;
            scratch.clear();
            let (a, b) = self.values.as_slices();
            // Every value kept is finite (`push`), so the copy is two memcpys.
            scratch.extend_from_slice(a);
            scratch.extend_from_slice(b);
            self.cached = middle(scratch).map(|m| (m, None));
        }
    }

    pub(super) fn mean(&self) -> Option<f64> {
        (!self.values.is_empty()).then(|| self.sum / self.values.len() as f64)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_running_mean_is_the_windows_mean() {
        let mut w = super::Window::default();
        for i in 0..10_000u32 {
            let v = if i % 7 == 0 {
                f64::NAN
            } else {
                f64::from(i % 97) * 1e6 + 0.1
            };
            w.push(v, 100);
            let Some(mean) = w.mean() else {
                assert!(w.values.is_empty());
                continue;
            };
            let exact = w.values.iter().sum::<f64>() / w.values.len() as f64;
            assert!(
                (mean - exact).abs() <= exact.abs() * 1e-12,
                "{mean} vs {exact} at {i}"
            );
        }
    }

    #[test]
    fn median_is_the_sorted_middle_of_the_finite_values() {
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        for n in 0..200 {
            let mut values = Vec::new();
            for _ in 0..n {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                values.push(match x % 11 {
                    0 => f64::NAN,
                    1 => f64::INFINITY,
                    2 => 1.0, // repeats
                    _ => (x % 1000) as f64 - 500.0,
                });
            }
            let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
            sorted.sort_by(f64::total_cmp);
            let want = (!sorted.is_empty()).then(|| sorted[sorted.len() / 2]);
            assert_eq!(super::median(values.into_iter()), want);
        }
    }
}
