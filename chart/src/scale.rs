//! Axes: the x axis modes, the y range (padded, logarithmic, or ignoring outliers) and how
//! values are written on the axes.

/// What the x axis measures; one choice for every chart of the page.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Axis {
    #[default]
    Step,
    /// Wall time, the viewer's local clock.
    Wall,
    /// Seconds since the run started.
    Relative,
    /// A metric of each run (tokens seen, samples, epoch): the page joins each line's points
    /// to that metric's value at the same step; the chart only places and labels them.
    Metric,
}

impl Axis {
    pub fn code(self) -> &'static str {
        match self {
            Axis::Step => "step",
            Axis::Wall => "wall",
            Axis::Relative => "relative",
            Axis::Metric => "metric",
        }
    }

    pub fn parse(s: &str) -> Option<Axis> {
        Some(match s {
            "step" => Axis::Step,
            "wall" => Axis::Wall,
            "relative" => Axis::Relative,
            "metric" => Axis::Metric,
            _ => return None,
        })
    }

    /// A point's x: its step, its wall time (unix seconds) or seconds since `started`; on
    /// a metric axis its step (the caller joins the metric's values, which it alone holds).
    pub fn x(self, step: i64, time: f64, started: f64) -> f64 {
        match self {
            Axis::Step | Axis::Metric => step as f64,
            Axis::Wall => time,
            Axis::Relative => time - started,
        }
    }

    /// An x value as an axis label.
    pub fn label(self, x: f64) -> String {
        match self {
            Axis::Step => format!("{x:.0}"),
            Axis::Wall => clock(x),
            Axis::Relative => duration(x),
            Axis::Metric => compact(x),
        }
    }
}

/// `950`, `12.5k`, `3.2M`, `1.05G`, `0.25`: a count such as tokens seen, short.
pub fn compact(v: f64) -> String {
    if !v.is_finite() {
        return format!("{v}");
    }
    let a = v.abs();
    let (scaled, unit) = match a {
        a if a >= 1e12 => (v / 1e12, "T"),
        a if a >= 1e9 => (v / 1e9, "G"),
        a if a >= 1e6 => (v / 1e6, "M"),
        a if a >= 1e4 => (v / 1e3, "k"),
        _ => (v, ""),
    };
    let digits = match scaled.abs() {
        s if s >= 100.0 || (unit.is_empty() && s == s.trunc()) => 0,
        s if s >= 10.0 => 1,
        _ => 2,
    };
    format!("{scaled:.digits$}{unit}")
}

/// `HH:MM:SS` of a unix time on the viewer's clock.
pub fn clock(unix: f64) -> String {
    let d = js_sys::Date::new(&wasm_bindgen::JsValue::from_f64(unix * 1000.0));
    format!(
        "{:02}:{:02}:{:02}",
        d.get_hours(),
        d.get_minutes(),
        d.get_seconds()
    )
}

/// `1h02m`, `3m05s`, `12s`, `0.4s`.
pub fn duration(seconds: f64) -> String {
    if !seconds.is_finite() {
        return String::new();
    }
    let sign = if seconds < 0.0 { "-" } else { "" };
    if seconds.abs() < 10.0 {
        return format!("{sign}{:.1}s", seconds.abs());
    }
    let s = seconds.abs().round() as i64;
    if s >= 3600 {
        format!("{sign}{}h{:02}m", s / 3600, s / 60 % 60)
    } else if s >= 60 {
        format!("{sign}{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{sign}{s}s")
    }
}

/// A value for an axis label or a tooltip.
pub fn value(v: f64) -> String {
    if !v.is_finite() {
        format!("{v}")
    } else if v != 0.0 && (v.abs() >= 1e5 || v.abs() < 1e-3) {
        format!("{v:.3e}")
    } else {
        format!("{v:.4}")
    }
}

/// A y-axis label: as many decimals as the axis's span needs to tell its ticks apart.
pub fn tick(v: f64, span: f64) -> String {
    if !v.is_finite() || !span.is_finite() || span <= 0.0 {
        return value(v);
    }
    if v != 0.0 && (v.abs() >= 1e5 || v.abs() < 1e-4 && span < 1e-4) {
        let digits = ((v.abs().log10() - span.log10()).ceil().max(0.0) as usize + 1).min(10);
        return format!("{v:.digits$e}");
    }
    let decimals = (2.0 - span.log10().floor()).clamp(0.0, 12.0) as usize;
    format!("{v:.decimals$}")
}

/// Where a value goes on the y axis: itself, or its log10 (`None` when it has no place:
/// non-finite, or not positive on a log axis).
pub fn to_y(v: f64, log: bool) -> Option<f64> {
    if !v.is_finite() {
        None
    } else if log {
        (v > 0.0).then(|| v.log10())
    } else {
        Some(v)
    }
}

/// A padded range around `ys`; `(0, 1)` when there is nothing or it is not finite, as
/// plotters would loop forever on an infinite range. With `robust`, the range spans the
/// 1st to 99th percentile, so one spike does not flatten the rest of the curve.
pub fn y_range(ys: &mut [f64], robust: bool) -> (f64, f64) {
    if ys.is_empty() {
        return (0.0, 1.0);
    }
    let (lo, hi) = if robust && ys.len() >= 20 {
        ys.sort_unstable_by(f64::total_cmp);
        let q = |p: f64| ys[((ys.len() - 1) as f64 * p).round() as usize];
        (q(0.01), q(0.99))
    } else {
        let lo = ys.iter().copied().fold(f64::MAX, f64::min);
        let hi = ys.iter().copied().fold(f64::MIN, f64::max);
        (lo, hi)
    };
    pad(lo, hi)
}

fn pad(lo: f64, hi: f64) -> (f64, f64) {
    if lo > hi || !(hi - lo).is_finite() {
        return (0.0, 1.0);
    }
    if (hi - lo).abs() < 1e-12 {
        let pad = lo.abs().max(1e-3) * 0.05;
        return (lo - pad, hi + pad);
    }
    let pad = (hi - lo) * 0.05;
    (lo - pad, hi + pad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_or_extreme_ranges_are_safe() {
        assert_eq!(y_range(&mut [], false), (0.0, 1.0));
        assert_eq!(y_range(&mut [-f64::MAX, f64::MAX], false), (0.0, 1.0));
        let (a, b) = y_range(&mut [1.0, 1.0], false);
        assert!(a < 1.0 && b > 1.0);
    }

    #[test]
    fn robust_range_ignores_a_spike() {
        let mut ys: Vec<f64> = (0..1000)
            .map(|i| 1.0 + (i as f64 * 0.1).sin() * 0.1)
            .collect();
        ys[500] = 1000.0;
        let (_, hi) = y_range(&mut ys.clone(), false);
        assert!(hi > 1000.0);
        let (_, hi) = y_range(&mut ys, true);
        assert!(hi < 2.0, "{hi}");
    }

    #[test]
    fn log_axis_places_only_positive_values() {
        assert_eq!(to_y(100.0, true), Some(2.0));
        assert_eq!(to_y(0.0, true), None);
        assert_eq!(to_y(-1.0, false), Some(-1.0));
        assert_eq!(to_y(f64::NAN, false), None);
        assert_eq!(duration(3725.0), "1h02m");
        assert_eq!(duration(65.0), "1m05s");
        assert_eq!(duration(0.44), "0.4s");
        // A flat 1e-3 line padded by 5%: its ticks differ in the label.
        assert_ne!(tick(0.00099, 1e-4), tick(0.00101, 1e-4));
        assert_eq!(tick(0.5, 1.0), "0.50");
        assert_eq!(tick(1500.0, 1000.0), "1500");
    }

    #[test]
    fn counts_are_written_short() {
        assert_eq!(compact(950.0), "950");
        assert_eq!(compact(12_500.0), "12.5k");
        assert_eq!(compact(3_200_000.0), "3.20M");
        assert_eq!(compact(1.05e9), "1.05G");
        assert_eq!(compact(0.25), "0.25");
        assert_eq!(compact(-2e6), "-2.00M");
        assert_eq!(Axis::parse("metric"), Some(Axis::Metric));
    }
}
