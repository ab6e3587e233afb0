//! The viewer WebSocket: the run list, then for each subscribed run its history and its live
//! points, exactly once each.
//!
//! Per subscription a task first subscribes to the run's live channel, then takes the run's
//! last published sequence number `S` once the store holds it (`Run::subscribe`), sends the
//! history through `S` from the store, then forwards live batches with `seq > S`: no batch
//! falls between the two and none is sent twice. Each viewer has one outgoing queue,
//! bounded in frames and in bytes; when it is full the subscription task waits, its live
//! channel lags, and it then sends a [`Resync`] and the missed batches from the store. History
//! is read in pages, each read finished before its frames are queued: a slow viewer costs
//! only itself, and a viewer that takes nothing for the write stall (`--limit write_stall_s`,
//! 30 s) is disconnected.

use crate::auth::Scope;
use crate::hub::{Hub, LiveEvent, Run};
use crate::state::AppState;
use axum::body::Bytes;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{ConnectInfo, Extension, State};
use axum::response::Response;
use futures_util::{SinkExt, StreamExt};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use stepstream_protocol::{
    unix_now, ErrorCode, FromViewer, HubError, Live, Metrics, Resync, RunId, RunList, StatusChange,
    ToViewer,
};
use tokio::sync::{broadcast, mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::AbortHandle;

mod backfill;
mod filter;
mod zoom;

use backfill::backfill;
use filter::Filter;

const OUTGOING_CAPACITY: usize = 256;

/// Zoom windows one viewer may have read at once (one per chart is the page's way).
const ZOOMS_AT_ONCE: usize = 64;
/// Bytes of frames a viewer's queue holds, at most. A viewer that stops reading costs the
/// hub this, plus the history page a subscription holds while it waits for room (at most
/// 25,000 points and one batch) and the socket's write buffer: under 8 MiB in all, however
/// long the history it asked for (`viewers_that_never_read_cost_at_most_8_mib_each_and_block_nobody`).
const OUTGOING_BYTES: usize = 5 << 20;

/// Frames written to a viewer's socket at once, at most: a write costs the hub the same
/// for one frame as for many.
const COALESCE_FRAMES: usize = 64;

/// How long a viewer's writer waits for more frames after the first before it writes. A
/// group commit settles its batches over a millisecond or two, each run's on its own task:
/// without the wait a viewer of ten runs got about one write per batch (the fleet's hub made
/// 121,126 sends in 10 s; with it, 23,694).
const COALESCE_WAIT: std::time::Duration = std::time::Duration::from_millis(3);

pub async fn viewer_socket(
    State(app): State<AppState>,
    Extension(scope): Extension<Scope>,
    Extension(token): Extension<crate::auth::Presented>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: axum::http::HeaderMap,
    ws: WebSocketUpgrade,
) -> Response {
    let client = app.sockets.client_addr(peer.ip(), &headers);
    let slot = match app.sockets.slot(client) {
        Ok(slot) => slot,
        Err(refused) => return axum::response::IntoResponse::into_response(refused),
    };
    ws.max_message_size(64 * 1024)
        .read_buffer_size(crate::ingest::SOCKET_READ_BUFFER)
        .on_upgrade(move |socket| async move {
            let _slot = slot;
            let _open = crate::sockets::Open::new(&app.sockets.viewers);
            let revoked = revocation(app.auth.clone(), token.0, scope.clone());
            serve(app.hub.clone(), socket, scope, revoked).await
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
/// Runs per run-list page: with headline values a page is a few hundred KiB, far inside a
/// viewer's 5 MiB queue, however many runs the hub keeps.
const RUN_LIST_PAGE: usize = 1000;

/// Sends the run list as the viewer's token may see it, in pages; `Err` when the viewer is
/// gone.
async fn send_run_list(hub: &Hub, scope: &Scope, out: &Out) -> Result<(), Closed> {
    let mut runs = hub.run_list();
    runs.retain(|r| scope.allows(&r.project, r.run_id.as_str()));
    let now = unix_now();
    let pages = runs.len().div_ceil(RUN_LIST_PAGE).max(1);
    let mut runs = runs.into_iter();
    for page in 0..pages {
        let list = RunList {
            runs: runs.by_ref().take(RUN_LIST_PAGE).collect(),
            now,
            done: page + 1 == pages,
        };
        out.send(frame(ToViewer::RunList(list))).await?;
    }
    Ok(())
}

/// A run-list update (an encoded frame) as the viewer may see it: the frame itself, the
/// part of a [`ToViewer::RunUpdates`] about runs it may see, or nothing.
fn update_visible(hub: &Hub, scope: &Scope, bytes: Bytes) -> Option<Bytes> {
    if matches!(scope, Scope::All) {
        return Some(bytes);
    }
    let visible = match ToViewer::decode(&bytes) {
        Ok(ToViewer::RunUpdate(u)) => scope.allows(&u.run.project, u.run.run_id.as_str()),
        Ok(ToViewer::StatusChange(c)) => visible(hub, scope, &c.run_id),
        Ok(ToViewer::RunDeleted(d)) => scope.allows(&d.project, d.run_id.as_str()),
        Ok(ToViewer::RunUpdates(mut u)) => {
            let all = u.runs.len();
            u.runs
                .retain(|r| scope.allows(&r.project, r.run_id.as_str()));
            return match u.runs.len() {
                0 => None,
                n if n == all => Some(bytes),
                _ => Some(frame(ToViewer::RunUpdates(u))),
            };
        }
        Ok(_) | Err(_) => false,
    };
    visible.then_some(bytes)
}

fn frame(msg: ToViewer) -> Bytes {
    Bytes::from(msg.encode())
}

/// The viewer went away.
#[derive(Debug)]
struct Closed;

/// A viewer's outgoing queue, bounded in frames and in bytes; each queued frame holds its
/// share of the byte budget until the socket took it.
#[derive(Clone)]
struct Out {
    tx: mpsc::Sender<(Bytes, OwnedSemaphorePermit)>,
    bytes: Arc<Semaphore>,
}

impl Out {
    fn new() -> (Out, mpsc::Receiver<(Bytes, OwnedSemaphorePermit)>) {
        let (tx, rx) = mpsc::channel(OUTGOING_CAPACITY);
        let bytes = Arc::new(Semaphore::new(OUTGOING_BYTES));
        (Out { tx, bytes }, rx)
    }

    async fn send(&self, frame: Bytes) -> Result<(), Closed> {
        let n = frame.len().clamp(1, OUTGOING_BYTES) as u32;
        let permit = self
            .bytes
            .clone()
            .acquire_many_owned(n)
            .await
            .map_err(|_| Closed)?;
        self.tx.send((frame, permit)).await.map_err(|_| Closed)
    }

    fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// Resolves once the viewer's token no longer reads what it read when the socket opened (it
/// was revoked, or its scope changed): the socket then closes, and a page that reconnects
/// gets what its token reads now.
async fn revocation(auth: Arc<crate::auth::LiveAuth>, token: Option<String>, scope: Scope) {
    let mut changes = auth.changes();
    while changes.changed().await.is_ok() {
        if auth.current().read_scope(token.as_deref()).as_ref() != Some(&scope) {
            return;
        }
    }
    std::future::pending::<()>().await
}

async fn serve(
    hub: Arc<Hub>,
    socket: WebSocket,
    scope: Scope,
    revoked: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(revoked);
    let (mut sink, mut stream) = socket.split();
    let (out, mut outgoing) = Out::new();
    let budget = out.bytes.clone();
    let write_timeout = hub.limits.write_stall;
    let writer = tokio::spawn(async move {
        let mut taken = Vec::with_capacity(COALESCE_FRAMES);
        while outgoing.recv_many(&mut taken, COALESCE_FRAMES).await > 0 {
            // Frames queued meanwhile, or within COALESCE_WAIT (a group commit's batches of
            // several runs), go out in the same write.
            if taken.len() < COALESCE_FRAMES {
                tokio::time::sleep(COALESCE_WAIT).await;
                if !outgoing.is_empty() {
                    let room = COALESCE_FRAMES - taken.len();
                    outgoing.recv_many(&mut taken, room).await;
                }
            }
            let write = async {
                for (bytes, _) in &taken {
                    sink.feed(Message::Binary(bytes.clone())).await?;
                }
                sink.flush().await
            };
            let outcome = tokio::time::timeout(write_timeout, write).await;
            // The permits go with the frames: their bytes are the socket's now.
            taken.clear();
            match outcome {
                Ok(Ok(())) => {}
                Ok(Err(_)) => break,
                Err(_) => {
                    tracing::info!("viewer took no frame for {write_timeout:?}; disconnecting it");
                    break;
                }
            }
        }
        // Wakes any task waiting for queue room: it then finds the viewer gone.
        budget.close();
        let _ = sink.close().await;
    });

    let mut updates = hub.subscribe_updates();
    let mut subscriptions: HashMap<RunId, AbortHandle> = HashMap::new();
    let mut zooms: HashMap<(RunId, String), AbortHandle> = HashMap::new();
    let _ = send_run_list(&hub, &scope, &out).await;
    loop {
        tokio::select! {
            () = &mut revoked => {
                tracing::info!("read token revoked or rescoped: closing its viewer socket");
                let _ = out.send(error(ErrorCode::Unauthorized, "the read token was revoked", true)).await;
                break;
            }
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
                            let found = hub.find_run(run_id).await;
                            let Some(run) = found.filter(|_| visible(&hub, &scope, run_id)) else {
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
                    Ok(FromViewer::Zoom(zoom)) => {
                        // The newest window of a chart replaces the one being read for it.
                        zooms.retain(|_, task| !task.is_finished());
                        let key = (zoom.run_id.clone(), zoom.metric.clone());
                        if let Some(old) = zooms.remove(&key) {
                            old.abort();
                        }
                        if zooms.len() >= ZOOMS_AT_ONCE {
                            let msg = format!("more than {ZOOMS_AT_ONCE} zoom windows read at once");
                            let _ = out.send(error(ErrorCode::Limit, &msg, false)).await;
                            continue;
                        }
                        let task = tokio::spawn(zoom::answer(hub.clone(), scope.clone(), zoom, out.clone()));
                        zooms.insert(key, task.abort_handle());
                    }
                    Err(e) => {
                        let _ = out.send(error(ErrorCode::BadFrame, &e.to_string(), false)).await;
                    }
                }
            }
            update = updates.recv() => match update {
                Ok(bytes) => {
                    if let Some(bytes) = update_visible(&hub, &scope, bytes) {
                        if out.send(bytes).await.is_err() {
                            break;
                        }
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    // The list moved faster than this viewer reads: send it whole again.
                    let _ = send_run_list(&hub, &scope, &out).await;
                }
                Err(broadcast::error::RecvError::Closed) => break,
            },
        }
    }
    for task in subscriptions.into_values().chain(zooms.into_values()) {
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

/// Sends a run's history then its live stream to one viewer, until aborted or the viewer
/// goes away.
async fn follow(hub: Arc<Hub>, run: Arc<Run>, mut filter: Filter, out: Out) {
    let (mut live, through) = run.subscribe().await;
    let (run_id, defs, status, message) = run.state(|st| {
        (
            st.identity.run_id.clone(),
            st.metrics.clone(),
            st.status,
            st.status_message.clone(),
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
    // Its commands so far, each as it stands (a change meanwhile may come twice: viewers
    // key them by id and keep the furthest state).
    if let Ok(commands) = hub.store.commands(run.key, run_id.clone()).await {
        for c in commands {
            if out.send(frame(ToViewer::CommandEvent(c))).await.is_err() {
                return;
            }
        }
    }
    // A resubscription continues after the batches the viewer holds, exactly (no budget:
    // what it misses is what arrived while it was away); a new one gets the whole history.
    let (after, budget) = match filter.after_seq {
        Some(held) => (held.min(through), None),
        None => (0, filter.budget),
    };
    if backfill(&hub, &run, &filter, after, through, budget, &out)
        .await
        .is_break()
    {
        return;
    }
    let mut last = through.max(filter.after_seq.unwrap_or(0));
    loop {
        let sent = match live.recv().await {
            Ok(LiveEvent::Batch {
                seq,
                records,
                items,
                frame: whole,
            }) => {
                if seq <= last {
                    continue;
                }
                last = seq;
                if filter.takes_all_of(&items) {
                    out.send(whole).await
                } else {
                    let records = filter.records(&records);
                    // A viewer of some metrics (a widget's chart) takes no console lines
                    // unless it asked for them (a widget's console or sample panel).
                    let items = if filter.items {
                        items.to_vec()
                    } else {
                        Vec::new()
                    };
                    if records.is_empty() && items.is_empty() {
                        continue;
                    }
                    out.send(frame(ToViewer::Live(Live {
                        run_id: run_id.clone(),
                        seq,
                        records,
                        items,
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
            Ok(LiveEvent::Command(event)) => out.send(frame(ToViewer::CommandEvent(event))).await,
            Ok(LiveEvent::Deleted) => return,
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                tracing::info!(run = %run_id, missed, after_seq = last, "viewer lagged; resynchronising from storage");
                let through = run.settled_through().await;
                let defs = run.state(|st| st.metrics.clone());
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
                // Above `through` only if batches sent were then taken back: their resends
                // are the same records, and the viewer has them.
                last = last.max(through);
                Ok(())
            }
            Err(broadcast::error::RecvError::Closed) => return,
        };
        if sent.is_err() {
            return;
        }
    }
}
