//! The announcer: tells viewers, the other hubs and the notification channels of an alert or
//! a status change once the write behind it is committed, in the order they were written.
//!
//! The judge and the status clock hand their writes to the store and go on: a commit may be
//! a whole commit interval away (`--commit-interval`, 500 ms by default), and a judge that
//! waited for each alert's would fall behind the batches of a hundred runs firing at once.
//! Telling only after the commit keeps what a viewer is told consistent with what the store
//! answers a viewer who subscribes meanwhile.

use super::{Hub, LiveEvent, Run};
use crate::store::{self, Written};
use std::sync::{Arc, Weak};
use stepstream_protocol::{Alert, StatusChange};
use tokio::sync::mpsc;

/// Announcements waiting for their commit, at most; beyond it who announces waits for room.
pub(super) const ANNOUNCER_CAPACITY: usize = 4096;

/// What is told once stored.
pub(super) enum News {
    Alert {
        alert: Alert,
        /// `None` when the alert's notices are muted; else with the channel kinds it goes
        /// to (every channel when empty).
        notice: Option<(Box<crate::notify::Notice>, Vec<String>)>,
    },
    Status(StatusChange),
}

impl News {
    fn what(&self) -> &'static str {
        match self {
            News::Alert { .. } => "an alert",
            News::Status(_) => "a status change",
        }
    }
}

pub(super) struct Announcement {
    run: Arc<Run>,
    written: Option<Written>,
    news: News,
    /// Told once the news was told, for whoever must not go on before.
    told: Option<tokio::sync::oneshot::Sender<()>>,
}

/// Tells each announcement once its write committed (or failed: it is told all the same,
/// as the run's state already holds it, and the failure is logged).
pub(super) async fn announce_loop(hub: Weak<Hub>, mut queue: mpsc::Receiver<Announcement>) {
    while let Some(Announcement {
        run,
        written,
        news,
        told,
    }) = queue.recv().await
    {
        if let Some(written) = written {
            if let Err(e) = written.committed().await {
                tracing::error!(error = %e, "could not store {}", news.what());
            }
        }
        let Some(hub) = hub.upgrade() else {
            return;
        };
        hub.tell(&run, news);
        if let Some(told) = told {
            let _ = told.send(());
        }
    }
}

impl Hub {
    /// Queues `news` to be told once `written` is committed, after everything queued before.
    pub(super) async fn announce(
        &self,
        run: &Arc<Run>,
        written: Option<store::Result<Written>>,
        news: News,
    ) {
        self.queue_news(run, written, news, None).await;
    }

    /// Like [`Hub::announce`], returning once the news was told: what the caller does next
    /// comes after it (a collector's hello is answered after its run was told running).
    pub(super) async fn announce_and_wait(&self, run: &Arc<Run>, news: News) {
        let (told, done) = tokio::sync::oneshot::channel();
        self.queue_news(run, None, news, Some(told)).await;
        let _ = done.await;
    }

    async fn queue_news(
        &self,
        run: &Arc<Run>,
        written: Option<store::Result<Written>>,
        news: News,
        told: Option<tokio::sync::oneshot::Sender<()>>,
    ) {
        let written = match written {
            Some(Ok(w)) => Some(w),
            Some(Err(e)) => {
                tracing::error!(error = %e, "could not store {}", news.what());
                None
            }
            None => None,
        };
        let announcement = Announcement {
            run: run.clone(),
            written,
            news,
            told,
        };
        if let Err(mpsc::error::SendError(a)) = self.announcer.send(announcement).await {
            // The announcer is gone only while the hub shuts down: tell at once.
            self.tell(&a.run, a.news);
            if let Some(told) = a.told {
                let _ = told.send(());
            }
        }
    }

    fn tell(&self, run: &Run, news: News) {
        match news {
            News::Alert { alert, notice } => {
                let _ = run.live.send(LiveEvent::Alert(alert.clone()));
                self.tell_alert(&alert);
                if let Some((notice, kinds)) = notice {
                    let _ = self.notifier.send_to(*notice, &kinds);
                }
            }
            News::Status(change) => {
                self.tell_status(&change);
                self.publish_status(run, change);
            }
        }
    }
}
