//! The sender thread: owns the connection to the hub and every record not yet acknowledged.
//!
//! Records wait in `building` until the send window has room, then are sealed into a batch
//! under the next sequence number and kept in `pending` until the hub acknowledges it. On
//! any failure the connection is dropped and rebuilt with exponential backoff; the hub's
//! `Welcome` says which batches it already stored, and the rest are resent in order.

use crate::ids::MetricTable;
use crate::queue::Queue;
use crate::{Command, Options, Stats};
use futures_util::{SinkExt, StreamExt};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use stepstream_protocol::{
    codec, limits, unix_now, Batch, DefineMetrics, Finish, FinishStatus, FromHub, Heartbeat, Hello,
    RunIdentity, StepRecord, ToHub, Welcome,
};
use tokio::sync::oneshot;
use tokio::time::{sleep_until, timeout, Instant};
use tokio_tungstenite::tungstenite::Message;

/// Batches sent and not yet acknowledged, at most. The hub acknowledges at the latest when
/// half of them wait (or within its acknowledgement delay), so a busy sender never waits
/// for room.
const WINDOW: u64 = 64;
/// Records held in all (memory and spool), at most; beyond it the sender stops taking from
/// the queue, and `log` drops (and counts) once that fills too.
const MAX_BUFFERED: usize = 100_000_000;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const WELCOME_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// How often a connected sender looks at the queue while records flow.
const POLL: Duration = Duration::from_millis(2);
/// Records per tick from which the sender keeps ticking; below it (fewer than ~2,000
/// records a second) it sleeps on the queue and each record wakes it.
const BUSY_TICK: usize = 4;

pub(crate) struct Sender {
    url: String,
    options: Options,
    identity: RunIdentity,
    stats: Arc<Stats>,
    /// Every metric defined so far, and the ids the connected hub knows them by.
    metrics: MetricTable,
    building: Vec<StepRecord>,
    /// Encoded size of `building`, at most (see [`limits::record_bytes`]).
    building_bytes: usize,
    /// When `building` is sealed unless it fills first: the first tick of the wall clock in
    /// multiples of `options.linger` after its oldest record arrived (see [`linger_until`]).
    building_due: Option<Instant>,
    /// A flush asked for what is held to go now.
    flushing: bool,
    /// Random per process: the hub tells this writer from a second one on the same run.
    writer: u64,
    /// Where `log` leaves commands.
    queue: Arc<Queue>,
    /// What the last take swapped out of the queue (kept for its allocations).
    arrivals: crate::queue::Taken,
    /// Commands taken from the queue and not yet handled (when the buffers are full).
    inbox: VecDeque<Command>,
    /// Some `Collector` handle remains: more may come.
    queue_open: bool,
    /// Commands taken from the queue since the last tick.
    taken: usize,
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
    /// The connection ended; `progressed` when the hub acknowledged something on it (then
    /// the next attempt comes soon; otherwise the backoff grows, so a hub that refuses
    /// every attempt, full disk or wrong token, is not hammered).
    Lost {
        error: String,
        progressed: bool,
    },
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
        queue: Arc<Queue>,
    ) -> Sender {
        Sender {
            url,
            options,
            identity,
            stats,
            metrics: MetricTable::default(),
            building: Vec::new(),
            building_bytes: 0,
            building_due: None,
            flushing: false,
            writer: crate::random_u64(),
            queue,
            arrivals: Default::default(),
            inbox: VecDeque::new(),
            queue_open: true,
            taken: 0,
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

    pub(crate) fn run(mut self) {
        // However this thread ends, `log` then stops queueing for it.
        struct Ended(Arc<Queue>);
        impl Drop for Ended {
            fn drop(&mut self) {
                self.0.sender_ended();
            }
        }
        let _ended = Ended(self.queue.clone());
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
        rt.block_on(self.main());
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
            Some(Command::Define(def)) => self.metrics.push(def),
            Some(Command::Record(r, archive)) => {
                if archive {
                    self.archive_row(&r);
                }
                self.building_bytes += limits::record_bytes(r.values.len());
                let linger = self.options.linger;
                self.building_due
                    .get_or_insert_with(|| linger_until(linger));
                self.building.push(r);
                self.buffered += 1;
                self.in_memory += 1;
                let batch = self.options.max_batch.max(1);
                let over = self.in_memory > self.options.memory_records;
                if self.building.len() >= batch
                    || self.building_bytes >= limits::BATCH_BYTES
                    || (over && self.building.len() >= batch.min(64))
                {
                    self.seal();
                }
            }
            // Whatever is held goes with the next send, not after its linger.
            Some(Command::Flush) => self.flushing = !self.building.is_empty(),
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
        let metrics = &self.metrics;
        if let Err(e) = archive.row(r.step, r.wall_time, &r.values, |id| metrics.name(id)) {
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
    fn drain(&mut self) {
        while self.can_buffer() && self.building.len() < self.options.max_batch * 4 {
            if self.inbox.is_empty() && self.queue_open {
                self.queue_open = self.queue.take_all(&mut self.arrivals);
                self.arrivals.unpack(&mut self.inbox);
            }
            match self.inbox.pop_front() {
                Some(cmd) => {
                    self.taken += 1;
                    self.take(Some(cmd))
                }
                None => {
                    if !self.queue_open {
                        self.take(None);
                    }
                    break;
                }
            }
        }
    }

    /// Whether sleeping on the queue is what to do: there is room, and nothing taken waits.
    fn may_wait_for_commands(&self) -> bool {
        self.can_buffer() && self.queue_open && self.inbox.is_empty()
    }

    /// Seals `building` into batches of at most `max_batch` records and
    /// [`limits::BATCH_BYTES`] encoded, kept in memory while they fit `memory_records`,
    /// spooled to disk after (in order: once anything is spooled, later batches follow it
    /// there until it drains, so `pending` only ever holds batches older than the spool's).
    fn seal(&mut self) {
        while !self.building.is_empty() {
            let most = self.options.max_batch.max(1).min(self.building.len());
            let mut n = 0;
            let mut bytes = 0;
            while n < most {
                bytes += limits::record_bytes(self.building[n].values.len());
                if n > 0 && bytes > limits::BATCH_BYTES {
                    break;
                }
                n += 1;
            }
            let records: Vec<StepRecord> = self.building.drain(..n).collect();
            self.building_bytes = self
                .building_bytes
                .saturating_sub(limits::records_bytes(&records));
            let batch = Batch {
                seq: self.next_seq,
                records,
            };
            self.next_seq += 1;
            let spooling = self.spool.as_ref().is_some_and(|s| !s.is_empty())
                || self.in_memory > self.options.memory_records;
            if !spooling || self.spool_failed {
                self.pending.push_back(batch);
                continue;
            }
            match self.spool_push(batch) {
                Ok(()) => self.in_memory -= n,
                Err((mut batch, e)) => {
                    tracing::error!(error = %e, "stepstream: cannot spool; keeping records in memory");
                    self.note_error(format!("spool: {e}"));
                    self.spool_failed = true;
                    // What is spooled comes back to memory first, so batches stay in order.
                    self.unspool();
                    batch.seq = self.next_seq - 1;
                    self.pending.push_back(batch);
                }
            }
        }
        if self.building.is_empty() {
            self.building_bytes = 0;
            self.building_due = None;
        }
        self.flushing = false;
    }

    /// When `building` is to be sealed though it is not full: `None` when it is empty.
    /// Records wait up to `options.linger` for company, unless a flush or the run's end
    /// asked for everything now.
    fn seal_at(&self) -> Option<Instant> {
        let due = self.building_due?;
        if self.flushing || self.finish.is_some() || !self.queue_open {
            return Some(due.min(Instant::now()));
        }
        Some(due)
    }

    /// Seals `building` if its due time came (see [`Sender::seal_at`]).
    fn seal_due(&mut self) {
        if self.seal_at().is_some_and(|at| at <= Instant::now()) {
            self.seal();
        }
    }

    fn note_error(&self, error: String) {
        if let Ok(mut last) = self.stats.last_error.lock() {
            *last = Some(error);
        }
    }

    /// Reads the whole spool back into memory and drops it.
    fn unspool(&mut self) {
        while let Some(spool) = self.spool.as_mut() {
            match spool.pop() {
                Ok(Some(b)) => {
                    self.in_memory += b.records.len();
                    self.pending.push_back(b);
                }
                Ok(None) => {
                    self.spool = None;
                }
                Err(e) => self.spool_lost(&e),
            }
        }
    }

    /// The spool cannot be read: what it held is lost. Count it, say so, and number what
    /// follows right after what precedes it, so the hub sees no gap (a gap would be refused,
    /// and the sender would retry forever).
    fn spool_lost(&mut self, e: &std::io::Error) {
        let Some(spool) = self.spool.take() else {
            return;
        };
        let lost = spool.entries();
        let batches = lost.len() as u64;
        let records: usize = lost.iter().map(|&(_, n)| n).sum();
        let first = lost.first().map_or(self.next_seq, |&(seq, _)| seq);
        for b in self.pending.iter_mut().filter(|b| b.seq > first) {
            b.seq -= batches;
        }
        self.next_seq -= batches;
        self.buffered -= records;
        self.spool_failed = true;
        self.stats.lost.fetch_add(records as u64, Ordering::Relaxed);
        let text = format!(
            "spool {} unreadable ({e}): {records} records in {batches} batches lost",
            spool.path().display()
        );
        tracing::error!("stepstream: {text}");
        self.note_error(text);
    }

    fn spool_push(&mut self, batch: Batch) -> Result<(), (Batch, std::io::Error)> {
        if self.spool.is_none() {
            let dir = self
                .options
                .spool_dir
                .clone()
                .unwrap_or_else(crate::spool::default_dir);
            match crate::spool::Spool::create(&dir, self.identity.run_id.as_str()) {
                Ok(s) => {
                    tracing::info!(path = %s.path().display(), "stepstream: memory budget reached; spooling to disk");
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
                    self.spool_lost(&e);
                    return;
                }
            }
        }
    }

    fn acked_through(&mut self, through: u64) {
        self.acked_seq = self.acked_seq.max(through);
        let mut stored = None;
        while self.pending.front().is_some_and(|b| b.seq <= through) {
            let b = self.pending.pop_front().expect("front exists");
            let stored = stored
                .get_or_insert_with(|| self.stats.stored.lock().unwrap_or_else(|e| e.into_inner()));
            for r in &b.records {
                for &(id, _) in &r.values {
                    if !self.metrics.sent(id) {
                        continue;
                    }
                    let i = id.0 as usize;
                    if stored.len() <= i {
                        stored.resize(i + 1, 0);
                    }
                    stored[i] += 1;
                }
            }
            self.buffered -= b.records.len();
            self.in_memory -= b.records.len();
            self.stats
                .acked
                .fetch_add(b.records.len() as u64, Ordering::Relaxed);
        }
        drop(stored);
        self.refill();
        self.stats
            .unacked
            .store(self.buffered as u64, Ordering::Relaxed);
    }

    fn welcome(&mut self, w: &Welcome) {
        // A new process continuing a stored run numbers its batches after the hub's; so does
        // one whose hub lost batches it had acknowledged (a restored database). What is held
        // is contiguous from `acked_seq + 1`, in memory then in the spool.
        let behind = self.welcomed && w.last_seq < self.acked_seq;
        if (!self.welcomed && w.last_seq > 0) || behind {
            if behind {
                let text = format!(
                    "the hub has this run's batches only through {} though it acknowledged {}: \
                     the hub lost data (restored database?); continuing after {}",
                    w.last_seq, self.acked_seq, w.last_seq
                );
                tracing::error!("stepstream: {text}");
                self.note_error(text);
            }
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
        self.metrics.welcome(w);
        if let Ok(mut slot) = self.stats.welcome.lock() {
            slot.get_or_insert(w.last_step);
        }
    }

    /// A held batch as the connected hub reads it (its metric ids, within its limits).
    fn wire(&self, b: &Batch) -> Batch {
        let mut refused = 0;
        let records = b
            .records
            .iter()
            .map(|r| {
                let (r, n) = self.metrics.translate(r);
                refused += n;
                r
            })
            .collect();
        if refused > 0 {
            self.stats
                .refused
                .fetch_add(refused as u64, Ordering::Relaxed);
        }
        Batch {
            seq: b.seq,
            records,
        }
    }

    async fn main(&mut self) {
        let mut backoff = Duration::from_millis(100);
        loop {
            match self.connection().await {
                Ended::Done => return,
                Ended::Lost { error, progressed } => {
                    self.stats.connected.store(false, Ordering::Relaxed);
                    self.stats.reconnects.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(%error, "stepstream hub connection lost; retrying");
                    if let Ok(mut e) = self.stats.last_error.lock() {
                        *e = Some(error);
                    }
                    if progressed {
                        backoff = Duration::from_millis(100);
                    }
                }
            }
            // Jitter keeps many collectors from reconnecting in lockstep after a hub restart.
            let jitter = Duration::from_millis(u64::from(std::process::id() % 97));
            let until = Instant::now() + backoff + jitter;
            loop {
                self.drain();
                let queue = self.queue.clone();
                tokio::select! {
                    _ = sleep_until(until) => break,
                    _ = queue.wait(), if self.may_wait_for_commands() => {}
                }
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    async fn connection(&mut self) -> Ended {
        // Whether the hub acknowledged anything on this connection.
        let mut progressed = false;
        let lost = |error: String, progressed: bool| Ended::Lost { error, progressed };
        // `TCP_NODELAY`: a batch goes out when sealed, not after the hub's delayed ACK of the
        // one before (the hub acknowledges several batches at a time, so between its
        // acknowledgements nothing carries that ACK).
        let connect = tokio_tungstenite::connect_async_tls_with_config(
            &self.url,
            None,
            true,
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
            writer: self.writer,
            acked_through: if self.welcomed { self.acked_seq } else { 0 },
        });
        if let Err(e) = sink.send(binary(hello)).await {
            return lost(e.to_string(), false);
        }
        let welcome = match timeout(WELCOME_TIMEOUT, next_from_hub(&mut stream)).await {
            Err(_) => return lost("no welcome from the hub".into(), false),
            Ok(Err(e)) => return lost(e, false),
            Ok(Ok(FromHub::Welcome(w))) => w,
            Ok(Ok(FromHub::HubError(e))) => {
                if let Ok(mut r) = self.stats.refusal.lock() {
                    *r = Some((e.code, e.message.clone()));
                }
                let text = format!("the hub refused the run ({:?}): {}", e.code, e.message);
                tracing::warn!("stepstream: {text}");
                return lost(text, false);
            }
            Ok(Ok(other)) => return lost(format!("expected Welcome, got {}", other.name()), false),
        };
        self.welcome(&welcome);
        if let Ok(mut r) = self.stats.refusal.lock() {
            *r = None;
        }
        self.stats.connected.store(true, Ordering::Relaxed);
        tracing::debug!(run = %self.identity.run_id, last_seq = welcome.last_seq, "connected to the hub");

        self.refill();
        // Batches may sit in the spool, not in `pending`: count from the last ack.
        let mut acked = self.acked_seq;
        let mut sent = acked;
        let mut finish_sent = false;
        let mut last_send = Instant::now();
        loop {
            self.drain();
            let unsent = self.metrics.take_unsent();
            if !unsent.is_empty() {
                let defs = ToHub::DefineMetrics(DefineMetrics { metrics: unsent });
                if let Err(e) = sink.feed(binary(defs)).await {
                    return lost(e.to_string(), progressed);
                }
            }
            // New records go out after their linger, whatever is in flight: the hub stores a
            // batch while it reads the next, and acknowledges several at a time. At a few
            // records a second each is its own batch; at many, a batch holds what came
            // within the linger, or `max_batch`.
            self.seal_due();
            self.refill();
            let mut wrote = false;
            for b in self.pending.iter() {
                if b.seq <= sent {
                    continue;
                }
                if sent - acked >= WINDOW {
                    break;
                }
                if let Err(e) = sink.feed(binary(ToHub::Batch(self.wire(b)))).await {
                    return lost(e.to_string(), progressed);
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
                        return lost(e.to_string(), progressed);
                    }
                    finish_sent = true;
                    wrote = true;
                }
            }
            if wrote {
                if let Err(e) = sink.flush().await {
                    return lost(e.to_string(), progressed);
                }
                last_send = Instant::now();
            }

            let beat_at = last_send + self.options.heartbeat;
            let seal_at = self.seal_at();
            let busy = std::mem::take(&mut self.taken) >= BUSY_TICK;
            let queue = self.queue.clone();
            tokio::select! {
                // Many records a second: look at the queue every POLL instead of awaiting
                // it, since an awaited queue makes every `log` wake this thread (a futex
                // call on the training thread per step); the tick costs at most POLL of
                // latency and no syscall in `log`. Fewer: sleep on the queue, each record
                // wakes it (fewer wakeups than ticking, and no added latency).
                _ = tokio::time::sleep(POLL), if self.can_buffer() && busy => {}
                _ = queue.wait(), if !busy && self.may_wait_for_commands() => {}
                msg = next_from_hub(&mut stream) => match msg {
                    Ok(FromHub::Ack(ack)) => {
                        progressed = true;
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
                        tracing::warn!("stepstream: {text}");
                        if e.fatal {
                            return lost(text, progressed);
                        }
                        self.note_error(text);
                    }
                    Ok(FromHub::Welcome(_)) => return lost("unexpected second Welcome".into(), progressed),
                    Err(e) => return lost(e, progressed),
                },
                _ = sleep_until(seal_at.unwrap_or(beat_at)), if seal_at.is_some() => {}
                _ = sleep_until(beat_at) => {
                    let beat = ToHub::Heartbeat(Heartbeat { wall_time: unix_now() });
                    if let Err(e) = sink.send(binary(beat)).await {
                        return lost(e.to_string(), progressed);
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

/// When a batch begun now is sealed: at the next multiple of `linger` on the wall clock
/// (Unix time), so at most `linger` from now and on average half of it. Collectors that
/// share a clock (the ranks of a host, the jobs of a cluster with NTP) then send together,
/// and a hub with a hundred runs wakes for them once per tick instead of once per frame:
/// like the kernel's `round_jiffies` for timers that need not be exact.
fn linger_until(linger: Duration) -> Instant {
    let period = linger.as_micros();
    if period == 0 {
        return Instant::now();
    }
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros();
    let wait = period - since_epoch % period;
    Instant::now() + Duration::from_micros(wait as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch waits at most the linger, and batches begun within one tick of the wall clock
    /// are sealed together at its end.
    #[test]
    fn linger_ends_on_the_next_tick_of_the_wall_clock() {
        let linger = Duration::from_millis(40);
        // A preempted test thread may misread the clocks now and then: most must be on a tick
        // (unaligned deadlines would be within 2 ms of one about a tenth of the time).
        let mut on_tick = 0;
        for _ in 0..50 {
            let before = Instant::now();
            let due = linger_until(linger);
            let after_system = std::time::SystemTime::now();
            let took = before.elapsed();
            let wait = due.saturating_duration_since(before);
            assert!(wait <= linger + took, "waits {wait:?}");
            // The due instant, on the wall clock, is a multiple of the linger.
            let due_system = after_system + due.saturating_duration_since(Instant::now());
            let micros = due_system
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_micros();
            let off = micros % linger.as_micros();
            let off = off.min(linger.as_micros() - off);
            on_tick += usize::from(off < 2_000);
            std::thread::sleep(Duration::from_micros(3_700));
        }
        assert!(on_tick >= 40, "{on_tick} of 50 deadlines on a tick");
        let now = Instant::now();
        assert!(linger_until(Duration::ZERO) <= Instant::now().max(now));
    }
}
