//! The writer thread: it owns the write connection and commits every command waiting as one
//! transaction (group commit), then answers each with the transaction's outcome.

use super::blob::{encode_records, encode_values};
use super::schema::step_range;
use super::{Result, RunKey, RunTail, StoreError};
use rusqlite::{params, Connection};
use std::sync::Arc;
use stepstream_protocol::{MetricDef, RunIdentity, RunStatus, StepRecord};
use tokio::sync::{mpsc, oneshot};

pub(super) enum Command {
    UpsertRun {
        identity: RunIdentity,
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
        reply: oneshot::Sender<Result<()>>,
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
    AddAlert {
        key: RunKey,
        alert: stepstream_protocol::Alert,
        reply: oneshot::Sender<Result<()>>,
    },
}

/// The writer thread's loop: takes every waiting command (up to 1,024) and commits them as
/// one transaction.
pub(super) fn writer_loop(mut conn: Connection, mut rx: mpsc::Receiver<Command>) {
    let mut pending = Vec::with_capacity(256);
    while let Some(first) = rx.blocking_recv() {
        pending.push(first);
        while pending.len() < 1024 {
            match rx.try_recv() {
                Ok(c) => pending.push(c),
                Err(_) => break,
            }
        }
        commit_group(&mut conn, &mut pending);
    }
    tracing::debug!("database writer stopped");
}

/// Applies every command in one transaction; answers each with the transaction's outcome.
fn commit_group(conn: &mut Connection, pending: &mut Vec<Command>) {
    let outcome = (|| -> rusqlite::Result<Vec<Option<RunKey>>> {
        let tx = conn.transaction()?;
        let mut keys = Vec::with_capacity(pending.len());
        for cmd in pending.iter() {
            keys.push(apply(&tx, cmd)?);
        }
        tx.commit()?;
        Ok(keys)
    })();
    match outcome {
        Ok(keys) => {
            for (cmd, key) in pending.drain(..).zip(keys) {
                answer(cmd, Ok(key));
            }
        }
        Err(e) => {
            tracing::error!(error = %e, commands = pending.len(), "database commit failed");
            // One bad command must not fail the others: retry each alone.
            for cmd in pending.drain(..) {
                let single = (|| -> rusqlite::Result<Option<RunKey>> {
                    let tx = conn.transaction()?;
                    let key = apply(&tx, &cmd)?;
                    tx.commit()?;
                    Ok(key)
                })();
                answer(cmd, single);
            }
        }
    }
}

fn apply(tx: &rusqlite::Transaction<'_>, cmd: &Command) -> rusqlite::Result<Option<RunKey>> {
    match cmd {
        Command::UpsertRun { identity, at, .. } => {
            let id = &identity.run_id;
            tx.prepare_cached(
                "INSERT INTO runs (run_id, project, name, config, host, rank, world_size, \
                 started_at, status, last_activity, job, framework) VALUES (?1, ?2, ?3, ?4, \
                 ?5, ?6, ?7, ?8, 'running', ?9, ?10, ?11) ON CONFLICT(run_id) DO UPDATE SET \
                 project = excluded.project, name = excluded.name, config = excluded.config, \
                 host = excluded.host, rank = excluded.rank, world_size = excluded.world_size, \
                 job = excluded.job, framework = excluded.framework, status = 'running', \
                 status_message = NULL, last_activity = excluded.last_activity",
            )?
            .execute(params![
                id.as_str(),
                identity.project,
                identity.name,
                identity.config_json,
                identity.host,
                identity.rank,
                identity.world_size,
                identity.started_at,
                at,
                identity.job,
                identity.framework,
            ])?;
            let key = tx
                .prepare_cached("SELECT key FROM runs WHERE run_id = ?1")?
                .query_row([id.as_str()], |r| r.get(0))?;
            Ok(Some(key))
        }
        Command::DefineMetrics { key, metrics, .. } => {
            let mut stmt = tx.prepare_cached(
                "INSERT OR IGNORE INTO metrics (run_key, id, name) VALUES (?1, ?2, ?3)",
            )?;
            for m in metrics {
                stmt.execute(params![key, m.id.0, m.name])?;
            }
            Ok(None)
        }
        Command::AppendBatch {
            key,
            seq,
            records,
            tail,
            ..
        } => {
            let range = step_range(records);
            let blob = encode_records(records)
                .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
            let inserted = tx
                .prepare_cached(
                    "INSERT OR IGNORE INTO batches (run_key, seq, n, data, lo_step, hi_step) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                )?
                .execute(params![
                    key,
                    *seq as i64,
                    records.len() as i64,
                    blob,
                    range.map(|r| r.0),
                    range.map(|r| r.1),
                ])?;
            if let (1, Some((lo, hi))) = (inserted, range) {
                tx.prepare_cached(
                    "UPDATE runs SET max_span = ?2 WHERE key = ?1 AND max_span < ?2",
                )?
                .execute(params![key, hi.saturating_sub(lo)])?;
            }
            tx.prepare_cached(
                "UPDATE runs SET last_seq = ?2, last_step = ?3, last_point_at = ?4, \
                 records = ?5, last_values = ?6, last_activity = max(last_activity, ?7), \
                 status = CASE WHEN status = 'stale' THEN 'running' ELSE status END \
                 WHERE key = ?1 AND last_seq < ?2",
            )?
            .execute(params![
                key,
                tail.last_seq as i64,
                tail.last_step,
                tail.last_point_at,
                tail.records as i64,
                encode_values(&tail.last_values),
                protocol_now(),
            ])?;
            Ok(None)
        }
        Command::SetStatus {
            key,
            status,
            message,
            at,
            ..
        } => {
            tx.prepare_cached(
                "UPDATE runs SET status = ?2, status_message = ?3, status_at = ?4 WHERE key = ?1",
            )?
            .execute(params![key, status.as_str(), message, at])?;
            Ok(None)
        }
        Command::AddAlert { key, alert, .. } => {
            tx.prepare_cached(
                "INSERT INTO alerts (run_key, rule, fired, step, value, message, at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?
            .execute(params![
                key,
                alert.rule,
                alert.fired as i64,
                alert.step,
                alert.value.is_finite().then_some(alert.value),
                alert.message,
                alert.at
            ])?;
            Ok(None)
        }
        Command::Touch { key, at } => {
            tx.prepare_cached(
                "UPDATE runs SET last_activity = max(last_activity, ?2) WHERE key = ?1",
            )?
            .execute(params![key, at])?;
            Ok(None)
        }
    }
}

fn protocol_now() -> f64 {
    stepstream_protocol::unix_now()
}

fn answer(cmd: Command, outcome: rusqlite::Result<Option<RunKey>>) {
    let outcome = outcome.map_err(StoreError::from);
    match cmd {
        Command::UpsertRun { reply, .. } => {
            let _ = reply.send(outcome.map(|k| k.expect("upsert yields a key")));
        }
        Command::DefineMetrics { reply, .. }
        | Command::AddAlert { reply, .. }
        | Command::AppendBatch { reply, .. }
        | Command::SetStatus { reply, .. } => {
            let _ = reply.send(outcome.map(|_| ()));
        }
        Command::Touch { .. } => {}
    }
}
