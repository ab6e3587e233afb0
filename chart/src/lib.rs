//! What every browser view of a run shares, the web app and the embeddable widget alike:
//! one viewer client (`client`: what is wanted, the run list, resuming, dispatch), the points
//! held (`data`), the self-healing viewer socket (`ws`), and drawing one chart on a canvas with plotters (this module): several
//! lines overlaid, decimated per pixel column with the protocol's M4 (the hub's own
//! decimation), crisp on HiDPI screens. No Leptos here: the widget's bundle stays small.
//!
//! * `scale` — x axis modes, y ranges (log, ignoring outliers), labels.
//! * `measured` — the canvas backend, measuring text on the canvas, not in the page.
//! * `theme` — light and dark colours, stable colours per run.
//!
//! Non-finite values cannot be placed on the axis: they are drawn as ticks along the top
//! edge so a NaN is never invisible; points outside an outlier-ignoring range are clamped
//! to its edge and marked there with a triangle.

pub mod client;
pub mod data;
mod measured;
pub mod scale;
pub mod theme;
pub mod ws;

use plotters::prelude::*;
pub use plotters::style::RGBColor;
use scale::{to_y, y_range, Axis};
use stepstream_protocol::decimate::m4_indices;
use theme::Theme;
use web_sys::HtmlCanvasElement;

/// Where the plot landed, to map the mouse to data and back. Pixels are CSS pixels.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Geometry {
    pub left: f64,
    pub right: f64,
    pub top: f64,
    pub bottom: f64,
    pub x0: f64,
    pub x1: f64,
    pub y0: f64,
    pub y1: f64,
    pub log: bool,
}

impl Geometry {
    /// The x value under a CSS pixel column, if inside the plot.
    pub fn x_at(&self, px: f64) -> Option<f64> {
        if self.right <= self.left {
            return None;
        }
        let t = (px - self.left) / (self.right - self.left);
        (-0.001..=1.001)
            .contains(&t)
            .then_some(self.x0 + t.clamp(0.0, 1.0) * (self.x1 - self.x0))
    }

    /// The x value under a pixel column, clamped to the plot.
    pub fn x_clamped(&self, px: f64) -> f64 {
        let t = ((px - self.left) / (self.right - self.left).max(1.0)).clamp(0.0, 1.0);
        self.x0 + t * (self.x1 - self.x0)
    }

    pub fn px(&self, x: f64) -> f64 {
        self.left + (x - self.x0) / (self.x1 - self.x0) * (self.right - self.left)
    }

    /// The pixel row of a value (its log on a log chart), if it can be placed.
    pub fn py(&self, v: f64) -> Option<f64> {
        let y = to_y(v, self.log)?.clamp(self.y0, self.y1);
        Some(self.bottom - (y - self.y0) / (self.y1 - self.y0) * (self.bottom - self.top))
    }
}

/// One line on a chart: parallel arrays in step order.
pub struct Line<'a> {
    pub label: &'a str,
    pub color: RGBColor,
    pub xs: &'a [f64],
    /// Whether `xs` ascends (always on the step and time axes). A metric used as x may go
    /// back (tokens counted again after a restart): such a line is drawn as it goes, in step
    /// order, and decimated over its points' order instead of over x.
    pub ordered: bool,
    pub steps: &'a [i64],
    pub values: &'a [f64],
    /// The smoothed values, drawn over a faint raw line, when smoothing is on.
    pub smoothed: Option<&'a [f64]>,
    /// A band around the line (a group's min-max or +/- std), lower and upper edges
    /// parallel to `xs`: filled faintly in the line's colour, under every line.
    pub band: Option<(&'a [f64], &'a [f64])>,
    /// x of the alerts that fired on this line's run: dashed verticals.
    pub markers: &'a [f64],
    /// x of the commands its training acted on (a note, a checkpoint, a stop), each with
    /// what to write by it (the note's text): dotted verticals in the note colour.
    pub notes: &'a [(f64, String)],
}

/// How to draw a chart.
pub struct Options<'a> {
    pub title: &'a str,
    /// The x window; the lines' whole extent when `None` (following the live edge).
    pub window: Option<(f64, f64)>,
    pub axis: Axis,
    pub log: bool,
    /// y range from the 1st to the 99th percentile; the points beyond are marked.
    pub robust: bool,
    pub theme: &'a Theme,
    pub legend: bool,
    /// The canvas's CSS size when the caller read it already: reading it again after the
    /// previous chart's canvas was resized would lay the page out once more per chart.
    pub css_size: Option<(i32, i32)>,
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
    /// Command (note) markers drawn.
    pub notes: usize,
    /// Points outside an outlier-ignoring range, marked at its edge.
    pub clipped: usize,
    /// Non-finite values marked along the top.
    pub non_finite: usize,
}

/// The indices of `xs` inside `[x0, x1]`, with one neighbour each side so a line runs to the
/// edge of the plot (all of them when `xs` does not ascend).
fn visible(xs: &[f64], ordered: bool, x0: f64, x1: f64) -> std::ops::Range<usize> {
    if !ordered {
        return 0..xs.len();
    }
    let a = xs.partition_point(|&x| x < x0).saturating_sub(1);
    let b = (xs.partition_point(|&x| x <= x1) + 1).min(xs.len());
    a..b.max(a)
}

/// The x extent of all lines.
pub fn extent(lines: &[Line<'_>]) -> Option<(f64, f64)> {
    let (mut x0, mut x1) = (f64::MAX, f64::MIN);
    for l in lines {
        let ends = [l.xs.first(), l.xs.last()];
        let all = (!l.ordered).then_some(l.xs.iter()).into_iter().flatten();
        for x in ends.into_iter().flatten().chain(all) {
            if x.is_finite() {
                x0 = x0.min(*x);
                x1 = x1.max(*x);
            }
        }
    }
    (x0 <= x1).then_some((x0, x1))
}

/// Sizes the canvas's backing store to its CSS size times the device pixel ratio; returns
/// the ratio.
pub fn fit(canvas: &HtmlCanvasElement) -> f64 {
    fit_to(canvas, (canvas.client_width(), canvas.client_height()))
}

/// [`fit`] to a CSS size already read.
fn fit_to(canvas: &HtmlCanvasElement, (css_width, css_height): (i32, i32)) -> f64 {
    let dpr = web_sys::window()
        .map(|w| w.device_pixel_ratio())
        .unwrap_or(1.0)
        .clamp(1.0, 4.0);
    let width = (css_width.max(200) as f64 * dpr).round() as u32;
    let height = (css_height.max(120) as f64 * dpr).round() as u32;
    if canvas.width() != width || canvas.height() != height {
        canvas.set_width(width);
        canvas.set_height(height);
    }
    dpr
}

/// Draws a chart; `lines` may be empty (an empty frame with a caption).
pub fn draw(canvas: &HtmlCanvasElement, lines: &[Line<'_>], o: &Options<'_>) -> Option<Drawn> {
    let css = o
        .css_size
        .unwrap_or_else(|| (canvas.client_width(), canvas.client_height()));
    let dpr = fit_to(canvas, css);
    let px = |v: f64| (v * dpr).round() as u32;
    let (mut x0, mut x1) = o.window.or_else(|| extent(lines)).unwrap_or((0.0, 1.0));
    if x1 - x0 < 1e-9 {
        x1 = x0 + 1.0;
    }
    if !(x1 - x0).is_finite() {
        (x0, x1) = (0.0, 1.0);
    }
    // The plot is about the CSS width less the axis labels, one bucket per pixel column.
    let columns = ((css.0.max(200) - 70).max(10) as f64 * dpr) as usize;

    struct Kept {
        raw: Vec<(f64, f64)>,
        smooth: Vec<(f64, f64)>,
        bad: Vec<f64>,
    }
    let mut ys = Vec::new();
    let kept: Vec<Kept> = lines
        .iter()
        .map(|l| {
            let r = visible(l.xs, l.ordered, x0, x1);
            let idx = if l.ordered {
                m4_indices(&l.xs[r.clone()], &l.values[r.clone()], columns, x0, x1)
            } else {
                // Buckets of consecutive points: each keeps its first, last, lowest and
                // highest, so the line's shape and extremes survive whatever x does.
                let order: Vec<f64> = (0..r.len()).map(|i| i as f64).collect();
                m4_indices(&order, &l.values[r.clone()], columns, 0.0, r.len() as f64)
            };
            let mut k = Kept {
                raw: Vec::with_capacity(idx.len()),
                smooth: Vec::new(),
                bad: Vec::new(),
            };
            for i in idx.into_iter().map(|i| i + r.start) {
                let x = l.xs[i];
                match to_y(l.values[i], o.log) {
                    Some(y) => k.raw.push((x, y)),
                    None if !l.values[i].is_finite() => k.bad.push(x),
                    None => {}
                }
                if let Some(y) = l.smoothed.and_then(|s| to_y(s[i], o.log)) {
                    k.smooth.push((x, y));
                }
            }
            let inside = |p: &&(f64, f64)| p.0 >= x0 && p.0 <= x1;
            ys.extend(k.raw.iter().filter(inside).map(|p| p.1));
            ys.extend(k.smooth.iter().filter(inside).map(|p| p.1));
            if let Some((lo, hi)) = l.band {
                for (i, x) in l.xs.iter().enumerate() {
                    if (x0..=x1).contains(x) {
                        ys.extend([lo[i], hi[i]].into_iter().filter_map(|v| to_y(v, o.log)));
                    }
                }
            }
            k
        })
        .collect();
    let (y0, y1) = y_range(&mut ys, o.robust);
    let decimated_at = web_sys::window()
        .and_then(|w| w.performance())
        .map_or(0.0, |p| p.now());

    let backend = measured::Measured::new(canvas)?;
    let root = backend.into_drawing_area();
    let t = o.theme;
    root.fill(&t.background).ok()?;
    let font = |size: f64| ("sans-serif", size * dpr).into_font().color(&t.text);
    let log = o.log;
    let mut chart = ChartBuilder::on(&root)
        .margin(px(8.0))
        .caption(o.title, font(14.0))
        .x_label_area_size(px(22.0))
        .y_label_area_size(px(58.0))
        .build_cartesian_2d(x0..x1, y0..y1)
        .ok()?;
    let axis = o.axis;
    chart
        .configure_mesh()
        .x_labels(6)
        .y_labels(5)
        .x_label_formatter(&|x| axis.label(*x))
        .y_label_formatter(&|y| {
            if log {
                scale::value(10f64.powf(*y))
            } else {
                scale::tick(*y, y1 - y0)
            }
        })
        .bold_line_style(t.grid.stroke_width(px(1.0)))
        // No minor grid: each of its lines is a stroke per frame for little information.
        .max_light_lines(0)
        .axis_style(t.axis.stroke_width(px(1.0)))
        .label_style(font(11.0))
        .draw()
        .ok()?;
    let mut drawn = Drawn::default();
    let clamp = |p: &(f64, f64)| (p.0, p.1.clamp(y0, y1));
    let width = |w: f64| (w * dpr).max(1.0) as u32;
    // Bands first, so every line is drawn over them. A gap in a band (no member there, or
    // an edge that cannot be placed) splits it.
    for l in lines {
        let Some((lo, hi)) = l.band else {
            continue;
        };
        let mut part: Vec<(f64, f64, f64)> = Vec::new();
        let fill = |part: &mut Vec<(f64, f64, f64)>| {
            let outline: Vec<(f64, f64)> = part
                .iter()
                .map(|p| (p.0, p.2))
                .chain(part.iter().rev().map(|p| (p.0, p.1)))
                .map(|p| clamp(&p))
                .collect();
            part.clear();
            (outline.len() >= 4).then_some(outline)
        };
        let mut polygons = Vec::new();
        for i in 0..l.xs.len().min(lo.len()).min(hi.len()) {
            match (to_y(lo[i], o.log), to_y(hi[i], o.log)) {
                (Some(a), Some(b)) => part.push((l.xs[i], a, b)),
                _ => polygons.extend(fill(&mut part)),
            }
        }
        polygons.extend(fill(&mut part));
        let style = l.color.mix(0.18).filled();
        for outline in polygons {
            chart
                .draw_series(std::iter::once(Polygon::new(outline, style)))
                .ok()?;
        }
    }
    for (l, k) in lines.iter().zip(&kept) {
        let color = l.color;
        drawn.drawn += k.raw.len();
        drawn.last_step = drawn.last_step.max(l.steps.last().copied());
        let smoothing = l.smoothed.is_some();
        let raw_style = if smoothing {
            color.mix(0.25).stroke_width(width(1.0))
        } else {
            color.stroke_width(width(1.5))
        };
        let series = chart
            .draw_series(LineSeries::new(k.raw.iter().map(clamp), raw_style))
            .ok()?;
        if !smoothing && o.legend {
            series.label(l.label.to_string()).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
            });
        }
        if smoothing {
            let s = chart
                .draw_series(LineSeries::new(
                    k.smooth.iter().map(clamp),
                    color.stroke_width(width(2.0)),
                ))
                .ok()?;
            if o.legend {
                s.label(l.label.to_string()).legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
                });
            }
        }
        if o.robust {
            let tri = (y1 - y0) * 0.03;
            for &(x, y) in k.raw.iter().filter(|p| p.0 >= x0 && p.0 <= x1) {
                let (edge, dir) = if y > y1 {
                    (y1, -1.0)
                } else if y < y0 {
                    (y0, 1.0)
                } else {
                    continue;
                };
                drawn.clipped += 1;
                chart
                    .draw_series(std::iter::once(Polygon::new(
                        vec![
                            (x, edge),
                            (x - (x1 - x0) * 0.004, edge + dir * tri),
                            (x + (x1 - x0) * 0.004, edge + dir * tri),
                        ],
                        color.filled(),
                    )))
                    .ok()?;
            }
        }
        for &x in k.bad.iter().filter(|&&x| x >= x0 && x <= x1) {
            drawn.non_finite += 1;
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(x, y1), (x, y1 - (y1 - y0) * 0.06)],
                    t.alert.stroke_width(width(2.0)),
                )))
                .ok()?;
        }
    }
    for l in lines {
        for &x in l.markers.iter().filter(|&&x| x >= x0 && x <= x1) {
            drawn.markers += 1;
            let dash = (y1 - y0) / 20.0;
            let segments = (0..10).map(|k| {
                let a = y0 + dash * (2 * k) as f64;
                PathElement::new(
                    vec![(x, a), (x, a + dash)],
                    t.alert.stroke_width(width(1.0)),
                )
            });
            chart.draw_series(segments).ok()?;
        }
        for (x, label) in l.notes.iter().filter(|(x, _)| *x >= x0 && *x <= x1) {
            let x = *x;
            drawn.notes += 1;
            let dot = (y1 - y0) / 40.0;
            let segments = (0..20).map(|k| {
                let a = y0 + dot * (2 * k) as f64;
                PathElement::new(vec![(x, a), (x, a + dot)], t.note.stroke_width(width(1.5)))
            });
            chart.draw_series(segments).ok()?;
            // What it was, by its top: a note's first words.
            let mut text: String = label.chars().take(24).collect();
            if label.chars().count() > 24 {
                text.push('…');
            }
            chart
                .draw_series(std::iter::once(Text::new(
                    text,
                    (x, y1),
                    font(10.0).color(&t.note),
                )))
                .ok()?;
        }
    }
    if o.legend && lines.len() > 1 {
        chart
            .configure_series_labels()
            .background_style(t.background.mix(0.85))
            .border_style(t.grid)
            .label_font(font(11.0))
            .position(SeriesLabelPosition::UpperRight)
            .draw()
            .ok()?;
    }
    let (xr, yr) = chart.plotting_area().get_pixel_range();
    drawn.geometry = Geometry {
        left: xr.start as f64 / dpr,
        right: xr.end as f64 / dpr,
        top: yr.start as f64 / dpr,
        bottom: yr.end as f64 / dpr,
        x0,
        x1,
        y0,
        y1,
        log,
    };
    root.present().ok()?;
    let done = web_sys::window()
        .and_then(|w| w.performance())
        .map_or(0.0, |p| p.now());
    let _ = canvas.set_attribute("data-render-ms", &format!("{:.2}", done - decimated_at));
    Some(drawn)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visible_keeps_one_neighbour_each_side() {
        let xs: Vec<f64> = (0..100).map(|i| i as f64).collect();
        assert_eq!(visible(&xs, true, 10.0, 20.0), 9..22);
        assert_eq!(visible(&xs, true, -5.0, 3.0), 0..5);
        assert_eq!(visible(&xs, true, 200.0, 300.0), 99..100);
        assert_eq!(visible(&[], true, 0.0, 1.0), 0..0);
        // An x that goes back: every point may be in the window.
        assert_eq!(visible(&[5.0, 1.0, 9.0], false, 2.0, 3.0), 0..3);
    }

    #[test]
    fn the_extent_of_a_line_going_back_spans_all_its_points() {
        let line = |xs: &'static [f64], ordered| Line {
            label: "",
            color: RGBColor(0, 0, 0),
            xs,
            ordered,
            steps: &[],
            values: &[],
            smoothed: None,
            band: None,
            markers: &[],
            notes: &[],
        };
        assert_eq!(
            extent(&[line(&[5.0, 20.0, 1.0, 9.0], false)]),
            Some((1.0, 20.0))
        );
        assert_eq!(extent(&[line(&[1.0, 5.0, 9.0], true)]), Some((1.0, 9.0)));
    }

    #[test]
    fn geometry_maps_both_ways() {
        let g = Geometry {
            left: 50.0,
            right: 150.0,
            top: 0.0,
            bottom: 100.0,
            x0: 0.0,
            x1: 1000.0,
            y0: 0.0,
            y1: 2.0,
            log: false,
        };
        assert_eq!(g.x_at(100.0), Some(500.0));
        assert_eq!(g.x_at(400.0), None);
        assert_eq!(g.px(500.0), 100.0);
        assert_eq!(g.py(1.0), Some(50.0));
    }
}
