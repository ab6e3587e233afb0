//! `loss_spike`: a value far above its rolling median.

use super::{Judging, RecordRule};
use crate::alerts::sample::SPIKE;
use crate::alerts::window::Window;
use crate::alerts::{Finding, Rules, Sample};
use serde::Deserialize;

/// A value far above the rolling median: `value > median + mads * MAD` and `> ratio * median`.
#[derive(Clone, Debug, Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct LossSpike {
    pub enabled: bool,
    pub metric: String,
    pub window: usize,
    pub warmup_steps: usize,
    pub mads: f64,
    pub min_ratio: f64,
}

impl Default for LossSpike {
    fn default() -> Self {
        LossSpike {
            enabled: true,
            metric: "loss".into(),
            window: 200,
            warmup_steps: 50,
            mads: 20.0,
            min_ratio: 3.0,
        }
    }
}

#[derive(Default)]
pub(in crate::alerts) struct State {
    spike: Window,
}

impl RecordRule for State {
    fn name(&self) -> &'static str {
        "loss_spike"
    }

    fn evidence(&self, rules: &Rules, s: &Sample<'_>) -> bool {
        rules.loss_spike.enabled && s.get(SPIKE).is_some()
    }

    fn judge(&mut self, j: &Judging<'_>, s: &Sample<'_>, out: &mut Vec<Finding>) {
        let r = &j.rules.loss_spike;
        let Some(v) = s.get(SPIKE).filter(|_| r.enabled) else {
            return;
        };
        if self.spike.seen >= r.warmup_steps && v.is_finite() {
            if let Some((m, mad)) = self.spike.stats() {
                let mad = mad.max(m.abs() * 1e-3);
                if v > m + r.mads * mad && v > r.min_ratio * m {
                    let step = j.step;
                    out.push(j.finding("loss_spike", v, || {
                        format!(
                            "{} {v:.4} at step {step} is far above its recent median {m:.4}",
                            r.metric
                        )
                    }));
                }
            }
        }
        self.spike.push(v, r.window);
    }
}
