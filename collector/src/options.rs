//! How a collector connects and what run it reports.

use std::time::Duration;
use stepstream_protocol::RunId;

/// [`Options::linger`]'s default. Batches are sealed on ticks of the wall clock (see
/// `sender::linger_until`), so collectors that share a clock send together. With the hub's
/// 500 ms commit interval, the fleet of 100 runs at 100 steps/s cost the hub 7.2-8.0% of a
/// core at 40 ms (p99 to viewers 41-45 ms) against 9.6-10.1% at 35 ms (p99 38-39 ms),
/// measured alternately in one session (`stepstream-loadgen --fleet-only --fleet-linger-ms`).
pub const DEFAULT_LINGER: Duration = Duration::from_millis(40);

/// How a collector connects and what run it reports.
#[derive(Clone, Debug)]
pub struct Options {
    /// `ws://host:port` (or `http://`); `/ws/collector` is added when no path is given.
    pub hub: String,
    pub token: Option<String>,
    pub project: String,
    pub name: String,
    /// A fresh id (`YYYYMMDD-HHMMSS-xxxxxxxx`) when `None`; reuse one to resume a run.
    pub run_id: Option<RunId>,
    /// Hyper-parameters as JSON.
    pub config_json: String,
    pub host: Option<String>,
    pub rank: u32,
    pub world_size: u32,
    /// The distributed job this run is a rank of (the same for every rank of one launch);
    /// `None` reads it from the launcher's environment (see [`job_from_env`]).
    pub job: Option<String>,
    /// What trains the model (`mindspore`, `pytorch`, `tail`...), shown in the run panel.
    pub framework: String,
    /// Records the queue between `log` and the sender holds; beyond it `log` drops and counts.
    pub queue_capacity: usize,
    /// Most records per batch.
    pub max_batch: usize,
    /// How long a record may wait for others to share its batch (Kafka's `linger.ms`), at
    /// most: the hub asks for less while it has room (`Pace`: none under 2,000 records a
    /// second) and up to this as it fills. At 100 steps a second 40 ms puts four records in
    /// a frame, and most of a busy hub's work is per frame. A batch is sealed at the next
    /// multiple of the linger on the wall clock. A flush, a full batch and the run's end send
    /// at once.
    pub linger: Duration,
    /// Sent when nothing else was sent for this long.
    pub heartbeat: Duration,
    /// Keep `run_YYYYMMDD_HHMMSS_metrics.csv` and `..._config.json` in this folder.
    pub archive_dir: Option<std::path::PathBuf>,
    /// Added to the archive's file names (e.g. `rank3`).
    pub archive_tag: String,
    /// Archive rows buffered between flushes.
    pub flush_every: usize,
    /// Records kept in memory while the hub is away or slow; beyond, batches are spooled to
    /// a file in `spool_dir` and read back in order.
    pub memory_records: usize,
    /// Where the spool file goes (default: the system temp dir's `stepstream-spool/`).
    pub spool_dir: Option<std::path::PathBuf>,
    /// For `wss://`: PEM certificates of a private CA to trust besides the public roots.
    pub ca_file: Option<std::path::PathBuf>,
}

impl Options {
    pub fn new(hub: &str, project: &str, name: &str) -> Options {
        Options {
            hub: hub.to_string(),
            token: None,
            project: project.to_string(),
            name: name.to_string(),
            run_id: None,
            config_json: "{}".to_string(),
            host: None,
            rank: 0,
            world_size: 1,
            job: None,
            framework: String::new(),
            queue_capacity: 1 << 20,
            max_batch: 2000,
            linger: DEFAULT_LINGER,
            heartbeat: Duration::from_secs(5),
            archive_dir: None,
            archive_tag: String::new(),
            flush_every: 10,
            memory_records: 500_000,
            spool_dir: None,
            ca_file: None,
        }
    }
}
