//! The page's state: the reactive part (what the DOM shows: run list, selection, view
//! settings) in [`Ctx`], and the viewer client with the points in [`STORE`] (the client the
//! widget uses too, `chart::client`), outside the reactive system. Hub messages go through
//! the client; what it says changed is shown here, points only by marking the page dirty.

use crate::groups::{ChartSpec, Group};
use crate::i18n::Lang;
use crate::page::now_ms;
use crate::view::{ThemePref, View};
use leptos::prelude::*;
use serde_json::Value;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use stepstream_chart::client::{Change, Client};
use stepstream_chart::scale::Axis;
use stepstream_protocol::{FromViewer, RunId, RunStatus, RunSummary, ToViewer};

thread_local! {
    /// The viewer client and the points it holds (the page subscribes at once, listed or
    /// not: it selects only runs it was shown).
    pub static STORE: RefCell<Client> = RefCell::new(Client::new(false).keeping_items());
    static DIRTY: Cell<bool> = const { Cell::new(true) };
    /// While the view is being set from the address bar (back button), do not push it.
    static RESTORING: Cell<bool> = const { Cell::new(false) };
    static LAST_PUBLISH: Cell<f64> = const { Cell::new(0.0) };
    /// The runs the address asked for, until the run list arrives and they are opened.
    static INITIAL_RUNS: RefCell<Option<Vec<RunId>>> = const { RefCell::new(None) };
}

pub fn mark_dirty() {
    DIRTY.with(|d| d.set(true));
}

/// Whether anything changed since the last call.
pub fn take_dirty() -> bool {
    DIRTY.with(|d| d.replace(false))
}

fn send_all(frames: Vec<FromViewer>) {
    for f in frames {
        crate::socket::send(f);
    }
}

/// The socket opened: the frames that (re)subscribe the selected runs, each after the
/// batches the page holds of it.
pub fn on_open() -> Vec<FromViewer> {
    STORE.with(|s| s.borrow_mut().on_open())
}

/// The socket closed: its subscriptions and its run list are gone with it.
pub fn on_lost() {
    STORE.with(|s| s.borrow_mut().on_lost());
}

pub use crate::config::Config;

/// One chart's own settings.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ChartOpts {
    pub log: bool,
    /// A y range that ignores outliers.
    pub robust: bool,
}

/// The synchronised crosshair: an x on every chart; the tooltip belongs to one chart.
#[derive(Clone, Debug, PartialEq)]
pub struct Hover {
    pub x: f64,
    pub chart: String,
    pub text: String,
    pub page_x: f64,
    pub page_y: f64,
}

/// Run list columns, for sorting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Column {
    Project,
    Name,
    Status,
    LastStep,
    LastLoss,
    Age,
    Started,
    /// The user's `n`th added column (`Ctx::columns`).
    Extra(u8),
}

/// Everything the views share.
#[derive(Clone, Copy)]
pub struct Ctx {
    pub runs: RwSignal<Vec<RunSummary>>,
    pub selected: RwSignal<Vec<RunId>>,
    pub charts: RwSignal<Vec<ChartSpec>>,
    pub live: RwSignal<bool>,
    pub lang: RwSignal<Lang>,
    pub now: RwSignal<f64>,
    /// Hub clock minus page clock, seconds.
    pub hub_offset: RwSignal<f64>,
    /// Bumped when any watched run's alerts change.
    pub alerts: RwSignal<u64>,
    /// Bumped when a command for a watched run's training is queued or moves on.
    pub commands: RwSignal<u64>,
    pub window: RwSignal<Option<(f64, f64)>>,
    pub smoothing: RwSignal<f64>,
    pub axis: RwSignal<Axis>,
    /// The run metric on the x axis while `axis` is `Axis::Metric`.
    pub x_metric: RwSignal<String>,
    /// How the selected runs are grouped into bands (`bands`).
    pub grouping: RwSignal<crate::view::Grouping>,
    /// Resumed runs drawn segment by segment (`segments`), not the latest over the rest.
    pub all_segments: RwSignal<bool>,
    pub theme: RwSignal<ThemePref>,
    pub chart_opts: RwSignal<HashMap<String, ChartOpts>>,
    pub enlarged: RwSignal<Option<String>>,
    pub collapsed: RwSignal<Vec<Group>>,
    pub filter: RwSignal<String>,
    pub search: RwSignal<String>,
    /// Columns the user added to the run list (metrics' last values or config keys),
    /// comma separated; in the URL as `cols`.
    pub columns: RwSignal<String>,
    pub sort: RwSignal<(Column, bool)>,
    pub by_project: RwSignal<bool>,
    pub status_filter: RwSignal<String>,
    pub expanded: RwSignal<Vec<String>>,
    /// `/api/runs/{id}` answers (config and all), by run.
    pub details: RwSignal<HashMap<RunId, Value>>,
    /// Flattened configs of every run, for `key=value` search (asked for on first use).
    pub configs: RwSignal<Option<HashMap<RunId, Config>>>,
    pub only_diff: RwSignal<bool>,
    pub hover: RwSignal<Option<Hover>>,
    /// Bumped when the selected runs' console lines changed (`console::publish`).
    pub console: RwSignal<u64>,
    /// The step the console shows (a click on a chart, a line or an alert); `None` follows.
    pub console_step: RwSignal<Option<i64>>,
    /// Bumped when the selected runs' samples changed (`samples::publish`).
    pub samples: RwSignal<u64>,
    /// Bumped (with when) after the charts were redrawn, at most four times a second.
    pub drawn: RwSignal<(u64, f64)>,
    /// Runs deleted while the page was open that it was showing: who deleted each.
    pub deleted: RwSignal<Vec<(RunId, String)>>,
}

impl Ctx {
    /// The state for the page's address (its view) and nothing else yet.
    pub fn from_location() -> Ctx {
        let view = View::from_query(&crate::page::location_search());
        INITIAL_RUNS.with(|i| *i.borrow_mut() = Some(view.runs.clone()));
        // Opening the page's own view replaces its history entry rather than adding one.
        LAST_PUBLISH.with(|l| l.set(now_ms()));
        STORE.with(|s| s.borrow_mut().set_smoothing(view.smoothing));
        Ctx {
            runs: RwSignal::new(Vec::new()),
            selected: RwSignal::new(Vec::new()),
            charts: RwSignal::new(Vec::new()),
            live: RwSignal::new(false),
            lang: RwSignal::new(view.lang.unwrap_or_else(Lang::detect)),
            now: RwSignal::new(now_ms()),
            hub_offset: RwSignal::new(0.0),
            alerts: RwSignal::new(0),
            commands: RwSignal::new(0),
            window: RwSignal::new(view.window),
            smoothing: RwSignal::new(view.smoothing),
            axis: RwSignal::new(view.axis),
            x_metric: RwSignal::new(view.x_metric),
            grouping: RwSignal::new(view.grouping),
            all_segments: RwSignal::new(view.all_segments),
            theme: RwSignal::new(view.theme),
            chart_opts: RwSignal::new(HashMap::new()),
            enlarged: RwSignal::new(None),
            // Per-layer charts are many (two per layer); their heatmaps show them at once.
            collapsed: RwSignal::new(vec![crate::groups::Group::Layers]),
            filter: RwSignal::new(String::new()),
            search: RwSignal::new(String::new()),
            columns: RwSignal::new(view.columns.clone()),
            sort: RwSignal::new((Column::Started, false)),
            by_project: RwSignal::new(false),
            status_filter: RwSignal::new(String::new()),
            expanded: RwSignal::new(Vec::new()),
            details: RwSignal::new(HashMap::new()),
            configs: RwSignal::new(None),
            only_diff: RwSignal::new(false),
            hover: RwSignal::new(None),
            console: RwSignal::new(0),
            console_step: RwSignal::new(None),
            samples: RwSignal::new(0),
            drawn: RwSignal::new((0, 0.0)),
            deleted: RwSignal::new(Vec::new()),
        }
    }

    /// The view as a link carries it.
    pub fn view(&self) -> View {
        View {
            runs: self.selected.get(),
            window: self.window.get(),
            smoothing: self.smoothing.get(),
            axis: self.axis.get(),
            x_metric: self.x_metric.get(),
            grouping: self.grouping.get(),
            all_segments: self.all_segments.get(),
            columns: self.columns.get(),
            theme: self.theme.get(),
            lang: Some(self.lang.get()),
        }
    }

    /// Puts the view in the address bar whenever it changes: a new history entry, unless the
    /// last one is under a second old (a wheel zoom is one entry, not fifty).
    pub fn publish_view(&self) {
        let ctx = *self;
        Effect::new(move |_| {
            let view = ctx.view();
            let opening = INITIAL_RUNS.with(|i| i.borrow().as_ref().is_some_and(|r| !r.is_empty()));
            if RESTORING.with(Cell::get) || opening {
                return;
            }
            let now = now_ms();
            let replace = now - LAST_PUBLISH.with(Cell::get) < 1000.0;
            LAST_PUBLISH.with(|l| l.set(now));
            view.publish(replace);
        });
    }

    /// Sets the view from the address bar (the back and forward buttons).
    pub fn restore_view(&self) {
        let view = View::from_query(&crate::page::location_search());
        RESTORING.with(|r| r.set(true));
        self.window.set(view.window);
        self.set_smoothing(view.smoothing);
        self.axis.set(view.axis);
        self.x_metric.set(view.x_metric);
        self.grouping.set(view.grouping);
        self.all_segments.set(view.all_segments);
        self.columns.set(view.columns);
        self.theme.set(view.theme);
        if let Some(l) = view.lang {
            self.lang.set(l);
        }
        let known: Vec<RunId> = view
            .runs
            .into_iter()
            .filter(|id| self.runs.get_untracked().iter().any(|r| &r.run_id == id))
            .collect();
        self.select(known);
        RESTORING.with(|r| r.set(false));
        crate::fetch::forget(None);
        mark_dirty();
    }

    pub fn set_smoothing(&self, w: f64) {
        let w = w.clamp(0.0, 0.99);
        STORE.with(|s| s.borrow_mut().set_smoothing(w));
        self.smoothing.set(w);
        mark_dirty();
    }

    /// Back to the live whole-run view.
    pub fn follow(&self) {
        self.window.set(None);
        crate::fetch::forget(None);
        mark_dirty();
    }

    pub fn refresh_charts(&self) {
        let selected = self.selected.get_untracked();
        let names = STORE.with(|s| s.borrow().metric_names(&selected));
        let specs = crate::groups::charts(&names);
        if specs != self.charts.get_untracked() {
            self.charts.set(specs);
        }
        mark_dirty();
    }

    /// Makes `runs` the selection: subscribes to the new ones, drops the others.
    pub fn select(&self, runs: Vec<RunId>) {
        let before = self.selected.get_untracked();
        let gone: Vec<RunId> = before
            .iter()
            .filter(|r| !runs.contains(r))
            .cloned()
            .collect();
        if !gone.is_empty() {
            for r in &gone {
                crate::fetch::forget(Some(r));
            }
            send_all(STORE.with(|s| s.borrow_mut().unwant(&gone)));
        }
        let summaries = self.runs.get_untracked();
        let offset = self.hub_offset.get_untracked();
        for run in runs.iter().filter(|r| !before.contains(r)) {
            let summary = summaries.iter().find(|s| &s.run_id == run);
            let last_point_ms = summary
                .and_then(|s| s.last_point_at)
                .map_or(now_ms(), |t| (t - offset) * 1000.0);
            send_all(STORE.with(|s| s.borrow_mut().want(run, None, last_point_ms)));
            self.load_detail(run.clone());
        }
        self.selected.set(runs);
        self.refresh_charts();
    }

    pub fn toggle(&self, run: RunId) {
        let mut runs = self.selected.get_untracked();
        if runs.contains(&run) {
            runs.retain(|r| r != &run);
        } else {
            runs.push(run);
        }
        self.select(runs);
    }

    /// Selects every rank of a job, or deselects them when all are selected.
    pub fn toggle_job(&self, ranks: Vec<RunId>) {
        let mut runs = self.selected.get_untracked();
        if ranks.iter().all(|r| runs.contains(r)) {
            runs.retain(|r| !ranks.contains(r));
        } else {
            for r in ranks {
                if !runs.contains(&r) {
                    runs.push(r);
                }
            }
        }
        self.select(runs);
    }

    /// Asks for the run's detail (config) for the run panel, once.
    fn load_detail(&self, run: RunId) {
        if self.details.with_untracked(|d| d.contains_key(&run)) {
            return;
        }
        let details = self.details;
        let url = crate::fetch::api_url(&format!("/api/runs/{}", run.as_str()));
        wasm_bindgen_futures::spawn_local(async move {
            if let Ok(v) = crate::fetch::get_json(url).await {
                details.update(|d| {
                    d.insert(run, v);
                });
            }
        });
    }

    /// Asks for every run's config, for `key=value` search.
    pub fn load_configs(&self) {
        let configs = self.configs;
        configs.set(Some(HashMap::new()));
        let url = crate::fetch::api_url("/api/runs?config=1");
        wasm_bindgen_futures::spawn_local(async move {
            let Ok(v) = crate::fetch::get_json(url).await else {
                return;
            };
            let mut all = HashMap::new();
            for r in v["runs"].as_array().into_iter().flatten() {
                if let Some(id) = r["run_id"].as_str().and_then(|id| RunId::new(id).ok()) {
                    all.insert(id, crate::config::flatten(&r["config"]));
                }
            }
            configs.set(Some(all));
        });
    }

    /// A run's name for legends and tooltips, with its rank when it is one of several.
    pub fn label(&self, id: &RunId) -> String {
        self.runs.with_untracked(|runs| {
            runs.iter()
                .find(|r| &r.run_id == id)
                .map_or(id.to_string(), |r| {
                    if r.world_size > 1 {
                        format!("{} r{}", r.name, r.rank)
                    } else {
                        r.name.clone()
                    }
                })
        })
    }

    pub fn on_message(&self, msg: ToViewer) {
        let (change, frames) = STORE.with(|s| s.borrow_mut().on_message(msg, now_ms()));
        send_all(frames);
        let offset = STORE.with(|s| s.borrow().hub_offset);
        match change {
            Change::Nothing => {}
            Change::Listed(runs) => {
                self.hub_offset.set(offset);
                self.runs.set(runs);
                if self.configs.get_untracked().is_some() {
                    self.load_configs();
                }
                // The runs of the address (`?runs=` or the alert links' `?run=`) open once.
                let wanted = INITIAL_RUNS
                    .with(|i| i.borrow_mut().take())
                    .unwrap_or_default();
                if self.selected.get_untracked().is_empty() && !wanted.is_empty() {
                    let known: Vec<RunId> = wanted
                        .into_iter()
                        .filter(|id| self.runs.get_untracked().iter().any(|r| &r.run_id == id))
                        .collect();
                    self.select(known);
                }
            }
            Change::Summaries(changed) => {
                self.hub_offset.set(offset);
                self.runs.update(|runs| {
                    for run in changed {
                        upsert_summary(runs, run);
                    }
                });
            }
            Change::Status(c) => {
                self.runs.update(|runs| {
                    if let Some(r) = runs.iter_mut().find(|r| r.run_id == c.run_id) {
                        r.status = c.status;
                        r.status_message = c.message.clone();
                    }
                });
            }
            Change::Defined(_) => self.refresh_charts(),
            Change::Points(_) => mark_dirty(),
            Change::Alert(_) => {
                self.alerts.update(|n| *n += 1);
                mark_dirty();
            }
            Change::Command(_) => {
                self.commands.update(|n| *n += 1);
                mark_dirty();
            }
            Change::Zoomed(z) => {
                if crate::fetch::answer(z) {
                    mark_dirty();
                }
            }
            Change::Deleted(d) => {
                self.runs
                    .update(|runs| runs.retain(|r| r.run_id != d.run_id));
                let selected = self.selected.get_untracked();
                if selected.contains(&d.run_id) {
                    self.deleted
                        .update(|g| g.push((d.run_id.clone(), d.by.clone())));
                    // The client dropped its points already; the charts follow the rest.
                    crate::fetch::forget(Some(&d.run_id));
                    self.selected
                        .set(selected.into_iter().filter(|r| r != &d.run_id).collect());
                    self.refresh_charts();
                }
            }
            Change::HubError(e) => {
                web_sys::console::warn_1(
                    &format!("stepstream hub: {:?}: {}", e.code, e.message).into(),
                );
            }
        }
    }

    /// Selected runs the hub judges stale (nothing heard for its `--stale-after`), with
    /// how long since their last point and when that was.
    pub fn stale_runs(&self) -> Vec<(RunSummary, f64, f64)> {
        let now = self.now.get();
        let selected = self.selected.get();
        self.runs
            .get()
            .into_iter()
            .filter(|r| selected.contains(&r.run_id) && r.status == RunStatus::Stale)
            .map(|r| {
                let last = STORE
                    .with(|s| s.borrow().runs.get(&r.run_id).map(|d| d.last_point_ms))
                    .unwrap_or(now);
                let quiet = ((now - last) / 1000.0).max(0.0);
                (r, quiet, last)
            })
            .collect()
    }
}

/// Replaces the run's summary in the list, or adds it.
fn upsert_summary(runs: &mut Vec<RunSummary>, run: RunSummary) {
    match runs.iter_mut().find(|r| r.run_id == run.run_id) {
        Some(r) => *r = run,
        None => runs.push(run),
    }
}
