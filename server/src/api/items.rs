//! A run's console and samples over HTTP: the console's lines (a window or the tail,
//! searched by regular expression, filtered by stream), the whole console as a text
//! download, and a key's samples. Every answer is bounded (lines and bytes), and a download
//! is read in pages, so a client that stops reading holds no database connection.

use super::{attachment, find, ApiError, EXPORT_STALL};
use crate::auth::Scope;
use crate::state::AppState;
use crate::store::{image_of, ItemQuery, StoredItem};
use axum::body::{Body, Bytes};
use axum::extract::{Extension, Path, Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use std::ops::ControlFlow;
use stepstream_protocol::utc_stamp;

/// Lines one console answer holds, at most (`limit` is capped here).
const MOST_LINES: usize = 100_000;
/// Bytes of text one answer holds, about, at most: past it the answer says `more`.
const MOST_BYTES: usize = 8 << 20;
/// A search pattern's length, at most, and its compiled size.
const MOST_PATTERN: usize = 1000;

#[derive(Debug, Deserialize)]
pub struct ConsoleQuery {
    from_step: Option<i64>,
    to_step: Option<i64>,
    /// A regular expression the line must match.
    q: Option<String>,
    /// `stdout` or `stderr`.
    stream: Option<String>,
    limit: Option<usize>,
    /// `text`: the whole console as a download.
    format: Option<String>,
}

/// A search pattern, refused clearly when it is not a regular expression or too large.
fn pattern(q: Option<&str>) -> Result<Option<regex::Regex>, ApiError> {
    let Some(q) = q.filter(|q| !q.is_empty()) else {
        return Ok(None);
    };
    if q.len() > MOST_PATTERN {
        return Err(ApiError::BadRequest(format!(
            "q is {} bytes; at most {MOST_PATTERN}",
            q.len()
        )));
    }
    regex::RegexBuilder::new(q)
        .size_limit(1 << 20)
        .build()
        .map(Some)
        .map_err(|e| ApiError::BadRequest(format!("q is not a regular expression: {e}")))
}

fn line_json(i: &StoredItem) -> Value {
    json!({
        "seq": i.seq,
        "idx": i.idx,
        "step": i.step,
        "wall_time": i.wall_time,
        "stream": i.stream,
        "text": i.body,
    })
}

/// `GET /api/runs/{id}/console`: with `from_step`, the first `limit` matching lines from
/// there (through `to_step`); without, the last `limit` matching lines (through `to_step`),
/// in order either way. `total`, `kept` and `dropped` count the run's lines (the oldest
/// beyond the hub's cap are dropped); `more` says the answer stopped at its limit.
pub async fn console(
    State(app): State<AppState>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
    Query(q): Query<ConsoleQuery>,
) -> Result<Response, ApiError> {
    let run = find(&app, &id, &scope).await?;
    let stream = match q.stream.as_deref() {
        None | Some("") => None,
        Some(s @ ("stdout" | "stderr")) => Some(s.to_string()),
        Some(other) => {
            return Err(ApiError::BadRequest(format!(
                "stream must be stdout or stderr, not {other:?}"
            )))
        }
    };
    let re = pattern(q.q.as_deref())?;
    let steps = (
        q.from_step.unwrap_or(i64::MIN),
        q.to_step.unwrap_or(i64::MAX),
    );
    if q.format.as_deref() == Some("text") {
        let started = run.state(|st| st.identity.started_at);
        return Ok(download(&app, run.key, steps, stream, re, started));
    }
    let limit = q.limit.unwrap_or(1000).clamp(1, MOST_LINES);
    let newest_first = q.from_step.is_none();
    let (mut lines, more) = app
        .hub
        .store
        .items(
            run.key,
            ItemQuery::console(steps, newest_first),
            (Vec::new(), 0usize, false),
            move |(lines, bytes, more), item| {
                if stream.as_deref().is_some_and(|s| item.stream != Some(s))
                    || re.as_ref().is_some_and(|re| !re.is_match(&item.body))
                {
                    return ControlFlow::Continue(());
                }
                if lines.len() >= limit || *bytes >= MOST_BYTES {
                    *more = true;
                    return ControlFlow::Break(());
                }
                *bytes += item.body.len();
                lines.push(line_json(&item));
                ControlFlow::Continue(())
            },
        )
        .await
        .map(|(lines, _, more)| (lines, more))?;
    if newest_first {
        lines.reverse();
    }
    let (total, kept) = app.hub.store.console_counts(run.key).await?;
    Ok(Json(json!({
        "run_id": id,
        "lines": lines,
        "total": total,
        "kept": kept,
        "dropped": total.saturating_sub(kept),
        "more": more,
    }))
    .into_response())
}

/// The console as text, oldest first, one line per line (`[stderr]` marks stderr), in pages.
fn download(
    app: &AppState,
    key: crate::store::RunKey,
    steps: (i64, i64),
    stream: Option<String>,
    re: Option<regex::Regex>,
    started: f64,
) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(8);
    let store = app.hub.store.clone();
    tokio::spawn(async move {
        if let Ok((total, kept)) = store.console_counts(key).await {
            if total > kept {
                let note = format!(
                    "[stepstream: the first {} lines were dropped (the hub keeps the last {kept})]\n",
                    total - kept
                );
                let _ = tx.send(Ok(Bytes::from(note))).await;
            }
        }
        // Whole batches per page, so the next page starts after the last one sent.
        let mut after = 0u64;
        loop {
            let (stream, re) = (stream.clone(), re.clone());
            let mut query = ItemQuery::console(steps, false);
            query.seqs = (after, u64::MAX);
            let read = store
                .items(
                    key,
                    query,
                    (String::new(), after, false),
                    move |(buf, at, full), item| {
                        if item.seq != *at {
                            // The batches through `at` are whole in the page.
                            if buf.len() >= 256 * 1024 {
                                *full = true;
                                return ControlFlow::Break(());
                            }
                            *at = item.seq;
                        }
                        if stream.as_deref().is_some_and(|s| item.stream != Some(s))
                            || re.as_ref().is_some_and(|re| !re.is_match(&item.body))
                        {
                            return ControlFlow::Continue(());
                        }
                        if item.stream == Some("stderr") {
                            buf.push_str("[stderr] ");
                        }
                        buf.push_str(&item.body);
                        buf.push('\n');
                        ControlFlow::Continue(())
                    },
                )
                .await;
            let (page, at, full) = match read {
                Ok(page) => page,
                Err(e) => {
                    tracing::error!(error = %e, "console download failed");
                    let _ = tx.send(Err(std::io::Error::other(e.to_string()))).await;
                    return;
                }
            };
            let sent = tokio::time::timeout(EXPORT_STALL, tx.send(Ok(Bytes::from(page)))).await;
            if !matches!(sent, Ok(Ok(()))) || !full || at <= after {
                return;
            }
            after = at;
        }
    });
    let body = Body::from_stream(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    }));
    let name = format!("run_{}_console.txt", utc_stamp(started));
    (
        [
            (
                header::CONTENT_TYPE,
                "text/plain; charset=utf-8".to_string(),
            ),
            (header::CONTENT_DISPOSITION, attachment(&name)),
        ],
        body,
    )
        .into_response()
}

#[derive(Debug, Deserialize)]
pub struct SamplesQuery {
    key: Option<String>,
    from_step: Option<i64>,
    to_step: Option<i64>,
    limit: Option<usize>,
}

/// `GET /api/runs/{id}/samples?key=`: a key's text and table samples, oldest first, through
/// `to_step` from `from_step` (the last `limit` when `from_step` is not given); without a
/// key, the newest samples of every key (which keys a run has).
pub async fn samples(
    State(app): State<AppState>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
    Query(q): Query<SamplesQuery>,
) -> Result<Json<Value>, ApiError> {
    let run = find(&app, &id, &scope).await?;
    let run_id = id.clone();
    let steps = (
        q.from_step.unwrap_or(i64::MIN),
        q.to_step.unwrap_or(i64::MAX),
    );
    let limit = q.limit.unwrap_or(1000).clamp(1, MOST_LINES);
    let newest_first = q.from_step.is_none();
    // Console lines are no samples (they have no key): left out below.
    let query = ItemQuery::samples(q.key, steps, newest_first);
    let (mut out, more) = app
        .hub
        .store
        .items(
            run.key,
            query,
            (Vec::new(), 0usize, false),
            move |(out, bytes, more), item| {
                if item.key.is_empty() {
                    return ControlFlow::Continue(());
                }
                if out.len() >= limit || *bytes >= MOST_BYTES {
                    *more = true;
                    return ControlFlow::Break(());
                }
                *bytes += item.body.len();
                let body = match item.kind {
                    stepstream_protocol::ItemKind::Table
                    | stepstream_protocol::ItemKind::Histogram => {
                        serde_json::from_str(&item.body).unwrap_or(Value::Null)
                    }
                    // An image's place: its bytes are at `src`.
                    stepstream_protocol::ItemKind::Image => match image_of(&item.body) {
                        Some(i) => json!({
                            "format": i.format.mime(),
                            "width": i.width,
                            "height": i.height,
                            "caption": i.caption,
                            "bytes": i.data.len(),
                            "src": format!("/api/runs/{run_id}/image?seq={}&idx={}", item.seq, item.idx),
                        }),
                        None => Value::Null,
                    },
                    _ => Value::from(item.body.as_str()),
                };
                out.push(json!({
                    "seq": item.seq,
                    "idx": item.idx,
                    "kind": item.kind.as_str(),
                    "key": item.key,
                    "step": item.step,
                    "wall_time": item.wall_time,
                    "body": body,
                }));
                ControlFlow::Continue(())
            },
        )
        .await
        .map(|(out, _, more)| (out, more))?;
    if newest_first {
        out.reverse();
    }
    Ok(Json(json!({ "run_id": id, "samples": out, "more": more })))
}

#[derive(Debug, Deserialize)]
pub struct ImageQuery {
    seq: u64,
    idx: u32,
}

/// `GET /api/runs/{id}/image?seq=&idx=`: one stored image's file, as logged (PNG or JPEG).
/// Stored images never change, so the answer may be cached for good.
pub async fn image(
    State(app): State<AppState>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
    Query(q): Query<ImageQuery>,
) -> Result<Response, ApiError> {
    let run = find(&app, &id, &scope).await?;
    let mut query = ItemQuery::batches(q.seq.saturating_sub(1), q.seq);
    query.kind = Some(stepstream_protocol::ItemKind::Image);
    let found = app
        .hub
        .store
        .items(run.key, query, None, move |found, item| {
            if item.idx == q.idx {
                *found = image_of(&item.body);
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .await?;
    let Some(img) = found else {
        return Err(ApiError::BadRequest(format!(
            "run {id} has no image at seq {} idx {}",
            q.seq, q.idx
        )));
    };
    Ok((
        [
            (header::CONTENT_TYPE, img.format.mime().to_string()),
            (
                header::CACHE_CONTROL,
                "private, max-age=31536000, immutable".to_string(),
            ),
        ],
        img.data,
    )
        .into_response())
}
