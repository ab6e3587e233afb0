//! What `watch` knows and shows: the run list as the hub pushes it, the chosen runs' series
//! (their history, thinned by the hub to the subscription's budget, then every live point),
//! the runs' alerts and console lines, and the viewer's choices (cursor, chosen runs, metric,
//! zoom window, smoothing). Pure: it takes the hub's messages and the keys, and says what to
//! send back; the terminal and the socket live elsewhere (`draw.rs`, `link.rs`).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use stepstream_protocol::decimate::m4_indices;
use stepstream_protocol::{
    Alert, FromViewer, ItemBody, MetricId, RunId, RunStatus, RunSummary, Subscribe, ToViewer,
    Unsubscribe, Zoom,
};

/// Points of history per metric the hub sends on subscribing (it thins longer runs, M4).
pub const HISTORY_BUDGET: u32 = 2000;
/// Points a series may hold before it is thinned again (M4, to [`THIN_TO`] buckets).
const SERIES_CAP: usize = 20_000;
const THIN_TO: usize = 1000;
/// Console lines kept per run, and alerts overall.
const CONSOLE_LINES: usize = 500;
const ALERTS: usize = 100;
/// Runs that may be charted at once.
pub const MAX_CHOSEN: usize = 8;

/// A key, as `watch` reads it (the terminal's keys mapped in `mod.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Key {
    Up,
    Down,
    /// Toggle the run under the cursor in the charts.
    Toggle,
    /// Chart the run under the cursor alone.
    Only,
    NextMetric,
    PrevMetric,
    ZoomIn,
    ZoomOut,
    Left,
    Right,
    Reset,
    Smooth,
    Console,
    Quit,
}

/// One run's points, by metric name.
#[derive(Default)]
pub struct RunSeries {
    names: HashMap<MetricId, String>,
    pub points: BTreeMap<String, Vec<(i64, f64)>>,
    /// The latest zoom answer's raw points.
    pub zoomed: Option<Zoomed>,
}

/// A zoom answer: which metric and steps, and their raw points.
pub struct Zoomed {
    pub metric: String,
    pub window: (i64, i64),
    pub points: Vec<(i64, f64)>,
}

impl RunSeries {
    fn push(&mut self, metric: MetricId, step: i64, value: f64) {
        let Some(name) = self.names.get(&metric) else {
            return;
        };
        let points = self.points.entry(name.clone()).or_default();
        points.push((step, value));
        if points.len() > SERIES_CAP {
            thin(points);
        }
    }
}

/// Whether `target` names run `r` (by id, or by name).
fn names(r: &RunSummary, target: &str) -> bool {
    r.run_id.as_str() == target || r.name == target
}

/// M4 to [`THIN_TO`] buckets over the series' step range: spikes and NaN stay.
fn thin(points: &mut Vec<(i64, f64)>) {
    let xs: Vec<f64> = points.iter().map(|p| p.0 as f64).collect();
    let vs: Vec<f64> = points.iter().map(|p| p.1).collect();
    let (lo, hi) = (xs[0], xs[xs.len() - 1] + 1.0);
    let keep = m4_indices(&xs, &vs, THIN_TO, lo.min(hi - 1.0), hi);
    *points = keep.into_iter().map(|i| points[i]).collect();
}

pub struct App {
    /// `watch RUN|PROJECT`: the run to chart first (by id or name), or the project whose
    /// runs to list.
    pub target: Option<String>,
    /// The runs the token may see (of the target's project when it names one).
    pub runs: Vec<RunSummary>,
    /// The list's next pages, while the hub sends them.
    paging: Vec<RunSummary>,
    /// The hub's clock at its last message, and ours then (ages are the hub's).
    pub hub_now: (f64, std::time::Instant),
    pub cursor: usize,
    pub chosen: BTreeSet<RunId>,
    pub series: HashMap<RunId, RunSeries>,
    /// The charted metric, by name.
    pub metric: Option<String>,
    /// A step window, when zoomed.
    pub window: Option<(i64, i64)>,
    /// Exponential smoothing's weight (0: off), as the page's.
    pub smoothing: f64,
    pub alerts: VecDeque<Alert>,
    pub console: HashMap<RunId, VecDeque<String>>,
    pub show_console: bool,
    /// The link's state for the status line (connected, retrying...).
    pub link: String,
    pub quit: bool,
    /// The chart's width in cells, for zoom budgets.
    pub chart_width: u16,
    zoom_id: u64,
    /// A target that names a run was chosen once (later the viewer's choice stands).
    targeted: bool,
}

impl App {
    pub fn new(target: Option<String>) -> App {
        App {
            target,
            runs: Vec::new(),
            paging: Vec::new(),
            hub_now: (0.0, std::time::Instant::now()),
            cursor: 0,
            chosen: BTreeSet::new(),
            series: HashMap::new(),
            metric: None,
            window: None,
            smoothing: 0.0,
            alerts: VecDeque::new(),
            console: HashMap::new(),
            show_console: false,
            link: "connecting".into(),
            quit: false,
            chart_width: 80,
            zoom_id: 0,
            targeted: false,
        }
    }

    /// Whether a run belongs in the list: the target's project when it names one (or the
    /// project of the run it names), every run otherwise.
    fn listed(&self, r: &RunSummary) -> bool {
        match &self.target {
            None => true,
            Some(t) => {
                let of_run = self.project_of_target();
                r.project == *t || names(r, t) || of_run.is_some_and(|p| p == r.project)
            }
        }
    }

    fn project_of_target(&self) -> Option<String> {
        let t = self.target.as_ref()?;
        self.runs
            .iter()
            .chain(&self.paging)
            .find(|r| names(r, t))
            .map(|r| r.project.clone())
    }

    /// The hub's clock now.
    pub fn now(&self) -> f64 {
        self.hub_now.0 + self.hub_now.1.elapsed().as_secs_f64()
    }

    /// The messages to send when the socket (re)opens: the chosen runs' subscription.
    pub fn on_connect(&mut self) -> Vec<FromViewer> {
        self.series.clear();
        self.link = "live".into();
        self.subscribe(self.chosen.iter().cloned().collect())
    }

    fn subscribe(&mut self, runs: Vec<RunId>) -> Vec<FromViewer> {
        if runs.is_empty() {
            return Vec::new();
        }
        for r in &runs {
            self.series.insert(r.clone(), RunSeries::default());
        }
        vec![FromViewer::Subscribe(Subscribe {
            runs,
            metrics: None,
            from_step: None,
            budget: Some(HISTORY_BUDGET),
            after_seq: None,
            items: true,
        })]
    }

    /// Takes one of the hub's messages; what to send back.
    pub fn on_message(&mut self, msg: ToViewer) -> Vec<FromViewer> {
        match msg {
            ToViewer::RunList(list) => {
                self.hub_now = (list.now, std::time::Instant::now());
                self.paging.extend(list.runs);
                if list.done {
                    let runs = std::mem::take(&mut self.paging);
                    self.runs = runs;
                    let listed: Vec<bool> = self.runs.iter().map(|r| self.listed(r)).collect();
                    let mut keep = listed.into_iter();
                    self.runs.retain(|_| keep.next().unwrap_or(false));
                    self.sort();
                    return self.choose_first();
                }
            }
            ToViewer::RunUpdate(u) => {
                self.hub_now = (u.now, std::time::Instant::now());
                self.upsert(u.run);
                return self.choose_first();
            }
            ToViewer::RunUpdates(u) => {
                self.hub_now = (u.now, std::time::Instant::now());
                for r in u.runs {
                    self.upsert(r);
                }
                return self.choose_first();
            }
            ToViewer::StatusChange(c) => {
                if let Some(r) = self.runs.iter_mut().find(|r| r.run_id == c.run_id) {
                    r.status = c.status;
                    r.status_message = c.message;
                }
            }
            ToViewer::Metrics(m) => {
                let s = self.series.entry(m.run_id).or_default();
                for d in m.metrics {
                    s.names.insert(d.id, d.name);
                }
                self.pick_metric();
            }
            ToViewer::Backfill(b) => {
                let s = self.series.entry(b.run_id).or_default();
                for series in b.series {
                    let Some(name) = s.names.get(&series.metric).cloned() else {
                        continue;
                    };
                    let points = s.points.entry(name).or_default();
                    points.extend(series.steps.into_iter().zip(series.values));
                    points.sort_by_key(|p| p.0);
                    if points.len() > SERIES_CAP {
                        thin(points);
                    }
                }
                self.pick_metric();
            }
            ToViewer::Live(live) => {
                let s = self.series.entry(live.run_id.clone()).or_default();
                for rec in &live.records {
                    for (m, v) in &rec.values {
                        s.push(*m, rec.step, *v);
                    }
                }
                let lines = self.console.entry(live.run_id).or_default();
                for item in live.items {
                    if let ItemBody::Line { text, .. } = item.body {
                        lines.push_back(format!("{:>7} {text}", item.step));
                        if lines.len() > CONSOLE_LINES {
                            lines.pop_front();
                        }
                    }
                }
                self.pick_metric();
            }
            ToViewer::Resync(r) => {
                // Missed live batches: read the run again from the start.
                let run = r.run_id;
                if self.chosen.contains(&run) {
                    return self.subscribe(vec![run]);
                }
            }
            ToViewer::Alert(a) => {
                self.alerts.push_front(a);
                self.alerts.truncate(ALERTS);
            }
            ToViewer::Zoomed(z) => {
                if z.id == self.zoom_id {
                    if let Some(s) = self.series.get_mut(&z.run_id) {
                        s.zoomed = Some(Zoomed {
                            metric: z.metric,
                            window: (z.from, z.to),
                            points: z.steps.into_iter().zip(z.values).collect(),
                        });
                    }
                }
            }
            ToViewer::CommandEvent(_) => {}
            ToViewer::RunDeleted(d) => {
                self.runs.retain(|r| r.run_id != d.run_id);
                self.chosen.remove(&d.run_id);
                self.series.remove(&d.run_id);
                self.console.remove(&d.run_id);
                self.cursor = self.cursor.min(self.runs.len().saturating_sub(1));
                self.link = format!("run {} was deleted by {}", d.run_id, d.by);
            }
            ToViewer::HubError(e) => {
                self.link = format!("hub: {}", e.message);
            }
        }
        Vec::new()
    }

    fn upsert(&mut self, run: RunSummary) {
        if !self.listed(&run) {
            return;
        }
        let under_cursor = self.runs.get(self.cursor).map(|r| r.run_id.clone());
        match self.runs.iter_mut().find(|r| r.run_id == run.run_id) {
            Some(r) => *r = run,
            None => self.runs.push(run),
        }
        self.sort();
        if let Some(id) = under_cursor {
            self.cursor = self.runs.iter().position(|r| r.run_id == id).unwrap_or(0);
        }
    }

    /// Running runs first, then the newest.
    fn sort(&mut self) {
        self.runs.sort_by(|a, b| {
            let live = |r: &RunSummary| matches!(r.status, RunStatus::Running | RunStatus::Stale);
            live(b)
                .cmp(&live(a))
                .then(b.started_at.total_cmp(&a.started_at))
                .then(a.run_id.cmp(&b.run_id))
        });
        self.cursor = self.cursor.min(self.runs.len().saturating_sub(1));
    }

    /// Charts a run once there are runs: the target run, else the first listed.
    fn choose_first(&mut self) -> Vec<FromViewer> {
        if self.targeted || self.runs.is_empty() {
            return Vec::new();
        }
        self.targeted = true;
        let at = self
            .target
            .as_ref()
            .and_then(|t| self.runs.iter().position(|r| names(r, t)))
            .unwrap_or(0);
        self.cursor = at;
        let run = self.runs[at].run_id.clone();
        self.chosen.insert(run.clone());
        self.subscribe(vec![run])
    }

    /// Metric names of the chosen runs, `loss` first.
    pub fn metric_names(&self) -> Vec<String> {
        let mut names: BTreeSet<&String> = BTreeSet::new();
        for r in &self.chosen {
            if let Some(s) = self.series.get(r) {
                names.extend(s.points.keys());
            }
        }
        let mut out: Vec<String> = names.into_iter().cloned().collect();
        if let Some(i) = out.iter().position(|n| n == "loss") {
            let loss = out.remove(i);
            out.insert(0, loss);
        }
        out
    }

    fn pick_metric(&mut self) {
        if self.metric.is_none() {
            self.metric = self.metric_names().into_iter().next();
        }
    }

    /// The steps the chart spans: the zoom window, or every point of the chosen runs.
    pub fn span(&self) -> Option<(i64, i64)> {
        self.window.or_else(|| self.whole_span())
    }

    /// The steps of every point of the chosen runs' charted metric.
    fn whole_span(&self) -> Option<(i64, i64)> {
        let metric = self.metric.as_ref()?;
        let mut span: Option<(i64, i64)> = None;
        for r in &self.chosen {
            if let Some(pts) = self.series.get(r).and_then(|s| s.points.get(metric)) {
                for &(s, _) in pts.iter().take(1).chain(pts.last()) {
                    span = Some(span.map_or((s, s), |(a, b)| (a.min(s), b.max(s))));
                }
            }
        }
        span
    }

    /// The points of run `r` to draw for the charted metric: within the window, the zoom
    /// answer's raw points when it covers it, smoothed when asked.
    pub fn points(&self, r: &RunId) -> Vec<(i64, f64)> {
        let (Some(metric), Some(s)) = (self.metric.as_ref(), self.series.get(r)) else {
            return Vec::new();
        };
        let all = s.points.get(metric).map(Vec::as_slice).unwrap_or(&[]);
        let mut pts: Vec<(i64, f64)> = match (self.window, &s.zoomed) {
            (Some(w), Some(z)) if z.metric == *metric && z.window == w => z.points.clone(),
            (Some((a, b)), _) => all
                .iter()
                .copied()
                .filter(|p| p.0 >= a && p.0 <= b)
                .collect(),
            (None, _) => all.to_vec(),
        };
        if self.smoothing > 0.0 {
            smooth(&mut pts, self.smoothing);
        }
        pts
    }

    /// The run's last value of the charted metric, as the run list has it (the hub's).
    pub fn last_value(&self, r: &RunId) -> Option<(i64, f64)> {
        let metric = self.metric.as_ref()?;
        let s = self.series.get(r)?;
        s.points.get(metric)?.last().copied()
    }

    /// Takes a key; what to send to the hub.
    pub fn on_key(&mut self, key: Key) -> Vec<FromViewer> {
        match key {
            Key::Quit => self.quit = true,
            Key::Up => self.cursor = self.cursor.saturating_sub(1),
            Key::Down => {
                self.cursor = (self.cursor + 1).min(self.runs.len().saturating_sub(1));
            }
            Key::Toggle | Key::Only => {
                let Some(run) = self.runs.get(self.cursor).map(|r| r.run_id.clone()) else {
                    return Vec::new();
                };
                let mut out = Vec::new();
                let drop: Vec<RunId> = if key == Key::Only {
                    self.chosen.iter().filter(|r| **r != run).cloned().collect()
                } else if self.chosen.contains(&run) {
                    vec![run.clone()]
                } else {
                    Vec::new()
                };
                let adding = !self.chosen.contains(&run)
                    && (key == Key::Only || self.chosen.len() < MAX_CHOSEN);
                for r in &drop {
                    self.chosen.remove(r);
                    self.series.remove(r);
                }
                if !drop.is_empty() {
                    out.push(FromViewer::Unsubscribe(Unsubscribe { runs: drop }));
                }
                if adding {
                    self.chosen.insert(run.clone());
                    out.extend(self.subscribe(vec![run]));
                }
                if self
                    .metric
                    .as_ref()
                    .is_some_and(|m| !self.metric_names().contains(m))
                {
                    self.metric = None;
                }
                self.pick_metric();
                return out;
            }
            Key::NextMetric | Key::PrevMetric => {
                let names = self.metric_names();
                if !names.is_empty() {
                    let at = self
                        .metric
                        .as_ref()
                        .and_then(|m| names.iter().position(|n| n == m))
                        .unwrap_or(0);
                    let n = names.len();
                    let next = if key == Key::NextMetric {
                        (at + 1) % n
                    } else {
                        (at + n - 1) % n
                    };
                    self.metric = Some(names[next].clone());
                    return self.zoom_requests();
                }
            }
            Key::ZoomIn | Key::ZoomOut | Key::Left | Key::Right => {
                let Some((a, b)) = self.span() else {
                    return Vec::new();
                };
                let width = (b - a).max(1);
                self.window = Some(match key {
                    // Halve the window about its middle, down to 4 steps.
                    Key::ZoomIn if width > 4 => (a + width / 4, b - width / 4),
                    Key::ZoomIn => (a, b),
                    Key::ZoomOut => (a - width / 2, b + width / 2),
                    Key::Left => (a - width / 4, b - width / 4),
                    _ => (a + width / 4, b + width / 4),
                });
                if key == Key::ZoomOut && self.covers_all() {
                    self.window = None;
                }
                return self.zoom_requests();
            }
            Key::Reset => self.window = None,
            Key::Smooth => {
                // 0, 0.6, 0.9, 0.99: off, light, strong, very strong.
                self.smoothing = match self.smoothing {
                    s if s < 0.5 => 0.6,
                    s if s < 0.8 => 0.9,
                    s if s < 0.95 => 0.99,
                    _ => 0.0,
                };
            }
            Key::Console => self.show_console = !self.show_console,
        }
        Vec::new()
    }

    /// Whether the window holds every point of the chosen runs.
    fn covers_all(&self) -> bool {
        match (self.window, self.whole_span()) {
            (Some((a, b)), Some((x, y))) => a <= x && b >= y,
            _ => true,
        }
    }

    /// Asks the hub for every raw point of the window (thinned to the chart's width only
    /// when they do not fit), for each chosen run.
    fn zoom_requests(&mut self) -> Vec<FromViewer> {
        let (Some((from, to)), Some(metric)) = (self.window, self.metric.clone()) else {
            return Vec::new();
        };
        self.zoom_id += 1;
        self.chosen
            .iter()
            .map(|r| {
                FromViewer::Zoom(Zoom {
                    id: self.zoom_id,
                    run_id: r.clone(),
                    metric: metric.clone(),
                    from,
                    to,
                    budget: (self.chart_width as u32 * 2).max(200) * 4,
                })
            })
            .collect()
    }
}

/// Exponential moving average, debiased at the start (as TensorBoard's and the page's);
/// non-finite values pass through and do not poison the average.
fn smooth(points: &mut [(i64, f64)], weight: f64) {
    let (mut last, mut n) = (0.0, 0);
    for p in points {
        if !p.1.is_finite() {
            continue;
        }
        last = last * weight + (1.0 - weight) * p.1;
        n += 1;
        p.1 = last / (1.0 - weight.powi(n));
    }
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
