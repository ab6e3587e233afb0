//! The sender thread: owns the connection to the hub and every record not yet acknowledged.
//!
//! Records wait in `building` until the send window has room, then are sealed into a batch
//! under the next sequence number and kept in `pending` until the hub acknowledges it. On
//! any failure the connection is dropped and rebuilt with exponential backoff; the hub's
//! `Welcome` says which batches it already stored, and the rest are resent in order.

use crate::{Command, Options, Stats};
use futures_util::{SinkExt, StreamExt};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use stepstream_protocol::{
    codec, unix_now, Batch, DefineMetrics, Finish, FinishStatus, FromHub, Heartbeat, Hello,
    MetricDef, RunIdentity, StepRecord, ToHub, Welcome,
};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{sleep_until, timeout, Instant};
use tokio_tungstenite::tungstenite::Message;

/// Batches sent and not yet acknowledged, at most.
const WINDOW: u64 = 32;
/// Records held in all (memory and spool), at most; beyond it the sender stops taking from
/// the queue, and `log` drops (and counts) once that fills too.
const MAX_BUFFERED: usize = 100_000_000;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const WELCOME_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// How often a connected sender looks at the queue.
const POLL: Duration = Duration::from_millis(2);

pub(crate) struct Sender {
    url: String,
    options: Options,
    identity: RunIdentity,
    stats: Arc<Stats>,
    /// Every metric defined so far (resent on each connection).
    defs: Vec<MetricDef>,
    /// Defined since the connection started, not yet sent.
    new_defs: Vec<MetricDef>,
    building: Vec<StepRecord>,
    pending: VecDeque<Batch>,
    next_seq: u64,
    /// Every batch up to this one is acknowledged; what is held starts right after it.
    acked_seq: u64,
    /// Records in `building`, `pending` and the spool.
    buffered: usize,
    /// Records in `building` and `pending` (memory); above `options.memory_records` sealed
    /// batches go to the spool file instead.
    in_memory: usize,
    spool: Option<crate::spool::Spool>,
    /// The spool could not be written (disk full...): stay within memory.
    spool_failed: bool,
    /// A hub has welcomed this process at least once.
    welcomed: bool,
    finish: Option<(FinishStatus, Option<oneshot::Sender<bool>>)>,
    archive: Option<crate::archive::Archive>,
    /// For `wss://` hubs.
    tls: Arc<rustls::ClientConfig>,
}

enum Ended {
    Done,
    Lost { error: String, was_welcomed: bool },
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

impl Sender {
    pub(crate) fn new(
        url: String,
        options: Options,
        identity: RunIdentity,
        stats: Arc<Stats>,
        archive: Option<crate::archive::Archive>,
        tls: Arc<rustls::ClientConfig>,
    ) -> Sender {
        Sender {
            url,
            options,
            identity,
            stats,
            defs: Vec::new(),
            new_defs: Vec::new(),
            building: Vec::new(),
            pending: VecDeque::new(),
            next_seq: 1,
            acked_seq: 0,
            buffered: 0,
            in_memory: 0,
            spool: None,
            spool_failed: false,
            welcomed: false,
            finish: None,
            archive,
            tls,
        }
    }

    pub(crate) fn run(mut self, commands: mpsc::Receiver<Command>) {
        let rt = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                // Without a runtime nothing can be sent; the caller's `log` keeps working
                // (the queue fills and drops) so training is unaffected.
                tracing::error!(error = %e, "stepstream sender could not start");
                return;
            }
        };
        rt.block_on(self.main(commands));
    }

    fn can_buffer(&self) -> bool {
        let room = if self.spool_failed {
            self.in_memory < self.options.memory_records
        } else {
            self.buffered < MAX_BUFFERED
        };
        room && self.finish.is_none()
    }

    fn take(&mut self, cmd: Option<Command>) {
        match cmd {
            Some(Command::Define(def)) => {
                self.defs.push(def.clone());
                self.new_defs.push(def);
            }
            Some(Command::Record(r, archive)) => {
                if archive {
                    self.archive_row(&r);
                }
                self.building.push(r);
                self.buffered += 1;
                self.in_memory += 1;
                let batch = self.options.max_batch.max(1);
                let over = self.in_memory > self.options.memory_records;
                if self.building.len() >= batch || (over && self.building.len() >= batch.min(64)) {
                    self.seal();
                }
            }
            Some(Command::Flush) => {}
            Some(Command::Finish(status, reply)) => {
                self.flush_archive();
                self.finish = Some((status, Some(reply)));
            }
            // The collector was dropped without finishing: end the run as finished.
            None => {
                if self.finish.is_none() {
                    self.finish = Some((FinishStatus::Finished, None));
                }
            }
        }
        self.stats
            .unacked
            .store(self.buffered as u64, Ordering::Relaxed);
    }

    fn archive_row(&mut self, r: &StepRecord) {
        let Some(archive) = self.archive.as_mut() else {
            return;
        };
        // Ids are dense and defined before use (see `Collector::log_at`).
        let values: Vec<(&str, f64)> = r
            .values
            .iter()
            .filter_map(|&(id, v)| Some((self.defs.get(id.0 as usize)?.name.as_str(), v)))
            .collect();
        if let Err(e) = archive.row(r.step, r.wall_time, &values) {
            // A full disk must not stop training: say so once and stop archiving.
            tracing::error!(error = %e, "stepstream: cannot write the run archive; archiving stops");
            if let Ok(mut last) = self.stats.last_error.lock() {
                *last = Some(format!("archive: {e}"));
            }
            self.archive = None;
        }
    }

    fn flush_archive(&mut self) {
        if let Some(a) = self.archive.as_mut() {
            let _ = a.flush();
        }
    }

    /// Takes whatever else is already queued, without waiting.
    fn drain(&mut self, commands: &mut mpsc::Receiver<Command>) {
        while self.can_buffer() && self.building.len() < self.options.max_batch * 4 {
            match commands.try_recv() {
                Ok(cmd) => self.take(Some(cmd)),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    self.take(None);
                    break;
                }
            }
        }
    }

    /// Seals `building` into batches of at most `max_batch` records, kept in memory while
    /// they fit `memory_records`, spooled to disk after (in order: once anything is spooled,
    /// later batches follow it there until it drains).
    fn seal(&mut self) {
        while !self.building.is_empty() {
            let n = self.building.len().min(self.options.max_batch.max(1));
            let records: Vec<StepRecord> = self.building.drain(..n).collect();
            let batch = Batch {
                seq: self.next_seq,
                records,
            };
            self.next_seq += 1;
            let spooling = self.spool.as_ref().is_some_and(|s| !s.is_empty())
                || self.in_memory > self.options.memory_records;
            if spooling && !self.spool_failed {
                match self.spool_push(batch) {
                    Ok(()) => {
                        self.in_memory -= n;
                        continue;
                    }
                    Err((batch, e)) => {
                        tracing::error!(error = %e, "stepstream: cannot spool; keeping records in memory");
                        self.spool_failed = true;
                        self.pending.push_back(batch);
                    }
                }
            } else {
                self.pending.push_back(batch);
            }
        }
    }

    fn spool_push(&mut self, batch: Batch) -> Result<(), (Batch, std::io::Error)> {
        if self.spool.is_none() {
            let dir = self
                .options
                .spool_dir
                .clone()
                .unwrap_or_else(|| std::env::temp_dir().join("stepstream-spool"));
            let path = dir.join(format!("{}.spool", self.identity.run_id));
            match crate::spool::Spool::create(&path) {
                Ok(s) => {
                    tracing::info!(path = %path.display(), "stepstream: memory budget reached; spooling to disk");
                    self.spool = Some(s);
                }
                Err(e) => return Err((batch, e)),
            }
        }
        let spool = self.spool.as_mut().expect("created above");
        let copy = batch.clone();
        spool.push(batch).map_err(|e| (copy, e))
    }

    /// Moves spooled batches back into memory while there is room.
    fn refill(&mut self) {
        let limit = self.options.memory_records / 2;
        while self.in_memory < limit.max(1) {
            let Some(spool) = self.spool.as_mut() else {
                return;
            };
            match spool.pop() {
                Ok(Some(b)) => {
                    self.in_memory += b.records.len();
                    self.pending.push_back(b);
                }
                Ok(None) => return,
                Err(e) => {
                    tracing::error!(error = %e, "stepstream: spool unreadable");
                    self.spool = None;
                    return;
                }
            }
        }
    }

    fn acked_through(&mut self, through: u64) {
        self.acked_seq = self.acked_seq.max(through);
        while self.pending.front().is_some_and(|b| b.seq <= through) {
            let b = self.pending.pop_front().expect("front exists");
            self.buffered -= b.records.len();
            self.in_memory -= b.records.len();
            self.stats
                .acked
                .fetch_add(b.records.len() as u64, Ordering::Relaxed);
        }
        self.refill();
        self.stats
            .unacked
            .store(self.buffered as u64, Ordering::Relaxed);
    }

    fn welcome(&mut self, w: &Welcome) {
        if !self.welcomed && w.last_seq > 0 {
            // A new process continuing a stored run: number our batches after the hub's.
            // What we hold is contiguous from `acked_seq + 1`, in memory then in the spool.
            self.seal();
            let first = self.acked_seq + 1;
            let shift = (w.last_seq + 1) as i64 - first as i64;
            for b in self.pending.iter_mut() {
                b.seq = (b.seq as i64 + shift) as u64;
            }
            if let Some(spool) = self.spool.as_mut() {
                spool.shift += shift;
            }
            self.next_seq = (self.next_seq as i64 + shift) as u64;
            self.acked_seq = w.last_seq;
        } else {
            self.acked_through(w.last_seq);
        }
        self.welcomed = true;
        if let Ok(mut slot) = self.stats.welcome.lock() {
            slot.get_or_insert(w.last_step);
        }
    }

    async fn main(&mut self, mut commands: mpsc::Receiver<Command>) {
        let mut backoff = Duration::from_millis(100);
        loop {
            match self.connection(&mut commands).await {
                Ended::Done => return,
                Ended::Lost {
                    error,
                    was_welcomed,
                } => {
                    self.stats.connected.store(false, Ordering::Relaxed);
                    self.stats.reconnects.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(%error, "stepstream hub connection lost; retrying");
                    if let Ok(mut e) = self.stats.last_error.lock() {
                        *e = Some(error);
                    }
                    if was_welcomed {
                        backoff = Duration::from_millis(100);
                    }
                }
            }
            // Jitter keeps many collectors from reconnecting in lockstep after a hub restart.
            let jitter = Duration::from_millis(u64::from(std::process::id() % 97));
            let until = Instant::now() + backoff + jitter;
            loop {
                tokio::select! {
                    _ = sleep_until(until) => break,
                    cmd = commands.recv(), if self.can_buffer() => {
                        self.take(cmd);
                        self.drain(&mut commands);
                    }
                }
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    async fn connection(&mut self, commands: &mut mpsc::Receiver<Command>) -> Ended {
        let lost = |error: String, was_welcomed: bool| Ended::Lost {
            error,
            was_welcomed,
        };
        let connect = tokio_tungstenite::connect_async_tls_with_config(
            &self.url,
            None,
            false,
            Some(tokio_tungstenite::Connector::Rustls(self.tls.clone())),
        );
        let ws: Ws = match timeout(CONNECT_TIMEOUT, connect).await {
            Ok(Ok((ws, _))) => ws,
            Ok(Err(e)) => return lost(format!("cannot connect to {}: {e}", self.url), false),
            Err(_) => return lost(format!("connecting to {} timed out", self.url), false),
        };
        let (mut sink, mut stream) = ws.split();
        let hello = ToHub::Hello(Hello {
            protocol: codec::VERSION,
            token: self.options.token.clone(),
            run: self.identity.clone(),
        });
        if let Err(e) = sink.send(binary(hello)).await {
            return lost(e.to_string(), false);
        }
        let welcome = match timeout(WELCOME_TIMEOUT, next_from_hub(&mut stream)).await {
            Err(_) => return lost("no welcome from the hub".into(), false),
            Ok(Err(e)) => return lost(e, false),
            Ok(Ok(FromHub::Welcome(w))) => w,
            Ok(Ok(other)) => return lost(format!("expected Welcome, got {}", other.name()), false),
        };
        self.welcome(&welcome);
        self.stats.connected.store(true, Ordering::Relaxed);
        tracing::debug!(run = %self.identity.run_id, last_seq = welcome.last_seq, "connected to the hub");

        self.new_defs.clear();
        if !self.defs.is_empty() {
            let defs = ToHub::DefineMetrics(DefineMetrics {
                metrics: self.defs.clone(),
            });
            if let Err(e) = sink.send(binary(defs)).await {
                return lost(e.to_string(), true);
            }
        }
        self.refill();
        // Batches may sit in the spool, not in `pending`: count from the last ack.
        let mut acked = self.acked_seq;
        let mut sent = acked;
        let mut finish_sent = false;
        let mut last_send = Instant::now();
        loop {
            self.drain(commands);
            if !self.new_defs.is_empty() {
                let defs = ToHub::DefineMetrics(DefineMetrics {
                    metrics: std::mem::take(&mut self.new_defs),
                });
                if let Err(e) = sink.feed(binary(defs)).await {
                    return lost(e.to_string(), true);
                }
            }
            if sent - acked < WINDOW {
                self.seal();
            }
            self.refill();
            let mut wrote = false;
            for b in self.pending.iter() {
                if b.seq <= sent {
                    continue;
                }
                if sent - acked >= WINDOW {
                    break;
                }
                if let Err(e) = sink.feed(binary(ToHub::Batch(b.clone()))).await {
                    return lost(e.to_string(), true);
                }
                sent = b.seq;
                wrote = true;
            }
            if let Some((status, _)) = &self.finish {
                let spooled = self.spool.as_ref().is_some_and(|s| !s.is_empty());
                if !finish_sent && self.pending.is_empty() && self.building.is_empty() && !spooled {
                    let msg = ToHub::Finish(Finish {
                        status: status.clone(),
                        wall_time: unix_now(),
                    });
                    if let Err(e) = sink.feed(binary(msg)).await {
                        return lost(e.to_string(), true);
                    }
                    finish_sent = true;
                    wrote = true;
                }
            }
            if wrote {
                if let Err(e) = sink.flush().await {
                    return lost(e.to_string(), true);
                }
                last_send = Instant::now();
            }

            let beat_at = last_send + self.options.heartbeat;
            tokio::select! {
                // Poll the queue instead of awaiting it: an awaited queue makes every `log`
                // wake this thread (a futex call on the training thread, per step); polling
                // costs at most POLL of latency and no syscall in `log`.
                _ = tokio::time::sleep(POLL), if self.can_buffer() => {}
                msg = next_from_hub(&mut stream) => match msg {
                    Ok(FromHub::Ack(ack)) => {
                        acked = acked.max(ack.through_seq);
                        self.acked_through(ack.through_seq);
                    }
                    Ok(FromHub::FinishAck(_)) => {
                        if let Some((_, Some(reply))) = self.finish.take() {
                            let _ = reply.send(true);
                        }
                        let _ = sink.close().await;
                        return Ended::Done;
                    }
                    Ok(FromHub::HubError(e)) => {
                        let text = format!("hub error {:?}: {}", e.code, e.message);
                        tracing::warn!("{text}");
                        if e.fatal {
                            return lost(text, true);
                        }
                    }
                    Ok(FromHub::Welcome(_)) => return lost("unexpected second Welcome".into(), true),
                    Err(e) => return lost(e, true),
                },
                _ = sleep_until(beat_at) => {
                    let beat = ToHub::Heartbeat(Heartbeat { wall_time: unix_now() });
                    if let Err(e) = sink.send(binary(beat)).await {
                        return lost(e.to_string(), true);
                    }
                    last_send = Instant::now();
                }
            }
        }
    }
}

fn binary(msg: ToHub) -> Message {
    Message::Binary(msg.encode().into())
}

async fn next_from_hub(
    stream: &mut futures_util::stream::SplitStream<Ws>,
) -> Result<FromHub, String> {
    loop {
        match stream.next().await {
            None => return Err("the hub closed the connection".into()),
            Some(Err(e)) => return Err(e.to_string()),
            Some(Ok(Message::Binary(bytes))) => {
                return FromHub::decode(&bytes).map_err(|e| format!("bad frame from hub: {e}"))
            }
            Some(Ok(Message::Close(frame))) => {
                return Err(format!("the hub closed the connection ({frame:?})"))
            }
            Some(Ok(_)) => continue,
        }
    }
}
