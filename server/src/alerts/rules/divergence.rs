//! `divergence`: the smoothed value trends up over a long lookback.

use super::{Judging, RecordRule};
use crate::alerts::sample::DIVERGENCE;
use crate::alerts::{Finding, Rules, Sample};
use serde::Deserialize;
use std::collections::VecDeque;

/// The smoothed value (EMA) exceeds the smoothed value `lookback` points earlier by `factor`.
#[derive(Clone, Debug, Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Divergence {
    pub enabled: bool,
    pub metric: String,
    pub smoothing: usize,
    pub lookback: usize,
    pub factor: f64,
    /// Points in a row the trend must hold (one noisy stretch is not a trend).
    pub consecutive: usize,
    pub warmup_steps: usize,
}

impl Default for Divergence {
    fn default() -> Self {
        Divergence {
            enabled: true,
            metric: "loss".into(),
            smoothing: 50,
            lookback: 200,
            factor: 1.5,
            consecutive: 20,
            warmup_steps: 200,
        }
    }
}

#[derive(Default)]
pub(in crate::alerts) struct State {
    ema: Option<f64>,
    ema_history: VecDeque<f64>,
    seen: usize,
    diverging: usize,
}

impl RecordRule for State {
    fn name(&self) -> &'static str {
        "divergence"
    }

    fn evidence(&self, rules: &Rules, s: &Sample<'_>) -> bool {
        rules.divergence.enabled && s.get(DIVERGENCE).is_some()
    }

    fn judge(&mut self, j: &Judging<'_>, s: &Sample<'_>, out: &mut Vec<Finding>) {
        let r = &j.rules.divergence;
        let Some(v) = s.get(DIVERGENCE).filter(|v| r.enabled && v.is_finite()) else {
            return;
        };
        let alpha = 2.0 / (r.smoothing.max(1) as f64 + 1.0);
        let ema = self.ema.map_or(v, |e| e + alpha * (v - e));
        self.ema = Some(ema);
        self.seen += 1;
        self.ema_history.push_back(ema);
        while self.ema_history.len() > r.lookback.max(1) + 1 {
            self.ema_history.pop_front();
        }
        let before = self.ema_history[0];
        let up = self.seen >= r.warmup_steps
            && self.ema_history.len() > r.lookback
            && before > 0.0
            && ema > r.factor * before;
        self.diverging = if up { self.diverging + 1 } else { 0 };
        if self.diverging >= r.consecutive {
            out.push(j.finding("divergence", v, || {
                format!(
                    "{} is trending up: smoothed {ema:.4} vs {before:.4} {} points earlier",
                    r.metric, r.lookback
                )
            }));
        }
    }
}
