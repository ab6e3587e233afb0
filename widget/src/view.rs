//! One widget on the page: its element (a canvas and a status line), what state it is in,
//! and drawing its lines with the web app's chart code.
//!
//! The box always says why it is empty: loading, live, stale, finished, not found,
//! refused, unreachable (with the next retry), or what was wrong with its options. The
//! element carries test hooks: `data-state`, `data-points`, `data-drawn`, `data-last-step`,
//! `data-socket` (the shared socket's serial), `data-message`, `data-first-draw-ms`.

use crate::connection::{self, Connection, Probe, Shown};
use crate::options::{Options, Panel, ThemeChoice};

fn panel_code(p: Panel) -> &'static str {
    match p {
        Panel::Chart => "chart",
        Panel::Console => "console",
        Panel::Text => "text",
        Panel::Image => "image",
    }
}
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use stepstream_chart::scale::Axis;
use stepstream_chart::ws::Link;
use stepstream_chart::{data, theme, Line};
use stepstream_protocol::RunStatus;
use wasm_bindgen::JsCast;
use web_sys::{HtmlCanvasElement, HtmlElement};

/// What the widget is showing, worst first when its runs disagree.
#[derive(Clone, Debug, PartialEq)]
pub enum State {
    Refused(String),
    NotFound(String),
    Unreachable { retry_s: f64 },
    Loading(&'static str),
    Stale { quiet_s: f64 },
    Ended(RunStatus),
    Snapshot,
    Live,
}

impl State {
    pub fn code(&self) -> &'static str {
        match self {
            State::Refused(_) => "refused",
            State::NotFound(_) => "not-found",
            State::Unreachable { .. } => "unreachable",
            State::Loading(_) => "loading",
            State::Stale { .. } => "stale",
            State::Ended(s) => s.as_str(),
            State::Snapshot => "snapshot",
            State::Live => "live",
        }
    }

    fn rank(&self) -> u8 {
        match self {
            State::Refused(_) => 0,
            State::NotFound(_) => 1,
            State::Unreachable { .. } => 2,
            State::Loading(_) => 3,
            State::Stale { .. } => 4,
            State::Ended(_) => 5,
            State::Snapshot => 6,
            State::Live => 7,
        }
    }

    fn text(&self, hub: &str) -> String {
        match self {
            State::Refused(why) if why.is_empty() => format!("refused by the hub at {hub}"),
            State::Refused(why) => format!("refused: {why}"),
            State::NotFound(run) => format!("run {run} is not on {hub} (yet): waiting for it"),
            State::Unreachable { retry_s } => {
                format!("hub unreachable at {hub}; retrying in {retry_s:.0} s")
            }
            State::Loading(what) => format!("loading: {what}"),
            State::Stale { quiet_s } => format!("stale: no data for {quiet_s:.0} s"),
            State::Ended(s) => format!("run {}", s.as_str()),
            State::Snapshot => "snapshot (not following new points)".into(),
            State::Live => "live".into(),
        }
    }
}

pub struct View {
    pub id: u32,
    pub opts: Options,
    root: HtmlElement,
    canvas: HtmlCanvasElement,
    /// A console, text or image panel's content (the canvas stays empty then).
    panel: HtmlElement,
    status: HtmlElement,
    conn: Rc<RefCell<Connection>>,
    drawn_version: Cell<u64>,
    drawn_size: Cell<(i32, i32)>,
    drawn_second: Cell<i64>,
    pub closed: Cell<bool>,
    pub state: RefCell<String>,
    pub points: Cell<u64>,
}

fn element(tag: &str) -> HtmlElement {
    web_sys::window()
        .and_then(|w| w.document())
        .and_then(|d| d.create_element(tag).ok())
        .and_then(|e| e.dyn_into().ok())
        .expect("a document")
}

/// Replaces the element's contents with a message (bad options: nothing to connect to).
pub fn show_error(root: &HtmlElement, message: &str) {
    root.set_text_content(Some(&format!("stepstream: {message}")));
    let _ = root.set_attribute("data-state", "error");
    let _ = root.set_attribute("data-message", message);
    let _ = root
        .style()
        .set_property("font", "12px system-ui, sans-serif");
    let _ = root.style().set_property("color", "#b3261e");
}

impl View {
    pub fn new(id: u32, root: HtmlElement, opts: Options) -> View {
        root.set_text_content(None);
        let style = root.style();
        let _ = style.set_property("display", "block");
        let _ = style.set_property("position", "relative");
        let canvas: HtmlCanvasElement = element("canvas").unchecked_into();
        let cs = canvas.style();
        let _ = cs.set_property("display", "block");
        let _ = cs.set_property("width", "100%");
        let _ = cs.set_property("height", &format!("{}px", opts.height));
        let panel = element("div");
        if opts.panel != Panel::Chart {
            let _ = cs.set_property("display", "none");
            let ps = panel.style();
            let _ = ps.set_property("height", &format!("{}px", opts.height));
            let _ = ps.set_property("overflow", "auto");
            let _ = ps.set_property("font", "12px/1.45 ui-monospace, Menlo, Consolas, monospace");
            let _ = ps.set_property("white-space", "pre-wrap");
            let _ = panel.set_attribute("data-panel", panel_code(opts.panel));
        }
        let status = element("div");
        let ss = status.style();
        let _ = ss.set_property("font", "12px system-ui, sans-serif");
        let _ = ss.set_property("padding", "2px 4px");
        let _ = root.append_child(&canvas);
        let _ = root.append_child(&panel);
        let _ = root.append_child(&status);
        let conn = connection::attach(
            &opts.connection_key(),
            &opts.http_base(),
            opts.token.as_deref(),
            opts.live,
            id,
            &opts.runs,
            &opts.metrics,
            match opts.panel {
                Panel::Chart => None,
                Panel::Console => Some("console?limit=200"),
                Panel::Text | Panel::Image => Some("samples?limit=200"),
            },
        );
        let _ = root.set_attribute("data-socket", &conn.borrow().serial.to_string());
        View {
            id,
            opts,
            root,
            canvas,
            panel,
            status,
            conn,
            drawn_version: Cell::new(u64::MAX),
            drawn_size: Cell::new((0, 0)),
            drawn_second: Cell::new(0),
            closed: Cell::new(false),
            state: RefCell::new("loading".into()),
            points: Cell::new(0),
        }
    }

    pub fn close(&self) {
        if !self.closed.replace(true) {
            connection::detach(&self.opts.connection_key(), &self.conn, self.id);
        }
    }

    pub fn root_is(&self, el: &HtmlElement) -> bool {
        self.root == *el
    }

    pub fn is_attached(&self) -> bool {
        self.root.is_connected()
    }

    fn state_now(&self, c: &Connection, now_ms: f64) -> State {
        let retry_s = |link: Link| match link {
            Link::Lost { retry_ms } | Link::Failed { retry_ms } => {
                ((c.link_at + retry_ms as f64 - now_ms) / 1000.0).max(0.0)
            }
            Link::Open => 0.0,
        };
        match c.link {
            None => return State::Loading("connecting to the hub"),
            Some(l @ Link::Failed { .. }) => {
                return match &c.refusal {
                    Some(Probe::Refused(why)) => State::Refused(why.clone()),
                    Some(Probe::Other(why)) => State::Refused(why.clone()),
                    _ => State::Unreachable {
                        retry_s: retry_s(l),
                    },
                }
            }
            Some(l @ Link::Lost { .. }) => {
                return State::Unreachable {
                    retry_s: retry_s(l),
                }
            }
            Some(Link::Open) => {}
        }
        let Some(listed) = &c.client.listed else {
            return State::Loading("the run list");
        };
        let hub_now = now_ms / 1000.0 + c.client.hub_offset;
        let mut worst = State::Live;
        for run in &self.opts.runs {
            let w = c.client.runs.get(run);
            let state = match (listed.get(run), w) {
                (None, Some(_)) => match c.probes.get(run) {
                    Some(Probe::NotFound) => State::NotFound(run.to_string()),
                    Some(Probe::Refused(why)) => State::Refused(why.clone()),
                    Some(Probe::Other(why)) => State::Refused(why.clone()),
                    _ => State::Loading("asking the hub about the run"),
                },
                (None, None) => State::Loading("the run list"),
                (Some(_), Some(w)) if !w.backfilled => State::Loading("the run's history"),
                (Some(_), None) => State::Loading("the run's history"),
                (Some(r), Some(w)) => {
                    let last = r
                        .last_point_at
                        .unwrap_or(r.started_at)
                        .max(w.newest_wall_time);
                    if r.status.is_terminal() {
                        State::Ended(r.status)
                    } else if !c.live {
                        State::Snapshot
                    } else if r.status == RunStatus::Stale {
                        // The hub judges staleness (`--stale-after`), for every view alike.
                        State::Stale {
                            quiet_s: (hub_now - last).max(0.0),
                        }
                    } else {
                        State::Live
                    }
                }
            };
            if state.rank() < worst.rank() {
                worst = state;
            }
        }
        worst
    }

    fn dark(&self) -> bool {
        match self.opts.theme {
            ThemeChoice::Light => false,
            ThemeChoice::Dark => true,
            ThemeChoice::Auto => web_sys::window()
                .and_then(|w| w.match_media("(prefers-color-scheme: dark)").ok().flatten())
                .is_some_and(|m| m.matches()),
        }
    }

    /// Redraws when anything changed, the box was resized, or a second passed (the
    /// status line counts).
    pub fn frame(&self, now_ms: f64) {
        let version = connection::version();
        let size = (self.canvas.client_width(), self.canvas.client_height());
        let second = (now_ms / 1000.0) as i64;
        if version == self.drawn_version.get()
            && size == self.drawn_size.get()
            && second == self.drawn_second.get()
        {
            return;
        }
        self.drawn_second.set(second);
        let c = self.conn.borrow();
        let state = self.state_now(&c, now_ms);
        let dark = self.dark();
        let th = if dark { &theme::DARK } else { &theme::LIGHT };
        let message = match (&state, &c.last_error) {
            (State::Live, Some(e)) => format!("live; the hub said: {e}"),
            _ => state.text(&self.opts.http_base()),
        };
        self.status.set_text_content(Some(&message));
        let _ = self
            .status
            .style()
            .set_property("color", if dark { "#c8c8c8" } else { "#555" });
        let _ = self.root.set_attribute("data-state", state.code());
        let _ = self.root.set_attribute("data-message", &message);
        *self.state.borrow_mut() = state.code().to_string();
        if version == self.drawn_version.get() && size == self.drawn_size.get() {
            return;
        }
        self.drawn_version.set(version);
        self.drawn_size.set(size);
        if self.opts.panel == Panel::Chart {
            self.draw(&c, th);
        } else {
            self.draw_panel(&c, dark);
        }
    }

    /// A console panel's newest lines (of every run, by time of arrival per run), or the
    /// newest text or image of the panel's key.
    fn draw_panel(&self, c: &Connection, dark: bool) {
        let _ = self
            .panel
            .style()
            .set_property("color", if dark { "#e5e7eb" } else { "#111827" });
        let held = self.opts.runs.iter().filter_map(|r| c.items.get(r));
        match self.opts.panel {
            Panel::Console => {
                let mut lines: Vec<(i64, bool, &str)> = held
                    .flat_map(|m| m.values())
                    .filter_map(|s| match s {
                        Shown::Line { step, stderr, text } => Some((*step, *stderr, text.as_str())),
                        _ => None,
                    })
                    .collect();
                let keep = lines.len().saturating_sub(200);
                lines.drain(..keep);
                self.panel.set_text_content(None);
                for (step, stderr, text) in &lines {
                    let line = element("div");
                    line.set_text_content(Some(text));
                    let _ = line.set_attribute("data-step", &step.to_string());
                    if *stderr {
                        let _ = line.style().set_property("color", "#dc2626");
                    }
                    let _ = self.panel.append_child(&line);
                }
                self.panel.set_scroll_top(self.panel.scroll_height());
                let _ = self
                    .root
                    .set_attribute("data-lines", &lines.len().to_string());
            }
            Panel::Text | Panel::Image => {
                let key = self.opts.key.as_deref().unwrap_or("");
                // The newest by step (then by arrival).
                let newest = held
                    .flat_map(|m| m.values())
                    .filter(|s| match s {
                        Shown::Text { key: k, .. } | Shown::Image { key: k, .. } => k == key,
                        _ => false,
                    })
                    .max_by_key(|s| match s {
                        Shown::Text { step, .. } | Shown::Image { step, .. } => *step,
                        _ => i64::MIN,
                    });
                self.panel.set_text_content(None);
                match newest {
                    Some(Shown::Text { step, text, .. }) => {
                        self.panel.set_text_content(Some(text));
                        let _ = self
                            .root
                            .set_attribute("data-sample-step", &step.to_string());
                    }
                    Some(Shown::Image {
                        step, src, caption, ..
                    }) => {
                        let img = element("img");
                        let mut url = format!("{}{src}", self.opts.http_base());
                        if let Some(t) = &self.opts.token {
                            url.push_str("&token=");
                            url.push_str(&String::from(js_sys::encode_uri_component(t)));
                        }
                        let _ = img.set_attribute("src", &url);
                        let _ = img.set_attribute("alt", caption);
                        let _ = img.style().set_property("max-width", "100%");
                        let _ = img.style().set_property("max-height", "100%");
                        let _ = self.panel.append_child(&img);
                        let _ = self
                            .root
                            .set_attribute("data-sample-step", &step.to_string());
                    }
                    _ => {}
                }
            }
            Panel::Chart => {}
        }
    }

    fn draw(&self, c: &Connection, th: &theme::Theme) {
        let opts = &self.opts;
        let several_runs = opts.runs.len() > 1;
        // Owned per-line arrays first (x per axis, smoothing), then borrowed lines.
        struct Owned<'a> {
            label: String,
            color: stepstream_chart::RGBColor,
            series: &'a data::Series,
            xs: Option<Vec<f64>>,
            smoothed: Option<Vec<f64>>,
            markers: Vec<f64>,
        }
        let mut owned = Vec::new();
        let mut received = 0;
        for run in &opts.runs {
            let Some(w) = c.client.runs.get(run) else {
                continue;
            };
            let started = c
                .client
                .listed
                .as_ref()
                .and_then(|l| l.get(run))
                .map_or(0.0, |r| r.started_at);
            for (i, metric) in opts.metrics.iter().enumerate() {
                let Some(series) = w.series(metric) else {
                    continue;
                };
                received += series.received;
                let label = match (several_runs, opts.metrics.len() > 1) {
                    (true, true) => format!("{run} {metric}"),
                    (true, false) => run.to_string(),
                    _ => metric.clone(),
                };
                let color = if several_runs {
                    theme::color_of(&format!("{run}{}", if i > 0 { metric } else { "" }))
                } else {
                    theme::PALETTE[i % theme::PALETTE.len()]
                };
                let xs = (opts.axis != Axis::Step).then(|| {
                    series
                        .steps
                        .iter()
                        .zip(&series.times)
                        .map(|(&s, &t)| opts.axis.x(s, t, started))
                        .collect()
                });
                let smoothed = (opts.smoothing > 0.0)
                    .then(|| data::smooth(&series.values, opts.smoothing, None));
                let markers = if opts.axis == Axis::Step {
                    w.alert_steps().into_iter().map(|s| s as f64).collect()
                } else {
                    Vec::new()
                };
                owned.push(Owned {
                    label,
                    color,
                    series,
                    xs,
                    smoothed,
                    markers,
                });
            }
        }
        let lines: Vec<Line<'_>> = owned
            .iter()
            .map(|o| Line {
                label: &o.label,
                color: o.color,
                xs: o.xs.as_deref().unwrap_or(&o.series.xs),
                ordered: true,
                steps: &o.series.steps,
                values: &o.series.values,
                smoothed: o.smoothed.as_deref(),
                band: None,
                markers: &o.markers,
                notes: &[],
            })
            .collect();
        let title = opts
            .title
            .clone()
            .unwrap_or_else(|| opts.metrics.join(", "));
        let options = stepstream_chart::Options {
            css_size: None,
            title: &title,
            window: None,
            axis: opts.axis,
            log: opts.log,
            robust: false,
            theme: th,
            legend: lines.len() > 1,
        };
        let drawn = stepstream_chart::draw(&self.canvas, &lines, &options);
        self.points.set(received);
        let _ = self
            .root
            .set_attribute("data-points", &received.to_string());
        if let Some(d) = drawn {
            if d.drawn > 0 && !self.root.has_attribute("data-first-draw-ms") {
                // Milliseconds from the page's start to the first curve: the embed's cost.
                let at = web_sys::window()
                    .and_then(|w| w.performance())
                    .map_or(0.0, |p| p.now());
                let _ = self
                    .root
                    .set_attribute("data-first-draw-ms", &format!("{at:.0}"));
            }
            let _ = self.root.set_attribute("data-drawn", &d.drawn.to_string());
            if let Some(s) = d.last_step {
                let _ = self.root.set_attribute("data-last-step", &s.to_string());
            }
        }
    }
}
