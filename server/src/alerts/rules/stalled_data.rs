//! `stalled_data`: steps far slower than usual, or mostly spent waiting for data.

use super::{Judging, RecordRule};
use crate::alerts::sample::{DATA_WAIT, STEP_TIME};
use crate::alerts::window::Window;
use crate::alerts::{Finding, Rules, Sample};
use serde::Deserialize;

/// Step time above `factor` times its rolling median for `consecutive` steps, or data wait
/// above `wait_fraction` of the step time for `consecutive` steps.
#[derive(Clone, Debug, Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct StalledData {
    pub enabled: bool,
    pub step_time: String,
    pub data_wait: String,
    pub window: usize,
    pub factor: f64,
    pub wait_fraction: f64,
    pub consecutive: usize,
    pub warmup_steps: usize,
}

impl Default for StalledData {
    fn default() -> Self {
        StalledData {
            enabled: true,
            step_time: "step_time".into(),
            data_wait: "data_wait".into(),
            window: 100,
            factor: 5.0,
            wait_fraction: 0.8,
            consecutive: 10,
            warmup_steps: 20,
        }
    }
}

#[derive(Default)]
pub(in crate::alerts) struct State {
    step_times: Window,
    slow_steps: usize,
    waiting_steps: usize,
}

impl RecordRule for State {
    fn name(&self) -> &'static str {
        "stalled_data"
    }

    fn evidence(&self, rules: &Rules, s: &Sample<'_>) -> bool {
        rules.stalled_data.enabled && s.get(STEP_TIME).is_some()
    }

    fn judge(&mut self, j: &Judging<'_>, s: &Sample<'_>, out: &mut Vec<Finding>) {
        let r = &j.rules.stalled_data;
        let Some(t) = s
            .get(STEP_TIME)
            .filter(|v| r.enabled && v.is_finite() && *v > 0.0)
        else {
            return;
        };
        let slow = self.step_times.seen >= r.warmup_steps
            && self.step_times.median().is_some_and(|m| t > r.factor * m);
        self.slow_steps = if slow { self.slow_steps + 1 } else { 0 };
        let waiting = s.get(DATA_WAIT).is_some_and(|w| w > r.wait_fraction * t);
        self.waiting_steps = if waiting { self.waiting_steps + 1 } else { 0 };
        if self.slow_steps >= r.consecutive || self.waiting_steps >= r.consecutive {
            let waited = self.waiting_steps >= r.consecutive;
            let median = self.step_times.median().unwrap_or(t);
            let step = j.step;
            out.push(j.finding("stalled_data", t, || {
                let why = if waited {
                    "waiting for data takes most of the step".to_string()
                } else {
                    format!("step time {t:.3} s is {:.0}x its recent median", t / median)
                };
                format!("data pipeline stalled at step {step}: {why}")
            }));
        }
        if !slow {
            self.step_times.push(t, r.window);
        }
    }
}
