//! The sender thread: owns the connection to the hub and every record not yet acknowledged.
//!
//! Records wait in `building` until the send window has room, then are sealed into a batch
//! under the next sequence number and kept in `pending` until the hub acknowledges it. On
//! any failure the connection is dropped and rebuilt with exponential backoff; the hub's
//! `Welcome` says which batches it already stored, and the rest are resent in order.
//!
//! * `batching` — what the sender holds: taking from the queue, sealing batches on the
//!   wall clock's linger, the spool, the archive, and letting go of what the hub stored.
//! * `conversation` — one connection to the hub: hello and welcome, metric definitions,
//!   the send window, acknowledgements, heartbeats, finish; and reconnecting.

mod batching;
mod conversation;

use crate::ids::MetricTable;
use crate::options::Options;
use crate::queue::Command;
use crate::queue::Queue;
use crate::stats::Stats;
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
/// Console lines and samples in one batch, at most (a hub takes `batch_items`, 100,000 by
/// default: a batch stays well within it and within a frame).
const MAX_BATCH_ITEMS: usize = 4096;

/// What a batch weighs in the sender's budgets (`buffered`, `in_memory`, the spool's index):
/// its records and its items, one each.
fn weight(b: &Batch) -> usize {
    b.entries()
}

pub(crate) struct Sender {
    url: String,
    options: Options,
    identity: RunIdentity,
    stats: Arc<Stats>,
    /// Every metric defined so far, and the ids the connected hub knows them by.
    metrics: MetricTable,
    building: Vec<StepRecord>,
    /// Console lines and samples waiting with `building`, sealed into the same batches.
    building_items: Vec<stepstream_protocol::Item>,
    /// Encoded size of `building` and `building_items`, at most (see [`limits::record_bytes`]).
    building_bytes: usize,
    /// When `building` is sealed unless it fills first: the first tick of the wall clock in
    /// multiples of `options.linger` after its oldest record arrived (see [`linger_until`]).
    building_due: Option<Instant>,
    /// A flush asked for what is held to go now.
    flushing: bool,
    /// The linger in force: `options.linger`, or less where the hub asked for less
    /// ([`stepstream_protocol::Pace`]; none while the hub has room).
    linger: Duration,
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
    /// Records and items in `building`, `pending` and the spool.
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
    /// Commands the hub delivered, for the training thread.
    commands: Arc<crate::commands::Inbox>,
    /// Answers to commands and the training's alerts, not yet written to a connection (sent
    /// before the finish).
    outbox: Vec<ToHub>,
}

impl Sender {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        url: String,
        options: Options,
        identity: RunIdentity,
        stats: Arc<Stats>,
        archive: Option<crate::archive::Archive>,
        tls: Arc<rustls::ClientConfig>,
        queue: Arc<Queue>,
        commands: Arc<crate::commands::Inbox>,
    ) -> Sender {
        let linger = options.linger;
        Sender {
            url,
            options,
            identity,
            stats,
            metrics: MetricTable::default(),
            building: Vec::new(),
            building_items: Vec::new(),
            building_bytes: 0,
            building_due: None,
            flushing: false,
            linger,
            writer: crate::random::u64(),
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
            commands,
            outbox: Vec::new(),
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
}
