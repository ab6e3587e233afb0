//! The viewer WebSocket: the run list, then for each subscribed run its history and its live
//! points, exactly once each.
//!
//! Per subscription a task first subscribes to the run's live channel, then reads the run's
//! last stored sequence number `S` and sends the history through `S` from the store, then
//! forwards live batches with `seq > S`. Every batch is published after it is stored, so no
//! batch falls between the two and none is sent twice. Each viewer has one bounded outgoing
//! queue; when it is full the subscription task waits, its live channel lags, and it then
//! sends a [`Resync`] and the missed batches from the store: a slow viewer costs only itself.

use crate::auth::Scope;
use crate::downsample::PerMetric;
use crate::hub::{Hub, LiveEvent, Run};
use crate::AppState;
use axum::body::Bytes;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{ConnectInfo, Extension, State};
use axum::response::Response;
use futures_util::{SinkExt, StreamExt};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::sync::Arc;
use stepstream_protocol::{
    unix_now, Backfill, ErrorCode, FromViewer, HubError, Live, MetricDef, MetricId, Metrics,
    Resync, RunId, Series, StatusChange, StepRecord, Subscribe, ToViewer,
};
use tokio::sync::{broadcast, mpsc};
use tokio::task::AbortHandle;

const OUTGOING_CAPACITY: usize = 256;
/// Values per raw backfill chunk.
const CHUNK_VALUES: usize = 50_000;

/// A viewer that does not take a frame for this long is disconnected: its queue, its
/// subscription tasks and their reads are freed.
const WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

pub async fn viewer_socket(
    State(app): State<AppState>,
    Extension(scope): Extension<Scope>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    ws: WebSocketUpgrade,
) -> Response {
    let slot = match crate::ingest::connection_slot(&app, peer) {
        Ok(slot) => slot,
        Err(refused) => return axum::response::IntoResponse::into_response(refused),
    };
    ws.max_message_size(64 * 1024)
        .on_upgrade(move |socket| async move {
            let _slot = slot;
            serve(app.hub.clone(), socket, scope).await
        })
}

/// Whether the viewer's token covers `run_id`.
fn visible(hub: &Hub, scope: &Scope, run_id: &RunId) -> bool {
    matches!(scope, Scope::All)
        || hub
            .run(run_id)
            .is_some_and(|r| r.state(|st| scope.allows(&st.identity.project, run_id.as_str())))
}

/// The run list as the viewer's token may see it.
fn run_list(hub: &Hub, scope: &Scope) -> Bytes {
    let mut list = hub.run_list();
    list.runs
        .retain(|r| scope.allows(&r.project, r.run_id.as_str()));
    frame(ToViewer::RunList(list))
}

/// Whether a run-list update (an encoded frame) is about a run the viewer may see.
fn update_visible(hub: &Hub, scope: &Scope, bytes: &[u8]) -> bool {
    if matches!(scope, Scope::All) {
        return true;
    }
    match ToViewer::decode(bytes) {
        Ok(ToViewer::RunUpdate(u)) => scope.allows(&u.run.project, u.run.run_id.as_str()),
        Ok(ToViewer::StatusChange(c)) => visible(hub, scope, &c.run_id),
        Ok(ToViewer::RunList(_)) | Err(_) => false,
        Ok(_) => false,
    }
}

fn frame(msg: ToViewer) -> Bytes {
    Bytes::from(msg.encode())
}

async fn serve(hub: Arc<Hub>, socket: WebSocket, scope: Scope) {
    let (mut sink, mut stream) = socket.split();
    let (out, mut outgoing) = mpsc::channel::<Bytes>(OUTGOING_CAPACITY);
    let writer = tokio::spawn(async move {
        while let Some(bytes) = outgoing.recv().await {
            match tokio::time::timeout(WRITE_TIMEOUT, sink.send(Message::Binary(bytes))).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => break,
                Err(_) => {
                    tracing::info!("viewer took no frame for {WRITE_TIMEOUT:?}; disconnecting it");
                    break;
                }
            }
        }
        let _ = sink.close().await;
    });

    let mut updates = hub.subscribe_updates();
    let mut subscriptions: HashMap<RunId, AbortHandle> = HashMap::new();
    let _ = out.send(run_list(&hub, &scope)).await;
    loop {
        tokio::select! {
            incoming = stream.next() => {
                let bytes = match incoming {
                    Some(Ok(Message::Binary(bytes))) => bytes,
                    Some(Ok(Message::Text(_))) => {
                        let _ = out.send(error(ErrorCode::BadFrame, "send binary frames", false)).await;
                        continue;
                    }
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                    Some(Ok(_)) => continue,
                };
                match FromViewer::decode(&bytes) {
                    Ok(FromViewer::Subscribe(sub)) => {
                        let most = hub.limits.viewer_budget;
                        if sub.budget.is_some_and(|b| b > most || b == 0) {
                            let msg = format!(
                                "budget {} is outside 1..={most} points per metric (limit viewer_budget)",
                                sub.budget.unwrap_or(0)
                            );
                            tracing::info!(%msg, "subscription refused");
                            let _ = out.send(error(ErrorCode::Limit, &msg, false)).await;
                            continue;
                        }
                        for run_id in &sub.runs {
                            if let Some(old) = subscriptions.remove(run_id) {
                                old.abort();
                            }
                            let Some(run) = hub.run(run_id).filter(|_| visible(&hub, &scope, run_id)) else {
                                let msg = format!("unknown run {run_id}");
                                let _ = out.send(error(ErrorCode::UnknownRun, &msg, false)).await;
                                continue;
                            };
                            let task = tokio::spawn(follow(hub.clone(), run, Filter::new(&sub), out.clone()));
                            subscriptions.insert(run_id.clone(), task.abort_handle());
                        }
                    }
                    Ok(FromViewer::Unsubscribe(unsub)) => {
                        for run_id in &unsub.runs {
                            if let Some(old) = subscriptions.remove(run_id) {
                                old.abort();
                            }
                        }
                    }
                    Err(e) => {
                        let _ = out.send(error(ErrorCode::BadFrame, &e.to_string(), false)).await;
                    }
                }
            }
            update = updates.recv() => match update {
                Ok(bytes) => {
                    if update_visible(&hub, &scope, &bytes) && out.send(bytes).await.is_err() {
                        break;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    // The list moved faster than this viewer reads: send it whole again.
                    let _ = out.send(run_list(&hub, &scope)).await;
                }
                Err(broadcast::error::RecvError::Closed) => break,
            },
        }
    }
    for (_, task) in subscriptions {
        task.abort();
    }
    drop(out);
    let _ = writer.await;
}

fn error(code: ErrorCode, message: &str, fatal: bool) -> Bytes {
    frame(ToViewer::HubError(HubError {
        code,
        message: message.to_string(),
        fatal,
    }))
}

/// What of a run a subscription wants.
#[derive(Clone)]
struct Filter {
    names: Option<HashSet<String>>,
    /// Ids of the wanted names, learnt as metrics are defined; unused when `names` is None.
    ids: HashSet<MetricId>,
    from_step: Option<i64>,
    budget: Option<usize>,
}

impl Filter {
    fn new(sub: &Subscribe) -> Filter {
        Filter {
            names: sub.metrics.as_ref().map(|m| m.iter().cloned().collect()),
            ids: HashSet::new(),
            from_step: sub.from_step,
            budget: sub.budget.map(|b| b as usize),
        }
    }

    /// Learns the ids of wanted metrics; returns the definitions the viewer should get.
    fn learn(&mut self, defs: &[MetricDef]) -> Vec<MetricDef> {
        let Some(names) = &self.names else {
            return defs.to_vec();
        };
        let wanted: Vec<MetricDef> = defs
            .iter()
            .filter(|d| names.contains(&d.name))
            .cloned()
            .collect();
        self.ids.extend(wanted.iter().map(|d| d.id));
        wanted
    }

    fn takes_everything(&self) -> bool {
        self.names.is_none() && self.from_step.is_none()
    }

    fn wants(&self, id: MetricId) -> bool {
        self.names.is_none() || self.ids.contains(&id)
    }

    fn step_ok(&self, step: i64) -> bool {
        self.from_step.is_none_or(|from| step >= from)
    }

    fn records(&self, records: &[StepRecord]) -> Vec<StepRecord> {
        records
            .iter()
            .filter(|r| self.step_ok(r.step))
            .map(|r| StepRecord {
                step: r.step,
                wall_time: r.wall_time,
                values: r
                    .values
                    .iter()
                    .copied()
                    .filter(|&(id, _)| self.wants(id))
                    .collect(),
            })
            .filter(|r| !r.values.is_empty())
            .collect()
    }
}

/// Sends a run's history then its live stream to one viewer, until aborted or the viewer
/// goes away.
async fn follow(hub: Arc<Hub>, run: Arc<Run>, mut filter: Filter, out: mpsc::Sender<Bytes>) {
    let mut live = run.live.subscribe();
    let (run_id, defs, status, message, through) = run.state(|st| {
        (
            st.identity.run_id.clone(),
            st.metrics.clone(),
            st.status,
            st.status_message.clone(),
            st.tail.last_seq,
        )
    });
    let defs = filter.learn(&defs);
    let intro = [
        ToViewer::Metrics(Metrics {
            run_id: run_id.clone(),
            metrics: defs,
        }),
        ToViewer::StatusChange(StatusChange {
            run_id: run_id.clone(),
            status,
            message,
            at: unix_now(),
        }),
    ];
    for msg in intro {
        if out.send(frame(msg)).await.is_err() {
            return;
        }
    }
    // The run's alerts so far (one raised meanwhile may come twice: viewers key them).
    if let Ok(alerts) = hub.store.alerts(run.key, run_id.clone()).await {
        for a in alerts {
            if out.send(frame(ToViewer::Alert(a))).await.is_err() {
                return;
            }
        }
    }
    let budget = filter.budget;
    if backfill(&hub, &run, &filter, 0, through, budget, &out)
        .await
        .is_break()
    {
        return;
    }
    let mut last = through;
    loop {
        let sent = match live.recv().await {
            Ok(LiveEvent::Batch {
                seq,
                records,
                frame: whole,
            }) => {
                if seq <= last {
                    continue;
                }
                last = seq;
                if filter.takes_everything() {
                    out.send(whole).await
                } else {
                    let records = filter.records(&records);
                    if records.is_empty() {
                        continue;
                    }
                    out.send(frame(ToViewer::Live(Live {
                        run_id: run_id.clone(),
                        seq,
                        records,
                    })))
                    .await
                }
            }
            Ok(LiveEvent::Metrics(defs)) => {
                let metrics = filter.learn(&defs);
                if metrics.is_empty() {
                    continue;
                }
                out.send(frame(ToViewer::Metrics(Metrics {
                    run_id: run_id.clone(),
                    metrics,
                })))
                .await
            }
            Ok(LiveEvent::Status(change)) => out.send(frame(ToViewer::StatusChange(change))).await,
            Ok(LiveEvent::Alert(alert)) => out.send(frame(ToViewer::Alert(alert))).await,
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                tracing::info!(run = %run_id, missed, after_seq = last, "viewer lagged; resynchronising from storage");
                let (defs, through) = run.state(|st| (st.metrics.clone(), st.tail.last_seq));
                let metrics = filter.learn(&defs);
                let notices = [
                    ToViewer::Resync(Resync {
                        run_id: run_id.clone(),
                        after_seq: last,
                        reason: format!("viewer fell {missed} events behind the live stream"),
                    }),
                    ToViewer::Metrics(Metrics {
                        run_id: run_id.clone(),
                        metrics,
                    }),
                ];
                for msg in notices {
                    if out.send(frame(msg)).await.is_err() {
                        return;
                    }
                }
                if backfill(&hub, &run, &filter, last, through, None, &out)
                    .await
                    .is_break()
                {
                    return;
                }
                last = through;
                Ok(())
            }
            Err(broadcast::error::RecvError::Closed) => return,
        };
        if sent.is_err() {
            return;
        }
    }
}

/// Sends the stored batches `after < seq <= through` (exactly, or thinned to `budget` points
/// per metric), in chunks of at most one metric and [`CHUNK_VALUES`] points, the last one
/// marked `done`. Reads are paged: no read holds a database connection (or a transaction)
/// while it waits for this viewer. `Break` when the viewer is gone.
async fn backfill(
    hub: &Hub,
    run: &Run,
    filter: &Filter,
    after: u64,
    through: u64,
    budget: Option<usize>,
    out: &mpsc::Sender<Bytes>,
) -> ControlFlow<()> {
    let (run_id, last_step) = run.state(|st| (st.identity.run_id.clone(), st.tail.last_step));
    let chunk = |series: Vec<Series>, downsampled: bool, done: bool| {
        frame(ToViewer::Backfill(Backfill {
            run_id: run_id.clone(),
            through_seq: through,
            downsampled,
            series,
            done,
        }))
    };
    let mut sent = true;
    if after >= through {
        sent = out.send(chunk(Vec::new(), false, true)).await.is_ok();
    } else if let Some(budget) = budget {
        let lo = hub
            .store
            .first_step(run.key)
            .await
            .ok()
            .flatten()
            .unwrap_or(0);
        let lo = filter.from_step.map_or(lo, |from| from.max(lo));
        let range = (lo, last_step.unwrap_or(lo).max(lo));
        // Two halves of the run on two threads, their M4s merged: the same answer, sooner.
        let scan = |from: u64, to: u64| {
            let filter = filter.clone();
            hub.store.scan_values(
                run.key,
                from,
                to,
                PerMetric::new(budget, range),
                move |per_metric, step, time, id, v| {
                    if filter.step_ok(step) && filter.wants(id) {
                        per_metric.push(id, step, v, time);
                    }
                },
            )
        };
        let mid = after + (through - after) / 2;
        let scanned = tokio::try_join!(scan(after, mid), scan(mid, through))
            .map(|(early, late)| early.merge(late));
        let per_metric = match scanned {
            Ok(per_metric) => per_metric,
            Err(e) => {
                tracing::error!(error = %e, "backfill failed");
                return ControlFlow::Break(());
            }
        };
        let mut pieces = Vec::new();
        for (metric, points) in per_metric.finish() {
            let (steps, values, times, thinned) = points.finish();
            for part in split_series(metric, steps, values, times) {
                pieces.push((part, thinned));
            }
        }
        let n = pieces.len();
        if n == 0 {
            sent = out.send(chunk(Vec::new(), false, true)).await.is_ok();
        }
        for (i, (series, thinned)) in pieces.into_iter().enumerate() {
            if out
                .send(chunk(vec![series], thinned, i + 1 == n))
                .await
                .is_err()
            {
                sent = false;
                break;
            }
        }
    } else {
        let mut from = after;
        while from < through && sent {
            let page = Page {
                chunk: Chunk::default(),
                last_seq: from,
            };
            let filter_page = filter.clone();
            let read = hub
                .store
                .scan(run.key, from, through, page, move |page, seq, records| {
                    page.chunk.add(&filter_page, records);
                    page.last_seq = seq;
                    if page.chunk.values >= CHUNK_VALUES {
                        ControlFlow::Break(())
                    } else {
                        ControlFlow::Continue(())
                    }
                })
                .await;
            let mut page = match read {
                Ok(page) => page,
                Err(e) => {
                    tracing::error!(error = %e, "backfill failed");
                    return ControlFlow::Break(());
                }
            };
            // Nothing stored past `from` (cannot happen below `through`): end here.
            let done = page.last_seq >= through || page.last_seq == from;
            from = page.last_seq;
            sent = out
                .send(chunk(page.chunk.take(), false, done))
                .await
                .is_ok();
            if done {
                break;
            }
        }
    }
    if sent && !out.is_closed() {
        ControlFlow::Continue(())
    } else {
        ControlFlow::Break(())
    }
}

/// One metric's points, cut into series of at most [`CHUNK_VALUES`] points.
fn split_series(
    metric: MetricId,
    steps: Vec<i64>,
    values: Vec<f64>,
    times: Vec<f64>,
) -> Vec<Series> {
    if steps.len() <= CHUNK_VALUES {
        return vec![Series {
            metric,
            steps,
            values,
            times,
        }];
    }
    steps
        .chunks(CHUNK_VALUES)
        .zip(values.chunks(CHUNK_VALUES))
        .zip(times.chunks(CHUNK_VALUES))
        .map(|((s, v), t)| Series {
            metric,
            steps: s.to_vec(),
            values: v.to_vec(),
            times: t.to_vec(),
        })
        .collect()
}

/// One page of a raw backfill: what was read, and the last batch it read.
struct Page {
    chunk: Chunk,
    last_seq: u64,
}

/// A raw backfill chunk being filled.
#[derive(Default)]
struct Chunk {
    series: BTreeMap<MetricId, Series>,
    values: usize,
}

impl Chunk {
    fn add(&mut self, filter: &Filter, records: &[StepRecord]) {
        for r in records.iter().filter(|r| filter.step_ok(r.step)) {
            for &(id, v) in r.values.iter().filter(|(id, _)| filter.wants(*id)) {
                let s = self.series.entry(id).or_insert_with(|| Series {
                    metric: id,
                    steps: Vec::new(),
                    values: Vec::new(),
                    times: Vec::new(),
                });
                s.steps.push(r.step);
                s.values.push(v);
                s.times.push(r.wall_time);
                self.values += 1;
            }
        }
    }

    fn take(&mut self) -> Vec<Series> {
        self.values = 0;
        std::mem::take(&mut self.series).into_values().collect()
    }
}
