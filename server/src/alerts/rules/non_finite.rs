//! `non_finite`: a watched metric is NaN or infinite.

use super::{Judging, RecordRule};
use crate::alerts::{Finding, Rules, Sample};
use serde::Deserialize;

#[derive(Clone, Debug, Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct NonFinite {
    pub enabled: bool,
    pub metrics: Vec<String>,
}

impl Default for NonFinite {
    fn default() -> Self {
        NonFinite {
            enabled: true,
            metrics: vec!["loss".into(), "grad_norm".into()],
        }
    }
}

#[derive(Default)]
pub(in crate::alerts) struct State;

impl RecordRule for State {
    fn name(&self) -> &'static str {
        "non_finite"
    }

    fn evidence(&self, rules: &Rules, s: &Sample<'_>) -> bool {
        rules.non_finite.enabled && s.non_finite().iter().any(Option::is_some)
    }

    fn judge(&mut self, j: &Judging<'_>, s: &Sample<'_>, out: &mut Vec<Finding>) {
        let r = &j.rules.non_finite;
        if !r.enabled {
            return;
        }
        for (m, v) in r.metrics.iter().zip(s.non_finite()) {
            if let Some(v) = v.filter(|v| !v.is_finite()) {
                let step = j.step;
                out.push(j.finding("non_finite", v, || format!("{m} is {v} at step {step}")));
                break;
            }
        }
    }
}
