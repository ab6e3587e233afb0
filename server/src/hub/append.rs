//! Storing a collector's batches: the checks, the hand-off to the store, and what follows a
//! commit (the run's tail, its viewers, its alert rules).
//!
//! A batch goes through in two halves, so a collector's connection can hand the store its
//! next batch while the previous one commits: [`Hub::submit`] checks it against the tail
//! the batches before it leave, hands it to the store's writer and (a lone hub) publishes it
//! to the run's viewers; [`Hub::settle`] takes the store's answer, and only then is the batch
//! in the run's stored tail, acknowledgeable and judged. Viewers meet history and live at
//! the published tail once it is stored (`Run::subscribe`), so publishing before the commit
//! costs them nothing exact, and the commit interval does not add to their latency.
//! The writer stores a run's batches only in `seq` order without a gap (see `store`), so a
//! batch that failed takes every later batch in flight with it.

use super::{heard_from, publish_batch, same_records, Hub, IngestError, Run, RunState};
use crate::hub::judge::Job;
use crate::store::{RunTail, StoreError, StoredBatch};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use stepstream_protocol::{unix_now, Batch, Item, ItemKind, MetricId, RunId, StepRecord};
use tokio::sync::oneshot;

/// Batches published when checked and then not stored are taken back from the run's
/// published tail, so a new viewer reads its history through what is stored.
fn take_back(run: &Run, run_id: &RunId) {
    let taken = run.take_back();
    if taken > 0 {
        tracing::warn!(run = %run_id, batches = taken, "batches shown to viewers were not stored; their collector holds them to resend");
    }
}

/// What became of a batch.
#[derive(Debug, PartialEq, Eq)]
pub enum Appended {
    Stored,
    /// Already stored earlier, identical (a resend after a lost ack); nothing changed.
    Duplicate,
}

/// A batch handed to the store and not yet settled.
pub struct InFlight {
    pub seq: u64,
    records: Arc<[StepRecord]>,
    items: Arc<[Item]>,
    tail: RunTail,
    run_id: RunId,
    /// The records' encoded size, about.
    bytes: usize,
    /// Published to viewers when checked (a lone hub), not when settled.
    published: bool,
    /// Sample bytes reserved against the quotas, given back if the batch is not stored.
    samples: u64,
    /// Samples the quotas kept out of the batch, and why (told to the collector).
    refused: u64,
    refusal: Option<String>,
    answer: oneshot::Receiver<Result<bool, StoreError>>,
}

impl InFlight {
    /// The tail of the run once this batch is stored: what the next batch is checked against.
    pub fn tail(&self) -> &RunTail {
        &self.tail
    }

    /// The records' encoded size, about: what a connection's batches in flight are bounded by.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Samples the quotas kept out of this batch (its acknowledgement says so).
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// Why samples were kept out, once: for a non-fatal error frame.
    pub fn take_refusal(&mut self) -> Option<String> {
        self.refusal.take()
    }

    /// The store's answer, without waiting: `None` while the transaction is open.
    pub fn try_answer(&mut self) -> Option<Result<bool, StoreError>> {
        match self.answer.try_recv() {
            Ok(answer) => Some(answer),
            Err(oneshot::error::TryRecvError::Empty) => None,
            Err(oneshot::error::TryRecvError::Closed) => Some(Err(StoreError::WriterGone)),
        }
    }

    /// The store's answer. Cancel-safe: dropping the future loses nothing.
    pub async fn answer(&mut self) -> Result<bool, StoreError> {
        (&mut self.answer)
            .await
            .unwrap_or(Err(StoreError::WriterGone))
    }
}

/// What [`Hub::submit`] did with a batch.
pub enum Submitted {
    /// A resend of a stored batch, identical to it: acknowledge it again, saying how many of
    /// its samples the store does not hold (the quotas kept them out when it first came).
    Duplicate { refused: u64 },
    /// Handed to the store: settle it with its answer.
    InFlight(InFlight),
}

impl Hub {
    /// Checks a batch against the limits and the run's metric table.
    fn check_batch(&self, st: &RunState, batch: &Batch) -> Result<(), IngestError> {
        let limits = &self.limits.wire;
        if batch.records.len() > limits.batch_records as usize {
            return Err(IngestError::Limit(format!(
                "batch {} holds {} records; the limit is {} (limit batch_records)",
                batch.seq,
                batch.records.len(),
                limits.batch_records
            )));
        }
        if batch.items.len() > limits.batch_items as usize {
            return Err(IngestError::Limit(format!(
                "batch {} holds {} console lines and samples; the limit is {} (limit batch_items)",
                batch.seq,
                batch.items.len(),
                limits.batch_items
            )));
        }
        for item in &batch.items {
            item.check(limits)
                .map_err(|why| IngestError::Limit(format!("batch {}: {why}", batch.seq)))?;
        }
        let mut ids: Vec<MetricId> = Vec::new();
        for r in &batch.records {
            if r.values.len() > limits.record_values as usize {
                return Err(IngestError::Limit(format!(
                    "a record of batch {} (step {}) holds {} values; the limit is {} (limit \
                     record_values)",
                    batch.seq,
                    r.step,
                    r.values.len(),
                    limits.record_values
                )));
            }
            // Collectors send ids ascending: then no id repeats, and nothing is sorted.
            if !r.values.windows(2).all(|w| w[0].0 < w[1].0) {
                ids.clear();
                ids.extend(r.values.iter().map(|&(id, _)| id));
                ids.sort_unstable();
                if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
                    return Err(IngestError::Limit(format!(
                        "a record of batch {} (step {}) carries metric id {} twice",
                        batch.seq, r.step, w[0].0
                    )));
                }
            }
            if let Some(&(id, _)) = r
                .values
                .iter()
                .find(|&&(id, _)| st.metric_name(id).is_none())
            {
                return Err(IngestError::UndefinedMetric {
                    seq: batch.seq,
                    id: id.0,
                });
            }
        }
        Ok(())
    }

    /// Checks `batch` against `base`, the run's tail after every batch this connection has
    /// in flight (`None` when none is: the run's own tail), and hands it to the store. The caller
    /// holds the run's `ingest` lock from here until every batch it has in flight is
    /// settled, so no other connection of the run checks against a tail that is about to
    /// change.
    pub async fn submit(
        &self,
        run: &Arc<Run>,
        base: Option<&RunTail>,
        batch: Batch,
    ) -> Result<Submitted, IngestError> {
        let (tail, run_id) = run.state(|st| -> Result<_, IngestError> {
            let base = base.unwrap_or(&st.tail);
            let last = base.last_seq;
            if batch.seq <= last {
                return Ok((None, st.identity.run_id.clone()));
            }
            if batch.seq != last + 1 {
                return Err(IngestError::SequenceGap {
                    got: batch.seq,
                    last,
                });
            }
            self.check_batch(st, &batch)?;
            Ok((
                Some(base.after(batch.seq, &batch.records)),
                st.identity.run_id.clone(),
            ))
        })?;
        let Some(tail) = tail else {
            let refused = self.resent(run, &batch, &run_id).await?;
            return Ok(Submitted::Duplicate { refused });
        };
        self.pace.count(batch.records.len());
        let mut batch = batch;
        let (samples, refused, refusal) = self.within_quotas(run, &mut batch);
        let seq = batch.seq;
        let bytes = stepstream_protocol::limits::records_bytes(&batch.records)
            + stepstream_protocol::items::items_bytes(&batch.items);
        let records: Arc<[StepRecord]> = batch.records.into();
        let items: Arc<[Item]> = batch.items.into();
        let stored = StoredBatch {
            records: records.clone(),
            items: items.clone(),
            console_cap: self.limits.console_lines,
        };
        let answer = self
            .store
            .submit_batch(run.key, seq, stored, tail.clone())
            .await?;
        // Alone, a hub publishes a batch once it is checked and handed to the store, so a
        // viewer does not wait for the commit: the collector holds the batch until its
        // acknowledgement, which still waits for the commit, and resends it if the commit
        // fails. In a cluster another hub may store this number first: there it waits.
        let published = !self.clustered();
        if published {
            run.state_mut(|st| st.published = seq);
            publish_batch(run, run_id.clone(), seq, &records, &items);
        }
        Ok(Submitted::InFlight(InFlight {
            seq,
            records,
            items,
            tail,
            run_id,
            bytes,
            published,
            samples,
            refused,
            refusal,
            answer,
        }))
    }

    /// Keeps a batch's samples within the run's and the hub's sample quotas: those that fit
    /// are reserved (in order), the rest left out of the batch. Returns the bytes reserved,
    /// the samples left out and why. Console lines have their own cap (`console_lines`).
    fn within_quotas(&self, run: &Run, batch: &mut Batch) -> (u64, u64, Option<String>) {
        if batch.items.is_empty() {
            return (0, 0, None);
        }
        let (run_most, hub_most) = (self.limits.run_sample_bytes, self.limits.hub_sample_bytes);
        let mut reserved = 0u64;
        let mut refused = 0u64;
        let mut why = None;
        run.state_mut(|st| {
            batch.items.retain(|item| {
                if matches!(item.body, stepstream_protocol::ItemBody::Line { .. }) {
                    return true;
                }
                let bytes = item.content_bytes() as u64;
                let hub_now = self.sample_bytes.load(Ordering::Relaxed);
                let over = if st.sample_bytes + bytes > run_most {
                    Some(format!(
                        "run {} stores {} bytes of samples; {bytes} more exceed the limit of                          {run_most} (limit run_sample_bytes)",
                        st.identity.run_id, st.sample_bytes
                    ))
                } else if hub_now + bytes > hub_most {
                    Some(format!(
                        "the hub stores {hub_now} bytes of samples; {bytes} more exceed the limit                          of {hub_most} (limit hub_sample_bytes)"
                    ))
                } else {
                    None
                };
                match over {
                    Some(text) => {
                        refused += 1;
                        why.get_or_insert(format!(
                            "sample {:?} of step {} not stored: {text}",
                            item.key, item.step
                        ));
                        false
                    }
                    None => {
                        st.sample_bytes += bytes;
                        self.sample_bytes.fetch_add(bytes, Ordering::Relaxed);
                        reserved += bytes;
                        true
                    }
                }
            })
        });
        let why = why.map(|w| {
            if refused > 1 {
                format!("{w} ({refused} samples of batch {} in all)", batch.seq)
            } else {
                w
            }
        });
        (reserved, refused, why)
    }

    /// Gives back the sample bytes a batch that was not stored had reserved.
    fn unreserve(&self, run: &Run, samples: u64) {
        if samples > 0 {
            run.state_mut(|st| st.sample_bytes = st.sample_bytes.saturating_sub(samples));
            self.sample_bytes.fetch_sub(
                samples.min(self.sample_bytes.load(Ordering::Relaxed)),
                Ordering::Relaxed,
            );
        }
    }

    /// Takes the store's answer for a batch: a stored batch becomes the run's tail and goes
    /// to its alert rules (and to its viewers, if it did not when checked); one that was not
    /// stored is taken back. Batches are settled in the order submitted.
    pub async fn settle(
        &self,
        run: &Arc<Run>,
        batch: InFlight,
        answer: Result<bool, StoreError>,
    ) -> Result<Appended, IngestError> {
        let InFlight {
            seq,
            records,
            items,
            tail,
            run_id,
            published,
            samples,
            ..
        } = batch;
        let stored = match answer {
            Ok(stored) => stored,
            Err(e) => {
                take_back(run, &run_id);
                self.unreserve(run, samples);
                return Err(e.into());
            }
        };
        if !stored {
            self.unreserve(run, samples);
            // Another hub of a cluster stored this sequence number first (this hub's view
            // of the run was behind): judge it as the resend it is.
            let resent = self
                .same_as_stored(run, seq, &records, &run_id)
                .await
                .map(|()| Appended::Duplicate);
            if resent.is_err() {
                take_back(run, &run_id);
            }
            return resent;
        }
        self.tell_batch(&run_id, seq, &records);
        let now = unix_now();
        let (revived, resolved) = run.store_tail(tail, |st| {
            st.dirty = true;
            heard_from(st, &self.rules, now)
        });
        if !published {
            publish_batch(run, run_id, seq, &records, &items);
        }
        if revived {
            self.judge(Job::Revived {
                run: run.clone(),
                now,
                resolved,
            });
        }
        self.judge(Job::Records {
            run: run.clone(),
            records,
            now,
        });
        Ok(Appended::Stored)
    }

    /// Stores a batch (unless it is a resend of one already stored), then publishes it: one
    /// batch at a time, [`Hub::submit`] then [`Hub::settle`] under the run's lock. Nothing
    /// here waits for anything but the store (the alert rules run on the judge's task).
    pub async fn append(&self, run: &Arc<Run>, batch: Batch) -> Result<Appended, IngestError> {
        let _guard = run.ingest.lock().await;
        match self.submit(run, None, batch).await? {
            Submitted::Duplicate { .. } => Ok(Appended::Duplicate),
            Submitted::InFlight(mut batch) => {
                let answer = batch.answer().await;
                self.settle(run, batch, answer).await
            }
        }
    }

    /// Answers how many of the resend's samples the store does not hold: the quotas kept
    /// them out when the batch first came, and an acknowledgement must not count them as
    /// stored the second time either.
    async fn resent(&self, run: &Run, batch: &Batch, run_id: &RunId) -> Result<u64, IngestError> {
        let seq = batch.seq;
        self.same_as_stored(run, seq, &batch.records, run_id)
            .await?;
        let is_sample = |kind: ItemKind| kind != ItemKind::Line;
        let sent = batch.items.iter().filter(|i| is_sample(i.kind())).count() as u64;
        if sent == 0 {
            return Ok(0);
        }
        let kept = self
            .store
            .items(
                run.key,
                crate::store::ItemQuery::batches(seq - 1, seq),
                0u64,
                move |n, item| {
                    *n += u64::from(is_sample(item.kind));
                    std::ops::ControlFlow::Continue(())
                },
            )
            .await?;
        Ok(sent.saturating_sub(kept))
    }

    /// A batch whose sequence number is already stored: a resend must be what was stored;
    /// anything else is a second writer (or a collector that renumbered wrongly), and
    /// acknowledging it would lose its data.
    async fn same_as_stored(
        &self,
        run: &Run,
        seq: u64,
        records: &[StepRecord],
        run_id: &RunId,
    ) -> Result<(), IngestError> {
        let stored = self.store.batch(run.key, seq).await?;
        if stored.as_deref().is_some_and(|s| same_records(s, records)) {
            tracing::debug!(run = %run_id, seq, "duplicate batch ignored");
            return Ok(());
        }
        tracing::warn!(run = %run_id, seq, "a resent batch differs from the stored one");
        Err(IngestError::Conflict(format!(
            "batch {seq} was already stored with other records: another collector writes run \
             {run_id}, or this one lost track of its sequence numbers"
        )))
    }
}
