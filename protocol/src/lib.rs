//! The stepstream wire format: every message that crosses a socket between a collector, the
//! hub and a viewer, and nothing else.
//!
//! # Envelope
//! Each WebSocket binary message is one frame: `"SS" | version u8 | kind u8 | payload`
//! (see [`codec`]). The kind byte names the payload struct; kinds are unique across all five
//! directions, so a frame sent the wrong way is refused with a clear error.
//!
//! # Conversations
//! * Collector → hub ([`ToHub`]): [`Hello`] first (protocol version, write token, run
//!   identity); then any mix of [`DefineMetrics`] (a metric's name once, a small
//!   [`MetricId`] after), [`Batch`] (step records under a per-run sequence number, starting
//!   at 1 and without gaps), [`Heartbeat`] and finally [`Finish`].
//! * Hub → collector ([`FromHub`]): [`Welcome`] answers the hello with the last sequence
//!   number the hub has stored for that run, so a reconnecting collector resends only what
//!   was not stored; [`Ack`] says every batch up to `through_seq` is durable; [`FinishAck`];
//!   [`HubError`]; [`Pace`] (the linger the hub wants now); [`Command`]s for the training (stop, checkpoint, note; see [`commands`]),
//!   which the collector answers with [`CommandReply`].
//! * Viewer → hub ([`FromViewer`]): [`Subscribe`] / [`Unsubscribe`], and [`Zoom`] for a
//!   window at its own resolution (answered by [`Zoomed`]).
//! * Hub → viewer ([`ToViewer`]): [`RunList`] on connect, [`RunUpdate`] as a run's status
//!   changes and [`RunUpdates`] (every run whose summary changed) once a second;
//!   per subscribed run: [`Metrics`], [`Backfill`] chunks (history up to a sequence number),
//!   then [`Live`] batches with higher sequence numbers only, [`StatusChange`],
//!   [`Alert`]s (the run's stored ones first, then live), and [`Resync`] when a slow viewer
//!   was caught up from storage.
//! * Hub → hub ([`ToPeer`], only when several hubs share a PostgreSQL store and a NATS
//!   server): [`PeerBatch`] (a batch one hub committed), [`PeerMetrics`], [`PeerRun`] (a
//!   run's row changed: read it again) and [`PeerAlert`], which each hub forwards to its own
//!   viewers.
//!
//! Sequence numbers make the seam between history and live exact: a viewer applies a
//! [`Live`] batch only if its `seq` is above the `through_seq` of what it already holds.

pub mod codec;
pub mod commands;
pub mod csv;
pub mod decimate;
pub mod items;
pub mod limits;

pub use commands::{
    Action, AlertLevel, Command, CommandEvent, CommandReply, CommandState, PeerCommand, PeerRules,
    UserAlert,
};
pub use items::{Cell, Histogram, Image, ImageFormat, Item, ItemBody, ItemKind, Stream};
pub use limits::Limits;

pub use codec::DecodeError;
use serde::{Deserialize, Serialize};
use std::fmt;

/// A run's unique id: 1 to 64 characters of `[A-Za-z0-9_.-]`, chosen by the collector.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct RunId(String);

/// Why a string is not a [`RunId`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid run id {0:?}: use 1 to 64 characters of A-Z a-z 0-9 _ . -")]
pub struct InvalidRunId(pub String);

impl RunId {
    pub fn new(id: impl Into<String>) -> Result<Self, InvalidRunId> {
        let id = id.into();
        let ok = !id.is_empty()
            && id.len() <= 64
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if ok {
            Ok(Self(id))
        } else {
            Err(InvalidRunId(id))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for RunId {
    type Error = InvalidRunId;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::new(s)
    }
}

impl From<RunId> for String {
    fn from(id: RunId) -> String {
        id.0
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A metric's small id within one run, defined by [`DefineMetrics`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct MetricId(pub u32);

/// Who and what a run is; sent once in [`Hello`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunIdentity {
    pub run_id: RunId,
    pub project: String,
    pub name: String,
    /// Hyper-parameters as a JSON document (an object, by convention).
    pub config_json: String,
    pub host: String,
    pub rank: u32,
    pub world_size: u32,
    /// The distributed job this run is one rank of: the same for every rank of one launch
    /// (from the launcher's environment, or given by the user); empty for a lone run.
    pub job: String,
    /// What trained it (`mindspore`, `pytorch`, `tail`...); empty when unknown.
    pub framework: String,
    /// Unix seconds.
    pub started_at: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    /// The collector's [`codec::VERSION`]; repeated inside the payload for the error message.
    pub protocol: u8,
    pub token: Option<String>,
    pub run: RunIdentity,
    /// Random per collector process: the hub refuses a second live writer of one run, and
    /// lets the same writer take over its own half-open connection.
    pub writer: u64,
    /// The highest sequence number this collector has seen acknowledged for the run (0 for
    /// a new process): a hub whose stored `last_seq` is lower lost acknowledged data, and
    /// says so.
    pub acked_through: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetricDef {
    pub id: MetricId,
    pub name: String,
}

/// Where `id` sits in a metric table sorted by id. Collectors number metrics 0, 1, 2... so
/// the id is usually its own index; otherwise a binary search finds it.
pub fn metric_index(table: &[MetricDef], id: MetricId) -> Option<usize> {
    match table.get(id.0 as usize) {
        Some(m) if m.id == id => Some(id.0 as usize),
        _ => table.binary_search_by_key(&id, |m| m.id).ok(),
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DefineMetrics {
    pub metrics: Vec<MetricDef>,
}

/// One training step's values. Values may be NaN or infinite: those are data, not errors.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    pub step: i64,
    /// Unix seconds when the collector recorded the step.
    pub wall_time: f64,
    pub values: Vec<(MetricId, f64)>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Batch {
    /// Per-run sequence number: 1 for the first batch, then +1 with no gaps.
    pub seq: u64,
    pub records: Vec<StepRecord>,
    /// Console lines and samples logged with these records (see [`items`]), in order.
    pub items: Vec<Item>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Heartbeat {
    pub wall_time: f64,
}

/// How a run ended, as the collector saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FinishStatus {
    Finished,
    Failed {
        message: String,
    },
    Killed {
        message: String,
    },
    /// Ended at a stop command's bidding (who asked and why, in `message`).
    Stopped {
        message: String,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Finish {
    pub status: FinishStatus,
    pub wall_time: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Welcome {
    pub run_id: RunId,
    /// Highest batch sequence number stored for this run; 0 when none.
    pub last_seq: u64,
    /// Highest step stored for this run, if any.
    pub last_step: Option<i64>,
    /// The run's metric table as stored: a resuming collector uses these ids for the names
    /// it logs, whatever order they first appear in.
    pub metrics: Vec<MetricDef>,
    /// What this hub accepts.
    pub limits: Limits,
    /// The linger the hub wants now (see [`Pace`], which says when it changes).
    pub linger_ms: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    /// Every batch with `seq <= through_seq` is durably stored.
    pub through_seq: u64,
    /// Samples of the batches this acknowledgement covers (since the last one) that the
    /// hub's quotas kept out (`run_sample_bytes`, `hub_sample_bytes`; each named in a
    /// `HubError` when it happened): stored they are not.
    pub items_refused: u64,
}

/// The linger the hub wants of collectors now, when it changes ([`Welcome`] says what it is
/// at the hello). None while the hub has room (each record goes at once, for the lowest latency),
/// rising with the records it receives a second (batches of many records cost the hub less
/// per record). A collector lingers at most this, and at most its own `linger`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pace {
    pub linger_ms: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinishAck {
    pub status: RunStatus,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorCode {
    /// The frame could not be decoded (see the message).
    BadFrame,
    /// The peer speaks another wire version.
    UnsupportedVersion,
    /// Missing or wrong token.
    Unauthorized,
    /// The run id names no run the hub knows.
    UnknownRun,
    /// A well-formed message that breaks the conversation rules.
    ProtocolViolation,
    /// The hub could not store the data; nothing of it was acknowledged.
    Storage,
    /// Over one of the hub's [`Limits`] (or its run or connection limits); the message names
    /// the limit. Non-fatal when only the named item was refused.
    Limit,
    /// Another collector is writing this run, or a resent batch differs from the stored one.
    Conflict,
}

/// An error from the hub. After a fatal one the hub closes the socket.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HubError {
    pub code: ErrorCode,
    pub message: String,
    pub fatal: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subscribe {
    pub runs: Vec<RunId>,
    /// Only these metrics (by name); all when `None`.
    pub metrics: Option<Vec<String>>,
    /// Skip history before this step.
    pub from_step: Option<i64>,
    /// Most points per metric in the history; the hub downsamples (M4) above it.
    pub budget: Option<u32>,
    /// A resubscription: the viewer holds the run's batches through this sequence number;
    /// it gets the stored batches after it, then live ones, whatever their steps (a late
    /// evaluation at an earlier step, a resumed run that rewinds). A cut by step would lose
    /// those for the rest of the subscription.
    pub after_seq: Option<u64>,
    /// Live frames carry the run's console lines and samples too (an image's place, not its
    /// bytes); a chart alone does without.
    pub items: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unsubscribe {
    pub runs: Vec<RunId>,
}

/// A zoom window: one metric of a subscribed run over steps `from..=to`, every stored point
/// while they fit `budget`, else M4-thinned to it (the hub's one decimation). Answered by a
/// [`Zoomed`] with the same `id`; a page keeps only the answer to its newest request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Zoom {
    pub id: u64,
    pub run_id: RunId,
    pub metric: String,
    pub from: i64,
    pub to: i64,
    pub budget: u32,
}

/// The points of a [`Zoom`] window, each with its record's wall time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Zoomed {
    pub id: u64,
    pub run_id: RunId,
    pub metric: String,
    pub from: i64,
    pub to: i64,
    /// Points stored in the window, before any thinning.
    pub total_points: u64,
    pub downsampled: bool,
    pub steps: Vec<i64>,
    pub values: Vec<f64>,
    pub times: Vec<f64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RunStatus {
    Running,
    /// Running, but nothing (not even a heartbeat) arrived for the stale threshold.
    Stale,
    Finished,
    Failed,
    Killed,
    /// Ended by a stop command (from a person or a rule), not by itself.
    Stopped,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Stale => "stale",
            RunStatus::Finished => "finished",
            RunStatus::Failed => "failed",
            RunStatus::Killed => "killed",
            RunStatus::Stopped => "stopped",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "running" => RunStatus::Running,
            "stale" => RunStatus::Stale,
            "finished" => RunStatus::Finished,
            "failed" => RunStatus::Failed,
            "killed" => RunStatus::Killed,
            "stopped" => RunStatus::Stopped,
            _ => return None,
        })
    }

    /// Finished, failed, killed and stopped runs stay so until their collector says hello
    /// again.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RunStatus::Finished | RunStatus::Failed | RunStatus::Killed | RunStatus::Stopped
        )
    }
}

/// A run as the run list shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    pub run_id: RunId,
    pub project: String,
    pub name: String,
    pub host: String,
    pub rank: u32,
    pub world_size: u32,
    /// See [`RunIdentity::job`].
    pub job: String,
    pub framework: String,
    pub started_at: f64,
    pub status: RunStatus,
    pub status_message: Option<String>,
    pub last_step: Option<i64>,
    /// Wall time of the last point, unix seconds.
    pub last_point_at: Option<f64>,
    /// Latest value of each metric, by name.
    pub last_values: Vec<(String, f64)>,
    pub records: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunList {
    pub runs: Vec<RunSummary>,
    /// The hub's clock, unix seconds, so ages can be computed without trusting the viewer's.
    pub now: f64,
    /// The list comes in pages (ten thousand runs are megabytes): `false` while more pages
    /// follow. A viewer replaces its list once the last page is in.
    pub done: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunUpdate {
    pub run: RunSummary,
    pub now: f64,
}

/// The runs whose summary changed since the hub's last sweep (new steps, new values), in one
/// frame: a thousand live runs cost a viewer one frame a second, not a thousand. A status
/// change still goes out at once, as a [`RunUpdate`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunUpdates {
    pub runs: Vec<RunSummary>,
    pub now: f64,
}

/// A run was deleted (by someone through the API, the page or the CLI, or by its project's
/// retention): viewers drop it from their list and their charts. Its project lets the hub
/// tell only the viewers who may see it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunDeleted {
    pub run_id: RunId,
    pub project: String,
    /// Who deleted it, as they call themselves (`retention` for the hub's own).
    pub by: String,
    pub at: f64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Metrics {
    pub run_id: RunId,
    pub metrics: Vec<MetricDef>,
}

/// One metric's points, as parallel arrays.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Series {
    pub metric: MetricId,
    pub steps: Vec<i64>,
    pub values: Vec<f64>,
    /// Each point's record wall time, unix seconds (for wall-time and relative-time axes).
    pub times: Vec<f64>,
}

/// A chunk of a run's history: every stored point with `seq <= through_seq` (after
/// `from_step` and the metric filter), downsampled when the subscription set a budget.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Backfill {
    pub run_id: RunId,
    pub through_seq: u64,
    pub downsampled: bool,
    pub series: Vec<Series>,
    /// The last chunk of this backfill; live batches follow.
    pub done: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Live {
    pub run_id: RunId,
    pub seq: u64,
    pub records: Vec<StepRecord>,
    /// The batch's console lines and text samples (tables too); empty for a viewer that
    /// subscribed to some metrics only.
    pub items: Vec<Item>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatusChange {
    pub run_id: RunId,
    pub status: RunStatus,
    pub message: Option<String>,
    pub at: f64,
}

/// The viewer fell behind the live stream; a [`Backfill`] of what it missed follows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resync {
    pub run_id: RunId,
    pub after_seq: u64,
    pub reason: String,
}

/// An alert rule fired for a run, or stopped holding (`fired: false`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Alert {
    pub run_id: RunId,
    pub rule: String,
    pub fired: bool,
    pub step: i64,
    pub value: f64,
    pub message: String,
    /// Hub clock, unix seconds.
    pub at: f64,
}

/// What one hub of a cluster committed or decided, for the other hubs (through NATS): each
/// hub forwards it to its own viewers, so a viewer on any hub sees every run. `hub` names the
/// sender, which ignores its own messages.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeerBatch {
    pub hub: u64,
    pub run_id: RunId,
    pub seq: u64,
    pub records: Vec<StepRecord>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeerMetrics {
    pub hub: u64,
    pub run_id: RunId,
    pub metrics: Vec<MetricDef>,
}

/// A run was created or its stored row changed (a hello, a status): the other hubs read it
/// again from the shared store. `change` is the status change, when there is one.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeerRun {
    pub hub: u64,
    pub run_id: RunId,
    pub change: Option<StatusChange>,
}

/// A run was deleted through hub `hub` (by `by`): the others check that the shared store no
/// longer holds it, then forget it and tell their viewers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeerDeleted {
    pub hub: u64,
    pub run_id: RunId,
    pub by: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeerAlert {
    pub hub: u64,
    pub alert: Alert,
}

/// Declares one direction's message enum, its kind bytes, and its encode/decode.
macro_rules! direction {
    ($(#[$meta:meta])* $name:ident { $($variant:ident = $kind:literal,)* }) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq)]
        pub enum $name { $($variant($variant),)* }

        impl $name {
            /// The envelope's kind byte for this message.
            pub fn kind(&self) -> u8 {
                match self { $($name::$variant(_) => $kind,)* }
            }

            /// Name of the message, for logs and errors.
            pub fn name(&self) -> &'static str {
                match self { $($name::$variant(_) => stringify!($variant),)* }
            }

            pub fn encode(&self) -> Vec<u8> {
                match self { $($name::$variant(m) => codec::encode_frame($kind, m),)* }
            }

            pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
                let (kind, payload) = codec::open_frame(bytes)?;
                match kind {
                    $($kind => Ok($name::$variant(
                        codec::decode_payload(stringify!($variant), payload)?,
                    )),)*
                    other => Err(DecodeError::UnexpectedKind {
                        kind: other,
                        expected: stringify!($name),
                    }),
                }
            }
        }

        $(impl From<$variant> for $name {
            fn from(m: $variant) -> Self { $name::$variant(m) }
        })*
    };
}

direction! {
    /// Collector → hub.
    ToHub {
        Hello = 0x01,
        DefineMetrics = 0x02,
        Batch = 0x03,
        Heartbeat = 0x04,
        Finish = 0x05,
        CommandReply = 0x06,
        UserAlert = 0x07,
    }
}

impl Batch {
    /// Its records and items, counted together (what a collector's budgets count).
    pub fn entries(&self) -> usize {
        self.records.len() + self.items.len()
    }

    /// This batch as a [`ToHub::Batch`] frame, encoded from a borrow (a sender holding its
    /// batches until acknowledged sends them without copying).
    pub fn encode(&self) -> Vec<u8> {
        codec::encode_frame(ToHub::BATCH_KIND, self)
    }
}

impl ToHub {
    /// The kind byte of [`ToHub::Batch`].
    pub const BATCH_KIND: u8 = 0x03;
}

direction! {
    /// Hub → collector.
    FromHub {
        Welcome = 0x10,
        Ack = 0x11,
        FinishAck = 0x12,
        Command = 0x13,
        Pace = 0x14,
        HubError = 0x1f,
    }
}

direction! {
    /// Viewer → hub.
    FromViewer {
        Subscribe = 0x20,
        Unsubscribe = 0x21,
        Zoom = 0x22,
    }
}

direction! {
    /// Hub → viewer.
    ToViewer {
        RunList = 0x30,
        RunUpdate = 0x31,
        Metrics = 0x32,
        Backfill = 0x33,
        Live = 0x34,
        StatusChange = 0x35,
        Resync = 0x36,
        Alert = 0x37,
        RunUpdates = 0x38,
        Zoomed = 0x39,
        CommandEvent = 0x3a,
        RunDeleted = 0x3b,
        HubError = 0x3f,
    }
}

direction! {
    /// Hub → hub, in a cluster (published on NATS).
    ToPeer {
        PeerBatch = 0x40,
        PeerMetrics = 0x41,
        PeerRun = 0x42,
        PeerAlert = 0x43,
        PeerCommand = 0x44,
        PeerRules = 0x45,
        PeerDeleted = 0x46,
    }
}

/// Unix seconds now, as the wire carries times.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// `YYYYMMDD_HHMMSS` of a unix time in UTC: the stamp in archived file names
/// (`run_YYYYMMDD_HHMMSS_metrics.csv`) and in generated run ids.
pub fn utc_stamp(unix: f64) -> String {
    let secs = unix.max(0.0) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil-from-days (H. Hinnant).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}_{:02}{:02}{:02}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_id_rules() {
        assert!(RunId::new("20261202-180455-a1b2").is_ok());
        assert!(RunId::new("").is_err());
        assert!(RunId::new("a/b").is_err());
        assert!(RunId::new("x".repeat(65)).is_err());
    }

    #[test]
    fn stamps_are_utc_civil_time() {
        assert_eq!(utc_stamp(0.0), "19700101_000000");
        assert_eq!(utc_stamp(1_796_234_667.0), "20261202_180427");
        assert_eq!(utc_stamp(951_825_600.0), "20000229_120000");
    }

    #[test]
    fn wrong_direction_is_refused() {
        let frame = ToHub::Heartbeat(Heartbeat { wall_time: 1.0 }).encode();
        let err = FromViewer::decode(&frame).unwrap_err();
        assert_eq!(
            err,
            DecodeError::UnexpectedKind {
                kind: 0x04,
                expected: "FromViewer"
            }
        );
    }

    #[test]
    fn invalid_run_id_inside_a_frame_is_malformed() {
        let mut frame = ToViewer::Resync(Resync {
            run_id: RunId::new("ab").unwrap(),
            after_seq: 1,
            reason: String::new(),
        })
        .encode();
        // The run id's bytes follow its varint length; make one of them a '/'.
        frame[5] = b'/';
        assert!(matches!(
            ToViewer::decode(&frame),
            Err(DecodeError::Malformed { .. })
        ));
    }

    #[test]
    fn metric_index_finds_ids_dense_or_not() {
        let table = |ids: &[u32]| -> Vec<MetricDef> {
            ids.iter()
                .map(|&id| MetricDef {
                    id: MetricId(id),
                    name: format!("m{id}"),
                })
                .collect()
        };
        let dense = table(&[0, 1, 2, 3]);
        assert_eq!(metric_index(&dense, MetricId(2)), Some(2));
        assert_eq!(metric_index(&dense, MetricId(4)), None);
        // A gap: ids no longer equal their index, some index matches another id.
        let sparse = table(&[0, 2, 3, 9]);
        for (i, m) in sparse.iter().enumerate() {
            assert_eq!(metric_index(&sparse, m.id), Some(i));
        }
        assert_eq!(metric_index(&sparse, MetricId(1)), None);
        assert_eq!(metric_index(&sparse, MetricId(u32::MAX)), None);
        assert_eq!(metric_index(&[], MetricId(0)), None);
    }
}
