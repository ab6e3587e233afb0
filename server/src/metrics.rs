//! `GET /metrics`: the hub and its runs in the Prometheus text format (OpenMetrics), for
//! people who already run Prometheus and Grafana. Guarded by the read token like the API, and
//! scoped like it: a scoped token sees its runs only.
//!
//! Per run (labels `project`, `name`, `run_id`, `rank`): the last step, the last value of
//! each metric (label `metric`), steps per second (between two scrapes; the mean since the
//! start at the first), the status (`stepstream_run_status{status=...} 1`) and the alerts
//! firing (label `rule`). The hub: records stored, runs, open collector and viewer sockets,
//! the database's size on disk, batches the alert judge skipped.

use crate::auth::Scope;
use crate::AppState;
use axum::extract::{Extension, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use stepstream_protocol::{unix_now, RunStatus};

type Labels = Vec<(String, String)>;
type FloatGauge = Gauge<f64, AtomicU64>;

/// What a rate needs from the previous scrape: each run's `(hub time, last step)`.
#[derive(Default)]
pub struct Scrapes {
    last: Mutex<HashMap<String, (f64, i64)>>,
}

/// Live sockets, for the gauges: incremented while a socket is open.
#[derive(Default)]
pub struct Sockets {
    pub collectors: AtomicU64,
    pub viewers: AtomicU64,
}

/// Counts one open socket until dropped.
pub struct Open<'a>(&'a AtomicU64);

impl<'a> Open<'a> {
    pub fn new(counter: &'a AtomicU64) -> Open<'a> {
        counter.fetch_add(1, Ordering::Relaxed);
        Open(counter)
    }
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

const STATUSES: [RunStatus; 5] = [
    RunStatus::Running,
    RunStatus::Stale,
    RunStatus::Finished,
    RunStatus::Failed,
    RunStatus::Killed,
];

pub async fn metrics(State(app): State<AppState>, Extension(scope): Extension<Scope>) -> Response {
    // Before the registry exists: it is not `Send`, and the size of a PostgreSQL store is a
    // query.
    let storage_bytes = app.hub.store.size().await;
    let mut registry = Registry::with_prefix("stepstream");
    let last_step = Family::<Labels, Gauge>::default();
    let value = Family::<Labels, FloatGauge>::default();
    let rate = Family::<Labels, FloatGauge>::default();
    let status = Family::<Labels, Gauge>::default();
    let firing = Family::<Labels, Gauge>::default();
    let records = Family::<Labels, Counter>::default();
    registry.register("run_last_step", "Highest step stored", last_step.clone());
    registry.register("run_metric", "Last value of each metric", value.clone());
    registry.register(
        "run_steps_per_second",
        "Steps per second since the previous scrape (the mean since the start at the first)",
        rate.clone(),
    );
    registry.register("run_status", "1 for the run's status", status.clone());
    registry.register(
        "run_alert_firing",
        "1 for each alert rule firing",
        firing.clone(),
    );
    registry.register("run_records", "Records stored", records.clone());

    let now = unix_now();
    let mut scrapes = app.scrapes.last.lock().unwrap_or_else(|e| e.into_inner());
    let mut runs = 0i64;
    for run in app.hub.runs() {
        let (summary, rules) = run.state(|st| (st.summary(), st.firing_alerts()));
        if !scope.allows(&summary.project, summary.run_id.as_str()) {
            continue;
        }
        runs += 1;
        let labels: Labels = vec![
            ("project".into(), summary.project.clone()),
            ("name".into(), summary.name.clone()),
            ("run_id".into(), summary.run_id.to_string()),
            ("rank".into(), summary.rank.to_string()),
        ];
        let with = |k: &str, v: &str| {
            let mut l = labels.clone();
            l.push((k.to_string(), v.to_string()));
            l
        };
        records.get_or_create(&labels).inc_by(summary.records);
        if let Some(step) = summary.last_step {
            last_step.get_or_create(&labels).set(step);
            let id = summary.run_id.to_string();
            let per_second = match scrapes.get(&id) {
                Some(&(t, s)) if now > t => (step - s) as f64 / (now - t),
                _ => {
                    let elapsed = summary.last_point_at.unwrap_or(now) - summary.started_at;
                    if elapsed > 0.0 {
                        step as f64 / elapsed
                    } else {
                        0.0
                    }
                }
            };
            rate.get_or_create(&labels).set(per_second.max(0.0));
            scrapes.insert(id, (now, step));
        }
        for (metric, v) in &summary.last_values {
            value.get_or_create(&with("metric", metric)).set(*v);
        }
        for s in STATUSES {
            status
                .get_or_create(&with("status", s.as_str()))
                .set(i64::from(summary.status == s));
        }
        for rule in rules {
            firing.get_or_create(&with("rule", rule)).set(1);
        }
    }
    drop(scrapes);

    let hub_runs = Gauge::<i64>::default();
    hub_runs.set(runs);
    registry.register("runs", "Runs this token may see", hub_runs);
    let sockets = Family::<Labels, Gauge>::default();
    registry.register("sockets", "Open WebSockets by kind", sockets.clone());
    for (kind, n) in [
        ("collector", &app.sockets.collectors),
        ("viewer", &app.sockets.viewers),
    ] {
        sockets
            .get_or_create(&vec![("kind".into(), kind.into())])
            .set(n.load(Ordering::Relaxed) as i64);
    }
    let storage = Gauge::<i64>::default();
    storage.set(storage_bytes as i64);
    registry.register(
        "storage_bytes",
        "The database's size on disk (with its WAL)",
        storage,
    );
    let commits = Counter::<u64>::default();
    commits.inc_by(app.hub.store.commits());
    registry.register(
        "store_commits",
        "Database transactions committed (one holds every batch of its --commit-interval)",
        commits,
    );
    let unjudged = Counter::<u64>::default();
    unjudged.inc_by(app.hub.unjudged.load(Ordering::Relaxed));
    registry.register(
        "unjudged_batches",
        "Batches the alert judge skipped, too far behind",
        unjudged,
    );

    let mut body = String::new();
    if encode(&mut body, &registry).is_err() {
        return (
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            "encoding failed",
        )
            .into_response();
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        body,
    )
        .into_response()
}
