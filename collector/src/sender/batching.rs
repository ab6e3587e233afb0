//! What the sender holds, and when it becomes a batch: commands taken from the queue,
//! records sealed into batches at the wall clock's linger (or when full), batches moved to
//! the spool file past the memory limit and back, the run archive, and what the hub's
//! acknowledgements let go.

use super::*;

impl Sender {
    pub(super) fn can_buffer(&self) -> bool {
        let room = if self.spool_failed {
            self.in_memory < self.options.memory_records
        } else {
            self.buffered < MAX_BUFFERED
        };
        room && self.finish.is_none()
    }

    pub(super) fn take(&mut self, cmd: Option<Command>) {
        match cmd {
            Some(Command::Define(def)) => self.metrics.push(def),
            Some(Command::Record(r, archive)) => {
                if archive {
                    self.archive_row(&r);
                }
                self.hold(limits::record_bytes(r.values.len()));
                self.building.push(r);
                let batch = self.options.max_batch.max(1);
                let over = self.in_memory > self.options.memory_records;
                if self.building.len() >= batch
                    || self.building_bytes >= limits::BATCH_BYTES
                    || (over && self.building.len() >= batch.min(64))
                {
                    self.seal();
                }
            }
            Some(Command::Item(item)) => self.take_item(Ok(item)),
            Some(Command::Image {
                step,
                wall_time,
                key,
                image,
            }) => {
                let item = image.encode().map(|img| stepstream_protocol::Item {
                    step,
                    wall_time,
                    key: key.clone(),
                    body: stepstream_protocol::ItemBody::Image(img),
                });
                self.take_item(item.map_err(|why| format!("image {key:?}: {why}")))
            }
            // Whatever is held goes with the next send, not after its linger.
            Some(Command::Flush) => self.flushing = self.holds_unsealed(),
            Some(Command::Reply(reply)) => self.outbox.push(ToHub::CommandReply(reply)),
            Some(Command::Alert(alert)) => self.outbox.push(ToHub::UserAlert(alert)),
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

    /// Holds an item for the next batch, unless it is bad: checked against the limits of the
    /// hub last met (the defaults before), so one bad item never has its batch refused.
    fn take_item(&mut self, item: Result<stepstream_protocol::Item, String>) {
        let checked = item.and_then(|i| i.check(&self.metrics.limits()).map(|()| i));
        match checked {
            Err(why) => {
                self.stats.items_refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("stepstream: {why}; the item is not sent");
                self.note_error(why);
            }
            Ok(item) => {
                self.hold(item.wire_bytes());
                self.building_items.push(item);
                if self.building_items.len() >= MAX_BATCH_ITEMS
                    || self.building_bytes >= limits::BATCH_BYTES
                {
                    self.seal();
                }
            }
        }
    }

    /// Counts one more record or item into `building`, due at the linger's tick.
    fn hold(&mut self, bytes: usize) {
        self.building_bytes += bytes;
        let linger = self.linger;
        self.building_due
            .get_or_insert_with(|| linger_until(linger));
        self.buffered += 1;
        self.in_memory += 1;
    }

    /// The hub asked for this linger ([`stepstream_protocol::Pace`]): records wait at most
    /// that, and at most `options.linger`. What waits already is sealed by the new limit.
    pub(super) fn pace(&mut self, hub_linger: Duration) {
        self.linger = self.options.linger.min(hub_linger);
        if let Some(due) = self.building_due.as_mut() {
            *due = (*due).min(linger_until(self.linger));
        }
    }

    /// Records or items wait to be sealed.
    pub(super) fn holds_unsealed(&self) -> bool {
        !self.building.is_empty() || !self.building_items.is_empty()
    }

    pub(super) fn archive_row(&mut self, r: &StepRecord) {
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

    pub(super) fn flush_archive(&mut self) {
        if let Some(a) = self.archive.as_mut() {
            let _ = a.flush();
        }
    }

    /// Takes whatever else is already queued, without waiting.
    pub(super) fn drain(&mut self) {
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
    pub(super) fn may_wait_for_commands(&self) -> bool {
        self.can_buffer() && self.queue_open && self.inbox.is_empty()
    }

    /// Seals `building` into batches of at most `max_batch` records and
    /// [`limits::BATCH_BYTES`] encoded, kept in memory while they fit `memory_records`,
    /// spooled to disk after (in order: once anything is spooled, later batches follow it
    /// there until it drains, so `pending` only ever holds batches older than the spool's).
    pub(super) fn seal(&mut self) {
        while self.holds_unsealed() {
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
            // Items fill what the records left of the batch (at least one, however big: an
            // item is within `item_bytes`, far below a frame).
            let mut k = 0;
            let most_items = MAX_BATCH_ITEMS.min(self.building_items.len());
            while k < most_items {
                bytes += self.building_items[k].wire_bytes();
                if n + k > 0 && bytes > limits::BATCH_BYTES {
                    break;
                }
                k += 1;
            }
            let records: Vec<StepRecord> = self.building.drain(..n).collect();
            let items: Vec<stepstream_protocol::Item> = self.building_items.drain(..k).collect();
            self.building_bytes = self.building_bytes.saturating_sub(
                limits::records_bytes(&records) + stepstream_protocol::items::items_bytes(&items),
            );
            let batch = Batch {
                seq: self.next_seq,
                records,
                items,
            };
            let n = n + k;
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
        if !self.holds_unsealed() {
            self.building_bytes = 0;
            self.building_due = None;
        }
        self.flushing = false;
    }

    /// When `building` is to be sealed though it is not full: `None` when it is empty.
    /// Records wait up to `options.linger` for company, unless a flush or the run's end
    /// asked for everything now.
    pub(super) fn seal_at(&self) -> Option<Instant> {
        let due = self.building_due?;
        if self.flushing || self.finish.is_some() || !self.queue_open {
            return Some(due.min(Instant::now()));
        }
        Some(due)
    }

    /// Seals `building` if its due time came (see [`Sender::seal_at`]).
    pub(super) fn seal_due(&mut self) {
        if self.seal_at().is_some_and(|at| at <= Instant::now()) {
            self.seal();
        }
    }

    pub(super) fn note_error(&self, error: String) {
        if let Ok(mut last) = self.stats.last_error.lock() {
            *last = Some(error);
        }
    }

    /// Reads the whole spool back into memory and drops it.
    pub(super) fn unspool(&mut self) {
        while let Some(spool) = self.spool.as_mut() {
            match spool.pop() {
                Ok(Some(b)) => {
                    self.in_memory += weight(&b);
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
    pub(super) fn spool_lost(&mut self, e: &std::io::Error) {
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

    pub(super) fn spool_push(&mut self, batch: Batch) -> Result<(), (Batch, std::io::Error)> {
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
    pub(super) fn refill(&mut self) {
        let limit = self.options.memory_records / 2;
        while self.in_memory < limit.max(1) {
            let Some(spool) = self.spool.as_mut() else {
                return;
            };
            match spool.pop() {
                Ok(Some(b)) => {
                    self.in_memory += weight(&b);
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

    pub(super) fn acked_through(&mut self, through: u64) {
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
            self.buffered -= weight(&b);
            self.in_memory -= weight(&b);
            self.stats
                .acked
                .fetch_add(b.records.len() as u64, Ordering::Relaxed);
            self.stats
                .items_acked
                .fetch_add(b.items.len() as u64, Ordering::Relaxed);
        }
        drop(stored);
        self.refill();
        self.stats
            .unacked
            .store(self.buffered as u64, Ordering::Relaxed);
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
