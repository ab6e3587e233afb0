//! `stale`: the run is meant to be running and nothing was heard from it for the hub's
//! `--stale-after`. Judged by the hub's status clock (`Hub::tick`), not by records, so a
//! SIGKILLed job fires it too; its switch is `[rules.stale]`.

use crate::alerts::Event;
use std::collections::HashMap;

/// The rule's event for a run whose staleness is now `stale`: fired when it turns stale,
/// resolved when it is heard from again, nothing otherwise. `active` and `resolved_at` are
/// the run's firing rules and their last resolutions.
pub(in crate::alerts) fn event(
    active: &mut HashMap<&'static str, i64>,
    resolved_at: &mut HashMap<&'static str, f64>,
    stale: bool,
    step: i64,
    message: &str,
    now: f64,
) -> Option<Event> {
    match (stale, active.contains_key("stale")) {
        (true, false) => {
            active.insert("stale", step);
            Some(Event::Fired {
                rule: "stale",
                step,
                value: 0.0,
                message: message.to_string(),
            })
        }
        (false, true) => {
            active.remove("stale");
            resolved_at.insert("stale", now);
            Some(Event::Resolved {
                rule: "stale",
                step,
                message: "the run is sending again".to_string(),
            })
        }
        _ => None,
    }
}
