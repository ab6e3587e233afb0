//! The hand-off from `log` (any thread) to the sender thread.
//!
//! A list behind a mutex that the sender empties whole, instead of a channel: `log` then
//! costs a lock nobody else holds (the sender takes it once per tick, not once per record)
//! and a copy, with no atomic shared with the sender per record and no wake-up unless the
//! sender sleeps. A record's values are copied into one list shared by all records, so
//! `log` allocates nothing and no memory is freed on another thread than allocated it; the
//! sender builds its records from that list. The sender sleeps only when records come slowly
//! (see `sender::POLL`); then the first record after it parked wakes it.

use std::collections::VecDeque;
use std::sync::Mutex;
use stepstream_protocol::{FinishStatus, MetricDef};
use stepstream_protocol::{MetricId, StepRecord};
use tokio::sync::oneshot;
use tokio::sync::Notify;

/// What `log`, `flush` and `finish` leave for the sender thread.
pub(crate) enum Command {
    Define(MetricDef),
    /// A record, and whether the archive CSV gets it (system samples do not).
    Record(StepRecord, bool),
    /// A console line or a sample.
    Item(stepstream_protocol::Item),
    /// An image to encode (on the sender thread), then send as an item.
    Image {
        step: i64,
        wall_time: f64,
        key: String,
        image: crate::image::RawImage,
    },
    Flush,
    /// An answer to a command the hub delivered, for the hub.
    Reply(stepstream_protocol::CommandReply),
    /// An alert the training raised, for the hub.
    Alert(stepstream_protocol::UserAlert),
    Finish(FinishStatus, oneshot::Sender<bool>),
}

pub(crate) struct Queue {
    inner: Mutex<Inner>,
    /// Commands the list holds, at most; beyond, `push` refuses (the caller counts a drop).
    capacity: usize,
    wake: Notify,
}

struct Inner {
    items: Vec<Item>,
    /// The values of every queued record, in order.
    values: Vec<(MetricId, f64)>,
    /// Records queued since the start (the report's `logged`).
    logged: u64,
    /// Every `Collector` handle is gone: nothing more will come.
    producers_gone: bool,
    /// The sender thread ended: nothing queued will be taken.
    sender_gone: bool,
    /// The sender sleeps in [`Queue::wait`] until the next push. Set and cleared under the
    /// lock that guards the list, so a push either comes before the sender looked (and it
    /// does not sleep) or finds it parked (and wakes it).
    parked: bool,
}

/// What the list holds: a command, or a record whose values are the next `len` of
/// [`Inner::values`].
pub(crate) enum Item {
    Command(Command),
    Record {
        step: i64,
        wall_time: f64,
        len: usize,
        archive: bool,
    },
}

/// What the sender took: swapped with the queue's lists, so both keep their allocations.
#[derive(Default)]
pub(crate) struct Taken {
    items: Vec<Item>,
    values: Vec<(MetricId, f64)>,
}

impl Taken {
    /// Appends what was taken to `inbox` as commands, in order, and empties itself.
    pub(crate) fn unpack(&mut self, inbox: &mut VecDeque<Command>) {
        let mut at = 0;
        for item in self.items.drain(..) {
            inbox.push_back(match item {
                Item::Command(c) => c,
                Item::Record {
                    step,
                    wall_time,
                    len,
                    archive,
                } => {
                    let values = self.values[at..at + len].to_vec();
                    at += len;
                    Command::Record(
                        StepRecord {
                            step,
                            wall_time,
                            values,
                        },
                        archive,
                    )
                }
            });
        }
        self.values.clear();
    }
}

/// Why a command was not queued (a full queue gives it back, to try again).
pub(crate) enum Refused {
    Full(Command),
    SenderGone,
}

impl Queue {
    pub(crate) fn new(capacity: usize) -> Queue {
        Queue {
            inner: Mutex::new(Inner {
                items: Vec::new(),
                values: Vec::new(),
                logged: 0,
                producers_gone: false,
                sender_gone: false,
                parked: false,
            }),
            capacity: capacity.max(16),
            wake: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding this lock leaves the list whole (a push or a swap).
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `cmd` without ever blocking on the sender.
    pub(crate) fn push(&self, cmd: Command) -> Result<(), Refused> {
        let wake = {
            let mut inner = self.lock();
            if inner.sender_gone {
                return Err(Refused::SenderGone);
            }
            if inner.items.len() >= self.capacity {
                return Err(Refused::Full(cmd));
            }
            inner.items.push(Item::Command(cmd));
            std::mem::take(&mut inner.parked)
        };
        if wake {
            self.wake.notify_one();
        }
        Ok(())
    }

    /// Queues one record (its values copied), counting it as logged; `false` when it was
    /// dropped (a full queue, or no sender).
    pub(crate) fn push_record(
        &self,
        step: i64,
        wall_time: f64,
        values: &[(MetricId, f64)],
        archive: bool,
    ) -> bool {
        let wake = {
            let mut inner = self.lock();
            inner.logged += 1;
            if inner.sender_gone || inner.items.len() >= self.capacity {
                return false;
            }
            inner.values.extend_from_slice(values);
            inner.items.push(Item::Record {
                step,
                wall_time,
                len: values.len(),
                archive,
            });
            std::mem::take(&mut inner.parked)
        };
        if wake {
            self.wake.notify_one();
        }
        true
    }

    /// Records queued since the start, dropped ones included.
    pub(crate) fn logged(&self) -> u64 {
        self.lock().logged
    }

    /// No `Collector` handle remains: the sender ends once it took what is queued.
    pub(crate) fn close(&self) {
        self.lock().producers_gone = true;
        self.wake.notify_one();
    }

    /// The sender thread ended (or never started): later pushes are refused at once.
    pub(crate) fn sender_ended(&self) {
        let mut inner = self.lock();
        inner.sender_gone = true;
        inner.items.clear();
        inner.values.clear();
    }

    /// Swaps everything queued into `taken` (which must be empty); `false` once nothing
    /// more will come.
    pub(crate) fn take_all(&self, taken: &mut Taken) -> bool {
        let mut inner = self.lock();
        std::mem::swap(&mut inner.items, &mut taken.items);
        std::mem::swap(&mut inner.values, &mut taken.values);
        !inner.producers_gone
    }

    /// Returns once something is queued (at once if it already is), or nothing more will come.
    pub(crate) async fn wait(&self) {
        let notified = self.wake.notified();
        tokio::pin!(notified);
        // Registered before looking, so a wake-up between the look and the await is kept.
        notified.as_mut().enable();
        {
            let mut inner = self.lock();
            if !inner.items.is_empty() || inner.producers_gone {
                inner.parked = false;
                return;
            }
            inner.parked = true;
        }
        notified.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn a_sleeping_sender_is_woken_by_every_first_push() {
        // Many rounds of: the sender parks, a producer pushes one command. A lost wake-up
        // would hang a round (the timeout fails the test instead).
        let queue = Arc::new(Queue::new(16));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let producer = {
            let queue = queue.clone();
            std::thread::spawn(move || {
                for _ in 0..20_000 {
                    while queue.push(Command::Flush).is_err() {
                        std::thread::yield_now();
                    }
                }
                queue.close();
            })
        };
        let mut got = 0;
        let mut taken = Taken::default();
        let mut inbox = VecDeque::new();
        rt.block_on(async {
            loop {
                tokio::time::timeout(Duration::from_secs(10), queue.wait())
                    .await
                    .expect("a push woke the sender");
                let open = queue.take_all(&mut taken);
                taken.unpack(&mut inbox);
                got += inbox.len();
                inbox.clear();
                if !open {
                    break;
                }
            }
        });
        producer.join().unwrap();
        assert_eq!(got, 20_000);
    }

    #[test]
    fn records_come_out_whole_and_in_order_between_commands() {
        let queue = Queue::new(16);
        assert!(queue.push_record(1, 10.0, &[(MetricId(0), 0.5), (MetricId(1), 1.5)], true));
        assert!(queue.push(Command::Flush).is_ok());
        assert!(queue.push_record(2, 11.0, &[], false));
        assert!(queue.push_record(3, 12.0, &[(MetricId(2), 2.5)], true));
        let mut taken = Taken::default();
        let mut inbox = VecDeque::new();
        assert!(queue.take_all(&mut taken));
        taken.unpack(&mut inbox);
        let shapes: Vec<String> = inbox
            .iter()
            .map(|c| match c {
                Command::Record(r, archive) => format!("{} {:?} {archive}", r.step, r.values),
                Command::Flush => "flush".into(),
                _ => "other".into(),
            })
            .collect();
        assert_eq!(
            shapes,
            [
                "1 [(MetricId(0), 0.5), (MetricId(1), 1.5)] true",
                "flush",
                "2 [] false",
                "3 [(MetricId(2), 2.5)] true",
            ]
        );
        assert_eq!(queue.logged(), 3);
        // Both lists came back empty and go back into the queue at the next take.
        assert!(taken.items.is_empty() && taken.values.is_empty());
    }

    #[test]
    fn full_and_ended_queues_refuse_and_give_the_command_back() {
        let queue = Queue::new(16);
        for _ in 0..16 {
            assert!(queue.push(Command::Flush).is_ok());
        }
        assert!(matches!(
            queue.push(Command::Flush),
            Err(Refused::Full(Command::Flush))
        ));
        assert!(!queue.push_record(1, 1.0, &[], true));
        queue.sender_ended();
        assert!(matches!(
            queue.push(Command::Flush),
            Err(Refused::SenderGone)
        ));
        assert_eq!(queue.logged(), 1);
    }
}
