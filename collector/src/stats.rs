//! The counters a collector's handles and its sender thread share.

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Mutex;

/// Counters shared by the caller and the sender thread.
#[derive(Default)]
pub(crate) struct Stats {
    pub dropped: AtomicU64,
    pub acked: AtomicU64,
    pub unacked: AtomicU64,
    pub refused: AtomicU64,
    /// Console lines and samples dropped because the queue was full.
    pub items_dropped: AtomicU64,
    /// Console lines and samples refused by the hub's limits (checked before sending).
    pub items_refused: AtomicU64,
    /// Console lines and samples the hub acknowledged (stored).
    pub items_acked: AtomicU64,
    pub lost: AtomicU64,
    pub connected: AtomicBool,
    pub reconnects: AtomicU64,
    pub last_error: Mutex<Option<String>>,
    /// The hub's last refusal of this run's hello (its code and message), until a welcome.
    pub refusal: Mutex<Option<(stepstream_protocol::ErrorCode, String)>>,
    /// The hub's last stored step for the run, once a hub welcomed this collector.
    pub welcome: Mutex<Option<Option<i64>>>,
    /// Values the hub acknowledged (stored), by local metric id: what `tail` and `import`
    /// report, so no success is claimed for a value a hub's limits refused.
    pub stored: Mutex<Vec<u64>>,
}
