//! Drawing one metric's chart on a canvas with plotters, several runs overlaid.
//!
//! Before drawing, each series is decimated to first/min/max/last per pixel column of the
//! plot, so a frame costs what the pixels cost. Non-finite values cannot be placed on the
//! axis; they are drawn as red ticks along the top edge so a NaN is never invisible.

use crate::data::Series;
use plotters::prelude::*;
use plotters_canvas::CanvasBackend;
use web_sys::HtmlCanvasElement;

pub const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

pub fn css_color(i: usize) -> String {
    let RGBColor(r, g, b) = PALETTE[i % PALETTE.len()];
    format!("rgb({r},{g},{b})")
}

/// Where the plot landed, to map a mouse position back to a step.
#[derive(Clone, Copy, Debug, Default)]
pub struct Geometry {
    pub left: i32,
    pub right: i32,
    pub x0: f64,
    pub x1: f64,
}

impl Geometry {
    pub fn step_at(&self, px: f64) -> Option<f64> {
        if self.right <= self.left {
            return None;
        }
        let t = (px - self.left as f64) / (self.right - self.left) as f64;
        (0.0..=1.0)
            .contains(&t)
            .then_some(self.x0 + t * (self.x1 - self.x0))
    }
}

/// One run's line on a chart.
pub struct Line<'a> {
    pub label: &'a str,
    pub color: usize,
    pub series: &'a Series,
    /// Steps where an alert fired for this run: drawn as red dashed verticals.
    pub markers: &'a [i64],
}

/// What was drawn, for the page's test hooks.
#[derive(Default, Debug)]
pub struct Drawn {
    pub geometry: Geometry,
    /// Points drawn after decimation, over all lines.
    pub drawn: usize,
    pub last_step: Option<i64>,
    /// Alert markers drawn.
    pub markers: usize,
}

/// Points to draw as a line, and the steps of non-finite values.
type Decimated = (Vec<(f64, f64)>, Vec<f64>);

/// Keeps first, min, max and last of the points in each of `columns` pixel columns; returns
/// them and the steps of non-finite values.
pub fn decimate(s: &Series, x0: f64, x1: f64, columns: usize) -> Decimated {
    let mut out = Vec::with_capacity(columns * 4);
    let mut non_finite = Vec::new();
    let span = (x1 - x0).max(1e-9);
    let columns = columns.max(1) as f64;
    let mut col = i64::MIN;
    // first, min, max, last of the current column
    let mut cur: [(f64, f64); 4] = [(0.0, 0.0); 4];
    let emit = |cur: &[(f64, f64); 4], out: &mut Vec<(f64, f64)>| {
        let mut four = *cur;
        four.sort_by(|a, b| a.0.total_cmp(&b.0));
        for p in four {
            if out.last().is_none_or(|l: &(f64, f64)| l.0 != p.0) {
                out.push(p);
            }
        }
    };
    for (&step, &v) in s.steps.iter().zip(&s.values) {
        let x = step as f64;
        if !v.is_finite() {
            non_finite.push(x);
            continue;
        }
        let c = (((x - x0) / span) * columns) as i64;
        if c != col {
            if col != i64::MIN {
                emit(&cur, &mut out);
            }
            col = c;
            cur = [(x, v); 4];
            continue;
        }
        if v < cur[1].1 {
            cur[1] = (x, v);
        }
        if v > cur[2].1 {
            cur[2] = (x, v);
        }
        cur[3] = (x, v);
    }
    if col != i64::MIN {
        emit(&cur, &mut out);
    }
    (out, non_finite)
}

/// A padded value range; `(0, 1)` when there is nothing (lo > hi) or it is not finite, as
/// plotters would loop forever on an infinite range.
fn nice_range(lo: f64, hi: f64) -> (f64, f64) {
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

/// Draws the chart for `metric`; `lines` may be empty (an empty frame with a caption).
pub fn draw(canvas: &HtmlCanvasElement, metric: &str, lines: &[Line<'_>]) -> Option<Drawn> {
    let width = canvas.client_width().max(200) as u32;
    let height = canvas.client_height().max(120) as u32;
    if canvas.width() != width || canvas.height() != height {
        canvas.set_width(width);
        canvas.set_height(height);
    }
    let (mut x0, mut x1) = (f64::MAX, f64::MIN);
    for l in lines {
        if let (Some(&a), Some(&b)) = (l.series.steps.first(), l.series.steps.last()) {
            x0 = x0.min(a as f64);
            x1 = x1.max(b as f64);
        }
    }
    if x0 > x1 {
        (x0, x1) = (0.0, 1.0);
    }
    if x1 - x0 < 1.0 {
        x1 = x0 + 1.0;
    }
    // Leave room for the axis labels: the plot is about width - 70 pixels wide.
    let columns = width.saturating_sub(70).max(10) as usize;
    let decimated: Vec<Decimated> = lines
        .iter()
        .map(|l| decimate(l.series, x0, x1, columns))
        .collect();
    let (mut y0, mut y1) = (f64::MAX, f64::MIN);
    for (pts, _) in &decimated {
        for &(_, y) in pts {
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
    }
    let (y0, y1) = nice_range(y0, y1);

    let backend = CanvasBackend::with_canvas_object(canvas.clone())?;
    let root = backend.into_drawing_area();
    root.fill(&WHITE).ok()?;
    let mut chart = ChartBuilder::on(&root)
        .margin(8)
        .caption(metric, ("sans-serif", 14))
        .x_label_area_size(22)
        .y_label_area_size(58)
        .build_cartesian_2d(x0..x1, y0..y1)
        .ok()?;
    chart
        .configure_mesh()
        .x_labels(6)
        .y_labels(5)
        .x_label_formatter(&|x| format!("{:.0}", x))
        .y_label_formatter(&|y| {
            if y.abs() >= 1e4 || (y.abs() < 1e-3 && *y != 0.0) {
                format!("{y:.2e}")
            } else {
                format!("{y:.4}")
            }
        })
        .light_line_style(RGBColor(238, 238, 238))
        .label_style(("sans-serif", 11))
        .draw()
        .ok()?;
    let mut drawn = Drawn::default();
    for (l, (pts, bad)) in lines.iter().zip(&decimated) {
        let color = PALETTE[l.color % PALETTE.len()];
        drawn.drawn += pts.len();
        drawn.last_step = drawn.last_step.max(l.series.last_step());
        let series = chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .ok()?;
        if lines.len() > 1 {
            series.label(l.label.to_string()).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
            });
        }
        for &x in bad {
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(x, y1), (x, y1 - (y1 - y0) * 0.06)],
                    RED.stroke_width(2),
                )))
                .ok()?;
        }
    }
    for l in lines {
        for &m in l.markers {
            let x = m as f64;
            if x < x0 || x > x1 {
                continue;
            }
            drawn.markers += 1;
            let dash = (y1 - y0) / 20.0;
            let segments = (0..10).map(|k| {
                let a = y0 + dash * (2 * k) as f64;
                PathElement::new(vec![(x, a), (x, a + dash)], RED.stroke_width(1))
            });
            chart.draw_series(segments).ok()?;
        }
    }
    if lines.len() > 1 {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(200, 200, 200))
            .label_font(("sans-serif", 11))
            .position(SeriesLabelPosition::UpperRight)
            .draw()
            .ok()?;
    }
    let (xr, _) = chart.plotting_area().get_pixel_range();
    drawn.geometry = Geometry {
        left: xr.start,
        right: xr.end,
        x0,
        x1,
    };
    root.present().ok()?;
    Some(drawn)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_or_extreme_ranges_are_safe() {
        assert_eq!(nice_range(f64::MAX, f64::MIN), (0.0, 1.0));
        assert_eq!(nice_range(-f64::MAX, f64::MAX), (0.0, 1.0));
        let (a, b) = nice_range(1.0, 1.0);
        assert!(a < 1.0 && b > 1.0);
    }

    #[test]
    fn decimation_is_per_column_and_keeps_extremes() {
        let mut s = Series::default();
        for i in 0..100_000i64 {
            s.steps.push(i);
            s.values.push(if i == 5_000 {
                50.0
            } else {
                (i as f64 * 0.001).sin()
            });
        }
        s.steps.push(100_000);
        s.values.push(f64::NAN);
        let (pts, bad) = decimate(&s, 0.0, 100_000.0, 500);
        assert!(pts.len() <= 500 * 4, "{}", pts.len());
        assert!(pts.iter().any(|&(x, y)| x == 5000.0 && y == 50.0));
        assert_eq!(bad, vec![100_000.0]);
        assert!(pts.windows(2).all(|w| w[0].0 <= w[1].0));
    }
}
