//! Deleting runs that ended: asked for (the API, the page, `stepstream delete`) or by a
//! project's retention (`retention.rs`), on this hub or on any hub of a cluster. The store
//! deletes first; the hub then forgets the run and tells every viewer who may see it
//! (`RunDeleted`), and the other hubs, which find it gone from the shared store and do the
//! same.

use super::retention::{Ended, Retention};
use super::{encode, Hub, LiveEvent, Run};
use crate::store::StoreError;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use stepstream_protocol::{unix_now, PeerDeleted, RunDeleted, ToPeer, ToViewer};

/// How often the hub applies its retention rules (beside each run's end).
const RETAIN_EVERY_S: f64 = 5.0;

/// Why a run was not deleted.
#[derive(Debug, thiserror::Error)]
pub enum DeleteError {
    /// It has not ended: its collector may still write.
    #[error("{0}")]
    NotEnded(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Hub {
    /// Deletes a run that ended, with everything stored of it. `by` is who asked, as the
    /// viewers are told. Answers whether the store still held it.
    pub async fn delete_run(&self, run: &Arc<Run>, by: &str) -> Result<bool, DeleteError> {
        let (run_id, status) = run.state(|st| (st.identity.run_id.clone(), st.status));
        if !status.is_terminal() {
            return Err(DeleteError::NotEnded(format!(
                "run {run_id} is {}: only a run that ended may be deleted (stop it, or wait \
                 until the hub marks it failed)",
                status.as_str()
            )));
        }
        // No batch of another hub's (a catch-up) is applied meanwhile.
        let _guard = run.ingest.lock().await;
        let held = match self.store.delete_run(run.key).await {
            Ok(held) => held,
            Err(StoreError::Conflict(why)) => return Err(DeleteError::NotEnded(why)),
            Err(e) => return Err(e.into()),
        };
        self.forget(run, by);
        self.tell_peers(|hub| {
            ToPeer::PeerDeleted(PeerDeleted {
                hub,
                run_id,
                by: by.to_string(),
            })
        });
        Ok(held)
    }

    /// Drops a run the store no longer holds from memory, and from the list of every viewer
    /// who may see it; its followers stop.
    pub(super) fn forget(&self, run: &Run, by: &str) {
        let (run_id, project, samples) = run.state(|st| {
            (
                st.identity.run_id.clone(),
                st.identity.project.clone(),
                st.sample_bytes,
            )
        });
        let removed = {
            let mut runs = self.runs.write().unwrap_or_else(|e| e.into_inner());
            let same = runs.get(&run_id).is_some_and(|r| r.key == run.key);
            same && runs.remove(&run_id).is_some()
        };
        if !removed {
            return;
        }
        let _ = self
            .sample_bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                Some(b.saturating_sub(samples))
            });
        let _ = run.live.send(LiveEvent::Deleted);
        let _ = self.updates.send(encode(ToViewer::RunDeleted(RunDeleted {
            run_id: run_id.clone(),
            project,
            by: by.to_string(),
            at: unix_now(),
        })));
        tracing::info!(run = %run_id, by, "run deleted");
    }

    /// Sets the retention rules (before serving).
    pub fn set_retention(&self, retention: Retention) {
        let _ = self.retention.set(retention);
    }

    /// Applies the retention rules at most every few seconds, on a task of its own (the
    /// status clock does not wait for the deletes); `now`: the hub's clock.
    pub(super) fn retain_due(&self, now: f64) {
        if !self.retention.get().is_some_and(Retention::is_set) {
            return;
        }
        {
            let mut last = self.retained_at.lock().unwrap_or_else(|e| e.into_inner());
            if now - *last < RETAIN_EVERY_S {
                return;
            }
            *last = now;
        }
        self.retain_soon();
    }

    /// Applies the retention rules now, on a task of its own (a run just ended).
    pub(super) fn retain_soon(&self) {
        if !self.retention.get().is_some_and(Retention::is_set)
            || self.retaining.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let hub = self.me.clone();
        tokio::spawn(async move {
            if let Some(hub) = hub.upgrade() {
                hub.retain().await;
                hub.retaining.store(false, Ordering::Release);
            }
        });
    }

    /// Deletes the ended runs the rules no longer keep. The rules count every run of the
    /// cluster (a project's last N are the last N of all its runs, whichever hub took
    /// each). An ended run has no judge, so in a cluster every hub applies the rules: the
    /// store deletes a run in one transaction, a hub that comes second finds it gone, and
    /// each hub's viewers are told once (`Hub::forget` tells only if it still held it).
    async fn retain(&self) {
        let Some(rules) = self.retention.get() else {
            return;
        };
        let ended: Vec<Ended<Arc<Run>>> = self
            .runs()
            .into_iter()
            .filter_map(|run| {
                let (ended, project, at) = run.state(|st| {
                    (
                        st.status.is_terminal(),
                        st.identity.project.clone(),
                        st.last_activity,
                    )
                });
                ended.then_some(Ended {
                    project,
                    ended_at: at,
                    key: run,
                })
            })
            .collect();
        for run in rules.doomed(&ended, unix_now()) {
            if let Err(e) = self.delete_run(&run, "retention").await {
                tracing::warn!(run_key = run.key, error = %e, "retention could not delete a run");
            }
        }
    }
}
