//! `straggler`: one rank of a job much slower than the others. Judged against the other
//! ranks' smoothed step times, which the hub gathers (`hub/judge.rs`).

use crate::alerts::sample::STRAGGLER;
use crate::alerts::window::median;
use crate::alerts::{Finding, Judged, Rules, Sample};
use serde::Deserialize;

/// Where several ranks of one job report (runs of one project with the same
/// [`RunIdentity::job`](stepstream_protocol::RunIdentity::job)), a rank
/// whose smoothed step time stays above `factor` times the other ranks' median.
#[derive(Clone, Debug, Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Straggler {
    pub enabled: bool,
    pub metric: String,
    pub factor: f64,
    pub consecutive: usize,
    pub warmup_steps: usize,
}

impl Default for Straggler {
    fn default() -> Self {
        Straggler {
            enabled: true,
            metric: "step_time".into(),
            factor: 1.5,
            consecutive: 20,
            warmup_steps: 20,
        }
    }
}

#[derive(Default)]
pub(in crate::alerts) struct State {
    /// Smoothed step time, shared with the other ranks of the job.
    pub(in crate::alerts) step_time_ema: Option<f64>,
    seen: usize,
    straggling: usize,
}

impl State {
    /// Updates this rank's smoothed step time and compares it with the other ranks'.
    pub(in crate::alerts) fn judge(
        &mut self,
        rules: &Rules,
        s: &Sample<'_>,
        others: &[f64],
    ) -> Judged {
        let r = &rules.straggler;
        let mut out = Judged::default();
        let Some(t) = s.get(STRAGGLER) else {
            return out;
        };
        if !r.enabled || !t.is_finite() {
            return out;
        }
        out.evidence.push("straggler");
        self.seen += 1;
        let ema = self.step_time_ema.map_or(t, |e| e + 0.1 * (t - e));
        self.step_time_ema = Some(ema);
        let Some(median) = median(others.iter().copied()) else {
            return out;
        };
        let slow = self.seen >= r.warmup_steps && median > 0.0 && ema > r.factor * median;
        self.straggling = if slow { self.straggling + 1 } else { 0 };
        if self.straggling >= r.consecutive {
            out.findings.push(Finding {
                rule: "straggler",
                value: ema,
                message: format!(
                    "this rank's {} ({ema:.3} s) is {:.1}x the other ranks' median ({median:.3} s)",
                    r.metric,
                    ema / median
                ),
            });
        }
        out
    }
}
