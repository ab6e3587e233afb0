//! The one decimation of stepstream: M4 over equal buckets of an x range.
//!
//! The hub downsamples history and range answers with it, and the web app decimates what it
//! draws to one bucket per pixel column with it, so both treat spikes and non-finite values
//! the same way. Each bucket keeps its first, last, minimum and maximum finite point, so a
//! line through the result covers exactly the pixels the full series would, and also its
//! first NaN, +inf and -inf: a non-finite value is what a user most needs to see, so it is
//! never decimated away (the only case where more than four points per bucket survive).
//!
//! The result depends only on the points and the range, never on when they were pushed, so
//! a live run and the same run finished give the same picture. Dependency-free by design.

/// A kept point: its push index (to restore push order), value and caller's payload.
type Slot<P> = Option<(usize, f64, P)>;

#[derive(Clone, Copy)]
struct Bucket<P> {
    first: Slot<P>,
    last: Slot<P>,
    min: Slot<P>,
    max: Slot<P>,
    nan: Slot<P>,
    pos_inf: Slot<P>,
    neg_inf: Slot<P>,
}

impl<P> Default for Bucket<P> {
    fn default() -> Self {
        Bucket {
            first: None,
            last: None,
            min: None,
            max: None,
            nan: None,
            pos_inf: None,
            neg_inf: None,
        }
    }
}

/// Streaming M4: memory is per bucket, not per point. `P` is whatever the caller needs back
/// for a kept point (its step and time, or its index in an array).
pub struct M4<P> {
    lo: f64,
    /// Buckets per x unit.
    scale: f64,
    buckets: Vec<Bucket<P>>,
    n: usize,
}

impl<P: Copy> M4<P> {
    /// `buckets` equal buckets over `[lo, hi)`; points outside fall into the edge buckets.
    pub fn new(buckets: usize, lo: f64, hi: f64) -> M4<P> {
        let buckets = buckets.max(1);
        let width = hi - lo;
        let scale = if width > 0.0 && width.is_finite() {
            buckets as f64 / width
        } else {
            0.0
        };
        M4 {
            lo,
            scale,
            buckets: vec![Bucket::default(); buckets],
            n: 0,
        }
    }

    /// Buckets for integer steps `lo..=hi`, so that each bucket spans whole steps alike.
    pub fn for_steps(buckets: usize, lo: i64, hi: i64) -> M4<P> {
        M4::new(buckets, lo as f64, hi as f64 + 1.0)
    }

    /// Points pushed so far.
    pub fn len(&self) -> usize {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Which bucket `x` falls in (edge buckets catch what lies outside the range).
    pub fn bucket_of(&self, x: f64) -> usize {
        let b = ((x - self.lo) * self.scale).floor();
        if b.is_nan() || b < 0.0 {
            0
        } else {
            (b as usize).min(self.buckets.len() - 1)
        }
    }

    pub fn push(&mut self, x: f64, value: f64, payload: P) {
        let idx = self.bucket_of(x);
        let b = &mut self.buckets[idx];
        let point = Some((self.n, value, payload));
        self.n += 1;
        b.first.get_or_insert((self.n - 1, value, payload));
        b.last = point;
        if value.is_nan() {
            b.nan.get_or_insert((self.n - 1, value, payload));
        } else if value == f64::INFINITY {
            b.pos_inf.get_or_insert((self.n - 1, value, payload));
        } else if value == f64::NEG_INFINITY {
            b.neg_inf.get_or_insert((self.n - 1, value, payload));
        } else {
            if b.min.is_none_or(|(_, m, _)| value < m) {
                b.min = point;
            }
            if b.max.is_none_or(|(_, m, _)| value > m) {
                b.max = point;
            }
        }
    }

    /// Joins the M4 of points pushed after this one's (same buckets and range, e.g. the
    /// second half of a run scanned on another thread): the result is what pushing all the
    /// points into one M4 would have given.
    pub fn merge(mut self, later: M4<P>) -> M4<P> {
        debug_assert_eq!(self.buckets.len(), later.buckets.len());
        let offset = self.n;
        let shift = |slot: Slot<P>| slot.map(|(i, v, p)| (i + offset, v, p));
        for (a, b) in self.buckets.iter_mut().zip(later.buckets) {
            a.first = a.first.or(shift(b.first));
            a.last = shift(b.last).or(a.last);
            a.nan = a.nan.or(shift(b.nan));
            a.pos_inf = a.pos_inf.or(shift(b.pos_inf));
            a.neg_inf = a.neg_inf.or(shift(b.neg_inf));
            // Ties keep the earlier point, as pushing would.
            if let Some(m) = shift(b.min) {
                if a.min.is_none_or(|(_, v, _)| m.1 < v) {
                    a.min = Some(m);
                }
            }
            if let Some(m) = shift(b.max) {
                if a.max.is_none_or(|(_, v, _)| m.1 > v) {
                    a.max = Some(m);
                }
            }
        }
        self.n += later.n;
        self
    }

    /// The kept points' payloads and values, in the order they were pushed.
    pub fn finish(self) -> Vec<(P, f64)> {
        let mut keep: Vec<(usize, f64, P)> = self
            .buckets
            .iter()
            .flat_map(|b| [b.first, b.last, b.min, b.max, b.nan, b.pos_inf, b.neg_inf])
            .flatten()
            .collect();
        keep.sort_unstable_by_key(|p| p.0);
        keep.dedup_by_key(|p| p.0);
        keep.into_iter().map(|(_, v, p)| (p, v)).collect()
    }
}

/// Indices of the points of `(xs[i], values[i])` that M4 keeps with `buckets` buckets over
/// `[lo, hi)`, in order; every index when there are no more than four points per bucket.
pub fn m4_indices(xs: &[f64], values: &[f64], buckets: usize, lo: f64, hi: f64) -> Vec<usize> {
    debug_assert_eq!(xs.len(), values.len());
    if xs.len() <= buckets.max(1) * 4 {
        return (0..xs.len()).collect();
    }
    let mut m4 = M4::new(buckets, lo, hi);
    for (i, (&x, &v)) in xs.iter().zip(values).enumerate() {
        m4.push(x, v, i);
    }
    m4.finish().into_iter().map(|(i, _)| i).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(n: usize) -> (Vec<f64>, Vec<f64>) {
        let xs: Vec<f64> = (0..n).map(|i| i as f64).collect();
        let vs = xs.iter().map(|x| (x * 0.01).sin()).collect();
        (xs, vs)
    }

    #[test]
    fn few_points_pass_through() {
        let (xs, vs) = series(10);
        assert_eq!(
            m4_indices(&xs, &vs, 100, 0.0, 10.0),
            (0..10).collect::<Vec<_>>()
        );
    }

    #[test]
    fn budget_is_kept_and_extremes_survive_in_order() {
        let (xs, mut vs) = series(100_000);
        vs[31_337] = 50.0;
        vs[77_000] = -50.0;
        let kept = m4_indices(&xs, &vs, 100, 0.0, 100_000.0);
        assert!(kept.len() <= 400, "{}", kept.len());
        assert!(kept.windows(2).all(|w| w[0] < w[1]));
        assert!(kept.contains(&31_337) && kept.contains(&77_000));
        assert_eq!((kept[0], *kept.last().unwrap()), (0, 99_999));
    }

    #[test]
    fn every_kind_of_non_finite_value_survives_beside_the_extremes() {
        let (xs, mut vs) = series(10_000);
        vs[5000] = f64::NAN;
        vs[5001] = f64::INFINITY;
        vs[5002] = f64::NEG_INFINITY;
        vs[5003] = 9.0;
        let kept = m4_indices(&xs, &vs, 10, 0.0, 10_000.0);
        for i in 5000..=5003 {
            assert!(kept.contains(&i), "{i} kept");
        }
        // NaN is never taken for a minimum or maximum: the bucket's finite extremes survive.
        let bucket: Vec<usize> = kept
            .into_iter()
            .filter(|&i| (5000..6000).contains(&i))
            .collect();
        assert!(
            bucket.iter().any(|&i| vs[i].is_finite() && vs[i] < -0.9),
            "{bucket:?}"
        );
    }

    #[test]
    fn step_buckets_are_whole_steps_and_outside_points_clamp() {
        let m4: M4<()> = M4::for_steps(10, 0, 99);
        assert_eq!(m4.bucket_of(9.0), 0);
        assert_eq!(m4.bucket_of(10.0), 1);
        assert_eq!(m4.bucket_of(99.0), 9);
        assert_eq!(m4.bucket_of(-5.0), 0);
        assert_eq!(m4.bucket_of(1e300), 9);
        assert_eq!(m4.bucket_of(f64::NAN), 0);
        let flat: M4<()> = M4::new(4, 3.0, 3.0);
        assert_eq!(flat.bucket_of(3.0), 0);
    }

    #[test]
    fn merging_two_halves_is_pushing_them_all() {
        let (xs, mut vs) = series(20_000);
        vs[3] = f64::NAN;
        vs[15_000] = f64::NAN;
        vs[12_345] = 40.0;
        vs[7] = vs[12_001]; // a tie across the halves
        for cut in [0, 1, 9_999, 10_000, 19_999, 20_000] {
            let mut whole = M4::new(37, 0.0, 20_000.0);
            let (mut a, mut b) = (M4::new(37, 0.0, 20_000.0), M4::new(37, 0.0, 20_000.0));
            for i in 0..20_000 {
                whole.push(xs[i], vs[i], i);
                if i < cut {
                    a.push(xs[i], vs[i], i)
                } else {
                    b.push(xs[i], vs[i], i)
                }
            }
            let merged = a.merge(b);
            assert_eq!(merged.len(), 20_000);
            let key = |v: Vec<(usize, f64)>| v.into_iter().map(|(i, _)| i).collect::<Vec<_>>();
            assert_eq!(key(merged.finish()), key(whole.finish()), "cut at {cut}");
        }
    }

    #[test]
    fn the_same_points_give_the_same_answer_however_they_arrive() {
        let (xs, vs) = series(50_000);
        let whole = m4_indices(&xs[..30_000], &vs[..30_000], 50, 0.0, 30_000.0);
        let mut live = M4::new(50, 0.0, 30_000.0);
        for i in 0..30_000 {
            live.push(xs[i], vs[i], i);
        }
        let live: Vec<usize> = live.finish().into_iter().map(|(i, _)| i).collect();
        assert_eq!(whole, live);
    }
}
