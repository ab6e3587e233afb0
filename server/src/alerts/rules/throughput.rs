//! `throughput_drop`: samples or tokens per second far below their rolling median.

use super::{Judging, RecordRule};
use crate::alerts::window::Window;
use crate::alerts::{Finding, Rules, Sample};
use serde::Deserialize;

/// Throughput below `fraction` of its rolling median for `consecutive` steps.
#[derive(Clone, Debug, Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Throughput {
    pub enabled: bool,
    pub metrics: Vec<String>,
    pub window: usize,
    pub fraction: f64,
    pub consecutive: usize,
    pub warmup_steps: usize,
}

impl Default for Throughput {
    fn default() -> Self {
        Throughput {
            enabled: true,
            metrics: vec!["samples_per_sec".into(), "tokens_per_sec".into()],
            window: 100,
            fraction: 0.5,
            consecutive: 10,
            warmup_steps: 50,
        }
    }
}

/// Per `rules.throughput.metrics`, in order: its window and low steps in a row.
#[derive(Default)]
pub(in crate::alerts) struct State {
    metrics: Vec<(Window, usize)>,
}

impl RecordRule for State {
    fn name(&self) -> &'static str {
        "throughput_drop"
    }

    fn evidence(&self, rules: &Rules, s: &Sample<'_>) -> bool {
        rules.throughput.enabled && s.throughput().iter().any(Option::is_some)
    }

    fn judge(&mut self, j: &Judging<'_>, s: &Sample<'_>, out: &mut Vec<Finding>) {
        let r = &j.rules.throughput;
        if !r.enabled {
            return;
        }
        if self.metrics.len() < r.metrics.len() {
            self.metrics.resize_with(r.metrics.len(), Default::default);
        }
        for ((m, v), (w, low)) in r.metrics.iter().zip(s.throughput()).zip(&mut self.metrics) {
            let Some(v) = v.filter(|v| v.is_finite()) else {
                continue;
            };
            let is_low =
                w.seen >= r.warmup_steps && w.median().is_some_and(|med| v < r.fraction * med);
            *low = if is_low { *low + 1 } else { 0 };
            if *low >= r.consecutive {
                let median = w.median().unwrap_or(0.0);
                out.push(j.finding("throughput_drop", v, || {
                    format!(
                        "{m} {v:.1} is below {:.0}% of its recent median {median:.1}",
                        r.fraction * 100.0
                    )
                }));
            }
            if !is_low {
                w.push(v, r.window);
            }
        }
    }
}
