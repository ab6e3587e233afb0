//! The `[rules]` table of the alerts file: every rule's table (each defined beside its rule
//! in `rules/`, with the defaults that stay quiet on a healthy run with ordinary noise) and
//! the cooldown they share.

use super::{
    Divergence, GradExplosion, LossSpike, LrSchedule, Memory, NonFinite, StalledData, Straggler,
    Throughput,
};
use serde::Deserialize;

/// The rules' thresholds, windows and switches (`[rules.*]` in the alerts TOML file).
#[derive(Clone, Debug, Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Rules {
    pub non_finite: NonFinite,
    pub loss_spike: LossSpike,
    pub divergence: Divergence,
    pub grad_explosion: GradExplosion,
    pub lr_schedule: LrSchedule,
    pub throughput: Throughput,
    pub stalled_data: StalledData,
    pub memory: Memory,
    pub straggler: Straggler,
    pub stale: Switch,
    /// Seconds before the same rule may fire again for the same run after it resolved.
    pub cooldown_s: f64,
}

impl Default for Rules {
    fn default() -> Self {
        Rules {
            non_finite: NonFinite::default(),
            loss_spike: LossSpike::default(),
            divergence: Divergence::default(),
            grad_explosion: GradExplosion::default(),
            lr_schedule: LrSchedule::default(),
            throughput: Throughput::default(),
            stalled_data: StalledData::default(),
            memory: Memory::default(),
            straggler: Straggler::default(),
            stale: Switch { enabled: true },
            cooldown_s: 300.0,
        }
    }
}

#[derive(Clone, Debug, Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Switch {
    pub enabled: bool,
}

impl Default for Switch {
    fn default() -> Self {
        Switch { enabled: true }
    }
}
