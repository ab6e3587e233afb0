//! How `watch` looks: the run list on top (status, step, loss, age; the cursor's row
//! reversed, charted runs marked), the charted metric of the chosen runs below it (Braille
//! lines, each run's last value beside its name), the alerts or the console of the run under
//! the cursor, and the keys at the bottom. Fits 80x24; uses more room when there is more. In
//! monochrome, runs differ by their line's marker instead of their colour.

use super::state::App;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::symbols::Marker;
use ratatui::text::{Line, Span};
use ratatui::widgets::{
    Axis, Block, Borders, Cell, Chart, Dataset, GraphType, Paragraph, Row, Table, TableState,
};
use ratatui::Frame;
use stepstream_protocol::decimate::m4_indices;
use stepstream_protocol::{RunStatus, RunSummary};

const COLOURS: [Color; 8] = [
    Color::Cyan,
    Color::Yellow,
    Color::Magenta,
    Color::Green,
    Color::LightRed,
    Color::LightBlue,
    Color::White,
    Color::LightGreen,
];
const MARKERS: [Marker; 4] = [Marker::Braille, Marker::Dot, Marker::Block, Marker::Bar];
/// In monochrome, the legend's sign for each marker.
const SIGNS: [&str; 4] = ["⣿", "•", "█", "▄"];

const KEYS: &str =
    "q quit  ↑↓ move  space chart  ⏎ only  [ ] metric  + - zoom  ← → pan  0 all  s smooth  c console";

/// A number as the list and legend show it: up to 6 significant digits.
pub fn number(v: f64) -> String {
    if !v.is_finite() {
        return format!("{v}");
    }
    let a = v.abs();
    if a != 0.0 && !(1e-4..1e6).contains(&a) {
        format!("{v:.4e}")
    } else {
        let exponent = if a == 0.0 {
            0
        } else {
            a.log10().floor() as i32
        };
        let keep = (5 - exponent).max(0) as usize;
        let s = format!("{v:.keep$}");
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    }
}

fn age(seconds: f64) -> String {
    let s = seconds.max(0.0);
    if s < 60.0 {
        format!("{s:.0}s")
    } else if s < 3600.0 {
        format!("{:.0}m", s / 60.0)
    } else if s < 86_400.0 {
        format!("{:.1}h", s / 3600.0)
    } else {
        format!("{:.1}d", s / 86_400.0)
    }
}

fn status_colour(s: RunStatus) -> Color {
    match s {
        RunStatus::Running => Color::Green,
        RunStatus::Stale => Color::Yellow,
        RunStatus::Finished => Color::Blue,
        RunStatus::Failed | RunStatus::Killed => Color::Red,
        RunStatus::Stopped => Color::Magenta,
    }
}

/// A run as the list names it: its name, else its id.
fn label(r: &RunSummary) -> String {
    if r.name.is_empty() {
        r.run_id.to_string()
    } else {
        r.name.clone()
    }
}

/// The loss a run list shows: `loss`, else the first metric whose name holds "loss".
fn loss_of(r: &RunSummary) -> Option<f64> {
    r.last_values
        .iter()
        .find(|(n, _)| n == "loss")
        .or_else(|| r.last_values.iter().find(|(n, _)| n.contains("loss")))
        .map(|(_, v)| *v)
}

pub struct Look {
    pub colour: bool,
}

impl Look {
    fn fg(&self, c: Color) -> Style {
        if self.colour {
            Style::default().fg(c)
        } else {
            Style::default()
        }
    }
}

pub fn draw(frame: &mut Frame, app: &mut App, look: &Look) {
    let area = frame.area();
    let list_rows = (app.runs.len() as u16 + 3).clamp(4, (area.height / 3).max(4));
    let bottom = if area.height >= 36 { 8 } else { 4 };
    let [list, chart, legend, panel, keys] = Layout::vertical([
        Constraint::Length(list_rows),
        Constraint::Min(6),
        Constraint::Length((app.chosen.len() as u16).clamp(1, 3)),
        Constraint::Length(bottom),
        Constraint::Length(1),
    ])
    .areas(area);
    app.chart_width = chart.width;
    draw_list(frame, app, look, list);
    draw_chart(frame, app, look, chart);
    draw_legend(frame, app, look, legend);
    draw_panel(frame, app, look, panel);
    frame.render_widget(
        Paragraph::new(KEYS).style(Style::default().add_modifier(Modifier::DIM)),
        keys,
    );
}

fn draw_list(frame: &mut Frame, app: &App, look: &Look, area: Rect) {
    let now = app.now();
    let rows = app.runs.iter().map(|r| {
        let chosen = app.chosen.contains(&r.run_id);
        let at = app.chosen.iter().position(|c| *c == r.run_id).unwrap_or(0);
        let mark = if !chosen {
            " ".to_string()
        } else if look.colour {
            "●".to_string()
        } else {
            SIGNS[at % SIGNS.len()].to_string()
        };
        Row::new(vec![
            Cell::from(mark).style(look.fg(COLOURS[at % COLOURS.len()])),
            Cell::from(r.status.as_str()).style(look.fg(status_colour(r.status))),
            Cell::from(label(r)),
            Cell::from(r.project.clone()),
            Cell::from(r.last_step.map_or("-".into(), |s| s.to_string())),
            Cell::from(loss_of(r).map_or("-".into(), number)),
            Cell::from(r.last_point_at.map_or("-".into(), |t| age(now - t))),
        ])
    });
    let table = Table::new(
        rows,
        [
            Constraint::Length(1),
            Constraint::Length(8),
            Constraint::Fill(3),
            Constraint::Fill(2),
            Constraint::Length(9),
            Constraint::Length(11),
            Constraint::Length(5),
        ],
    )
    .header(
        Row::new(vec!["", "status", "run", "project", "step", "loss", "age"])
            .style(Style::default().add_modifier(Modifier::BOLD)),
    )
    .row_highlight_style(Style::default().add_modifier(Modifier::REVERSED))
    .block(Block::default().borders(Borders::TOP).title(format!(
        " stepstream watch · {} runs · {} ",
        app.runs.len(),
        app.link
    )));
    let mut state = TableState::default().with_selected(Some(app.cursor));
    frame.render_stateful_widget(table, area, &mut state);
}

fn draw_chart(frame: &mut Frame, app: &App, look: &Look, area: Rect) {
    let metric = app.metric.clone().unwrap_or_default();
    let span = app.span();
    let mut title = format!(" {metric} ");
    if let (Some((a, b)), Some(_)) = (span, app.window) {
        title.push_str(&format!("· zoom steps {a}..{b} "));
    }
    if app.smoothing > 0.0 {
        title.push_str(&format!("· smoothing {} ", app.smoothing));
    }
    let block = Block::default().borders(Borders::TOP).title(title);
    let Some((a, b)) = span else {
        frame.render_widget(
            Paragraph::new("no points yet: choose a run with space or enter").block(block),
            area,
        );
        return;
    };
    // What a Braille cell row can show: two points per column, M4-thinned to them (the
    // decimation the hub and the page use), so a frame costs the width, not the run's length.
    let columns = area.width.saturating_sub(10).max(10) as usize * 2;
    let data: Vec<Vec<(f64, f64)>> = app
        .chosen
        .iter()
        .map(|r| {
            let (xs, vs): (Vec<f64>, Vec<f64>) = app
                .points(r)
                .into_iter()
                .filter(|p| p.1.is_finite())
                .map(|(s, v)| (s as f64, v))
                .unzip();
            m4_indices(&xs, &vs, columns, a as f64, b as f64 + 1.0)
                .into_iter()
                .map(|i| (xs[i], vs[i]))
                .collect()
        })
        .collect();
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for &(_, v) in data.iter().flatten() {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        (lo, hi) = (0.0, 1.0);
    }
    let pad = ((hi - lo) * 0.05).max(hi.abs() * 1e-9).max(1e-12);
    let (lo, hi) = (lo - pad, hi + pad);
    let b = if b > a { b } else { a + 1 };
    let datasets: Vec<Dataset> = data
        .iter()
        .enumerate()
        .map(|(i, pts)| {
            Dataset::default()
                .marker(if look.colour {
                    Marker::Braille
                } else {
                    MARKERS[i % MARKERS.len()]
                })
                .graph_type(GraphType::Line)
                .style(look.fg(COLOURS[i % COLOURS.len()]))
                .data(pts)
        })
        .collect();
    let mid = a + (b - a) / 2;
    let chart = Chart::new(datasets)
        .block(block)
        .x_axis(Axis::default().bounds([a as f64, b as f64]).labels([
            a.to_string(),
            mid.to_string(),
            b.to_string(),
        ]))
        .y_axis(Axis::default().bounds([lo, hi]).labels([
            number(lo),
            number((lo + hi) / 2.0),
            number(hi),
        ]));
    frame.render_widget(chart, area);
}

fn draw_legend(frame: &mut Frame, app: &App, look: &Look, area: Rect) {
    let metric = app.metric.clone().unwrap_or_default();
    let lines: Vec<Line> = app
        .chosen
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let sign = if look.colour {
                "━━"
            } else {
                SIGNS[i % SIGNS.len()]
            };
            let name = match app.runs.iter().find(|s| s.run_id == *r) {
                Some(s) if !s.name.is_empty() && s.name != r.as_str() => {
                    format!("{} ({r})", s.name)
                }
                _ => r.to_string(),
            };
            let last = match app.last_value(r) {
                Some((step, v)) => format!("{metric} {} at step {step}", number(v)),
                None => format!("{metric}: no point yet"),
            };
            Line::from(vec![
                Span::styled(format!(" {sign} "), look.fg(COLOURS[i % COLOURS.len()])),
                Span::raw(format!("{name}  {last}")),
            ])
        })
        .collect();
    frame.render_widget(Paragraph::new(lines), area);
}

fn draw_panel(frame: &mut Frame, app: &App, look: &Look, area: Rect) {
    let rows = area.height.saturating_sub(1) as usize;
    if app.show_console {
        let run = app.runs.get(app.cursor).map(|r| r.run_id.clone());
        let lines: Vec<Line> = run
            .as_ref()
            .and_then(|r| app.console.get(r))
            .map(|c| {
                c.iter()
                    .rev()
                    .take(rows)
                    .rev()
                    .map(|l| Line::raw(l.clone()))
                    .collect()
            })
            .unwrap_or_default();
        let title = match &run {
            Some(r) if app.chosen.contains(r) => format!(" console of {r} "),
            Some(r) => format!(" console of {r} (chart it with space to follow it) "),
            None => " console ".into(),
        };
        frame.render_widget(
            Paragraph::new(lines).block(Block::default().borders(Borders::TOP).title(title)),
            area,
        );
        return;
    }
    let lines: Vec<Line> = app
        .alerts
        .iter()
        .take(rows)
        .map(|a| {
            let (word, colour) = if a.fired {
                ("FIRED", Color::Red)
            } else {
                ("resolved", Color::Green)
            };
            Line::from(vec![
                Span::styled(format!("{word:>8} "), look.fg(colour)),
                Span::raw(format!(
                    "{} {} step {}: {}",
                    app.runs
                        .iter()
                        .find(|r| r.run_id == a.run_id)
                        .map_or(a.run_id.to_string(), label),
                    a.rule,
                    a.step,
                    a.message.lines().next().unwrap_or("")
                )),
            ])
        })
        .collect();
    frame.render_widget(
        Paragraph::new(lines).block(
            Block::default()
                .borders(Borders::TOP)
                .title(format!(" alerts ({}) ", app.alerts.len())),
        ),
        area,
    );
}
