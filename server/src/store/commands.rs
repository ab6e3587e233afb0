//! Commands for a run's training as stored: queued by [`Store::add_command`], moved on by
//! [`Store::set_command`] (never back), read as the run's timeline by [`Store::commands`].
//! Both engines keep them in a `commands` table whose `state` column orders the states, so
//! "only forward, and never out of a final state" is two comparisons in the `UPDATE` (a
//! command honoured stays honoured when its run ends).

use super::command::Command;
use super::{Reads, Result, RunKey, Store, Written};
use stepstream_protocol::{Action, Command as Order, CommandEvent, CommandState, RunId};

/// An action as a `commands` row holds it.
pub(super) fn action_text(action: &Action) -> String {
    serde_json::to_string(action).unwrap_or_default()
}

/// An alert acknowledged: by whom, when, and until when its notices are muted.
#[derive(Clone, Debug, PartialEq)]
pub struct Acked {
    pub rule: String,
    pub by: String,
    pub mute_until: Option<f64>,
    pub at: f64,
}

impl Acked {
    /// Whether these acknowledgements of a run mute `rule`'s notices at `now`.
    pub fn mutes(acks: &[Acked], rule: &str, now: f64) -> bool {
        acks.iter()
            .any(|a| a.rule == rule && a.mute_until.is_some_and(|u| u > now))
    }

    /// Whether `rule`'s alert fired at `since` was acknowledged after it.
    pub fn acknowledged(acks: &[Acked], rule: &str, since: f64) -> bool {
        acks.iter().any(|a| a.rule == rule && a.at >= since)
    }
}

/// A rule made in the page, as stored: its project and its JSON (`alerts::custom::PageRule`).
#[derive(Clone, Debug, PartialEq)]
pub struct StoredRule {
    pub id: u64,
    pub project: String,
    pub body: String,
    pub by: String,
    pub at: f64,
}

/// One `commands` row, as its columns read back.
pub(super) struct Row {
    pub id: i64,
    pub action: String,
    pub by: String,
    pub reason: String,
    pub issued_at: f64,
    pub state: i64,
    pub step: Option<i64>,
    pub message: String,
    pub state_at: f64,
}

const STATES: [CommandState; 5] = [
    CommandState::Queued,
    CommandState::Delivered,
    CommandState::Honoured,
    CommandState::Declined,
    CommandState::Expired,
];

impl Row {
    /// The event the row says; `None` for a row this build cannot read (a newer action).
    pub(super) fn event(self, run_id: &RunId) -> Option<CommandEvent> {
        let action: Action = serde_json::from_str(&self.action).ok()?;
        Some(CommandEvent {
            run_id: run_id.clone(),
            command: Order {
                id: self.id as u64,
                action,
                by: self.by,
                reason: self.reason,
                issued_at: self.issued_at,
            },
            state: *STATES.get(usize::try_from(self.state).ok()?)?,
            step: self.step,
            message: self.message,
            at: self.state_at,
        })
    }
}

impl Store {
    /// Queues a command for the run's training; see [`Written`] (its value is the id).
    pub async fn add_command(
        &self,
        key: RunKey,
        action: Action,
        by: String,
        reason: String,
        at: f64,
    ) -> Result<Written<u64>> {
        self.hand(|reply| Command::QueueOrder {
            key,
            action,
            by,
            reason,
            at,
            reply,
        })
        .await
    }

    /// Moves command `id` (every unfinished one of the run when `None`) to `state`, if that
    /// is forward; see [`Written`] (its value says whether any moved).
    #[allow(clippy::too_many_arguments)]
    pub async fn set_command(
        &self,
        key: RunKey,
        id: Option<u64>,
        state: CommandState,
        step: Option<i64>,
        message: String,
        at: f64,
    ) -> Result<Written<bool>> {
        self.hand(|reply| Command::MoveOrder {
            key,
            id,
            state,
            step,
            message,
            at,
            reply,
        })
        .await
    }

    /// Records that `by` acknowledged `rule`'s alert on the run (muting its notices until
    /// `mute_until`); committed when this returns.
    pub async fn acknowledge(
        &self,
        key: RunKey,
        rule: String,
        by: String,
        mute_until: Option<f64>,
        at: f64,
    ) -> Result<()> {
        self.hand(|reply| Command::Acknowledge {
            key,
            rule,
            by,
            mute_until,
            at,
            reply,
        })
        .await?
        .committed()
        .await
    }

    /// Stores a project's rule made in the page; its id.
    pub async fn add_rule(
        &self,
        project: String,
        body: String,
        by: String,
        at: f64,
    ) -> Result<u64> {
        self.hand(|reply| Command::AddRule {
            project,
            body,
            by,
            at,
            reply,
        })
        .await?
        .committed()
        .await
    }

    /// Deletes a project's rule; whether it existed.
    pub async fn delete_rule(&self, project: String, id: u64) -> Result<bool> {
        self.hand(|reply| Command::DeleteRule { project, id, reply })
            .await?
            .committed()
            .await
    }

    /// Every project's page rules, oldest first.
    pub async fn rules(&self) -> Result<Vec<StoredRule>> {
        read!(self.rules())
    }

    /// The run's acknowledgements, oldest first.
    pub async fn acks(&self, key: RunKey) -> Result<Vec<Acked>> {
        read!(self.acks(key))
    }

    /// The run's commands, oldest first.
    pub async fn commands(&self, key: RunKey, run_id: RunId) -> Result<Vec<CommandEvent>> {
        read!(self.commands(key, run_id))
    }
}
