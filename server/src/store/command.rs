//! What the hub asks the store to write, and the one group-commit loop both engines share:
//! a writer thread takes every command waiting (up to 1,024), applies them in one
//! transaction, and answers each with that transaction's outcome. An engine says only how
//! to apply one command inside its transaction ([`Engine`]).

use super::{Result, RunKey, RunTail, StoreError};
use std::sync::Arc;
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
}

/// What applying one command yielded.
pub(super) enum Applied {
    Done,
    Key(RunKey),
    Inserted(bool),
    /// Refused without failing the transaction (another live writer holds the run).
    Refused(String),
}

/// One storage engine's write side: a transaction, and one command applied inside it.
pub(super) trait Engine {
    type Tx<'a>
    where
        Self: 'a;
    fn begin(&mut self) -> Result<Self::Tx<'_>>;
    fn apply(tx: &mut Self::Tx<'_>, cmd: &Command) -> Result<Applied>;
    fn commit(tx: Self::Tx<'_>) -> Result<()>;
}

/// The writer thread's loop: takes every waiting command (up to 1,024) and commits them as
/// one transaction.
pub(super) fn writer_loop<E: Engine>(mut engine: E, mut rx: mpsc::Receiver<Command>) {
    let mut pending = Vec::with_capacity(256);
    while let Some(first) = rx.blocking_recv() {
        pending.push(first);
        while pending.len() < 1024 {
            match rx.try_recv() {
                Ok(c) => pending.push(c),
                Err(_) => break,
            }
        }
        commit_group(&mut engine, &mut pending);
    }
    tracing::debug!("database writer stopped");
}

fn apply_all<E: Engine>(engine: &mut E, cmds: &[Command]) -> Result<Vec<Applied>> {
    let mut tx = engine.begin()?;
    let mut out = Vec::with_capacity(cmds.len());
    for cmd in cmds {
        out.push(E::apply(&mut tx, cmd)?);
    }
    E::commit(tx)?;
    Ok(out)
}

/// Applies every command in one transaction; answers each with the transaction's outcome.
fn commit_group<E: Engine>(engine: &mut E, pending: &mut Vec<Command>) {
    match apply_all(engine, pending) {
        Ok(applied) => {
            for (cmd, a) in pending.drain(..).zip(applied) {
                answer(cmd, Ok(a));
            }
        }
        Err(e) => {
            tracing::error!(error = %e, commands = pending.len(), "database commit failed");
            // One bad command must not fail the others: retry each alone.
            for cmd in pending.drain(..) {
                let single = apply_all(engine, std::slice::from_ref(&cmd))
                    .map(|mut a| a.pop().unwrap_or(Applied::Done));
                answer(cmd, single);
            }
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
        Command::DefineMetrics { reply, .. }
        | Command::AddAlert { reply, .. }
        | Command::SetStatus { reply, .. } => {
            let _ = reply.send(outcome.map(|_| ()));
        }
        Command::Touch { .. } | Command::ReleaseWriter { .. } => {}
    }
}
