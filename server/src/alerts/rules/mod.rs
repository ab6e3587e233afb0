//! The alert rules, one file each: its thresholds (its `[rules.NAME]` table in the alerts
//! TOML file), its state per run, and how it judges. A rule judged on every record is a
//! [`RecordRule`]; adding one is adding its file, its table to [`Rules`] and its state to
//! [`every`]. Two rules are judged otherwise, each in its file too: `straggler` against the
//! other ranks of a job, `stale` by the hub's status clock.

use super::{Finding, Rules, Sample};
use std::collections::HashMap;

pub mod divergence;
pub mod grad_explosion;
pub mod loss_spike;
pub mod lr_schedule;
pub mod memory;
pub mod non_finite;
pub mod stale;
pub mod stalled_data;
pub mod straggler;
pub mod throughput;

/// What a rule is told while it judges one record.
pub(super) struct Judging<'a> {
    pub rules: &'a Rules,
    pub step: i64,
    /// The rules firing now, and since which step.
    pub active: &'a HashMap<&'static str, i64>,
    /// The run's config says it warms up.
    pub expects_warmup: bool,
}

impl Judging<'_> {
    /// A finding of `rule`. Its message is written only when the rule is not firing
    /// already: a condition that holds for many records in a row is judged on each, and a
    /// firing rule's findings are dropped, so formatting each one would be spent for nothing.
    pub fn finding(
        &self,
        rule: &'static str,
        value: f64,
        message: impl FnOnce() -> String,
    ) -> Finding {
        let message = if self.active.contains_key(rule) {
            String::new()
        } else {
            message()
        };
        Finding {
            rule,
            value,
            message,
        }
    }
}

/// A rule judged on each record of a run.
pub(super) trait RecordRule: Send {
    /// Its name, in alerts and in the TOML file.
    fn name(&self) -> &'static str;
    /// Whether the record carried what this rule reads, with the rule enabled: an active
    /// alert resolves only on evidence.
    fn evidence(&self, rules: &Rules, s: &Sample<'_>) -> bool;
    /// Judges one record, adding a finding to `out` when the rule's condition holds.
    fn judge(&mut self, j: &Judging<'_>, s: &Sample<'_>, out: &mut Vec<Finding>);
}

/// Every rule judged on records, fresh for a new run, in the order their findings are
/// reported.
pub(super) fn every() -> Vec<Box<dyn RecordRule>> {
    vec![
        Box::<non_finite::State>::default(),
        Box::<loss_spike::State>::default(),
        Box::<divergence::State>::default(),
        Box::<grad_explosion::State>::default(),
        Box::<lr_schedule::State>::default(),
        Box::<throughput::State>::default(),
        Box::<stalled_data::State>::default(),
        Box::<memory::State>::default(),
    ]
}
