//! `memory`: an accelerator's memory nearly full.

use super::{Judging, RecordRule};
use crate::alerts::{Finding, Rules, Sample};
use serde::Deserialize;

/// Accelerator memory used above `fraction` of its total (`gpuN/mem_used_gb` over
/// `gpuN/mem_total_gb`, as the collectors' system sampler names them).
#[derive(Clone, Debug, Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Memory {
    pub enabled: bool,
    pub fraction: f64,
}

impl Default for Memory {
    fn default() -> Self {
        Memory {
            enabled: true,
            fraction: 0.95,
        }
    }
}

#[derive(Default)]
pub(in crate::alerts) struct State;

impl RecordRule for State {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn evidence(&self, rules: &Rules, s: &Sample<'_>) -> bool {
        rules.memory.enabled && s.carries_memory()
    }

    fn judge(&mut self, j: &Judging<'_>, s: &Sample<'_>, out: &mut Vec<Finding>) {
        let r = &j.rules.memory;
        if !r.enabled {
            return;
        }
        for (prefix, used, total) in s.memory() {
            if let Some(total) = total.filter(|t| *t > 0.0) {
                if used > r.fraction * total {
                    out.push(j.finding("memory", used, || {
                        format!("{prefix} memory {used:.1} of {total:.1} GB in use")
                    }));
                    break;
                }
            }
        }
    }
}
