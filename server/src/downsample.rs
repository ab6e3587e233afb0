//! M4 downsampling: the shape of a series within a point budget, with every spike kept.
//!
//! The step range is cut into `budget / 4` equal buckets; each keeps its first, last,
//! minimum and maximum point, so a line drawn through the result covers exactly the pixels
//! the full series would. Non-finite values are what a user most needs to see, so each
//! bucket also keeps its first NaN, +inf and -inf (the only case where the result may exceed
//! the budget). The result depends only on the points and the range: the same data gives
//! the same output, whether the run is live or finished.

/// Picks at most about `budget` of the points (`steps[i]`, `values[i]`), in their order.
/// `range` fixes the bucket grid; without it the grid spans the data's steps.
pub fn m4(
    steps: &[i64],
    values: &[f64],
    budget: usize,
    range: Option<(i64, i64)>,
) -> (Vec<i64>, Vec<f64>) {
    debug_assert_eq!(steps.len(), values.len());
    if steps.len() <= budget.max(4) {
        return (steps.to_vec(), values.to_vec());
    }
    let range = range.unwrap_or_else(|| {
        let lo = *steps.iter().min().expect("non-empty");
        let hi = *steps.iter().max().expect("non-empty");
        (lo, hi)
    });
    let mut m4 = M4::new(budget, range);
    for (&s, &v) in steps.iter().zip(values) {
        m4.push(s, v);
    }
    m4.finish()
}

type Slot = Option<(u64, i64, f64)>;

#[derive(Clone, Copy, Default)]
struct Bucket {
    first: Slot,
    last: Slot,
    min: Slot,
    max: Slot,
    nan: Slot,
    pos_inf: Slot,
    neg_inf: Slot,
}

/// Streaming M4 over a known step range: memory is per bucket, not per point.
pub struct M4 {
    lo: i64,
    span: i128,
    buckets: Vec<Bucket>,
    n: u64,
}

impl M4 {
    pub fn new(budget: usize, (lo, hi): (i64, i64)) -> M4 {
        M4 {
            lo,
            span: (hi as i128 - lo as i128 + 1).max(1),
            buckets: vec![Bucket::default(); (budget / 4).max(1)],
            n: 0,
        }
    }

    /// Points pushed so far.
    pub fn len(&self) -> u64 {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    pub fn push(&mut self, step: i64, value: f64) {
        let offset = (step as i128 - self.lo as i128).clamp(0, self.span - 1);
        let idx = (offset * self.buckets.len() as i128 / self.span) as usize;
        let b = &mut self.buckets[idx];
        let point = Some((self.n, step, value));
        self.n += 1;
        b.first.get_or_insert((self.n - 1, step, value));
        b.last = point;
        if value.is_nan() {
            b.nan.get_or_insert((self.n - 1, step, value));
        } else if value == f64::INFINITY {
            b.pos_inf.get_or_insert((self.n - 1, step, value));
        } else if value == f64::NEG_INFINITY {
            b.neg_inf.get_or_insert((self.n - 1, step, value));
        } else {
            if b.min.is_none_or(|(_, _, m)| value < m) {
                b.min = point;
            }
            if b.max.is_none_or(|(_, _, m)| value > m) {
                b.max = point;
            }
        }
    }

    /// The kept points, in the order they were pushed.
    pub fn finish(self) -> (Vec<i64>, Vec<f64>) {
        let mut keep: Vec<(u64, i64, f64)> = self
            .buckets
            .iter()
            .flat_map(|b| [b.first, b.last, b.min, b.max, b.nan, b.pos_inf, b.neg_inf])
            .flatten()
            .collect();
        keep.sort_unstable_by_key(|p| p.0);
        keep.dedup_by_key(|p| p.0);
        keep.into_iter().map(|(_, s, v)| (s, v)).unzip()
    }
}

/// Keeps points exactly while they fit the budget and switches to [`M4`] once they do not,
/// so a short series is never thinned and a long one never held whole.
pub struct Budgeted {
    budget: usize,
    range: (i64, i64),
    raw: Vec<(i64, f64)>,
    m4: Option<M4>,
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

    pub fn push(&mut self, step: i64, value: f64) {
        if let Some(m4) = &mut self.m4 {
            m4.push(step, value);
            return;
        }
        self.raw.push((step, value));
        if self.raw.len() > self.budget {
            let mut m4 = M4::new(self.budget, self.range);
            for (s, v) in self.raw.drain(..) {
                m4.push(s, v);
            }
            self.m4 = Some(m4);
        }
    }

    /// The points, and whether they were thinned.
    pub fn finish(self) -> (Vec<i64>, Vec<f64>, bool) {
        match self.m4 {
            Some(m4) => {
                let (s, v) = m4.finish();
                (s, v, true)
            }
            None => {
                let (s, v) = self.raw.into_iter().unzip();
                (s, v, false)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(n: i64) -> (Vec<i64>, Vec<f64>) {
        let steps: Vec<i64> = (0..n).collect();
        let values = steps.iter().map(|&s| (s as f64 * 0.01).sin()).collect();
        (steps, values)
    }

    #[test]
    fn budgeted_is_exact_until_the_budget_then_thins() {
        let (s, v) = series(1000);
        let mut exact = Budgeted::new(1000, (0, 999));
        s.iter().zip(&v).for_each(|(&a, &b)| exact.push(a, b));
        assert_eq!(exact.finish(), (s.clone(), v.clone(), false));
        let mut thin = Budgeted::new(100, (0, 999));
        s.iter().zip(&v).for_each(|(&a, &b)| thin.push(a, b));
        let (ts, tv, thinned) = thin.finish();
        assert!(thinned && ts.len() <= 100);
        assert_eq!((ts, tv), m4(&s, &v, 100, Some((0, 999))));
    }

    #[test]
    fn short_series_pass_through() {
        let (s, v) = series(10);
        assert_eq!(m4(&s, &v, 100, None), (s, v));
    }

    #[test]
    fn budget_is_kept_and_extremes_survive() {
        let (s, mut v) = series(100_000);
        v[31_337] = 50.0;
        v[77_000] = -50.0;
        let (ds, dv) = m4(&s, &v, 400, None);
        assert!(ds.len() <= 400, "{} points", ds.len());
        assert!(ds.windows(2).all(|w| w[0] < w[1]));
        let max = dv.iter().cloned().fold(f64::MIN, f64::max);
        let min = dv.iter().cloned().fold(f64::MAX, f64::min);
        assert_eq!((max, min), (50.0, -50.0));
        assert!(ds.contains(&31_337) && ds.contains(&77_000));
        assert_eq!((ds[0], *ds.last().unwrap()), (0, 99_999));
    }

    #[test]
    fn non_finite_values_survive() {
        let (s, mut v) = series(10_000);
        v[5000] = f64::NAN;
        v[6000] = f64::INFINITY;
        let (ds, dv) = m4(&s, &v, 40, None);
        let i = ds.iter().position(|&x| x == 5000).expect("NaN kept");
        assert!(dv[i].is_nan());
        assert!(ds.contains(&6000));
    }

    #[test]
    fn deterministic_for_a_fixed_range() {
        let (s, v) = series(50_000);
        // A live run seen at 30,000 steps and the finished run, asked for the same range
        // (the API keeps only the points inside it), give the same picture.
        let live = m4(&s[..30_000], &v[..30_000], 200, Some((0, 29_999)));
        let (fs, fv): (Vec<i64>, Vec<f64>) = s
            .iter()
            .zip(&v)
            .filter(|(&x, _)| x < 30_000)
            .map(|(&x, &y)| (x, y))
            .unzip();
        let done = m4(&fs, &fv, 200, Some((0, 29_999)));
        assert_eq!(live.0, done.0);
        assert_eq!(live.1, done.1);
    }
}
