//! The collector WebSocket: hello, metric definitions, batches, heartbeats, finish.
//!
//! A batch is acknowledged only after the store committed it. Any frame the hub cannot
//! accept gets a [`HubError`] that says why; a fatal one also closes the socket, and the
//! collector reconnects and resends whatever was not acknowledged, so nothing accepted is lost.

use crate::hub::{Hub, InFlight, IngestError, Run, Submitted};
use crate::state::AppState;
use crate::store::StoreError;
use crate::upgrade::{Gate, Socket, HELLO_LIMIT};
use axum::extract::{ConnectInfo, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures_util::{SinkExt, StreamExt};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use stepstream_protocol::{
    codec, Ack, Batch, ErrorCode, FinishAck, FinishStatus, FromHub, HubError, Pace, RunStatus,
    ToHub, Welcome,
};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;

/// Socket-level message limit: a little above the codec's, so an oversized frame reaches the
/// decoder and gets a clear error instead of a dropped connection.
pub const SOCKET_LIMIT: usize = codec::MAX_FRAME_LEN + 64 * 1024;
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Numbers each collector connection, so a run's writer claim names one connection.
static CONNECTIONS: AtomicU64 = AtomicU64::new(1);

/// Bytes read from a socket at a time (see the upgrade below).
pub(crate) const SOCKET_READ_BUFFER: usize = 16 * 1024;

pub async fn collector_socket(
    State(app): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    req: Request,
) -> Response {
    // Sockets that have not presented a token yet are few and cheap: a global count of them
    // (not one per address, which a proxy or a NAT shares), each bounded by the gate.
    let Some(pending) = app.sockets.pending_hellos.clone().try_acquire_owned().ok() else {
        tracing::warn!(%peer, "collector socket refused: too many connections awaiting their hello");
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "too many connections are awaiting their hello (limit pending_hellos); retry later\n",
        )
            .into_response();
    };
    let config = WebSocketConfig::default()
        .max_message_size(Some(SOCKET_LIMIT))
        .max_frame_size(Some(SOCKET_LIMIT))
        // tungstenite zero-fills its whole read buffer before each read: at its 128 KiB
        // default that memset was a tenth of a fleet hub's CPU (perf), for frames that are
        // mostly a few hundred bytes. Big batches are still read whole, in more reads.
        .read_buffer_size(SOCKET_READ_BUFFER);
    let client = app.sockets.client_addr(peer.ip(), req.headers());
    crate::upgrade::upgrade(
        req,
        config,
        app.sockets.prehello_bytes.clone(),
        move |socket, gate| async move {
            let sockets = app.sockets.clone();
            let _open = crate::sockets::Open::new(&sockets.collectors);
            let mut conn = Conn {
                socket,
                id: CONNECTIONS.fetch_add(1, Ordering::Relaxed),
                token: None,
                gate,
                pending: Some(pending),
                slot: None,
                client,
            };
            if let Err(refusal) = serve(&app, &mut conn).await {
                tracing::info!(code = ?refusal.code, message = %refusal.message, "collector refused");
                conn.send(FromHub::HubError(refusal)).await;
                let _ = conn.socket.send(Message::Close(None)).await;
            }
        },
    )
}

struct Conn {
    socket: Socket,
    id: u64,
    /// The hello's token: checked again whenever the tokens change.
    token: Option<String>,
    /// Opened once the hello is accepted: until then frames are bounded as they arrive.
    gate: Arc<Gate>,
    /// A place among the sockets awaiting their hello, given back once it is accepted.
    pending: Option<tokio::sync::OwnedSemaphorePermit>,
    /// This address's connection slot, taken once the hello is accepted.
    slot: Option<crate::sockets::Slot>,
    /// The address the per-address limit keys on.
    client: std::net::IpAddr,
}

impl Conn {
    async fn send(&mut self, msg: FromHub) -> bool {
        self.socket
            .send(Message::Binary(msg.encode().into()))
            .await
            .is_ok()
    }

    /// The next protocol frame, refused undecoded above `limit` bytes; `Ok(None)` when the
    /// peer closed.
    async fn next(&mut self, limit: usize) -> Result<Option<ToHub>, HubError> {
        loop {
            match self.socket.next().await {
                None | Some(Ok(Message::Close(_))) => return Ok(None),
                Some(Err(e)) => {
                    if let Some(why) = self.gate.refusal() {
                        return Err(fatal(ErrorCode::ProtocolViolation, why));
                    }
                    tracing::debug!(error = %e, "collector socket error");
                    return Ok(None);
                }
                Some(Ok(Message::Binary(bytes))) if bytes.len() > limit => {
                    return Err(fatal(
                        ErrorCode::ProtocolViolation,
                        format!(
                            "a frame of {} bytes before an accepted hello; until then frames \
                             are limited to {limit} bytes",
                            bytes.len()
                        ),
                    ))
                }
                Some(Ok(Message::Binary(bytes))) => {
                    return ToHub::decode(&bytes).map(Some).map_err(|e| {
                        let code = match e {
                            stepstream_protocol::DecodeError::UnsupportedVersion { .. } => {
                                ErrorCode::UnsupportedVersion
                            }
                            _ => ErrorCode::BadFrame,
                        };
                        fatal(code, e.to_string())
                    })
                }
                Some(Ok(Message::Text(_))) => {
                    return Err(fatal(
                        ErrorCode::BadFrame,
                        "text frames are not part of the protocol; send binary frames",
                    ))
                }
                Some(Ok(_)) => continue, // ping / pong
            }
        }
    }
}

fn fatal(code: ErrorCode, message: impl Into<String>) -> HubError {
    HubError {
        code,
        message: message.into(),
        fatal: true,
    }
}

async fn serve(app: &AppState, conn: &mut Conn) -> Result<(), HubError> {
    let hello = match tokio::time::timeout(HELLO_TIMEOUT, conn.next(HELLO_LIMIT)).await {
        Err(_) => {
            return Err(fatal(
                ErrorCode::ProtocolViolation,
                "no hello within 10 s of connecting",
            ))
        }
        Ok(Ok(None)) => return Ok(()),
        Ok(Ok(Some(ToHub::Hello(hello)))) => hello,
        Ok(Ok(Some(other))) => {
            return Err(fatal(
                ErrorCode::ProtocolViolation,
                format!("the first message must be Hello, not {}", other.name()),
            ))
        }
        Ok(Err(e)) => return Err(e),
    };
    tracing::debug!(run = %hello.run.run_id, writer = hello.writer, "hello");
    if hello.protocol != codec::VERSION {
        return Err(fatal(
            ErrorCode::UnsupportedVersion,
            format!(
                "collector speaks protocol {}, this hub speaks {}",
                hello.protocol,
                codec::VERSION
            ),
        ));
    }
    conn.token = hello.token.clone();
    if !app
        .auth
        .current()
        .may_write(hello.token.as_deref(), &hello.run.project)
    {
        return Err(fatal(
            ErrorCode::Unauthorized,
            format!(
                "missing or wrong write token for project {:?}",
                hello.run.project
            ),
        ));
    }
    // Authenticated: the address's slot now (a proxy's many clients or a stranger's sockets
    // awaiting their hello do not take it), and the socket may send what a batch needs.
    let slot = app
        .sockets
        .slot(conn.client)
        .map_err(|too_many| fatal(ErrorCode::Limit, too_many.to_string()))?;
    conn.slot = Some(slot);
    let run = app
        .hub
        .open_run(hello.run, hello.writer, conn.id)
        .await
        .map_err(refusal)?;
    conn.gate.open();
    conn.pending = None;
    let (run_id, last_seq, last_step, metrics) = run.state(|st| {
        (
            st.identity.run_id.clone(),
            st.tail.last_seq,
            st.tail.last_step,
            st.metrics.clone(),
        )
    });
    tracing::info!(run = %run_id, last_seq, "collector connected");
    // The linger the hub wants: now, in the welcome, then whenever it changes (a `Pace`).
    let mut pace = app.hub.pace.watch();
    let welcome = Welcome {
        run_id: run_id.clone(),
        last_seq,
        last_step,
        metrics,
        limits: app.hub.limits.wire,
        linger_ms: *pace.borrow_and_update(),
    };
    let mut served = Ok(());
    if conn.send(FromHub::Welcome(welcome)).await {
        if hello.acked_through > last_seq {
            // The collector saw batches acknowledged that this hub no longer has: its database
            // was restored or replaced. They are gone from the hub (the collector dropped them
            // when they were acknowledged); say so loudly, then continue after what is stored.
            tracing::error!(
                run = %run_id,
                acknowledged = hello.acked_through,
                stored = last_seq,
                "the hub lost acknowledged batches of this run (database restored or replaced?)"
            );
            let message = format!(
                "this hub has batches through {last_seq} but acknowledged {} earlier: batches \
                 {}..={} were lost by the hub (database restored or replaced?); continuing \
                 after {last_seq}",
                hello.acked_through,
                last_seq + 1,
                hello.acked_through
            );
            app.hub.note_loss(&run, message.clone());
            conn.send(FromHub::HubError(HubError {
                code: ErrorCode::Storage,
                message,
                fatal: false,
            }))
            .await;
        }
        served = session(app, conn, &run, pace).await;
    }
    app.hub.release_writer(&run, conn.id);
    served
}

/// The error frame for an ingest refusal: its code says whether retrying can help.
fn refusal(e: IngestError) -> HubError {
    let code = match &e {
        IngestError::Store(_) => ErrorCode::Storage,
        IngestError::Limit(_) => ErrorCode::Limit,
        IngestError::Conflict(_) => ErrorCode::Conflict,
        IngestError::Forbidden(_) => ErrorCode::Unauthorized,
        _ => ErrorCode::ProtocolViolation,
    };
    fatal(code, e.to_string())
}

/// Batches one connection may have handed to the store and not yet settled, at most; past
/// it the session reads nothing more until a commit answers.
const MAX_IN_FLIGHT: usize = 64;
/// A stored batch is acknowledged within this, together with the ones stored after it: a
/// collector no longer waits for acknowledgements to send, and one acknowledgement a
/// commit per run was a fifth of a fleet hub's CPU (at 50 ms the acknowledgements were still
/// a third of its sends: 33,276 in 10 s of the fleet; at 200 ms, 21,878). It bounds how long
/// a collector holds what is stored, and how long `finish` waits for its last batch.
const ACK_DELAY: Duration = Duration::from_millis(200);
/// ... or as soon as this many batches wait for it (a collector sends 64 unacknowledged).
const ACK_EVERY: usize = 16;
/// Their records' encoded size, at most (at least one batch is always let through).
const MAX_IN_FLIGHT_BYTES: usize = 4 * stepstream_protocol::limits::BATCH_BYTES;

/// The batches a connection handed to the store and awaits the answers of, oldest first.
/// While it holds any, it holds the run's `ingest` lock: no other connection of the run
/// checks a batch against a tail that is about to change, and a connection that takes over
/// the run starts from a settled tail.
struct Pipeline<'r> {
    run: &'r Arc<Run>,
    lock: Option<tokio::sync::MutexGuard<'r, ()>>,
    in_flight: VecDeque<InFlight>,
    bytes: usize,
    /// Stored through this and not yet acknowledged.
    unacked: Option<u64>,
    /// Batches stored and not yet acknowledged.
    unacked_batches: usize,
    /// Samples the quotas kept out of the batches stored and not yet acknowledged.
    unacked_refused: u64,
}

impl<'r> Pipeline<'r> {
    fn new(run: &'r Arc<Run>) -> Self {
        Pipeline {
            run,
            lock: None,
            in_flight: VecDeque::new(),
            bytes: 0,
            unacked: None,
            unacked_batches: 0,
            unacked_refused: 0,
        }
    }

    fn has_room(&self) -> bool {
        self.in_flight.is_empty()
            || (self.in_flight.len() < MAX_IN_FLIGHT && self.bytes < MAX_IN_FLIGHT_BYTES)
    }

    /// Checks a batch and hands it to the store; `Some(seq)` when it is a duplicate to
    /// acknowledge at once (nothing is in flight then; its samples the store does not hold
    /// are counted to the acknowledgement), and why samples were kept out of it, if some
    /// were (the rest is being stored: a non-fatal error for the collector).
    async fn submit(
        &mut self,
        hub: &Hub,
        batch: Batch,
    ) -> Result<(Option<u64>, Option<HubError>), HubError> {
        let seq = batch.seq;
        if self.lock.is_none() {
            self.lock = Some(self.run.lock_ingest().await);
        }
        let newest = self.in_flight.back().map_or(0, |b| b.seq);
        if seq <= newest {
            // A resend of a batch still in flight: compare it once that one is settled.
            return Err(fatal(
                ErrorCode::ProtocolViolation,
                format!("batch {seq} sent again while it is being stored"),
            ));
        }
        let base = self.in_flight.back().map(InFlight::tail);
        match hub.submit(self.run, base, batch).await {
            Ok(Submitted::InFlight(mut b)) => {
                self.bytes += b.bytes();
                let refusal = b.take_refusal().map(|message| HubError {
                    code: ErrorCode::Limit,
                    message,
                    fatal: false,
                });
                self.in_flight.push_back(b);
                Ok((None, refusal))
            }
            Ok(Submitted::Duplicate { refused }) => {
                self.release_if_idle();
                self.unacked_refused += refused;
                Ok((Some(seq), None))
            }
            Err(e) => {
                self.release_if_idle();
                Err(ingest_error(seq, e))
            }
        }
    }

    /// The oldest batch's answer. Cancel-safe; pends forever when nothing is in flight.
    async fn next_answer(&mut self) -> Result<bool, StoreError> {
        match self.in_flight.front_mut() {
            Some(b) => b.answer().await,
            None => std::future::pending().await,
        }
    }

    /// Settles the oldest batch with `answer`, then every later one already answered (one
    /// commit answers many), and counts them to acknowledge.
    async fn settle(
        &mut self,
        hub: &Hub,
        answer: Result<bool, StoreError>,
    ) -> Result<(), HubError> {
        let mut answer = answer;
        while let Some(b) = self.in_flight.pop_front() {
            let seq = b.seq;
            let refused = b.refused();
            self.bytes = self.bytes.saturating_sub(b.bytes());
            if let Err(e) = hub.settle(self.run, b, answer).await {
                // The store holds no batch after a missing one, so the later ones fail too;
                // they are settled all the same, so the run's tail is right when the lock
                // goes.
                while let Some(mut later) = self.in_flight.pop_front() {
                    let answer = later.answer().await;
                    let _ = hub.settle(self.run, later, answer).await;
                }
                self.bytes = 0;
                self.release_if_idle();
                return Err(ingest_error(seq, e));
            }
            self.unacked = Some(seq);
            self.unacked_batches += 1;
            self.unacked_refused += refused;
            match self.in_flight.front_mut().and_then(InFlight::try_answer) {
                Some(next) => answer = next,
                None => break,
            }
        }
        self.release_if_idle();
        Ok(())
    }

    /// Settles everything in flight, waiting for the store.
    async fn drain(&mut self, hub: &Hub) -> Result<(), HubError> {
        while !self.in_flight.is_empty() {
            let answer = self.next_answer().await;
            self.settle(hub, answer).await?;
        }
        Ok(())
    }

    /// Acknowledges what is stored and not yet acknowledged; `false` when the socket is gone.
    async fn acknowledge(&mut self, conn: &mut Conn) -> bool {
        self.unacked_batches = 0;
        match self.unacked.take() {
            Some(through) => {
                conn.send(FromHub::Ack(Ack {
                    through_seq: through,
                    items_refused: std::mem::take(&mut self.unacked_refused),
                }))
                .await
            }
            None => true,
        }
    }

    fn release_if_idle(&mut self) {
        if self.in_flight.is_empty() {
            self.lock = None;
        }
    }
}

/// The error frame for a batch the hub could not take.
fn ingest_error(seq: u64, e: IngestError) -> HubError {
    match e {
        IngestError::Store(e) => {
            tracing::error!(error = %e, seq, "batch not stored");
            fatal(
                ErrorCode::Storage,
                format!("batch {seq} was not stored ({e}); resend it later"),
            )
        }
        e => refusal(e),
    }
}

/// A collector's frames after its hello. Batches are handed to the store as they arrive
/// (up to [`MAX_IN_FLIGHT`]), so the next one is read and checked while the previous ones
/// commit; one acknowledgement answers every batch a commit stored.
async fn session(
    app: &AppState,
    conn: &mut Conn,
    run: &Arc<Run>,
    pace: tokio::sync::watch::Receiver<u32>,
) -> Result<(), HubError> {
    let mut pipe = Pipeline::new(run);
    let ended = converse(app, conn, &mut pipe, pace).await;
    // However the conversation ended, what the store was handed is settled before the run
    // is let go, and acknowledged if the socket still takes it.
    let drained = pipe.drain(&app.hub).await;
    pipe.acknowledge(conn).await;
    match (ended, drained) {
        (Err(e), _) | (Ok(()), Err(e)) => Err(e),
        (Ok(()), Ok(_)) => Ok(()),
    }
}

async fn converse(
    app: &AppState,
    conn: &mut Conn,
    pipe: &mut Pipeline<'_>,
    mut pace: tokio::sync::watch::Receiver<u32>,
) -> Result<(), HubError> {
    let hub = &app.hub;
    let run = pipe.run;
    let ack_due = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(ack_due);
    let mut tokens = app.auth.changes();
    let project = run.state(|st| st.identity.project.clone());
    // Commands for the training: the unfinished ones now, then whenever one is queued.
    let mut orders = run.commands.subscribe();
    orders.mark_changed();
    let mut delivered = std::collections::HashSet::new();
    loop {
        let msg = tokio::select! {
            biased;
            Ok(()) = pace.changed() => {
                let linger_ms = *pace.borrow_and_update();
                // A socket that takes no more may still hold frames the collector sent
                // before it closed: they are read (and stored) whatever this send did.
                let _ = conn.send(FromHub::Pace(Pace { linger_ms })).await;
                continue;
            }
            Ok(()) = orders.changed() => {
                if !deliver(hub, conn, run, &mut delivered).await {
                    return Ok(());
                }
                continue;
            }
            Ok(()) = tokens.changed() => {
                // A revoked token (its entry removed, the file emptied or deleted) writes
                // nothing more: its socket closes now, what it had in flight settled first.
                if !app.auth.current().may_write(conn.token.as_deref(), &project) {
                    tracing::warn!(run = %run.state(|st| st.identity.run_id.clone()), "write token revoked: closing its collector socket");
                    return Err(fatal(
                        ErrorCode::Unauthorized,
                        format!("the write token for project {project:?} was revoked"),
                    ));
                }
                continue;
            }
            answer = pipe.next_answer() => {
                let first = pipe.unacked.is_none();
                let settled = pipe.settle(hub, answer).await;
                if pipe.unacked_batches >= ACK_EVERY || settled.is_err() {
                    if !pipe.acknowledge(conn).await {
                        return Ok(());
                    }
                } else if first {
                    ack_due.as_mut().reset(tokio::time::Instant::now() + ACK_DELAY);
                }
                settled?;
                continue;
            }
            _ = &mut ack_due, if pipe.unacked.is_some() => {
                if !pipe.acknowledge(conn).await {
                    return Ok(());
                }
                continue;
            }
            msg = conn.next(usize::MAX), if pipe.has_room() => msg,
        };
        let Some(msg) = msg? else { break };
        match msg {
            ToHub::Batch(batch) => {
                let (duplicate, refusal) = pipe.submit(hub, batch).await?;
                if let Some(e) = refusal {
                    tracing::info!(run = %run.state(|st| st.identity.run_id.clone()), "{}", e.message);
                    if !conn.send(FromHub::HubError(e)).await {
                        return Ok(());
                    }
                }
                if let Some(seq) = duplicate {
                    pipe.unacked = pipe.unacked.max(Some(seq));
                    if !pipe.acknowledge(conn).await {
                        return Ok(());
                    }
                }
            }
            ToHub::DefineMetrics(defs) => {
                // Defining takes the run's lock; the batches before it are settled first,
                // committed now rather than after the commit interval.
                hub.store.hurry();
                pipe.drain(hub).await?;
                hub.define_metrics(run, defs.metrics)
                    .await
                    .map_err(refusal)?;
            }
            ToHub::Heartbeat(_) => hub.heartbeat(run),
            ToHub::UserAlert(alert) => hub.user_alert_from(run, alert),
            ToHub::CommandReply(reply) => {
                hub.command_reply(run, reply)
                    .await
                    .map_err(|e| fatal(ErrorCode::Storage, e.to_string()))?;
            }
            ToHub::Finish(finish) => {
                hub.store.hurry();
                pipe.drain(hub).await?;
                if !pipe.acknowledge(conn).await {
                    return Ok(());
                }
                let (status, message) = match finish.status {
                    FinishStatus::Finished => (RunStatus::Finished, None),
                    FinishStatus::Failed { message } => (RunStatus::Failed, Some(message)),
                    FinishStatus::Killed { message } => (RunStatus::Killed, Some(message)),
                    FinishStatus::Stopped { message } => (RunStatus::Stopped, Some(message)),
                };
                hub.finish(run, status, message)
                    .await
                    .map_err(|e| fatal(ErrorCode::Storage, e.to_string()))?;
                conn.send(FromHub::FinishAck(FinishAck { status })).await;
                let _ = conn.socket.send(Message::Close(None)).await;
                return Ok(());
            }
            ToHub::Hello(_) => {
                return Err(fatal(
                    ErrorCode::ProtocolViolation,
                    "hello sent twice on one connection",
                ))
            }
        }
    }
    tracing::info!(run = %run.state(|st| st.identity.run_id.clone()), "collector disconnected");
    Ok(())
}

/// Sends the run's unfinished commands this connection has not sent yet; `false` when the
/// socket is gone. The collector answers each (and one it already answered, again), so a
/// command is delivered on every connection until answered and acted on once.
async fn deliver(
    hub: &crate::hub::Hub,
    conn: &mut Conn,
    run: &Arc<Run>,
    delivered: &mut std::collections::HashSet<u64>,
) -> bool {
    let run_id = run.state(|st| st.identity.run_id.clone());
    let stored = match hub.store.commands(run.key, run_id).await {
        Ok(stored) => stored,
        Err(e) => {
            tracing::warn!(error = %e, "could not read a run's commands to deliver them");
            return true;
        }
    };
    for event in stored {
        if event.state.is_final() || !delivered.insert(event.command.id) {
            continue;
        }
        if !conn.send(FromHub::Command(event.command)).await {
            return false;
        }
    }
    true
}
