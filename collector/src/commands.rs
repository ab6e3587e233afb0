//! Commands the hub delivered for the training (stop, checkpoint, note), waiting for the
//! training thread to take them at its next safe point, and the answers it gave.
//!
//! The sender thread files each delivered command here ([`Inbox::arrive`]) and tells the hub
//! it has it; the training thread takes new ones ([`Inbox::take`], cheap to call every step:
//! one atomic load while nothing is new) and answers with `Collector::command_done`. A
//! command the hub delivers again (a reconnect, a hub restart) is never handed out twice:
//! the hub is told again what became of it instead.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use stepstream_protocol::{Action, Command, CommandReply, CommandState};

#[derive(Default)]
pub struct Inbox {
    /// Something new waits in `state.new` (read without the lock, every step).
    waiting: AtomicBool,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Every command delivered to this process, with its answer once given.
    seen: HashMap<u64, Option<CommandReply>>,
    new: VecDeque<Command>,
    /// The first stop command taken, once taken: how the run's end is reported.
    stop: Option<Command>,
}

impl Inbox {
    /// A command the hub delivered; returns what to tell the hub now: that it arrived, or,
    /// for one already answered, the answer again.
    pub(crate) fn arrive(&self, command: Command) -> CommandReply {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let id = command.id;
        match st.seen.get(&id) {
            Some(Some(answer)) => answer.clone(),
            Some(None) => delivered(id),
            None => {
                st.seen.insert(id, None);
                st.new.push_back(command);
                self.waiting.store(true, Ordering::Release);
                delivered(id)
            }
        }
    }

    /// Whether commands wait to be taken.
    pub fn has_new(&self) -> bool {
        self.waiting.load(Ordering::Acquire)
    }

    /// The commands delivered since the last take, oldest first.
    pub fn take(&self) -> Vec<Command> {
        if !self.has_new() {
            return Vec::new();
        }
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.waiting.store(false, Ordering::Release);
        let taken: Vec<Command> = st.new.drain(..).collect();
        if st.stop.is_none() {
            st.stop = taken
                .iter()
                .find(|c| matches!(c.action, Action::Stop { .. }))
                .cloned();
        }
        taken
    }

    /// Records the answer to a command; `None` when it is unknown or already answered (the
    /// first answer stands).
    pub(crate) fn answer(&self, reply: CommandReply) -> Option<CommandReply> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match st.seen.get_mut(&reply.id) {
            Some(slot @ None) => {
                *slot = Some(reply.clone());
                Some(reply)
            }
            _ => None,
        }
    }

    /// The stop command the training took, if it took one.
    pub fn stop(&self) -> Option<Command> {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .stop
            .clone()
    }
}

fn delivered(id: u64) -> CommandReply {
    CommandReply {
        id,
        state: CommandState::Delivered,
        step: None,
        message: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command(id: u64, action: Action) -> Command {
        Command {
            id,
            action,
            by: "t".into(),
            reason: String::new(),
            issued_at: 0.0,
        }
    }

    #[test]
    fn a_command_delivered_twice_is_taken_once_and_its_answer_repeated() {
        let inbox = Inbox::default();
        assert!(!inbox.has_new());
        let first = inbox.arrive(command(7, Action::Stop { checkpoint: true }));
        assert_eq!(first.state, CommandState::Delivered);
        // Delivered again before it was taken (a reconnect): still one to take.
        inbox.arrive(command(7, Action::Stop { checkpoint: true }));
        let taken = inbox.take();
        assert_eq!(taken.len(), 1);
        assert!(inbox.take().is_empty());
        assert_eq!(inbox.stop().map(|c| c.id), Some(7));
        let done = CommandReply {
            id: 7,
            state: CommandState::Honoured,
            step: Some(3),
            message: "saved".into(),
        };
        assert!(inbox.answer(done.clone()).is_some());
        // A second answer does not replace the first; unknown ids are ignored.
        assert!(inbox
            .answer(CommandReply {
                state: CommandState::Declined,
                ..done.clone()
            })
            .is_none());
        assert!(inbox
            .answer(CommandReply {
                id: 99,
                ..done.clone()
            })
            .is_none());
        // Delivered once more (a hub restart): not taken again, the answer repeated.
        assert_eq!(
            inbox.arrive(command(7, Action::Stop { checkpoint: true })),
            done
        );
        assert!(!inbox.has_new());
        assert!(inbox.take().is_empty());
    }
}
