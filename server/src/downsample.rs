//! Point budgets for history and range answers, over the one M4 decimation of
//! `stepstream_protocol::decimate` (the same routine the web app draws with).

use stepstream_protocol::decimate::M4;

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

#[cfg(test)]
mod tests {
    use super::*;

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
