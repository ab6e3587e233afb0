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

impl<P: Copy> Bucket<P> {
    /// The point pushed `n`-th joins the bucket.
    fn add(&mut self, n: usize, value: f64, payload: P) {
        let point = Some((n, value, payload));
        self.first.get_or_insert((n, value, payload));
        self.last = point;
        if value.is_nan() {
            self.nan.get_or_insert((n, value, payload));
        } else if value == f64::INFINITY {
            self.pos_inf.get_or_insert((n, value, payload));
        } else if value == f64::NEG_INFINITY {
            self.neg_inf.get_or_insert((n, value, payload));
        } else {
            if self.min.is_none_or(|(_, m, _)| value < m) {
                self.min = point;
            }
            if self.max.is_none_or(|(_, m, _)| value > m) {
                self.max = point;
            }
        }
    }

    fn kept(&self) -> impl Iterator<Item = (usize, f64, P)> {
        [
            self.first,
            self.last,
            self.min,
            self.max,
            self.nan,
            self.pos_inf,
            self.neg_inf,
        ]
        .into_iter()
        .flatten()
    }
}

/// The kept points, in push order, once each.
fn in_push_order<P>(mut keep: Vec<(usize, f64, P)>) -> Vec<(P, f64)> {
    keep.sort_unstable_by_key(|p| p.0);
    keep.dedup_by_key(|p| p.0);
    keep.into_iter().map(|(_, v, p)| (p, v)).collect()
}

/// M4 over buckets of whole steps aligned to multiples of `width` (bucket `k` holds the
/// steps `k * width .. (k + 1) * width`), placed by integer division and kept sparsely, so
/// any steps, however far apart, cost only the buckets they fill.
///
/// This is what makes summaries nest: the M4 of a run at width `W` is the M4, at `W`, of
/// the points its parts kept at any width `w` that divides `W`, pushed part by part in the
/// order the parts were pushed (a bucket of `W` is a union of buckets of `w`, and each kept
/// point keeps its place in the order). The store keeps each pack's M4 at a few widths for
/// whole-run views.
pub struct StepM4<P> {
    width: i64,
    buckets: Vec<Bucket<P>>,
    /// Where each bucket's is in `buckets`, and the last one pushed to (steps mostly come
    /// in order: most pushes skip the map).
    index: std::collections::HashMap<i64, usize>,
    last: Option<(i64, usize)>,
    n: usize,
}

impl<P: Copy> StepM4<P> {
    pub fn new(width: i64) -> StepM4<P> {
        StepM4 {
            width: width.max(1),
            buckets: Vec::new(),
            index: std::collections::HashMap::new(),
            last: None,
            n: 0,
        }
    }

    /// The bucket of `step` at `width`.
    pub fn bucket_of(step: i64, width: i64) -> i64 {
        step.div_euclid(width.max(1))
    }

    pub fn push(&mut self, step: i64, value: f64, payload: P) {
        let key = Self::bucket_of(step, self.width);
        let at = match self.last {
            Some((last, at)) if last == key => at,
            _ => {
                let fresh = self.buckets.len();
                let at = *self.index.entry(key).or_insert(fresh);
                if at == fresh {
                    self.buckets.push(Bucket::default());
                }
                self.last = Some((key, at));
                at
            }
        };
        self.buckets[at].add(self.n, value, payload);
        self.n += 1;
    }

    /// Points pushed so far.
    pub fn len(&self) -> usize {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Buckets holding a point.
    pub fn buckets(&self) -> usize {
        self.buckets.len()
    }

    /// The kept points' payloads and values, in the order they were pushed.
    pub fn finish(self) -> Vec<(P, f64)> {
        in_push_order(self.buckets.iter().flat_map(Bucket::kept).collect())
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
        self.buckets[idx].add(self.n, value, payload);
        self.n += 1;
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
        in_push_order(self.buckets.iter().flat_map(Bucket::kept).collect())
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

    /// A series with spikes, every non-finite value, ties and steps that go back.
    fn rough(n: usize, seed: u64) -> Vec<(i64, f64)> {
        let mut x = seed | 1;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        (0..n)
            .map(|i| {
                let r = rnd();
                let step = if i > n / 2 {
                    i as i64 - (n / 3) as i64
                } else {
                    i as i64
                };
                let v = match r % 97 {
                    0 => f64::NAN,
                    1 => f64::INFINITY,
                    2 => f64::NEG_INFINITY,
                    3 => 1e6,
                    4..=10 => 0.5,
                    _ => ((r >> 11) as f64 / (1u64 << 53) as f64).sin(),
                };
                (step, v)
            })
            .collect()
    }

    #[test]
    fn step_m4_of_parts_kept_at_a_divisor_width_is_step_m4_of_everything() {
        for (n, seed) in [(50_000, 7), (9_999, 12_345)] {
            let points = rough(n, seed);
            for (fine, coarse) in [(16, 64), (1024, 16_384), (1024, 1024), (7, 700)] {
                let mut whole = StepM4::new(coarse);
                for (i, &(s, v)) in points.iter().enumerate() {
                    whole.push(s, v, i);
                }
                // Parts of 4,096 points (packs), each kept at the fine width, then pushed in
                // order into the coarse M4.
                let mut joined = StepM4::new(coarse);
                for (p, part) in points.chunks(4096).enumerate() {
                    let mut m4 = StepM4::new(fine);
                    for (j, &(s, v)) in part.iter().enumerate() {
                        m4.push(s, v, (p * 4096 + j, s));
                    }
                    for ((i, s), v) in m4.finish() {
                        joined.push(s, v, (i, s));
                    }
                }
                let whole: Vec<usize> = whole.finish().into_iter().map(|(i, _)| i).collect();
                let joined: Vec<usize> = joined.finish().into_iter().map(|((i, _), _)| i).collect();
                assert_eq!(whole, joined, "{fine} into {coarse}, {n} points");
            }
        }
    }

    #[test]
    fn step_buckets_are_aligned_to_multiples_of_the_width() {
        assert_eq!(StepM4::<()>::bucket_of(0, 1024), 0);
        assert_eq!(StepM4::<()>::bucket_of(1023, 1024), 0);
        assert_eq!(StepM4::<()>::bucket_of(1024, 1024), 1);
        assert_eq!(StepM4::<()>::bucket_of(-1, 1024), -1);
        assert_eq!(StepM4::<()>::bucket_of(i64::MIN, 1024), i64::MIN / 1024);
        let mut m4 = StepM4::new(10);
        m4.push(i64::MAX, 1.0, ());
        m4.push(i64::MIN, 2.0, ());
        assert_eq!((m4.buckets(), m4.len()), (2, 2));
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
