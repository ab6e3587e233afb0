//! `grad_explosion`: the gradient norm far above its rolling mean, several steps in a row.

use super::{Judging, RecordRule};
use crate::alerts::sample::GRAD;
use crate::alerts::window::Window;
use crate::alerts::{Finding, Rules, Sample};
use serde::Deserialize;

/// `consecutive` values above `factor` times the rolling mean (the reference design's 10x).
#[derive(Clone, Debug, Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct GradExplosion {
    pub enabled: bool,
    pub metric: String,
    pub window: usize,
    pub factor: f64,
    pub consecutive: usize,
    pub warmup_steps: usize,
}

impl Default for GradExplosion {
    fn default() -> Self {
        GradExplosion {
            enabled: true,
            metric: "grad_norm".into(),
            window: 100,
            factor: 10.0,
            consecutive: 3,
            warmup_steps: 20,
        }
    }
}

#[derive(Default)]
pub(in crate::alerts) struct State {
    grad: Window,
    over: usize,
}

impl RecordRule for State {
    fn name(&self) -> &'static str {
        "grad_explosion"
    }

    fn evidence(&self, rules: &Rules, s: &Sample<'_>) -> bool {
        rules.grad_explosion.enabled && s.get(GRAD).is_some()
    }

    fn judge(&mut self, j: &Judging<'_>, s: &Sample<'_>, out: &mut Vec<Finding>) {
        let r = &j.rules.grad_explosion;
        let Some(v) = s.get(GRAD).filter(|v| r.enabled && v.is_finite()) else {
            return;
        };
        let over = self.grad.seen >= r.warmup_steps
            && self
                .grad
                .mean()
                .is_some_and(|m| m > 0.0 && v > r.factor * m);
        self.over = if over { self.over + 1 } else { 0 };
        if self.over >= r.consecutive {
            let mean = self.grad.mean().unwrap_or(0.0);
            let steps = self.over;
            out.push(j.finding("grad_explosion", v, || {
                format!(
                    "{} {v:.4} has been above {:.0}x its rolling mean ({mean:.4}) for {steps} steps",
                    r.metric, r.factor
                )
            }));
        }
        // Exploded values stay out of the baseline they are judged against.
        if !over {
            self.grad.push(v, r.window);
        }
    }
}
