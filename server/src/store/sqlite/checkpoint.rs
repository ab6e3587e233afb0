//! The checkpointer: copies committed pages from the WAL back into the database file on its
//! own thread and connection, at most once per [`PERIOD`], and only after a commit asked (an
//! idle hub does nothing).
//!
//! SQLite's automatic checkpoint runs inside the commit that crosses its threshold, on the
//! writer: with a hundred busy runs that was a quarter of the writer's CPU at the default
//! threshold (every few commits), and a raised threshold made that one commit wait for tens
//! of megabytes and an fsync (p99 latency to viewers doubled). A `PASSIVE` checkpoint on
//! another connection runs beside the writer and its readers and waits for neither; each
//! hot page (a run's last index leaves, rewritten by every commit) is copied once per period.

use rusqlite::Connection;
use std::path::Path;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::time::{Duration, Instant};

/// Checkpoints are at least this far apart. Short, so each copies little: with a hundred busy
/// runs a 300 ms or 1 s period made the commit beside a checkpoint wait (p99 to viewers 49
/// and 64 ms), at 100 ms it did not (31 ms, the same as without the thread); its CPU is
/// the same at 50 ms to 1 s, within noise (`stepstream-loadgen --fleet-only`).
pub(super) const PERIOD: Duration = Duration::from_millis(100);

/// WAL pages after which a commit checkpoints by itself (SQLite's automatic checkpoint):
/// only a backstop, for a checkpointer that cannot keep up.
pub(super) const BACKSTOP_PAGES: i64 = 65_536;

/// Bytes the WAL file is cut back to when a checkpoint lets SQLite start it over.
pub(super) const WAL_KEPT_BYTES: i64 = 64 << 20;

/// The writer's handle: waking it never blocks the writer. The thread ends when this drops.
pub(in crate::store) struct Checkpointer(SyncSender<()>);

impl Checkpointer {
    /// Starts the checkpointer thread on its own connection to `path`.
    pub(super) fn start(path: &Path) -> rusqlite::Result<Checkpointer> {
        let conn = super::open_connection(path)?;
        let (wake, woken) = sync_channel(1);
        std::thread::Builder::new()
            .name("stepstream-db-checkpoint".into())
            .spawn(move || run(conn, woken))
            .expect("spawn the database checkpointer thread");
        Ok(Checkpointer(wake))
    }

    /// Asks for a checkpoint (one pending request is enough).
    pub(in crate::store) fn wake(&self) {
        let _ = self.0.try_send(());
    }
}

fn run(conn: Connection, woken: Receiver<()>) {
    let mut last: Option<Instant> = None;
    let mut failing = false;
    while woken.recv().is_ok() {
        if let Some(wait) = last.and_then(|at| PERIOD.checked_sub(at.elapsed())) {
            std::thread::sleep(wait);
        }
        // The commits made while it slept are covered by this checkpoint.
        let _ = woken.try_recv();
        last = Some(Instant::now());
        match conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
            Ok((r.get::<_, i64>(1)?, r.get::<_, i64>(2)?))
        }) {
            Ok((wal, copied)) => {
                failing = false;
                tracing::trace!(wal, copied, "checkpoint");
            }
            // A full disk or an I/O error: the data is safe in the WAL; the next commit
            // asks again. Said once per spell of failures.
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(error = %e, "database checkpoint failed; the WAL keeps the data");
            }
            Err(_) => {}
        }
    }
    tracing::debug!("database checkpointer stopped");
}
