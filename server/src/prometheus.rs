//! `GET /metrics`: the hub and its runs in the Prometheus text format (OpenMetrics), for
//! people who already run Prometheus and Grafana. Guarded by the read token like the API, and
//! scoped like it: a scoped token sees its runs only.
//!
//! Per run (labels `project`, `name`, `run_id`, `rank`): the last step, the last value of
//! each metric (label `metric`), the steps stored as a counter (`rate()` in PromQL gives
//! steps per second; a scrape keeps no state, so two scrapers see the same numbers), the
//! status (`stepstream_run_status{status=...} 1`) and the alerts firing (label `rule`). The
//! hub: records stored, runs, open collector and viewer sockets, the database's size on
//! disk, batches the alert judge skipped.
//!
//! Label values are escaped here (`\\`, `\"`, `\n`, as the exposition format says):
//! `prometheus_client` writes them as given, so one project name holding a `"` would break
//! the whole scrape.

use crate::auth::Scope;
use crate::state::AppState;
use axum::extract::{Extension, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicU64, Ordering};
use stepstream_protocol::RunStatus;

type Labels = Vec<(String, String)>;
type FloatGauge = Gauge<f64, AtomicU64>;

/// A label value as the exposition format writes it: backslash, double quote and line feed
/// escaped. (Control characters never reach here: names are refused with them at the door.)
fn label(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

const STATUSES: [RunStatus; 6] = [
    RunStatus::Running,
    RunStatus::Stale,
    RunStatus::Finished,
    RunStatus::Failed,
    RunStatus::Killed,
    RunStatus::Stopped,
];

pub async fn metrics(State(app): State<AppState>, Extension(scope): Extension<Scope>) -> Response {
    // Before the registry exists: it is not `Send`, and the size of a PostgreSQL store is a
    // query.
    let storage_bytes = app.hub.store.size().await;
    let mut registry = Registry::with_prefix("stepstream");
    let last_step = Family::<Labels, Gauge>::default();
    let value = Family::<Labels, FloatGauge>::default();
    let steps = Family::<Labels, Counter>::default();
    let status = Family::<Labels, Gauge>::default();
    let firing = Family::<Labels, Gauge>::default();
    let records = Family::<Labels, Counter>::default();
    registry.register("run_last_step", "Highest step stored", last_step.clone());
    registry.register("run_metric", "Last value of each metric", value.clone());
    registry.register(
        "run_steps",
        "Steps stored (one record per step): rate() gives steps per second",
        steps.clone(),
    );
    registry.register("run_status", "1 for the run's status", status.clone());
    registry.register(
        "run_alert_firing",
        "1 for each alert rule firing",
        firing.clone(),
    );
    registry.register("run_records", "Records stored", records.clone());

    let mut runs = 0i64;
    for run in app.hub.runs() {
        let (summary, rules) = run.state(|st| (st.summary(), st.firing_alerts()));
        if !scope.allows(&summary.project, summary.run_id.as_str()) {
            continue;
        }
        runs += 1;
        let labels: Labels = vec![
            ("project".into(), label(&summary.project)),
            ("name".into(), label(&summary.name)),
            ("run_id".into(), label(summary.run_id.as_str())),
            ("rank".into(), summary.rank.to_string()),
        ];
        let with = |k: &str, v: &str| {
            let mut l = labels.clone();
            l.push((k.to_string(), label(v)));
            l
        };
        records.get_or_create(&labels).inc_by(summary.records);
        steps.get_or_create(&labels).inc_by(summary.records);
        if let Some(step) = summary.last_step {
            last_step.get_or_create(&labels).set(step);
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
