//! `lr_schedule`: learning-rate schedule mistakes.

use super::{Judging, RecordRule};
use crate::alerts::sample::LR;
use crate::alerts::{Finding, Rules, Sample};
use serde::Deserialize;

/// Learning-rate schedule mistakes: no warmup (a jump from ~0 to near the peak in one step,
/// or the first step already at the configured peak when the config asks for warmup), a
/// rise by more than `rise_tolerance` during decay, a reset to `reset_factor` times the
/// previous value when the step count jumps back (a resume).
#[derive(Clone, Debug, Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct LrSchedule {
    pub enabled: bool,
    pub metric: String,
    pub jump_factor: f64,
    pub rise_tolerance: f64,
    pub reset_factor: f64,
}

impl Default for LrSchedule {
    fn default() -> Self {
        LrSchedule {
            enabled: true,
            metric: "lr".into(),
            jump_factor: 50.0,
            rise_tolerance: 0.05,
            reset_factor: 2.0,
        }
    }
}

#[derive(Default)]
pub(in crate::alerts) struct State {
    last: Option<(i64, f64)>,
    peak: f64,
    decaying: bool,
    /// A jump from ~0 (step, from, to), confirmed as "no warmup" if the rate then stops rising.
    jump: Option<(i64, f64, f64)>,
}

impl RecordRule for State {
    fn name(&self) -> &'static str {
        "lr_schedule"
    }

    fn evidence(&self, rules: &Rules, s: &Sample<'_>) -> bool {
        rules.lr_schedule.enabled && s.get(LR).is_some()
    }

    fn judge(&mut self, j: &Judging<'_>, s: &Sample<'_>, out: &mut Vec<Finding>) {
        let r = &j.rules.lr_schedule;
        if let Some(lr) = s.get(LR).filter(|v| r.enabled && v.is_finite()) {
            if let Some(message) = self.mistake(r, j.step, lr, j.expects_warmup) {
                out.push(j.finding("lr_schedule", lr, || message));
            }
        }
    }
}

impl State {
    /// What is wrong with the schedule at this step, if anything.
    fn mistake(
        &mut self,
        r: &LrSchedule,
        step: i64,
        lr: f64,
        expects_warmup: bool,
    ) -> Option<String> {
        let previous = self.last.replace((step, lr));
        let Some((prev_step, prev)) = previous else {
            self.peak = lr;
            return None;
        };
        let peak_before = self.peak;
        self.peak = self.peak.max(lr);
        if step <= prev_step && lr > r.reset_factor * prev && prev > 0.0 {
            return Some(format!(
                "learning rate reset to {lr:.3e} at step {step} after a resume (was {prev:.3e} at step {prev_step})"
            ));
        }
        if prev_step <= 1
            && expects_warmup
            && prev > 0.0
            && lr <= prev * 1.0001
            && lr >= peak_before
        {
            // The first two steps already at the top although the config warms up.
            return Some(format!(
                "no warmup: the learning rate starts at its peak {prev:.3e} though the config asks for warmup"
            ));
        }
        if let Some((at, from, to)) = self.jump.take() {
            // A warmup that starts at 0 also jumps by a large factor at first, but keeps
            // rising; a missing warmup lands on the peak and stays there.
            if lr <= to * (1.0 + r.rise_tolerance) {
                return Some(format!(
                    "no warmup: the learning rate jumped from {from:.3e} to {to:.3e} in one step (step {at})"
                ));
            }
        }
        if prev <= lr / r.jump_factor && step.checked_sub(prev_step) == Some(1) && prev_step < 10 {
            self.jump = Some((step, prev, lr));
        }
        if lr < prev * (1.0 - 1e-9) {
            self.decaying = true;
        } else if self.decaying && lr > prev * (1.0 + r.rise_tolerance) && step > prev_step {
            return Some(format!(
                "learning rate rose from {prev:.3e} to {lr:.3e} during decay (step {step})"
            ));
        }
        None
    }
}
