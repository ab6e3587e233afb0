//! Commands to a running training: what someone (on the page, through the API or the CLI)
//! or a rule asks a run's collector to do, and what became of it.
//!
//! A command is the hub's: it numbers and stores it, then delivers it to the run's collector
//! ([`crate::FromHub::Command`]) on every connection until the collector says it was honoured
//! or declined ([`crate::ToHub::CommandReply`]); a collector that meets a command it already
//! answered answers again and does not act twice. Viewers see each change of state
//! ([`crate::ToViewer::CommandEvent`]), the run's timeline.

use crate::RunId;
use serde::{Deserialize, Serialize};

/// What a command asks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Action {
    /// End the training at its next safe point; save a checkpoint first when `checkpoint`
    /// and the framework can.
    Stop { checkpoint: bool },
    /// Save a checkpoint at the next safe point and go on.
    Checkpoint,
    /// A marker with text on the run's charts (the training is told, and does nothing).
    Note { text: String },
}

impl Action {
    /// `stop`, `checkpoint` or `note`.
    pub fn name(&self) -> &'static str {
        match self {
            Action::Stop { .. } => "stop",
            Action::Checkpoint => "checkpoint",
            Action::Note { .. } => "note",
        }
    }
}

/// A command as the hub delivers it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Command {
    /// Unique on the hub (or on the hubs sharing a store).
    pub id: u64,
    pub action: Action,
    /// Who asked (a person's name as they gave it, or `rule:<name>`).
    pub by: String,
    /// Why, in their words.
    pub reason: String,
    /// Hub clock, unix seconds.
    pub issued_at: f64,
}

/// Where a command is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum CommandState {
    /// Stored; the collector has not said it has it (it is away, or about to).
    Queued,
    /// The collector has it and acts at its next safe point.
    Delivered,
    /// Done: the training stopped (or is stopping), saved, or showed the note.
    Honoured,
    /// The training could not do it (no checkpoint configured, an error while saving...).
    Declined,
    /// The run ended before its collector honoured it.
    Expired,
}

impl CommandState {
    pub fn as_str(self) -> &'static str {
        match self {
            CommandState::Queued => "queued",
            CommandState::Delivered => "delivered",
            CommandState::Honoured => "honoured",
            CommandState::Declined => "declined",
            CommandState::Expired => "expired",
        }
    }

    pub fn parse(s: &str) -> Option<CommandState> {
        Some(match s {
            "queued" => CommandState::Queued,
            "delivered" => CommandState::Delivered,
            "honoured" => CommandState::Honoured,
            "declined" => CommandState::Declined,
            "expired" => CommandState::Expired,
            _ => return None,
        })
    }

    /// Honoured, declined and expired commands are not delivered again.
    pub fn is_final(self) -> bool {
        self >= CommandState::Honoured
    }
}

/// The collector about a command it was delivered.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CommandReply {
    pub id: u64,
    /// [`CommandState::Delivered`] when it arrives, then [`CommandState::Honoured`] or
    /// [`CommandState::Declined`]; the hub never moves a command backwards.
    pub state: CommandState,
    /// The training's step when it acted.
    pub step: Option<i64>,
    /// What happened, in the training's words (the checkpoint's path, the error).
    pub message: String,
}

/// A command and where it is now, as a run's timeline shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CommandEvent {
    pub run_id: RunId,
    pub command: Command,
    pub state: CommandState,
    pub step: Option<i64>,
    pub message: String,
    /// Hub clock, unix seconds, of this state.
    pub at: f64,
}

/// A command was stored or changed state on one hub of a cluster: the others read the run's
/// commands again from the shared store (to deliver it to a collector connected to them, or
/// tell their viewers).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeerCommand {
    pub hub: u64,
    pub run_id: RunId,
    pub id: u64,
}

/// How loud an alert raised by the training's own code is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AlertLevel {
    Info,
    Warning,
    Error,
}

impl AlertLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            AlertLevel::Info => "info",
            AlertLevel::Warning => "warning",
            AlertLevel::Error => "error",
        }
    }

    pub fn parse(s: &str) -> Option<AlertLevel> {
        Some(match s {
            "info" => AlertLevel::Info,
            "warning" => AlertLevel::Warning,
            "error" => AlertLevel::Error,
            _ => return None,
        })
    }
}

/// An alert the training's code raises itself (`run.alert(title, text, level)`): the hub
/// stores it with the run's alerts (rule `user:TITLE`) and tells the same channels.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UserAlert {
    pub title: String,
    pub text: String,
    pub level: AlertLevel,
    /// The training's step when it was raised.
    pub step: i64,
    pub wall_time: f64,
}

/// A project's rules made in the page changed on one hub of a cluster: the others read them
/// again from the shared store.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeerRules {
    pub hub: u64,
    pub project: String,
}
