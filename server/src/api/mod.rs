//! The JSON API for scripts and tests, and the CSV / config exports; a run's console and
//! samples in `items`; commands for a run's training in `commands`.
//!
//! Non-finite values, which JSON cannot hold as numbers, are written as the strings `"NaN"`,
//! `"Infinity"` and `"-Infinity"`.

pub mod commands;
pub mod delete;
pub mod items;
pub mod parquet;
pub mod rules;

use crate::auth::Scope;
use crate::hub::Run;
use crate::state::AppState;
use axum::body::{Body, Bytes};
use axum::extract::{Extension, Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use std::ops::ControlFlow;
use std::sync::Arc;
use stepstream_protocol::{unix_now, utc_stamp, MetricId, RunId, RunStatus, RunSummary};

/// An API failure: a status code and a message for the caller; internals go to the log.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("unknown run {0:?}")]
    UnknownRun(String),
    /// The run exists; the token may not read it. (Run ids are addresses, not secrets: the
    /// data is what a scoped token keeps from its holder, and saying "refused" rather than
    /// "not found" tells an embedding page's author what to fix.)
    #[error("this token may not read run {0:?} (a token scoped to other projects or runs)")]
    NotCovered(String),
    #[error("run {run} has no metric {metric:?}")]
    UnknownMetric { run: String, metric: String },
    #[error("{0}")]
    BadRequest(String),
    #[error("this token may not command or delete runs of project {0:?}: a write token of the project may")]
    MayNotWrite(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    TooMany(String),
    #[error("storage error")]
    Store(#[from] crate::store::StoreError),
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = match &self {
            ApiError::UnknownRun(_) | ApiError::UnknownMetric { .. } => StatusCode::NOT_FOUND,
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::NotCovered(_) | ApiError::MayNotWrite(_) => StatusCode::FORBIDDEN,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::TooMany(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Store(e) => {
                tracing::error!(error = %e, "API storage error");
                StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        (status, Json(json!({ "error": self.to_string() }))).into_response()
    }
}

/// A float as JSON: a number, or a string for NaN and the infinities.
pub fn json_f64(v: f64) -> Value {
    if v.is_finite() {
        json!(v)
    } else if v.is_nan() {
        json!("NaN")
    } else if v > 0.0 {
        json!("Infinity")
    } else {
        json!("-Infinity")
    }
}

fn summary_json(s: &RunSummary, now: f64) -> Value {
    let values: serde_json::Map<String, Value> = s
        .last_values
        .iter()
        .map(|(k, v)| (k.clone(), json_f64(*v)))
        .collect();
    let age = s.last_point_at.map(|t| (now - t).max(0.0));
    json!({
        "run_id": s.run_id.as_str(),
        "project": s.project,
        "name": s.name,
        "host": s.host,
        "rank": s.rank,
        "world_size": s.world_size,
        "job": s.job,
        "framework": s.framework,
        "started_at": s.started_at,
        "status": s.status.as_str(),
        "status_message": s.status_message,
        "last_step": s.last_step,
        "last_point_at": s.last_point_at,
        "age_s": age,
        "last_values": values,
        "records": s.records,
        // The hub's status clock judges staleness (`--stale-after`): the one judge of it.
        "training": s.status == RunStatus::Running,
    })
}

/// The run `id`, if it exists and `scope` covers it: a run outside the token's scope is as
/// unknown as one that does not exist, so a scoped token cannot probe for others.
pub(super) async fn find(app: &AppState, id: &str, scope: &Scope) -> Result<Arc<Run>, ApiError> {
    let run = match RunId::new(id) {
        Ok(run_id) => app.hub.find_run(&run_id).await,
        Err(_) => None,
    }
    .ok_or_else(|| ApiError::UnknownRun(id.to_string()))?;
    if !run.state(|st| scope.allows(&st.identity.project, id)) {
        tracing::info!(
            run = id,
            "a read of a run outside the token's scope refused"
        );
        return Err(ApiError::NotCovered(id.to_string()));
    }
    Ok(run)
}

/// `ok` and `writable` false (and a 503) while the database refuses writes: nothing is
/// acknowledged then, and a load balancer or a probe should know.
pub async fn health(State(app): State<AppState>) -> (axum::http::StatusCode, Json<Value>) {
    let writable = app.hub.store.writable();
    let status = if writable {
        axum::http::StatusCode::OK
    } else {
        axum::http::StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        Json(json!({
            "ok": writable,
            "writable": writable,
            "version": env!("CARGO_PKG_VERSION"),
            "protocol": stepstream_protocol::codec::VERSION,
            "runs": app.hub.runs().len(),
        })),
    )
}

#[derive(Deserialize)]
pub struct ListQuery {
    /// `?config=1`: each run's hyper-parameters too (the web app's `key=value` search).
    #[serde(default)]
    config: Option<String>,
}

pub async fn list_runs(
    State(app): State<AppState>,
    Extension(scope): Extension<Scope>,
    Query(q): Query<ListQuery>,
) -> Json<Value> {
    let now = unix_now();
    let with_config = q.config.is_some_and(|c| c == "1" || c == "true");
    let runs: Vec<Value> = app
        .hub
        .runs()
        .iter()
        .filter(|r| r.state(|st| scope.allows(&st.identity.project, st.identity.run_id.as_str())))
        .map(|r| {
            let (summary, config) = r.state(|st| {
                let config = with_config.then(|| st.identity.config_json.clone());
                (st.summary(), config)
            });
            let mut v = summary_json(&summary, now);
            if let Some(c) = config {
                v["config"] = serde_json::from_str(&c).unwrap_or(Value::String(c));
            }
            v
        })
        .collect();
    Json(json!({ "now": now, "runs": runs }))
}

/// One run: identity, config, metrics and where it is now (the reference design's
/// `/api/latest`).
pub async fn run_detail(
    State(app): State<AppState>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let run = find(&app, &id, &scope).await?;
    let (summary, metrics, config) = run.state(|st| {
        (
            st.summary(),
            st.metrics
                .iter()
                .map(|m| m.name.clone())
                .collect::<Vec<_>>(),
            st.identity.config_json.clone(),
        )
    });
    let mut v = summary_json(&summary, unix_now());
    v["config"] = serde_json::from_str(&config).unwrap_or(Value::String(config));
    v["metrics"] = json!(metrics);
    Ok(Json(v))
}

#[derive(Deserialize)]
pub struct SeriesQuery {
    metric: String,
    from: Option<i64>,
    to: Option<i64>,
    budget: Option<usize>,
}

/// One metric over the steps `from..=to` (default: the whole run), every raw point while
/// they fit the budget (default 2000), else M4-downsampled to it; each point with its wall
/// time. Found through the step index, so a narrow window of a long run is cheap. The
/// answer holds the budget's points, and its JSON is written as the client takes it.
pub async fn series(
    State(app): State<AppState>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
    Query(q): Query<SeriesQuery>,
) -> Result<Response, ApiError> {
    let run = find(&app, &id, &scope).await?;
    let (metric, last_seq) = run.state(|st| {
        let metric = st.metrics.iter().find(|m| m.name == q.metric).map(|m| m.id);
        (metric, st.tail.last_seq)
    });
    let metric: MetricId = metric.ok_or_else(|| ApiError::UnknownMetric {
        run: id.clone(),
        metric: q.metric.clone(),
    })?;
    let budget = q.budget.unwrap_or(2000);
    let most = app.hub.limits.viewer_budget as usize;
    if !(4..=most).contains(&budget) {
        return Err(ApiError::BadRequest(format!(
            "budget must be between 4 and {most} (limit viewer_budget)"
        )));
    }
    let Some(w) = crate::downsample::window(
        &app.hub.store,
        run.key,
        last_seq,
        metric,
        (q.from, q.to),
        budget,
    )
    .await?
    else {
        return Err(ApiError::BadRequest(format!(
            "empty step range {:?}..{:?}",
            q.from, q.to
        )));
    };
    let (lo, hi, total, downsampled) = (w.from, w.to, w.total, w.downsampled);
    let (steps, values, times) = (w.steps, w.values, w.times);
    let head = json!({
        "run_id": id,
        "metric": q.metric,
        "from": lo,
        "to": hi,
        "budget": budget,
        "total_points": total,
        "downsampled": downsampled,
    });
    let body = SeriesBody {
        head: Some(head),
        columns: [
            Column::Steps(steps),
            Column::Values(values),
            Column::Times(times),
        ],
        column: 0,
        at: 0,
    };
    Ok((
        [(header::CONTENT_TYPE, "application/json")],
        Body::from_stream(futures_util::stream::iter(
            body.map(Ok::<_, std::convert::Infallible>),
        )),
    )
        .into_response())
}

/// Bytes of JSON a `/series` answer is written in at a time: a budget of a million points
/// is ~60 MB of text, never held whole.
const SERIES_PIECE: usize = 64 * 1024;

/// One of a series answer's arrays.
enum Column {
    Steps(Vec<i64>),
    Values(Vec<f64>),
    Times(Vec<f64>),
}

impl Column {
    fn name(&self) -> &'static str {
        match self {
            Column::Steps(_) => "steps",
            Column::Values(_) => "values",
            Column::Times(_) => "times",
        }
    }

    fn len(&self) -> usize {
        match self {
            Column::Steps(v) => v.len(),
            Column::Values(v) | Column::Times(v) => v.len(),
        }
    }

    fn write(&self, i: usize, out: &mut Vec<u8>) {
        use std::io::Write;
        let _ = match self {
            Column::Steps(v) => write!(out, "{}", v[i]),
            // NaN and the infinities as the strings the API writes for them.
            Column::Values(v) => {
                serde_json::to_writer(&mut *out, &json_f64(v[i])).map_err(Into::into)
            }
            Column::Times(v) => serde_json::to_writer(&mut *out, &v[i]).map_err(Into::into),
        };
    }
}

/// A series answer written piece by piece: the head's fields, then each array.
struct SeriesBody {
    head: Option<Value>,
    columns: [Column; 3],
    column: usize,
    at: usize,
}

impl Iterator for SeriesBody {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        let mut out = Vec::with_capacity(SERIES_PIECE + 64);
        if let Some(head) = self.head.take() {
            // `{"budget":..,"downsampled":..,...` without its closing brace.
            let mut text = head.to_string();
            text.pop();
            out.extend_from_slice(text.as_bytes());
        }
        while self.column < self.columns.len() && out.len() < SERIES_PIECE {
            let column = &self.columns[self.column];
            if self.at == 0 {
                out.extend_from_slice(format!(",\"{}\":[", column.name()).as_bytes());
            }
            while self.at < column.len() && out.len() < SERIES_PIECE {
                if self.at > 0 {
                    out.push(b',');
                }
                column.write(self.at, &mut out);
                self.at += 1;
            }
            if self.at == column.len() {
                out.push(b']');
                self.column += 1;
                self.at = 0;
                if self.column == self.columns.len() {
                    out.push(b'}');
                }
            }
        }
        (!out.is_empty()).then(|| Bytes::from(out))
    }
}

pub(super) fn attachment(name: &str) -> String {
    format!("attachment; filename=\"{name}\"")
}

/// A download of the bytes `rx` hands on as they come (an `Err` breaks it off, so a client
/// never takes a cut file for a whole one), named `name`.
pub(super) fn download(
    rx: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>,
    content_type: &str,
    name: &str,
) -> Response {
    let body = Body::from_stream(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    }));
    (
        [
            (header::CONTENT_TYPE, content_type.to_string()),
            (header::CONTENT_DISPOSITION, attachment(name)),
        ],
        body,
    )
        .into_response()
}

/// A download whose client takes nothing for this long is abandoned.
pub(super) const EXPORT_STALL: std::time::Duration = std::time::Duration::from_secs(60);

/// The run as CSV: `step,timestamp,` then one column per metric; streamed from the store.
pub async fn export_csv(
    State(app): State<AppState>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let run = find(&app, &id, &scope).await?;
    let (metrics, last_seq, started) =
        run.state(|st| (st.metrics.clone(), st.tail.last_seq, st.identity.started_at));
    let header_line = stepstream_protocol::csv::header(metrics.iter().map(|m| m.name.as_str()));
    let column: Arc<std::collections::HashMap<MetricId, usize>> =
        Arc::new(metrics.iter().enumerate().map(|(i, m)| (m.id, i)).collect());
    let width = metrics.len();

    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(8);
    let _ = tx.send(Ok(Bytes::from(header_line))).await;
    let store = app.hub.store.clone();
    let key = run.key;
    // Paged: each page is one short read, sent before the next is read, so a client that
    // stops reading holds neither a database connection nor a transaction, and is dropped
    // after `EXPORT_STALL`.
    tokio::spawn(async move {
        let mut from = 0u64;
        while from < last_seq {
            let column = column.clone();
            let read = store
                .scan(
                    key,
                    from,
                    last_seq,
                    (String::new(), from),
                    move |(buf, last), seq, records| {
                        *last = seq;
                        let mut row: Vec<Option<f64>> = vec![None; width];
                        for r in records {
                            row.iter_mut().for_each(|c| *c = None);
                            for &(id, v) in &r.values {
                                if let Some(&i) = column.get(&id) {
                                    row[i] = Some(v);
                                }
                            }
                            stepstream_protocol::csv::push_row(
                                buf,
                                r.step,
                                r.wall_time,
                                row.iter().copied(),
                            );
                        }
                        if buf.len() >= 256 * 1024 {
                            ControlFlow::Break(())
                        } else {
                            ControlFlow::Continue(())
                        }
                    },
                )
                .await;
            let (page, last) = match read {
                Ok(page) => page,
                Err(e) => {
                    tracing::error!(error = %e, "CSV export failed");
                    let _ = tx.send(Err(std::io::Error::other(e.to_string()))).await;
                    return;
                }
            };
            let sent = tokio::time::timeout(EXPORT_STALL, tx.send(Ok(Bytes::from(page)))).await;
            if !matches!(sent, Ok(Ok(()))) || last == from {
                return;
            }
            from = last;
        }
    });
    let name = format!("run_{}_metrics.csv", utc_stamp(started));
    Ok(download(rx, "text/csv; charset=utf-8", &name))
}

/// The run's alerts (fired and resolved), oldest first.
pub async fn alerts(
    State(app): State<AppState>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let run = find(&app, &id, &scope).await?;
    let run_id = run.state(|st| st.identity.run_id.clone());
    let alerts = app.hub.store.alerts(run.key, run_id).await?;
    let acks: Vec<Value> = app
        .hub
        .store
        .acks(run.key)
        .await?
        .iter()
        .map(|a| json!({"rule": a.rule, "by": a.by, "at": a.at, "mute_until": a.mute_until}))
        .collect();
    let list: Vec<Value> = alerts
        .iter()
        .map(|a| {
            json!({
                "rule": a.rule,
                "state": if a.fired { "fired" } else { "resolved" },
                "step": a.step,
                "value": json_f64(a.value),
                "message": a.message,
                "at": a.at,
            })
        })
        .collect();
    Ok(Json(json!({ "run_id": id, "alerts": list, "acks": acks })))
}

/// The run's hyper-parameters, as the collector sent them.
pub async fn export_config(
    State(app): State<AppState>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let run = find(&app, &id, &scope).await?;
    let (config, started) =
        run.state(|st| (st.identity.config_json.clone(), st.identity.started_at));
    let name = format!("run_{}_config.json", utc_stamp(started));
    Ok((
        [
            (header::CONTENT_TYPE, "application/json".to_string()),
            (header::CONTENT_DISPOSITION, attachment(&name)),
        ],
        config,
    )
        .into_response())
}
