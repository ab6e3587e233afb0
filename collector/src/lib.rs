//! The stepstream collector: stream a training run's step metrics to a hub without ever
//! blocking or crashing the training loop.
//!
//! ```no_run
//! use stepstream_collector::{Collector, Options};
//! let run = Collector::start(Options::new("ws://127.0.0.1:7070", "demo", "mlp-lr1e-3")).unwrap();
//! for step in 0..100 {
//!     run.log(step, &[("loss", 1.0 / (step + 1) as f64), ("lr", 1e-3)]);
//! }
//! let report = run.finish(stepstream_collector::Outcome::Finished);
//! assert!(report.delivered);
//! ```
//!
//! [`Collector::log`] puts the record on a bounded queue (`queue`) and returns; a background thread
//! (`sender`) batches, sends, waits for the hub's acknowledgements, reconnects with backoff,
//! and resends whatever was not acknowledged. The hub drops resent batches it already
//! stored, so every record arrives exactly once.

pub mod archive;
pub mod commands;
pub mod console;
mod ids;
pub mod image;
mod options;
mod queue;
mod random;
mod sender;
mod spool;
mod stats;
pub mod system;
mod tls;
/// The TLS client configuration a collector uses (web PKI roots and a private CA file), for
/// the other clients of a hub (`stepstream watch`).
pub use tls::client_config as tls_client_config;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use stepstream_protocol::{unix_now, utc_stamp, FinishStatus, MetricDef, MetricId, RunId};
use tokio::sync::oneshot;

pub use options::{Options, DEFAULT_LINGER};
use queue::Command;
use stats::Stats;
pub use stepstream_protocol::RunId as Id;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("invalid hub address {0:?}: use ws://HOST:PORT")]
    BadHub(String),
    #[error("config is not valid JSON: {0}")]
    BadConfig(String),
    #[error("cannot start the sender thread: {0}")]
    Thread(std::io::Error),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("cannot create the run archive in {dir}: {source}")]
    Archive {
        dir: std::path::PathBuf,
        source: std::io::Error,
    },
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Finished,
    Failed(String),
    Killed(String),
    /// Ended at a stop command's bidding (who asked and why).
    Stopped(String),
}

impl From<Outcome> for FinishStatus {
    fn from(o: Outcome) -> FinishStatus {
        match o {
            Outcome::Finished => FinishStatus::Finished,
            Outcome::Failed(message) => FinishStatus::Failed { message },
            Outcome::Killed(message) => FinishStatus::Killed { message },
            Outcome::Stopped(message) => FinishStatus::Stopped { message },
        }
    }
}

/// What [`Collector::finish`] could deliver.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// The hub stored every record and the run's end.
    pub delivered: bool,
    pub logged: u64,
    /// Records `log` dropped because the queue was full.
    pub dropped: u64,
    /// Records acknowledged by the hub.
    pub acked: u64,
    /// Records still not acknowledged when `finish` gave up.
    pub unacked: u64,
    /// Values the hub's limits refused (a metric name too long, too many metrics).
    pub refused: u64,
    /// Records lost after `log` took them: a damaged spool file. Never silently: each loss
    /// is logged and in [`Collector::last_error`].
    pub lost: u64,
    /// Values the hub acknowledged (stored), per metric name ([`Collector::stored_values`]).
    pub stored: Vec<(String, u64)>,
    /// Console lines and samples the hub acknowledged (stored).
    pub items_acked: u64,
    /// Console lines and samples dropped because the queue was full.
    pub items_dropped: u64,
    /// Console lines and samples the hub's limits refuse (too big, a ragged table...).
    pub items_refused: u64,
}

/// A run being streamed. `log` from any thread; `finish` once.
pub struct Collector {
    run_id: RunId,
    archive: Option<(std::path::PathBuf, std::path::PathBuf)>,
    queue: Arc<queue::Queue>,
    names: Mutex<HashMap<String, MetricId>>,
    stats: Arc<Stats>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    finish_timeout: Duration,
    /// The step `log` last saw: where system samples and console lines are placed.
    last_step: Arc<std::sync::atomic::AtomicI64>,
    /// Commands the hub delivered for the training.
    commands: Arc<commands::Inbox>,
}

/// `YYYYMMDD-HHMMSS-xxxxxxxx`: sortable by start time, unique by the random tail.
pub fn new_run_id() -> RunId {
    let stamp = utc_stamp(unix_now()).replace('_', "-");
    RunId::new(format!("{stamp}-{:08x}", random::u64() as u32)).expect("generated ids are valid")
}

/// This machine's name, as runs report it.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".to_string())
}

/// Normalises a hub address to the collector socket's URL.
pub fn collector_url(hub: &str) -> Result<String, StartError> {
    let bad = || StartError::BadHub(hub.to_string());
    let (scheme, rest) = hub.split_once("://").ok_or_else(bad)?;
    let scheme = match scheme {
        "ws" | "http" => "ws",
        "wss" | "https" => "wss",
        _ => return Err(bad()),
    };
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if host.is_empty() {
        return Err(bad());
    }
    let path = if path.is_empty() || path == "/" {
        "/ws/collector"
    } else {
        path
    };
    Ok(format!("{scheme}://{host}{path}"))
}

/// The job identity a launcher gives every rank of one launch alike: `STEPSTREAM_JOB`, else
/// torchrun's `TORCHELASTIC_RUN_ID`, Slurm's job and step, PBS's or LSF's job id, or
/// MindSpore's scheduler address (`MS_SCHED_HOST:MS_SCHED_PORT`).
pub fn job_from_env() -> Option<String> {
    let var = |k: &str| {
        std::env::var(k)
            .ok()
            .filter(|v| !v.is_empty() && v != "none")
    };
    var("STEPSTREAM_JOB")
        .or_else(|| var("TORCHELASTIC_RUN_ID"))
        .or_else(|| {
            var("SLURM_JOB_ID").map(|j| match var("SLURM_STEP_ID") {
                Some(s) => format!("slurm-{j}.{s}"),
                None => format!("slurm-{j}"),
            })
        })
        .or_else(|| var("PBS_JOBID"))
        .or_else(|| var("LSB_JOBID").map(|j| format!("lsf-{j}")))
        .or_else(|| {
            Some(format!(
                "ms-{}:{}",
                var("MS_SCHED_HOST")?,
                var("MS_SCHED_PORT")?
            ))
        })
}

impl Collector {
    /// Starts streaming; returns at once, connecting in the background (a hub that is not up
    /// yet is retried with backoff while records queue).
    pub fn start(options: Options) -> Result<Collector, StartError> {
        let url = collector_url(&options.hub)?;
        serde_json::from_str::<serde_json::Value>(&options.config_json)
            .map_err(|e| StartError::BadConfig(e.to_string()))?;
        let run_id = options.run_id.clone().unwrap_or_else(new_run_id);
        let identity = stepstream_protocol::RunIdentity {
            run_id: run_id.clone(),
            project: options.project.clone(),
            name: options.name.clone(),
            config_json: options.config_json.clone(),
            host: options.host.clone().unwrap_or_else(hostname),
            rank: options.rank,
            world_size: options.world_size,
            job: options
                .job
                .clone()
                .or_else(|| (options.world_size > 1).then(job_from_env).flatten())
                .unwrap_or_default(),
            framework: options.framework.clone(),
            started_at: unix_now(),
        };
        let archive = match &options.archive_dir {
            Some(dir) => Some(
                archive::Archive::create(
                    dir,
                    identity.started_at,
                    &options.archive_tag,
                    &options.config_json,
                    options.flush_every,
                )
                .map_err(|source| StartError::Archive {
                    dir: dir.clone(),
                    source,
                })?,
            ),
            None => None,
        };
        let archive_paths = archive
            .as_ref()
            .map(|a| (a.metrics_path.clone(), a.config_path.clone()));
        let queue = Arc::new(queue::Queue::new(options.queue_capacity));
        let stats = Arc::new(Stats::default());
        let tls = tls::client_config(options.ca_file.as_deref()).map_err(StartError::Tls)?;
        let inbox = Arc::new(commands::Inbox::default());
        let sender = sender::Sender::new(
            url,
            options.clone(),
            identity,
            stats.clone(),
            archive,
            tls,
            queue.clone(),
            inbox.clone(),
        );
        let thread = std::thread::Builder::new()
            .name("stepstream-sender".into())
            .spawn(move || sender.run())
            .map_err(StartError::Thread)?;
        Ok(Collector {
            run_id,
            archive: archive_paths,
            queue,
            names: Mutex::new(HashMap::new()),
            stats,
            thread: Mutex::new(Some(thread)),
            finish_timeout: Duration::from_secs(30),
            last_step: Arc::new(std::sync::atomic::AtomicI64::new(-1)),
            commands: inbox,
        })
    }

    pub fn run_id(&self) -> &RunId {
        &self.run_id
    }

    /// The archive's metrics CSV and config JSON, when archiving.
    pub fn archive_paths(&self) -> Option<&(std::path::PathBuf, std::path::PathBuf)> {
        self.archive.as_ref()
    }

    /// How long `finish` (and drop) waits for the hub to acknowledge everything.
    pub fn set_finish_timeout(&mut self, timeout: Duration) {
        self.finish_timeout = timeout;
    }

    /// Records one step now. Never blocks: when the queue is full the record is dropped and
    /// counted ([`Report::dropped`]).
    pub fn log(&self, step: i64, metrics: &[(&str, f64)]) {
        self.log_at(step, unix_now(), metrics)
    }

    /// Records one step with an explicit wall time (unix seconds).
    pub fn log_at(&self, step: i64, wall_time: f64, metrics: &[(&str, f64)]) {
        self.last_step.store(step, Ordering::Relaxed);
        self.send_record(step, wall_time, metrics, true);
    }

    /// Records a step whose record waited (a binding's held tensors, logged by its converter
    /// after the training moved on): the current step, noted when the training logged it,
    /// stays where the training is, so console lines printed meanwhile keep their step.
    pub fn log_later(&self, step: i64, wall_time: f64, metrics: &[(&str, f64)]) {
        self.send_record(step, wall_time, metrics, true);
    }

    /// Says the training is at `step` now, for what is placed at the current step (console
    /// lines, system samples) while its record waits elsewhere (a binding holding tensors
    /// until they are read).
    pub fn note_step(&self, step: i64) {
        self.last_step.store(step, Ordering::Relaxed);
    }

    /// Records system metrics (host, accelerators) at the last logged step; they go to the
    /// hub but not into the archive CSV, which holds training steps only.
    pub fn log_system(&self, metrics: &[(&str, f64)]) {
        let step = self.last_step.load(Ordering::Relaxed).max(0);
        self.send_record(step, unix_now(), metrics, false);
    }

    /// The id of metric `name` in this run, defining it on first use; `None` when its
    /// definition could not be queued (a full queue: the record is dropped and counted).
    /// Callers that log the same names every step keep the id and use [`Collector::log_ids_at`].
    pub fn metric_id(&self, name: &str) -> Option<MetricId> {
        let mut names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        self.id_in(&mut names, name)
    }

    /// [`Collector::metric_id`] with the name table already locked.
    fn id_in(&self, names: &mut HashMap<String, MetricId>, name: &str) -> Option<MetricId> {
        if let Some(&id) = names.get(name) {
            return Some(id);
        }
        let id = MetricId(names.len() as u32);
        let def = MetricDef {
            id,
            name: name.to_string(),
        };
        // A definition that does not fit is retried with the next record.
        if self.queue.push(Command::Define(def)).is_err() {
            return None;
        }
        names.insert(name.to_string(), id);
        Some(id)
    }

    /// Records one step of metrics by id (from [`Collector::metric_id`]): the fast path of a
    /// binding that caches ids, with no name lookup per value.
    pub fn log_ids_at(&self, step: i64, wall_time: f64, values: &[(MetricId, f64)]) {
        self.last_step.store(step, Ordering::Relaxed);
        self.push_record(step, wall_time, values, true);
    }

    fn send_record(&self, step: i64, wall_time: f64, metrics: &[(&str, f64)], archive: bool) {
        let mut values = Vec::with_capacity(metrics.len());
        {
            // One lock for the record's names, not one per name.
            let mut names = self.names.lock().unwrap_or_else(|e| e.into_inner());
            for &(name, value) in metrics {
                match self.id_in(&mut names, name) {
                    Some(id) => values.push((id, value)),
                    None => {
                        self.stats.dropped.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                }
            }
        }
        self.push_record(step, wall_time, &values, archive);
    }

    fn push_record(&self, step: i64, wall_time: f64, values: &[(MetricId, f64)], archive: bool) {
        let queued = if values.windows(2).all(|w| w[0].0 < w[1].0) {
            self.queue.push_record(step, wall_time, values, archive)
        } else {
            // A name given twice in one call: one value per metric, the last one winning
            // (the hub refuses a record that carries a metric twice). Ids are given in
            // first-use order, so a record whose names come in that order is already sorted.
            let mut unique = values.to_vec();
            unique.reverse();
            unique.sort_by_key(|&(id, _)| id);
            unique.dedup_by_key(|&mut (id, _)| id);
            self.queue.push_record(step, wall_time, &unique, archive)
        };
        if !queued {
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Records a console line or a sample (text, table) at `step`; `false` when it was
    /// dropped (a full queue: counted in [`Report::items_dropped`]). Its content is checked
    /// against the hub's limits before it is sent; one they refuse is counted in
    /// [`Report::items_refused`] and named in [`Collector::last_error`], and nothing else
    /// is held back.
    pub fn log_item_at(
        &self,
        step: i64,
        wall_time: f64,
        key: &str,
        body: stepstream_protocol::ItemBody,
    ) -> bool {
        let item = stepstream_protocol::Item {
            step,
            wall_time,
            key: key.to_string(),
            body,
        };
        let queued = self.queue.push(Command::Item(item)).is_ok();
        if !queued {
            self.stats.items_dropped.fetch_add(1, Ordering::Relaxed);
        }
        queued
    }

    /// Records an image at `step`, encoded on the sender thread (PNG or JPEG, as asked);
    /// `false` when it was dropped (a full queue). One that cannot be encoded, or is larger
    /// than the hub's `item_bytes` once encoded, is counted in [`Report::items_refused`].
    pub fn log_image_at(
        &self,
        step: i64,
        wall_time: f64,
        key: &str,
        image: image::RawImage,
    ) -> bool {
        let queued = self
            .queue
            .push(Command::Image {
                step,
                wall_time,
                key: key.to_string(),
                image,
            })
            .is_ok();
        if !queued {
            self.stats.items_dropped.fetch_add(1, Ordering::Relaxed);
        }
        queued
    }

    /// [`Collector::log_item_at`] at the last logged step, now.
    pub fn log_item(&self, key: &str, body: stepstream_protocol::ItemBody) -> bool {
        let step = self.last_step.load(Ordering::Relaxed).max(0);
        self.log_item_at(step, unix_now(), key, body)
    }

    /// Captures this process's stdout and stderr (file descriptors 1 and 2) as the run's
    /// console until the capture is stopped or dropped: see [`console`]. Stop it before
    /// [`Collector::finish`], so the last lines go with the run.
    pub fn capture_console(&self) -> std::io::Result<console::Capture> {
        console::Capture::start(console::Sink {
            queue: self.queue.clone(),
            last_step: self.last_step.clone(),
            stats: self.stats.clone(),
        })
    }

    /// Asks the sender to send what it holds now rather than with the next batch.
    pub fn flush(&self) {
        let _ = self.queue.push(Command::Flush);
    }

    /// Whether the sender is connected to the hub right now.
    pub fn connected(&self) -> bool {
        self.stats.connected.load(Ordering::Relaxed)
    }

    /// Waits until a hub has welcomed this run and returns the last step it had stored
    /// (`Some(None)` for a new run); `None` if that did not happen within `timeout`.
    pub fn wait_welcome(&self, timeout: Duration) -> Option<Option<i64>> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(w) = *self.stats.welcome.lock().ok()? {
                return Some(w);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Records the hub has acknowledged (stored) so far. The hub acknowledges within about
    /// 200 ms of storing, several batches at a time.
    pub fn acknowledged(&self) -> u64 {
        self.stats.acked.load(Ordering::Relaxed)
    }

    /// Values the hub acknowledged (stored), per metric name, in first-use order. A value the
    /// hub's limits refused is never counted.
    pub fn stored_values(&self) -> Vec<(String, u64)> {
        let stored = self
            .stats
            .stored
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default();
        let names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<(MetricId, String)> =
            names.iter().map(|(n, &id)| (id, n.clone())).collect();
        out.sort_by_key(|(id, _)| id.0);
        out.into_iter()
            .map(|(id, n)| (n, stored.get(id.0 as usize).copied().unwrap_or(0)))
            .collect()
    }

    /// The hub's refusal of the run, while it refuses it (a wrong token, a run of another
    /// project, a limit): what a command-line tool stops on instead of retrying forever.
    pub fn refused_by_hub(&self) -> Option<(stepstream_protocol::ErrorCode, String)> {
        self.stats.refusal.lock().ok()?.clone()
    }

    /// The last connection or hub error, if any.
    pub fn last_error(&self) -> Option<String> {
        self.stats.last_error.lock().ok()?.clone()
    }

    fn report(&self, delivered: bool) -> Report {
        Report {
            delivered,
            logged: self.queue.logged(),
            dropped: self.stats.dropped.load(Ordering::Relaxed),
            acked: self.stats.acked.load(Ordering::Relaxed),
            unacked: self.stats.unacked.load(Ordering::Relaxed),
            refused: self.stats.refused.load(Ordering::Relaxed),
            lost: self.stats.lost.load(Ordering::Relaxed),
            stored: self.stored_values(),
            items_acked: self.stats.items_acked.load(Ordering::Relaxed),
            items_dropped: self.stats.items_dropped.load(Ordering::Relaxed),
            items_refused: self.stats.items_refused.load(Ordering::Relaxed),
        }
    }

    /// [`Collector::finish`] through a shared reference (the first call wins), waiting at most
    /// `timeout`.
    pub fn finish_shared(&self, outcome: Outcome, timeout: Duration) -> Report {
        self.end_within(outcome, timeout)
    }

    fn end(&self, outcome: Outcome) -> Report {
        self.end_within(outcome, self.finish_timeout)
    }

    /// Waits at most `timeout` in every state: a full queue, a sender stuck on an
    /// unreachable hub, a sender that never started. An unrepresentable timeout (`inf`)
    /// waits as long as it takes.
    fn end_within(&self, outcome: Outcome, timeout: Duration) -> Report {
        let Some(thread) = self.thread.lock().ok().and_then(|mut t| t.take()) else {
            return self.report(false);
        };
        let deadline = std::time::Instant::now().checked_add(timeout);
        let expired = || deadline.is_some_and(|d| std::time::Instant::now() >= d);
        let (reply, mut answer) = oneshot::channel();
        let mut finish = Command::Finish(outcome.into(), reply);
        // The queue may be full (the sender is behind or stuck): retry until the deadline
        // rather than block on it.
        let queued = loop {
            match self.queue.push(finish) {
                Ok(()) => break true,
                Err(queue::Refused::SenderGone) => break false,
                Err(queue::Refused::Full(again)) => {
                    if expired() {
                        break false;
                    }
                    finish = again;
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        };
        let delivered = queued
            && loop {
                match answer.try_recv() {
                    Ok(d) => break d,
                    Err(oneshot::error::TryRecvError::Closed) => break false,
                    Err(oneshot::error::TryRecvError::Empty) => {
                        if expired() {
                            break false;
                        }
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
            };
        if delivered {
            let _ = thread.join();
        }
        // Otherwise the thread is left to end with the process; waiting longer would stall
        // the caller's exit on an unreachable hub.
        self.report(delivered)
    }

    /// Whether the hub delivered commands the training has not taken: one atomic load, for
    /// every step.
    pub fn has_commands(&self) -> bool {
        self.commands.has_new()
    }

    /// The commands delivered since the last call (stop, checkpoint, note), oldest first;
    /// each is handed out once, however often the hub delivers it. Answer each with
    /// [`Collector::command_done`].
    pub fn take_commands(&self) -> Vec<stepstream_protocol::Command> {
        self.commands.take()
    }

    /// The stop command the training took, if any: a run that ends after it ends `stopped`.
    pub fn stop_command(&self) -> Option<stepstream_protocol::Command> {
        self.commands.stop()
    }

    /// Tells the hub what became of command `id`: `honoured` (done) or not (declined, with
    /// why). The first answer stands; it reaches the hub before the run's finish.
    pub fn command_done(&self, id: u64, honoured: bool, message: &str) {
        let state = if honoured {
            stepstream_protocol::CommandState::Honoured
        } else {
            stepstream_protocol::CommandState::Declined
        };
        let step = self.last_step.load(Ordering::Relaxed);
        let reply = stepstream_protocol::CommandReply {
            id,
            state,
            step: (step >= 0).then_some(step),
            message: message.to_string(),
        };
        if let Some(reply) = self.commands.answer(reply) {
            let mut reply = Command::Reply(reply);
            // A full queue: the answer waits for room (briefly); it must not be dropped,
            // or the hub would deliver the command again to a run that did it.
            for _ in 0..200 {
                match self.queue.push(reply) {
                    Ok(()) | Err(queue::Refused::SenderGone) => return,
                    Err(queue::Refused::Full(again)) => {
                        reply = again;
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
            }
        }
    }

    /// Raises an alert of the training's own (`level`: info, warning, error): the hub stores
    /// it with the run's alerts (rule `user:TITLE`) and tells its channels; a title raised
    /// again within a minute is told once. Queued like a record; never blocks.
    pub fn alert(&self, title: &str, text: &str, level: stepstream_protocol::AlertLevel) -> bool {
        let alert = stepstream_protocol::UserAlert {
            title: title.to_string(),
            text: text.to_string(),
            level,
            step: self.last_step.load(Ordering::Relaxed).max(0),
            wall_time: unix_now(),
        };
        self.queue.push(Command::Alert(alert)).is_ok()
    }

    /// Sends everything, marks the run ended, and waits (up to the finish timeout) for the
    /// hub to acknowledge it all.
    pub fn finish(self, outcome: Outcome) -> Report {
        self.end(outcome)
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        if self.thread.lock().map(|t| t.is_some()).unwrap_or(false) {
            self.end(Outcome::Finished);
        }
        self.queue.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            collector_url("ws://127.0.0.1:7070").unwrap(),
            "ws://127.0.0.1:7070/ws/collector"
        );
        assert_eq!(
            collector_url("http://h:1/").unwrap(),
            "ws://h:1/ws/collector"
        );
        assert_eq!(collector_url("wss://h/x").unwrap(), "wss://h/x");
        assert!(collector_url("127.0.0.1:7070").is_err());
        assert!(collector_url("ftp://h").is_err());
    }

    #[test]
    fn run_ids_are_unique_and_valid() {
        let a = new_run_id();
        let b = new_run_id();
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), "20261202-180455-9f3a1b2c".len());
    }

    #[test]
    fn log_never_blocks_without_a_hub() {
        let mut opts = Options::new("ws://127.0.0.1:9", "p", "n");
        opts.queue_capacity = 100;
        let mut run = Collector::start(opts).unwrap();
        run.set_finish_timeout(Duration::from_millis(200));
        let t = std::time::Instant::now();
        for step in 0..10_000 {
            run.log(step, &[("loss", 1.0)]);
        }
        assert!(t.elapsed() < Duration::from_secs(5));
        let report = run.finish(Outcome::Finished);
        assert!(!report.delivered);
        assert_eq!(report.logged, 10_000);
    }
}
