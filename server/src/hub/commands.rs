//! Commands for a run's training: queued here (from the API, the page, the CLI or a rule),
//! stored, delivered by the run's collector connection (`ingest.rs`) until the collector
//! answers, and told to viewers and the other hubs at each step.
//!
//! The store holds the truth: a command is delivered from what the store says is unfinished,
//! and a state only moves forward (`Store::set_command`), so a reply that comes twice, late,
//! or through another hub changes nothing the first did not.

use super::{truncate, Hub, LiveEvent, Run};
use crate::store::StoreError;
use std::sync::Arc;
use stepstream_protocol::{
    unix_now, Action, CommandEvent, CommandReply, CommandState, PeerCommand, RunId, RunStatus,
    ToPeer,
};

/// Bytes of a command's `by`, `reason` or note text, at most.
pub const COMMAND_TEXT_BYTES: usize = 4096;
/// Unfinished commands a run may have, at most: a page or a rule that keeps asking while the
/// training is away does not grow the queue without end.
pub const OPEN_COMMANDS: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("run {run} has ended ({status}): a finished run takes no commands")]
    Ended { run: RunId, status: &'static str },
    #[error("{0}")]
    Limit(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Hub {
    /// Queues `action` for the run's training, stored before it is told to anyone.
    pub async fn command(
        &self,
        run: &Arc<Run>,
        action: Action,
        by: String,
        reason: String,
    ) -> Result<CommandEvent, CommandError> {
        let (run_id, status) = run.state(|st| (st.identity.run_id.clone(), st.status));
        if status.is_terminal() {
            return Err(CommandError::Ended {
                run: run_id,
                status: status.as_str(),
            });
        }
        let text = match &action {
            Action::Note { text } => text.len(),
            _ => 0,
        };
        if by.len().max(reason.len()).max(text) > COMMAND_TEXT_BYTES {
            return Err(CommandError::Limit(format!(
                "a command's name, reason or note is over {COMMAND_TEXT_BYTES} bytes"
            )));
        }
        if [&by, &reason].iter().any(|s| s.contains('\0')) || text_has_nul(&action) {
            return Err(CommandError::Limit("a command's text holds a NUL".into()));
        }
        let open = self
            .store
            .commands(run.key, run_id.clone())
            .await?
            .iter()
            .filter(|c| !c.state.is_final())
            .count();
        if open >= OPEN_COMMANDS {
            return Err(CommandError::Limit(format!(
                "run {run_id} has {open} commands its training has not answered (at most \
                 {OPEN_COMMANDS}): wait for them"
            )));
        }
        let at = unix_now();
        let id = self
            .store
            .add_command(run.key, action.clone(), by.clone(), reason.clone(), at)
            .await?
            .committed()
            .await?;
        let event = CommandEvent {
            run_id,
            command: stepstream_protocol::Command {
                id,
                action,
                by,
                reason,
                issued_at: at,
            },
            state: CommandState::Queued,
            step: None,
            message: String::new(),
            at,
        };
        tracing::info!(run = %event.run_id, id, action = event.command.action.name(), by = %event.command.by, "command queued");
        self.told_command(run, event.clone());
        Ok(event)
    }

    /// What the run's collector says of a command; stored, then told, if it moved it on.
    pub async fn command_reply(
        &self,
        run: &Arc<Run>,
        mut reply: CommandReply,
    ) -> Result<(), StoreError> {
        if !matches!(
            reply.state,
            CommandState::Delivered | CommandState::Honoured | CommandState::Declined
        ) {
            return Ok(());
        }
        truncate(&mut reply.message, COMMAND_TEXT_BYTES);
        if reply.message.contains('\0') {
            reply.message = reply.message.replace('\0', "\u{fffd}");
        }
        let moved = self
            .store
            .set_command(
                run.key,
                Some(reply.id),
                reply.state,
                reply.step,
                reply.message,
                unix_now(),
            )
            .await?
            .committed()
            .await?;
        if moved {
            self.tell_stored_command(run, Told::Id(reply.id)).await;
        }
        Ok(())
    }

    /// A run ended: the commands its training never answered expire.
    pub(super) async fn expire_commands(&self, run: &Arc<Run>, status: RunStatus) {
        let message = format!(
            "the run ended ({}) before its training answered",
            status.as_str()
        );
        let at = unix_now();
        let expired = match self
            .store
            .set_command(run.key, None, CommandState::Expired, None, message, at)
            .await
        {
            Ok(w) => w.committed().await,
            Err(e) => Err(e),
        };
        match expired {
            Ok(true) => self.tell_stored_command(run, Told::ExpiredAt(at)).await,
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "could not expire a run's commands"),
        }
    }

    /// Tells viewers and peers of the commands `which` names, as stored.
    async fn tell_stored_command(&self, run: &Arc<Run>, which: Told) {
        let run_id = run.state(|st| st.identity.run_id.clone());
        let Ok(stored) = self.store.commands(run.key, run_id).await else {
            return;
        };
        for event in stored {
            let ours = match which {
                Told::Id(id) => event.command.id == id,
                Told::ExpiredAt(at) => event.at == at && event.state == CommandState::Expired,
            };
            if ours {
                self.told_command(run, event);
            }
        }
    }

    /// Viewers, the collector's connection and the other hubs hear of a stored command.
    fn told_command(&self, run: &Arc<Run>, event: CommandEvent) {
        let id = event.command.id;
        let run_id = event.run_id.clone();
        let _ = run.live.send(LiveEvent::Command(event));
        run.commands.send_replace(());
        self.tell_peers(|hub| ToPeer::PeerCommand(PeerCommand { hub, run_id, id }));
    }

    /// Another hub stored or moved command `id`: this hub's viewers and the run's collector,
    /// if it is connected here, hear of it as the shared store holds it.
    pub(super) async fn peer_command(&self, run: &Arc<Run>, id: u64) {
        let run_id = run.state(|st| st.identity.run_id.clone());
        let Ok(stored) = self.store.commands(run.key, run_id).await else {
            return;
        };
        if let Some(event) = stored.into_iter().find(|c| c.command.id == id) {
            let _ = run.live.send(LiveEvent::Command(event));
            run.commands.send_replace(());
        }
    }
}

/// Which stored commands to tell of.
enum Told {
    Id(u64),
    /// Those a run's end expired at this time.
    ExpiredAt(f64),
}

fn text_has_nul(action: &Action) -> bool {
    matches!(action, Action::Note { text } if text.contains('\0'))
}
