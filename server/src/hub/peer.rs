//! The hub as one of several (see `cluster.rs`): what it tells the others, what it takes
//! from them, and which runs it judges.
//!
//! Another hub's batch is applied exactly like a local one after its commit: the run's tail
//! moves, then the batch goes to this hub's viewers, so the history/live seam stays exact. A
//! batch above the next expected one means messages were missed: the missing batches are
//! read from the shared store first (they committed before their message left).

use super::{judge::Job, Hub, LiveEvent, Run, RunState};
use crate::cluster::{Heard, Inbox};
use crate::store::{ItemQuery, RunKey, StoredRun};
use std::collections::HashSet;
use std::sync::{Arc, Weak};
use stepstream_protocol::{
    unix_now, Item, PeerAlert, PeerBatch, PeerMetrics, PeerRun, RunId, StatusChange, StepRecord,
    ToPeer,
};

/// How long a hub may stay silent before the others take its runs' judge leases.
const LEASE_TTL_S: f64 = 3.0;
/// How often a hub renews its sign of life and looks for runs to take.
const LEASE_EVERY_S: f64 = 1.0;

/// Applies what the other hubs say to `hub` until it is gone; reads every run again from
/// the store whenever NATS (re)connects, since messages may have been missed.
pub async fn follow(hub: Weak<Hub>, mut inbox: Inbox) {
    while let Some(heard) = inbox.next().await {
        let Some(hub) = hub.upgrade() else { return };
        match heard {
            Heard::Message(msg) => hub.apply_peer(msg).await,
            Heard::Reconnected => hub.catch_up_from_store().await,
        }
    }
    tracing::error!("stopped following the other hubs: the NATS subscription ended");
}

impl Hub {
    /// This hub's id in its cluster, or 0 alone.
    fn hub_id(&self) -> u64 {
        self.cluster.get().map_or(0, |c| c.hub_id)
    }

    /// Whether this hub is one of several sharing its store.
    pub(super) fn clustered(&self) -> bool {
        self.judging
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// Tells the other hubs, if there are any.
    pub(super) fn tell_peers(&self, make: impl FnOnce(u64) -> ToPeer) {
        if let Some(cluster) = self.cluster.get() {
            cluster.publish(make(cluster.hub_id));
        }
    }

    pub(super) fn tell_batch(&self, run_id: &RunId, seq: u64, records: &[StepRecord]) {
        self.tell_peers(|hub| {
            ToPeer::PeerBatch(PeerBatch {
                hub,
                run_id: run_id.clone(),
                seq,
                records: records.to_vec(),
            })
        });
    }

    pub(super) fn tell_run(&self, run_id: &RunId, change: Option<StatusChange>) {
        self.tell_peers(|hub| {
            ToPeer::PeerRun(PeerRun {
                hub,
                run_id: run_id.clone(),
                change,
            })
        });
    }

    /// Whether this hub judges the run (status and alerts): always when it is alone; in a
    /// cluster, only while it holds the run's lease.
    pub(super) fn judges(&self, key: RunKey) -> bool {
        match &*self.judging.lock().unwrap_or_else(|e| e.into_inner()) {
            None => true,
            Some(mine) => mine.contains(&key),
        }
    }

    /// Renews this hub's sign of life (at most once a second), which keeps its judge leases,
    /// and takes the runs without a judge or whose judge went silent.
    pub(super) async fn renew_leases(&self) {
        if self.cluster.get().is_none() {
            return;
        }
        let now = unix_now();
        {
            let mut last = self.leases_at.lock().unwrap_or_else(|e| e.into_inner());
            if now - *last < LEASE_EVERY_S {
                return;
            }
            *last = now;
        }
        if !self.store.writable() {
            // A hub that cannot write cannot store what it judges (an alert, a status): its
            // leases lapse, and a hub that can write takes its runs over.
            tracing::warn!("the database refuses this hub's writes: not renewing its judge leases");
            *self.judging.lock().unwrap_or_else(|e| e.into_inner()) = Some(HashSet::new());
            return;
        }
        match self.store.judge_leases(self.hub_id(), LEASE_TTL_S).await {
            Ok(Some(keys)) => {
                let keys: HashSet<RunKey> = keys.into_iter().collect();
                let gained: Vec<RunKey> = {
                    let mut judging = self.judging.lock().unwrap_or_else(|e| e.into_inner());
                    let before = judging.as_ref().map_or(0, |k| k.len());
                    if keys.len() != before {
                        tracing::info!(runs = keys.len(), "runs this hub judges");
                    }
                    let gained = keys
                        .iter()
                        .filter(|k| !judging.as_ref().is_some_and(|j| j.contains(k)))
                        .copied()
                        .collect();
                    *judging = Some(keys);
                    gained
                };
                // Runs taken over from a hub that went away: their pending rule actions.
                if !gained.is_empty() {
                    self.resume_actions(Some(&gained)).await;
                }
            }
            Ok(None) => {}
            // Unrenewed leases lapse and another hub judges: better than two judges.
            Err(e) => {
                tracing::warn!(error = %e, "could not renew judge leases");
                *self.judging.lock().unwrap_or_else(|e| e.into_inner()) = Some(HashSet::new());
            }
        }
    }

    /// Takes the run's judge lease: its collector connected here, so its heartbeats arrive
    /// here. The hub that held it lets go at its next renewal.
    pub(super) async fn take_lease(&self, key: RunKey) {
        if self.cluster.get().is_none() {
            return;
        }
        match self.store.take_lease(self.hub_id(), key).await {
            Ok(()) => {
                let gained = self
                    .judging
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .as_mut()
                    .is_some_and(|mine| mine.insert(key));
                if gained {
                    // Its pending rule actions are this hub's now (off the hello's path).
                    let hub = self.me.clone();
                    tokio::spawn(async move {
                        if let Some(hub) = hub.upgrade() {
                            hub.resume_actions(Some(&[key])).await;
                        }
                    });
                }
            }
            Err(e) => tracing::warn!(error = %e, "could not take a run's judge lease"),
        }
    }

    /// The run as this hub knows it, read from the store when it was created through
    /// another hub (or changed there); `None` when the store has no such run.
    pub(super) async fn refresh(&self, run_id: &RunId) -> Option<Arc<Run>> {
        let stored = match self.store.load_run(run_id.clone()).await {
            Ok(Some(s)) => s,
            Ok(None) => {
                // Known here and gone from the shared store: another hub deleted it.
                if let Some(run) = self.run(run_id) {
                    self.forget(&run, "another hub");
                }
                return None;
            }
            Err(e) => {
                tracing::warn!(run = %run_id, error = %e, "could not read a run another hub changed");
                return self.run(run_id);
            }
        };
        Some(self.adopt(stored).await)
    }

    /// Brings a stored run into memory, or this hub's copy up to date with it: identity,
    /// status, metrics, and any batches this hub missed (sent to its viewers in order).
    async fn adopt(&self, stored: StoredRun) -> Arc<Run> {
        let run_id = stored.identity.run_id.clone();
        if let Some(old) = self.run(&run_id).filter(|r| r.key != stored.key) {
            // Deleted, and made again under the same id through another hub.
            self.forget(&old, "another hub");
        }
        let run = self.run(&run_id).unwrap_or_else(|| {
            let mut state = RunState::new(
                stored.identity.clone(),
                Default::default(),
                stored.metrics.clone(),
            );
            state.last_activity = stored.last_activity;
            state.sample_bytes = stored.sample_bytes;
            let run = Arc::new(Run::new(stored.key, state));
            self.runs
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .entry(run_id.clone())
                .or_insert(run)
                .clone()
        });
        // This hub's own limits apply to what another hub stored too.
        let limits = self.limits.wire;
        let fresh = run.state_mut(|st| {
            st.identity = stored.identity.clone();
            st.status = stored.status;
            st.status_message = stored.status_message.clone();
            st.last_activity = st.last_activity.max(stored.last_activity);
            let known: HashSet<_> = st.metrics.iter().map(|m| m.id).collect();
            let room = (limits.run_metrics as usize).saturating_sub(st.metrics.len());
            let fresh: Vec<_> = stored
                .metrics
                .iter()
                .filter(|m| !known.contains(&m.id))
                .filter(|d| limits.check_name("metric name", &d.name).is_ok())
                .take(room)
                .cloned()
                .collect();
            st.metrics.extend(fresh.iter().cloned());
            st.metrics.sort_by_key(|m| m.id);
            st.dirty = true;
            fresh
        });
        if !fresh.is_empty() {
            let _ = run.live.send(LiveEvent::Metrics(fresh));
        }
        self.catch_up(&run, stored.tail.last_seq).await;
        run
    }

    /// Applies the stored batches above this hub's tail of the run, through `seq`.
    async fn catch_up(&self, run: &Arc<Run>, through: u64) {
        let _guard = run.ingest.lock().await;
        let last = run.state(|st| st.tail.last_seq);
        if through <= last {
            return;
        }
        let missed = self
            .store
            .scan(run.key, last, through, Vec::new(), |out, seq, records| {
                out.push((seq, records.to_vec()));
                std::ops::ControlFlow::Continue(())
            })
            .await;
        // Their console lines and samples, for this hub's viewers' live frames.
        let items = self
            .store
            .items(
                run.key,
                ItemQuery::batches(last, through),
                Vec::new(),
                |out: &mut Vec<(u64, Item)>, i| {
                    out.push((i.seq, i.to_item()));
                    std::ops::ControlFlow::Continue(())
                },
            )
            .await
            .unwrap_or_default();
        match missed {
            Ok(batches) => {
                let mut items = items.into_iter().peekable();
                for (seq, records) in batches {
                    let mut mine = Vec::new();
                    while let Some((_, item)) = items.next_if(|(s, _)| *s <= seq) {
                        mine.push(item);
                    }
                    self.apply_remote_batch(run, seq, records, &mine);
                }
            }
            Err(e) => tracing::warn!(error = %e, "could not read batches another hub stored"),
        }
    }

    /// One batch another hub committed, in order (the caller holds the run's ingest lock).
    fn apply_remote_batch(
        &self,
        run: &Arc<Run>,
        seq: u64,
        records: Vec<StepRecord>,
        items: &[Item],
    ) {
        let now = unix_now();
        let tail = run.state(|st| st.tail.after(seq, &records));
        let run_id = run.store_tail(tail, |st| {
            st.last_activity = now;
            st.dirty = true;
            st.identity.run_id.clone()
        });
        let records: Arc<[StepRecord]> = records.into();
        super::publish_batch(run, run_id, seq, &records, items);
        // Only the run's judge runs its rules (the hub its collector writes through, as a
        // rule: it took the lease at the hello). A hub that takes a lease over starts the
        // run's rolling windows afresh.
        if self.judges(run.key) {
            self.judge(Job::Records {
                run: run.clone(),
                records,
                now,
            });
        }
    }

    /// A message from another hub.
    pub async fn apply_peer(&self, msg: ToPeer) {
        match msg {
            ToPeer::PeerBatch(b) if b.hub != self.hub_id() => {
                // A hint, not data: the bus is not trusted (a forged or replayed message
                // must neither show points that were never stored nor move the tail a
                // resuming collector is welcomed with). The batches are read from the
                // store, which has them first, through the one announced.
                let Some(run) = self.run_or_refresh(&b.run_id).await else {
                    return;
                };
                if b.seq <= run.state(|st| st.tail.last_seq) {
                    return;
                }
                self.catch_up(&run, b.seq).await;
            }
            // Metric names, statuses and alerts are hints too: each is read back from the
            // store, and only what it holds is told to this hub's viewers (a forged message
            // must not name a series wrongly, fail a run, or raise an alert).
            ToPeer::PeerMetrics(m) if m.hub != self.hub_id() => {
                self.refresh(&m.run_id).await;
            }
            ToPeer::PeerRun(r) if r.hub != self.hub_id() => {
                let Some(run) = self.refresh(&r.run_id).await else {
                    return;
                };
                match r.change {
                    Some(said) => {
                        let stored = run.state(|st| StatusChange {
                            run_id: st.identity.run_id.clone(),
                            status: st.status,
                            message: st.status_message.clone(),
                            at: said.at,
                        });
                        if stored.status != said.status || stored.message != said.message {
                            tracing::info!(run = %r.run_id, "a peer's status change differs from the store's; telling the store's");
                        }
                        self.publish_status(&run, stored)
                    }
                    None => self.publish_update(&run),
                }
            }
            ToPeer::PeerDeleted(d) if d.hub != self.hub_id() => {
                // Only when the store agrees: a forged message deletes nothing.
                let Some(run) = self.run(&d.run_id) else {
                    return;
                };
                match self.store.load_run(d.run_id.clone()).await {
                    Ok(None) => self.forget(&run, &d.by),
                    Ok(Some(stored)) if stored.key != run.key => {
                        self.forget(&run, &d.by);
                        self.adopt(stored).await;
                    }
                    Ok(Some(_)) => {
                        tracing::warn!(run = %d.run_id, "a peer says a run was deleted that the store holds; keeping it")
                    }
                    Err(e) => {
                        tracing::warn!(run = %d.run_id, error = %e, "could not check a peer's deletion against the store")
                    }
                }
            }
            ToPeer::PeerRules(r) if r.hub != self.hub_id() => {
                // Read from the shared store, not taken from the message.
                if let Err(e) = self.load_rules().await {
                    tracing::warn!(project = %r.project, error = %e, "could not read the page rules again");
                }
            }
            ToPeer::PeerCommand(c) if c.hub != self.hub_id() => {
                if let Some(run) = self.run_or_refresh(&c.run_id).await {
                    self.peer_command(&run, c.id).await;
                }
            }
            ToPeer::PeerAlert(PeerAlert { hub, alert }) if hub != self.hub_id() => {
                let Some(run) = self.run_or_refresh(&alert.run_id).await else {
                    return;
                };
                let stored = match self.store.alerts(run.key, alert.run_id.clone()).await {
                    Ok(stored) => stored,
                    Err(e) => {
                        tracing::warn!(error = %e, "could not check a peer's alert against the store");
                        return;
                    }
                };
                // Newest first: an alert told is among the last stored.
                let found = stored.into_iter().rev().find(|a| {
                    a.rule == alert.rule
                        && a.fired == alert.fired
                        && a.step == alert.step
                        && a.message == alert.message
                        && a.value.to_bits() == alert.value.to_bits()
                });
                match found {
                    Some(stored) => {
                        let _ = run.live.send(LiveEvent::Alert(stored));
                    }
                    None => {
                        tracing::warn!(run = %alert.run_id, rule = %alert.rule, "a peer's alert is not in the store; not telling it")
                    }
                }
            }
            _ => {}
        }
    }

    async fn run_or_refresh(&self, run_id: &RunId) -> Option<Arc<Run>> {
        match self.run(run_id) {
            Some(run) => Some(run),
            None => self.refresh(run_id).await,
        }
    }

    /// The run, from memory, or in a cluster from the shared store when another hub created
    /// it and this hub has not heard yet (its message may still be on its way): a viewer or
    /// an API client of any hub finds every run the cluster stored.
    pub async fn find_run(&self, run_id: &RunId) -> Option<Arc<Run>> {
        match self.run(run_id) {
            Some(run) => Some(run),
            None if self.clustered() => self.refresh(run_id).await,
            None => None,
        }
    }

    /// Reads every run again from the store and applies what this hub missed (NATS came
    /// back after an outage, or this hub just joined).
    pub async fn catch_up_from_store(&self) {
        match self.store.load_runs().await {
            Ok(runs) => {
                let n = runs.len();
                // Runs deleted through another hub while this one was not listening.
                let kept: HashSet<_> = runs.iter().map(|s| s.key).collect();
                for run in self.runs() {
                    if !kept.contains(&run.key) {
                        // Or created since the list was read: the store says which.
                        let run_id = run.state(|st| st.identity.run_id.clone());
                        self.refresh(&run_id).await;
                    }
                }
                for stored in runs {
                    let run = self.adopt(stored).await;
                    self.publish_update(&run);
                }
                tracing::info!(runs = n, "caught up with the shared store");
            }
            Err(e) => tracing::warn!(error = %e, "could not read the runs from the shared store"),
        }
    }

    /// A status this hub decided (its judge, a hello, a finish), for the other hubs.
    pub(super) fn tell_status(&self, change: &StatusChange) {
        self.tell_run(&change.run_id, Some(change.clone()));
    }

    pub(super) fn tell_metrics(&self, run_id: &RunId, metrics: &[stepstream_protocol::MetricDef]) {
        self.tell_peers(|hub| {
            ToPeer::PeerMetrics(PeerMetrics {
                hub,
                run_id: run_id.clone(),
                metrics: metrics.to_vec(),
            })
        });
    }

    pub(super) fn tell_alert(&self, alert: &stepstream_protocol::Alert) {
        self.tell_peers(|hub| {
            ToPeer::PeerAlert(PeerAlert {
                hub,
                alert: alert.clone(),
            })
        });
    }
}
