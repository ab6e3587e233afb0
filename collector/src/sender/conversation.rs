//! One connection to the hub and the reconnecting around it: hello and welcome (which
//! batches the hub already stored), metric definitions, batches within the send window,
//! acknowledgements, heartbeats and the finish, each as the hub's limits and ids want it.

use super::*;

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
    /// Whether `b` goes out as held: the hub numbers its metrics as `log` did, and no
    /// record carries more values than the hub takes.
    fn numbered_as_the_hub(&self, b: &Batch) -> bool {
        let most = self.metrics.record_values() as usize;
        let limits = self.metrics.limits();
        self.metrics.numbered_as_the_hub()
            && b.records.iter().all(|r| r.values.len() <= most)
            && b.items.len() <= limits.batch_items as usize
            && b.items.iter().all(|i| i.check(&limits).is_ok())
    }

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
        // Items were checked against the limits of the hub met when they were taken; one
        // that this hub's stricter limits refuse is counted and left out, not sent to have
        // its whole batch refused.
        let limits = self.metrics.limits();
        let items: Vec<_> = b
            .items
            .iter()
            .filter(|i| i.check(&limits).is_ok())
            .take(limits.batch_items as usize)
            .cloned()
            .collect();
        let left_out = b.items.len() - items.len();
        if left_out > 0 {
            self.stats
                .items_refused
                .fetch_add(left_out as u64, Ordering::Relaxed);
        }
        Batch {
            seq: b.seq,
            records,
            items,
        }
    }

    pub(super) async fn main(&mut self) {
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
        self.pace(Duration::from_millis(u64::from(welcome.linger_ms)));
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
                    return lost(why(&mut stream, e.to_string()).await, progressed);
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
                let frame = if self.numbered_as_the_hub(b) {
                    Message::Binary(b.encode().into())
                } else {
                    binary(ToHub::Batch(self.wire(b)))
                };
                if let Err(e) = sink.feed(frame).await {
                    return lost(why(&mut stream, e.to_string()).await, progressed);
                }
                sent = b.seq;
                wrote = true;
            }
            let mut outbox = std::mem::take(&mut self.outbox).into_iter();
            while let Some(msg) = outbox.next() {
                if let Err(e) = sink.feed(binary(msg.clone())).await {
                    // Kept for the next connection: this one may not have taken it.
                    self.outbox.push(msg);
                    self.outbox.extend(outbox);
                    return lost(why(&mut stream, e.to_string()).await, progressed);
                }
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
                        return lost(why(&mut stream, e.to_string()).await, progressed);
                    }
                    finish_sent = true;
                    wrote = true;
                }
            }
            if wrote {
                if let Err(e) = sink.flush().await {
                    return lost(why(&mut stream, e.to_string()).await, progressed);
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
                        if ack.items_refused > 0 {
                            // Samples the hub's quotas kept out: acknowledged batches, but
                            // not stored (the error frame before named the quota).
                            let n = ack.items_refused;
                            let _ = self.stats.items_acked.fetch_update(
                                Ordering::Relaxed,
                                Ordering::Relaxed,
                                |a| Some(a.saturating_sub(n)),
                            );
                            self.stats.items_refused.fetch_add(n, Ordering::Relaxed);
                        }
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
                    Ok(FromHub::Command(command)) => {
                        tracing::info!(id = command.id, action = command.action.name(), by = %command.by, "stepstream: command from the hub");
                        let reply = self.commands.arrive(command);
                        if let Err(e) = sink.send(binary(ToHub::CommandReply(reply))).await {
                            return lost(why(&mut stream, e.to_string()).await, progressed);
                        }
                    }
                    Ok(FromHub::Pace(pace)) => {
                        tracing::debug!(linger_ms = pace.linger_ms, "stepstream: the hub's pace");
                        self.pace(Duration::from_millis(u64::from(pace.linger_ms)));
                    }
                    Ok(FromHub::Welcome(_)) => return lost("unexpected second Welcome".into(), progressed),
                    Err(e) => return lost(e, progressed),
                },
                _ = sleep_until(seal_at.unwrap_or(beat_at)), if seal_at.is_some() => {}
                _ = sleep_until(beat_at) => {
                    let beat = ToHub::Heartbeat(Heartbeat { wall_time: unix_now() });
                    if let Err(e) = sink.send(binary(beat)).await {
                        return lost(why(&mut stream, e.to_string()).await, progressed);
                    }
                    last_send = Instant::now();
                }
            }
        }
    }
}

/// Why a write to the hub failed: the hub's own error frame when it sent one before it
/// closed (a refusal arrives while this side is still writing its window, and the write
/// then fails first), else the write's error.
async fn why(stream: &mut futures_util::stream::SplitStream<Ws>, write_error: String) -> String {
    match timeout(Duration::from_millis(200), next_from_hub(stream)).await {
        Ok(Ok(FromHub::HubError(e))) => format!("hub error {:?}: {}", e.code, e.message),
        _ => write_error,
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
