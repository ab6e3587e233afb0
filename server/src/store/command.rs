//! What the hub asks the store to write, and the one group-commit loop both engines share:
//! a writer thread takes every command waiting (up to 1,024), applies them in one
//! transaction, and answers each with that transaction's outcome. An engine says only how
//! to apply one command inside its transaction ([`Engine`]).

use super::{Result, RunKey, RunTail, StoreError};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use stepstream_protocol::{MetricDef, RunIdentity, RunStatus, StepRecord};
use tokio::sync::{mpsc, oneshot};

pub(super) enum Command {
    UpsertRun {
        identity: RunIdentity,
        /// The collector process claiming the run (an engine shared by several hubs refuses
        /// a second live writer here; one hub's engine leaves that to the hub's memory).
        writer: u64,
        at: f64,
        reply: oneshot::Sender<Result<RunKey>>,
    },
    DefineMetrics {
        key: RunKey,
        metrics: Vec<MetricDef>,
        reply: oneshot::Sender<Result<()>>,
    },
    AppendBatch {
        key: RunKey,
        seq: u64,
        records: Arc<[StepRecord]>,
        /// The batch's console lines and samples, stored beside it.
        items: Arc<[stepstream_protocol::Item]>,
        /// Console lines a run keeps, at most (the oldest beyond are dropped).
        console_cap: u64,
        tail: RunTail,
        /// Whether the batch was inserted (`false`: that `(run, seq)` was already stored).
        reply: oneshot::Sender<Result<bool>>,
    },
    SetStatus {
        key: RunKey,
        status: RunStatus,
        message: Option<String>,
        at: f64,
        reply: oneshot::Sender<Result<()>>,
    },
    Touch {
        key: RunKey,
        at: f64,
    },
    /// The writer's connection ended cleanly: the run has no writer until the next hello.
    ReleaseWriter {
        key: RunKey,
        writer: u64,
    },
    AddAlert {
        key: RunKey,
        alert: stepstream_protocol::Alert,
        reply: oneshot::Sender<Result<()>>,
    },
    /// A command for the run's training, queued; answered with its id.
    QueueOrder {
        key: RunKey,
        action: stepstream_protocol::Action,
        by: String,
        reason: String,
        at: f64,
        reply: oneshot::Sender<Result<u64>>,
    },
    /// Someone acknowledged a rule's alert on a run (its action called off), muting its
    /// notices until `mute_until` when given.
    Acknowledge {
        key: RunKey,
        rule: String,
        by: String,
        mute_until: Option<f64>,
        at: f64,
        reply: oneshot::Sender<Result<()>>,
    },
    /// A rule made in the page for a project; answered with its id.
    AddRule {
        project: String,
        body: String,
        by: String,
        at: f64,
        reply: oneshot::Sender<Result<u64>>,
    },
    /// A project's rule deleted; answered with whether it existed.
    DeleteRule {
        project: String,
        id: u64,
        reply: oneshot::Sender<Result<bool>>,
    },
    /// Packs a run's batches after its last pack, the tail included (`store::pack`); answers
    /// whether batches are left for another command (at most `PACKS_PER_COMMAND` packs each).
    Pack {
        key: RunKey,
        reply: oneshot::Sender<Result<bool>>,
    },
    /// Summarises (`store::summary`) a few packs that have no summaries (made by a version
    /// before them), of any run, in order of run and sequence number after `after`; answers
    /// where the next command goes on from (`None`: none is left).
    Summarize {
        after: (RunKey, u64),
        reply: oneshot::Sender<Result<Option<(RunKey, u64)>>>,
    },
    /// Deletes a run that ended, with everything stored of it; answered with whether it
    /// was there. Refused ([`Applied::Refused`]) while it is running or stale, or while a
    /// writer heard from within `WRITER_SILENCE_S` holds it (a resume through another hub).
    DeleteRun {
        key: RunKey,
        reply: oneshot::Sender<Result<bool>>,
    },
    /// A command moved on (never back: a state at or below the stored one changes nothing);
    /// answered with whether it moved. `id: None` moves every command of the run that is
    /// not final yet (a run that ended expires them).
    MoveOrder {
        key: RunKey,
        id: Option<u64>,
        state: stepstream_protocol::CommandState,
        step: Option<i64>,
        message: String,
        at: f64,
        reply: oneshot::Sender<Result<bool>>,
    },
}

/// What applying one command yielded.
pub(super) enum Applied {
    Done,
    Key(RunKey),
    Inserted(bool),
    /// Refused without failing the transaction (another live writer holds the run).
    Refused(String),
    /// Where a command that walks the store goes on from (`None`: it is done).
    Cursor(Option<(RunKey, u64)>),
}

/// One storage engine's write side: a transaction, and one command applied inside it.
pub(super) trait Engine {
    type Tx<'a>
    where
        Self: 'a;
    fn begin(&mut self) -> Result<Self::Tx<'_>>;
    fn apply(tx: &mut Self::Tx<'_>, cmd: &Command) -> Result<Applied>;
    fn commit(tx: Self::Tx<'_>) -> Result<()>;
    /// Called after each group commit, on the writer thread: work the engine does beside
    /// its transactions (SQLite's checkpoints) is asked for here, never done here.
    fn committed(&mut self) {}
}

/// A batch the run's tail update did not match (its stored tail is not the batch before
/// it), given the stored tail's `seq`: a resend when that covers the batch, else a batch
/// after a missing one, which must not be stored.
pub(super) fn not_next(run_key: RunKey, seq: u64, stored: u64) -> Result<Applied> {
    if stored >= seq {
        Ok(Applied::Inserted(false))
    } else {
        Err(StoreError::Gap {
            run_key,
            seq,
            stored,
        })
    }
}

/// How the writer thread commits, the same for both engines.
pub(super) struct Writer {
    /// A transaction starts at most once per this, while many writers are busy.
    pub interval: Duration,
    /// Transactions committed, counted.
    pub commits: Arc<AtomicU64>,
    /// Set while the last transaction failed (a dead or unreachable database): `/api/health`
    /// says so, and a cluster hub stops renewing its judge leases.
    pub failing: Arc<AtomicBool>,
    /// Someone waits for a command's commit (see [`Waiting`]).
    pub waiting: Arc<Waiting>,
}

/// Commands someone waits on (a collector's hello and metric definitions, a status, an
/// alert) end the writer's commit interval: they are rare, and a new metric's definition
/// holds back its run's batches, which viewers wait for. Batches do not wake the writer, so
/// a busy hub's interval costs no wake-ups.
#[derive(Default)]
pub(crate) struct Waiting {
    flag: AtomicBool,
    writer: OnceLock<std::thread::Thread>,
}

impl Waiting {
    /// A command someone waits on was queued.
    pub(crate) fn wake(&self) {
        self.flag.store(true, Ordering::Release);
        if let Some(writer) = self.writer.get() {
            writer.unpark();
        }
    }

    /// Whether one was queued since the last call.
    fn take(&self) -> bool {
        self.flag.swap(false, Ordering::AcqRel)
    }
}

/// Starts the writer thread that owns `engine`; commands go to the sender returned.
pub(super) fn spawn_writer<E: Engine + Send + 'static>(
    engine: E,
    writer: Writer,
) -> mpsc::Sender<Command> {
    let (tx, rx) = mpsc::channel(4096);
    let waiting = writer.waiting.clone();
    let thread = std::thread::Builder::new()
        .name("stepstream-db-writer".into())
        .spawn(move || writer_loop(engine, rx, writer))
        .expect("spawn the database writer thread");
    let _ = waiting.writer.set(thread.thread().clone());
    tx
}

/// Commands one transaction holds, at most: more than a busy hub's commit interval brings
/// (a 100-run fleet sends 2,500 batches a second; at 1,024 its transactions filled before
/// the interval ended, twice as many commits, each rewriting every run's newest pages).
const GROUP_MAX: usize = 8192;

/// Runs that must have stored batches within the last `interval` for the next transaction
/// to wait for its interval: fewer mean few writers, whom a wait would only delay (one busy
/// collector hands over several batches at once, and is still one writer).
const SIBLINGS: usize = 4;

/// The writer thread's loop: takes every waiting command (up to [`GROUP_MAX`]) and commits
/// them as one transaction. While many writers are busy (at least [`SIBLINGS`] runs stored
/// batches within the last `interval`, and the last transaction was not full) a transaction
/// starts at most once per `interval`. Counting the runs of the interval, not of the last
/// transaction alone: a fleet whose first batches happened to reach the writer one by one
/// (each its own transaction) is a fleet all the same.
///
/// Why wait: a commit costs about the same for one batch as for a hundred (each run's
/// newest pages are written once per commit, whatever it holds), so a hub with many runs
/// spends most of its database time on commits that hold a few batches each. Waiting up
/// to `interval` lets every run's batch of that moment share one commit, at the price of
/// up to `interval` more before the acknowledgement and the viewers. One or two busy
/// collectors never wait: their batches commit as they come, as PostgreSQL's
/// `commit_delay` applies only with `commit_siblings` active.
fn writer_loop<E: Engine>(mut engine: E, mut rx: mpsc::Receiver<Command>, writer: Writer) {
    let Writer {
        interval,
        commits,
        waiting,
        failing,
    } = writer;
    let mut pending = Vec::with_capacity(256);
    let mut last_start = Instant::now();
    let mut last_len = 0;
    // When each run last had a batch committed, for the runs of the last `interval`.
    let mut busy: std::collections::HashMap<RunKey, Instant> = Default::default();
    while let Some(first) = rx.blocking_recv() {
        pending.push(first);
        let now = Instant::now();
        busy.retain(|_, at| now.duration_since(*at) < interval);
        if busy.len() >= SIBLINGS && last_len < GROUP_MAX {
            let due = last_start + interval;
            // Parked until due, or until a command someone waits on arrives (park may
            // also return early for no reason: the loop checks again).
            while !waiting.take() {
                let now = Instant::now();
                if now >= due {
                    break;
                }
                std::thread::park_timeout(due - now);
            }
        }
        last_start = Instant::now();
        // Whoever woke the writer so far is in this transaction (queued before the
        // commands taken below): a wake must not cut the next interval short as well.
        waiting.take();
        while pending.len() < GROUP_MAX {
            match rx.try_recv() {
                Ok(c) => pending.push(c),
                Err(_) => break,
            }
        }
        last_len = pending.len();
        if !interval.is_zero() {
            for c in &pending {
                if let Command::AppendBatch { key, .. } = c {
                    busy.insert(*key, last_start);
                }
            }
        }
        let ok = commit_group(&mut engine, &mut pending, &commits);
        let was_failing = failing.swap(!ok, Ordering::Relaxed);
        if was_failing == ok {
            if ok {
                tracing::info!("the database takes writes again");
            } else {
                tracing::error!("the database refuses writes: nothing is acknowledged until it takes them again");
            }
        }
        engine.committed();
    }
    tracing::debug!("database writer stopped");
}

fn apply_all<E: Engine>(
    engine: &mut E,
    cmds: &[Command],
    commits: &AtomicU64,
) -> Result<Vec<Applied>> {
    let mut tx = engine.begin()?;
    let mut out = Vec::with_capacity(cmds.len());
    for cmd in cmds {
        out.push(E::apply(&mut tx, cmd)?);
    }
    E::commit(tx)?;
    commits.fetch_add(1, Ordering::Relaxed);
    Ok(out)
}

/// Applies every command in one transaction; answers each with the transaction's outcome.
/// Returns whether the database took writes (the group, or any of its commands alone).
fn commit_group<E: Engine>(
    engine: &mut E,
    pending: &mut Vec<Command>,
    commits: &AtomicU64,
) -> bool {
    match apply_all(engine, pending, commits) {
        Ok(applied) => {
            for (cmd, a) in pending.drain(..).zip(applied) {
                answer(cmd, Ok(a));
            }
            true
        }
        Err(e) => {
            tracing::error!(error = %e, commands = pending.len(), "database commit failed");
            // One bad command must not fail the others: retry each alone.
            let mut any = false;
            for cmd in pending.drain(..) {
                let single = apply_all(engine, std::slice::from_ref(&cmd), commits)
                    .map(|mut a| a.pop().unwrap_or(Applied::Done));
                any |= single.is_ok();
                answer(cmd, single);
            }
            any
        }
    }
}

fn answer(cmd: Command, outcome: Result<Applied>) {
    match cmd {
        Command::UpsertRun { reply, .. } => {
            let _ = reply.send(outcome.and_then(|a| match a {
                Applied::Key(k) => Ok(k),
                Applied::Refused(why) => Err(StoreError::Conflict(why)),
                _ => unreachable!("an upsert yields a key or a refusal"),
            }));
        }
        Command::AppendBatch { reply, .. } => {
            let _ = reply.send(outcome.map(|a| matches!(a, Applied::Inserted(true))));
        }
        Command::AddRule { reply, .. } => {
            let _ = reply.send(outcome.map(|a| match a {
                Applied::Key(id) => id as u64,
                _ => unreachable!("a rule's insert yields its id"),
            }));
        }
        Command::DeleteRule { reply, .. } | Command::Pack { reply, .. } => {
            let _ = reply.send(outcome.map(|a| matches!(a, Applied::Inserted(true))));
        }
        Command::Summarize { reply, .. } => {
            let _ = reply.send(outcome.map(|a| match a {
                Applied::Cursor(next) => next,
                _ => unreachable!("summarising yields where it goes on"),
            }));
        }
        Command::DeleteRun { reply, .. } => {
            let _ = reply.send(outcome.and_then(|a| match a {
                Applied::Refused(why) => Err(StoreError::Conflict(why)),
                a => Ok(matches!(a, Applied::Inserted(true))),
            }));
        }
        Command::QueueOrder { reply, .. } => {
            let _ = reply.send(outcome.map(|a| match a {
                Applied::Key(id) => id as u64,
                _ => unreachable!("a command's insert yields its id"),
            }));
        }
        Command::MoveOrder { reply, .. } => {
            let _ = reply.send(outcome.map(|a| matches!(a, Applied::Inserted(true))));
        }
        Command::DefineMetrics { reply, .. }
        | Command::Acknowledge { reply, .. }
        | Command::AddAlert { reply, .. }
        | Command::SetStatus { reply, .. } => {
            let _ = reply.send(outcome.map(|_| ()));
        }
        Command::Touch { .. } | Command::ReleaseWriter { .. } => {}
    }
}
