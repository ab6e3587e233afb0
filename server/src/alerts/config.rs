//! Every rule's switches, thresholds and windows, with the defaults that stay quiet on a
//! healthy run with ordinary noise.

use serde::Deserialize;

/// The rules' thresholds, windows and switches (`[rules.*]` in the alerts TOML file).
#[derive(Clone, Debug, Deserialize)]
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

#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Switch {
    pub enabled: bool,
}

impl Default for Switch {
    fn default() -> Self {
        Switch { enabled: true }
    }
}

#[derive(Clone, Debug, Deserialize)]
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

/// A value far above the rolling median: `value > median + mads * MAD` and `> ratio * median`.
#[derive(Clone, Debug, Deserialize)]
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

/// The smoothed value (EMA) exceeds the smoothed value `lookback` points earlier by `factor`.
#[derive(Clone, Debug, Deserialize)]
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

/// `consecutive` values above `factor` times the rolling mean (the reference design's 10x).
#[derive(Clone, Debug, Deserialize)]
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

/// Learning-rate schedule mistakes: no warmup (a jump from ~0 to near the peak in one step,
/// or the first step already at the configured peak when the config asks for warmup), a
/// rise by more than `rise_tolerance` during decay, a reset to `reset_factor` times the
/// previous value when the step count jumps back (a resume).
#[derive(Clone, Debug, Deserialize)]
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

/// Throughput below `fraction` of its rolling median for `consecutive` steps.
#[derive(Clone, Debug, Deserialize)]
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

/// Step time above `factor` times its rolling median for `consecutive` steps, or data wait
/// above `wait_fraction` of the step time for `consecutive` steps.
#[derive(Clone, Debug, Deserialize)]
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

/// Accelerator memory used above `fraction` of its total (`gpuN/mem_used_gb` over
/// `gpuN/mem_total_gb`, as the collectors' system sampler names them).
#[derive(Clone, Debug, Deserialize)]
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

/// Where several ranks of one job report (runs of one project with the same
/// [`RunIdentity::job`](stepstream_protocol::RunIdentity::job)), a rank
/// whose smoothed step time stays above `factor` times the other ranks' median.
#[derive(Clone, Debug, Deserialize)]
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
