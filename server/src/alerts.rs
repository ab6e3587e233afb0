//! Alert rules, evaluated in the hub on each run's live stream.
//!
//! Each rule keeps a little state per run (rolling windows) and says, per record, whether
//! its condition holds. An alert *fires* when a condition starts holding and *resolves* when
//! it stops; while it holds nothing new is said (de-duplication), and `cooldown_s` keeps a
//! flapping condition from firing again and again. Defaults stay quiet on a healthy run with
//! ordinary noise: rules need a warm-up, compare against robust baselines (median, MAD) and
//! most need several consecutive steps.

use serde::Deserialize;
use std::collections::{HashMap, VecDeque};

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

/// The job a run is one rank of, as the collector sent it: `(project, job)`; `None` for a
/// lone run (no job identity).
pub fn job_of(identity: &stepstream_protocol::RunIdentity) -> Option<(String, String)> {
    (!identity.job.is_empty()).then(|| (identity.project.clone(), identity.job.clone()))
}

/// What a rule says about one record.
#[derive(Clone, Debug, PartialEq)]
pub struct Finding {
    pub rule: &'static str,
    pub value: f64,
    pub message: String,
}

/// A change of an alert's state.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    Fired {
        rule: &'static str,
        step: i64,
        value: f64,
        message: String,
    },
    Resolved {
        rule: &'static str,
        step: i64,
        message: String,
    },
}

fn median(values: impl Iterator<Item = f64>) -> Option<f64> {
    let mut v: Vec<f64> = values.filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

/// A bounded window of recent finite values, with its median and MAD recomputed every
/// [`REFRESH`] values (a sort per record would cost the hub more than storing it).
#[derive(Default, Debug)]
struct Window {
    values: VecDeque<f64>,
    seen: usize,
    stale: usize,
    cached: Option<(f64, f64)>,
}

const REFRESH: usize = 16;

impl Window {
    fn push(&mut self, v: f64, cap: usize) {
        self.seen += 1;
        if v.is_finite() {
            self.values.push_back(v);
            while self.values.len() > cap.max(1) {
                self.values.pop_front();
            }
            self.stale += 1;
        }
    }

    /// Median and median absolute deviation of the window.
    fn stats(&mut self) -> Option<(f64, f64)> {
        if self.cached.is_none() || self.stale >= REFRESH {
            self.stale = 0;
            self.cached = median(self.values.iter().copied()).map(|m| {
                let mad = median(self.values.iter().map(|v| (v - m).abs())).unwrap_or(0.0);
                (m, mad)
            });
        }
        self.cached
    }

    fn median(&mut self) -> Option<f64> {
        self.stats().map(|(m, _)| m)
    }

    fn mean(&self) -> Option<f64> {
        (!self.values.is_empty())
            .then(|| self.values.iter().sum::<f64>() / self.values.len() as f64)
    }
}

/// Per-run rule state.
#[derive(Default)]
pub struct RunRules {
    spike: Window,
    ema: Option<f64>,
    ema_history: VecDeque<f64>,
    diverge_seen: usize,
    diverging: usize,
    grad: Window,
    grad_over: usize,
    lr_last: Option<(i64, f64)>,
    lr_peak: f64,
    lr_decaying: bool,
    /// A jump from ~0 (step, from, to), confirmed as "no warmup" if the rate then stops rising.
    lr_jump: Option<(i64, f64, f64)>,
    throughput: HashMap<String, (Window, usize)>,
    step_times: Window,
    slow_steps: usize,
    waiting_steps: usize,
    /// Smoothed step time, shared with the other ranks of the job.
    pub step_time_ema: Option<f64>,
    step_time_seen: usize,
    straggling: usize,
    /// Rules whose condition holds now, and since which step.
    active: HashMap<&'static str, i64>,
    /// When each rule last resolved (hub clock), for the cooldown.
    resolved_at: HashMap<&'static str, f64>,
    /// The run's config says it warms up.
    pub expects_warmup: bool,
}

impl RunRules {
    pub fn new(config_json: &str) -> RunRules {
        let expects_warmup = serde_json::from_str::<serde_json::Value>(config_json)
            .ok()
            .and_then(|c| {
                let obj = c.as_object()?.clone();
                obj.iter()
                    .find(|(k, _)| k.to_ascii_lowercase().contains("warmup"))
                    .and_then(|(_, v)| v.as_f64())
            })
            .is_some_and(|w| w > 0.0);
        RunRules {
            expects_warmup,
            ..RunRules::default()
        }
    }

    /// Conditions that hold at this record.
    pub fn findings(&mut self, rules: &Rules, step: i64, values: &[(&str, f64)]) -> Vec<Finding> {
        let get = |name: &str| values.iter().find(|(n, _)| *n == name).map(|(_, v)| *v);
        let mut out = Vec::new();
        if rules.non_finite.enabled {
            for m in &rules.non_finite.metrics {
                if let Some(v) = get(m).filter(|v| !v.is_finite()) {
                    out.push(Finding {
                        rule: "non_finite",
                        value: v,
                        message: format!("{m} is {v} at step {step}"),
                    });
                    break;
                }
            }
        }
        let r = &rules.loss_spike;
        if let Some(v) = get(&r.metric).filter(|_| r.enabled) {
            if self.spike.seen >= r.warmup_steps && v.is_finite() {
                if let Some((m, mad)) = self.spike.stats() {
                    let mad = mad.max(m.abs() * 1e-3);
                    if v > m + r.mads * mad && v > r.min_ratio * m {
                        out.push(Finding {
                            rule: "loss_spike",
                            value: v,
                            message: format!(
                                "{} {v:.4} at step {step} is far above its recent median {m:.4}",
                                r.metric
                            ),
                        });
                    }
                }
            }
            self.spike.push(v, r.window);
        }
        let r = &rules.divergence;
        if let Some(v) = get(&r.metric).filter(|v| r.enabled && v.is_finite()) {
            let alpha = 2.0 / (r.smoothing.max(1) as f64 + 1.0);
            let ema = self.ema.map_or(v, |e| e + alpha * (v - e));
            self.ema = Some(ema);
            self.diverge_seen += 1;
            self.ema_history.push_back(ema);
            while self.ema_history.len() > r.lookback.max(1) + 1 {
                self.ema_history.pop_front();
            }
            let before = self.ema_history[0];
            let up = self.diverge_seen >= r.warmup_steps
                && self.ema_history.len() > r.lookback
                && before > 0.0
                && ema > r.factor * before;
            self.diverging = if up { self.diverging + 1 } else { 0 };
            if self.diverging >= r.consecutive {
                {
                    out.push(Finding {
                        rule: "divergence",
                        value: v,
                        message: format!(
                            "{} is trending up: smoothed {ema:.4} vs {before:.4} {} points earlier",
                            r.metric, r.lookback
                        ),
                    });
                }
            }
        }
        let r = &rules.grad_explosion;
        if let Some(v) = get(&r.metric).filter(|v| r.enabled && v.is_finite()) {
            let over = self.grad.seen >= r.warmup_steps
                && self
                    .grad
                    .mean()
                    .is_some_and(|m| m > 0.0 && v > r.factor * m);
            self.grad_over = if over { self.grad_over + 1 } else { 0 };
            if self.grad_over >= r.consecutive {
                let mean = self.grad.mean().unwrap_or(0.0);
                out.push(Finding {
                    rule: "grad_explosion",
                    value: v,
                    message: format!(
                        "{} {v:.4} has been above {:.0}x its rolling mean ({mean:.4}) for {} steps",
                        r.metric, r.factor, self.grad_over
                    ),
                });
            }
            // Exploded values stay out of the baseline they are judged against.
            if !over {
                self.grad.push(v, r.window);
            }
        }
        let r = &rules.lr_schedule;
        if let Some(lr) = get(&r.metric).filter(|v| r.enabled && v.is_finite()) {
            if let Some(f) = self.lr_finding(r, step, lr) {
                out.push(f);
            }
        }
        let r = &rules.throughput;
        if r.enabled {
            for m in &r.metrics {
                let Some(v) = get(m).filter(|v| v.is_finite()) else {
                    continue;
                };
                let (w, low) = self.throughput.entry(m.clone()).or_default();
                let is_low =
                    w.seen >= r.warmup_steps && w.median().is_some_and(|med| v < r.fraction * med);
                *low = if is_low { *low + 1 } else { 0 };
                if *low >= r.consecutive {
                    out.push(Finding {
                        rule: "throughput_drop",
                        value: v,
                        message: format!(
                            "{m} {v:.1} is below {:.0}% of its recent median {:.1}",
                            r.fraction * 100.0,
                            w.median().unwrap_or(0.0)
                        ),
                    });
                }
                if !is_low {
                    w.push(v, r.window);
                }
            }
        }
        let r = &rules.stalled_data;
        if let Some(t) = get(&r.step_time).filter(|v| r.enabled && v.is_finite() && *v > 0.0) {
            let slow = self.step_times.seen >= r.warmup_steps
                && self.step_times.median().is_some_and(|m| t > r.factor * m);
            self.slow_steps = if slow { self.slow_steps + 1 } else { 0 };
            let waiting = get(&r.data_wait).is_some_and(|w| w > r.wait_fraction * t);
            self.waiting_steps = if waiting { self.waiting_steps + 1 } else { 0 };
            if self.slow_steps >= r.consecutive || self.waiting_steps >= r.consecutive {
                let why = if self.waiting_steps >= r.consecutive {
                    "waiting for data takes most of the step".to_string()
                } else {
                    format!(
                        "step time {t:.3} s is {:.0}x its recent median",
                        t / self.step_times.median().unwrap_or(t)
                    )
                };
                out.push(Finding {
                    rule: "stalled_data",
                    value: t,
                    message: format!("data pipeline stalled at step {step}: {why}"),
                });
            }
            if !slow {
                self.step_times.push(t, r.window);
            }
        }
        if rules.memory.enabled {
            for (name, used) in values.iter().filter(|(n, _)| n.ends_with("/mem_used_gb")) {
                let prefix = name.trim_end_matches("/mem_used_gb");
                let total = get(&format!("{prefix}/mem_total_gb"));
                if let Some(total) = total.filter(|t| *t > 0.0) {
                    if *used > rules.memory.fraction * total {
                        out.push(Finding {
                            rule: "memory",
                            value: *used,
                            message: format!("{prefix} memory {used:.1} of {total:.1} GB in use"),
                        });
                        break;
                    }
                }
            }
        }
        out
    }

    /// Updates this rank's smoothed step time and compares it with the other ranks'.
    pub fn straggler(
        &mut self,
        rules: &Rules,
        values: &[(&str, f64)],
        others: &[f64],
    ) -> Option<Finding> {
        let r = &rules.straggler;
        let t = values
            .iter()
            .find(|(n, _)| *n == r.metric)
            .map(|(_, v)| *v)?;
        if !r.enabled || !t.is_finite() {
            return None;
        }
        self.step_time_seen += 1;
        let ema = self.step_time_ema.map_or(t, |e| e + 0.1 * (t - e));
        self.step_time_ema = Some(ema);
        let median = median(others.iter().copied())?;
        let slow = self.step_time_seen >= r.warmup_steps && median > 0.0 && ema > r.factor * median;
        self.straggling = if slow { self.straggling + 1 } else { 0 };
        (self.straggling >= r.consecutive).then(|| Finding {
            rule: "straggler",
            value: ema,
            message: format!(
                "this rank's {} ({ema:.3} s) is {:.1}x the other ranks' median ({median:.3} s)",
                r.metric,
                ema / median
            ),
        })
    }

    fn lr_finding(&mut self, r: &LrSchedule, step: i64, lr: f64) -> Option<Finding> {
        let previous = self.lr_last.replace((step, lr));
        let finding = |message: String| {
            Some(Finding {
                rule: "lr_schedule",
                value: lr,
                message,
            })
        };
        let Some((prev_step, prev)) = previous else {
            self.lr_peak = lr;
            return None;
        };
        let peak_before = self.lr_peak;
        self.lr_peak = self.lr_peak.max(lr);
        if step <= prev_step && lr > r.reset_factor * prev && prev > 0.0 {
            return finding(format!(
                "learning rate reset to {lr:.3e} at step {step} after a resume (was {prev:.3e} at step {prev_step})"
            ));
        }
        if prev_step <= 1
            && self.expects_warmup
            && prev > 0.0
            && lr <= prev * 1.0001
            && lr >= peak_before
        {
            // The first two steps already at the top although the config warms up.
            return finding(format!(
                "no warmup: the learning rate starts at its peak {prev:.3e} though the config asks for warmup"
            ));
        }
        if let Some((at, from, to)) = self.lr_jump.take() {
            // A warmup that starts at 0 also jumps by a large factor at first, but keeps
            // rising; a missing warmup lands on the peak and stays there.
            if lr <= to * (1.0 + r.rise_tolerance) {
                return finding(format!(
                    "no warmup: the learning rate jumped from {from:.3e} to {to:.3e} in one step (step {at})"
                ));
            }
        }
        if prev <= lr / r.jump_factor && step - prev_step == 1 && prev_step < 10 {
            self.lr_jump = Some((step, prev, lr));
        }
        if lr < prev * (1.0 - 1e-9) {
            self.lr_decaying = true;
        } else if self.lr_decaying && lr > prev * (1.0 + r.rise_tolerance) && step > prev_step {
            return finding(format!(
                "learning rate rose from {prev:.3e} to {lr:.3e} during decay (step {step})"
            ));
        }
        None
    }

    /// Turns this record's findings into fired/resolved events, with de-duplication and the
    /// cooldown. `now` is the hub's clock.
    pub fn events(
        &mut self,
        rules: &Rules,
        step: i64,
        findings: Vec<Finding>,
        now: f64,
    ) -> Vec<Event> {
        let mut events = Vec::new();
        let holding: Vec<&'static str> = findings.iter().map(|f| f.rule).collect();
        for f in findings {
            if self.active.contains_key(f.rule) {
                continue;
            }
            if self
                .resolved_at
                .get(f.rule)
                .is_some_and(|t| now - t < rules.cooldown_s)
            {
                continue;
            }
            self.active.insert(f.rule, step);
            events.push(Event::Fired {
                rule: f.rule,
                step,
                value: f.value,
                message: f.message,
            });
        }
        // Rules judged on a single record (non-finite, spikes) resolve on the next record
        // where they no longer hold; the state-based ones likewise.
        let ended: Vec<&'static str> = self
            .active
            .keys()
            .copied()
            .filter(|rule| !holding.contains(rule) && *rule != "stale")
            .collect();
        for rule in ended {
            let since = self.active.remove(rule).unwrap_or(step);
            self.resolved_at.insert(rule, now);
            events.push(Event::Resolved {
                rule,
                step,
                message: format!("{rule} cleared at step {step} (fired at step {since})"),
            });
        }
        events
    }

    /// The stale rule is judged by the hub's status clock, not by records.
    pub fn stale(
        &mut self,
        rules: &Rules,
        stale: bool,
        step: i64,
        message: &str,
        now: f64,
    ) -> Option<Event> {
        if !rules.stale.enabled {
            return None;
        }
        match (stale, self.active.contains_key("stale")) {
            (true, false) => {
                self.active.insert("stale", step);
                Some(Event::Fired {
                    rule: "stale",
                    step,
                    value: 0.0,
                    message: message.to_string(),
                })
            }
            (false, true) => {
                self.active.remove("stale");
                self.resolved_at.insert("stale", now);
                Some(Event::Resolved {
                    rule: "stale",
                    step,
                    message: "the run is sending again".to_string(),
                })
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic noise in [-1, 1].
    fn noise(i: i64) -> f64 {
        let x = (i as u64)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(17);
        (x % 20_001) as f64 / 10_000.0 - 1.0
    }

    struct Step {
        step: i64,
        values: Vec<(&'static str, f64)>,
    }

    /// A healthy run: decaying noisy loss, warmup + cosine lr, noisy grad norm, steady
    /// throughput, with a config that says it warms up.
    fn healthy(n: i64) -> Vec<Step> {
        (1..=n)
            .map(|s| {
                let t = s as f64;
                let lr = if s <= 100 {
                    1e-3 * t / 100.0
                } else {
                    1e-3 * 0.5
                        * (1.0 + (std::f64::consts::PI * (t - 100.0) / (n as f64 - 100.0)).cos())
                };
                Step {
                    step: s,
                    values: vec![
                        ("loss", 2.0 * (-t / 800.0).exp() + 0.3 + 0.05 * noise(s)),
                        ("lr", lr),
                        ("grad_norm", 1.0 + 0.3 * noise(s + 7)),
                        ("samples_per_sec", 200.0 * (1.0 + 0.1 * noise(s + 13))),
                        ("step_time", 0.05 * (1.0 + 0.2 * noise(s + 17))),
                        ("data_wait", 0.005 * (1.0 + noise(s + 19).abs())),
                    ],
                }
            })
            .collect()
    }

    /// Replays steps; returns the fired events as (rule, step).
    fn replay(steps: &[Step], config: &str) -> Vec<(&'static str, i64)> {
        let rules = Rules::default();
        let mut state = RunRules::new(config);
        let mut fired = Vec::new();
        for (i, s) in steps.iter().enumerate() {
            let f = state.findings(&rules, s.step, &s.values);
            for e in state.events(&rules, s.step, f, i as f64) {
                if let Event::Fired { rule, step, .. } = e {
                    fired.push((rule, step));
                }
            }
        }
        fired
    }

    fn set(steps: &mut [Step], from: i64, to: i64, metric: &str, f: impl Fn(i64, f64) -> f64) {
        for s in steps.iter_mut().filter(|s| (from..=to).contains(&s.step)) {
            for v in s.values.iter_mut().filter(|(n, _)| *n == metric) {
                v.1 = f(s.step, v.1);
            }
        }
    }

    const CONFIG: &str = r#"{"lr": 0.001, "warmup_steps": 100}"#;

    #[test]
    fn healthy_noisy_runs_fire_nothing() {
        assert_eq!(replay(&healthy(3000), CONFIG), vec![]);
        // Also a run without warmup in its config, and a short one.
        let mut flat = healthy(500);
        set(&mut flat, 1, 500, "lr", |_, _| 1e-3);
        assert_eq!(replay(&flat, "{}"), vec![]);
    }

    #[test]
    fn nan_fires_at_once() {
        let mut s = healthy(400);
        set(&mut s, 250, 250, "loss", |_, _| f64::NAN);
        assert_eq!(replay(&s, CONFIG), vec![("non_finite", 250)]);
    }

    #[test]
    fn a_spike_fires_at_its_step() {
        let mut s = healthy(400);
        set(&mut s, 300, 300, "loss", |_, v| v * 6.0);
        assert_eq!(replay(&s, CONFIG), vec![("loss_spike", 300)]);
    }

    #[test]
    fn divergence_fires_on_a_trend_not_a_step() {
        let mut s = healthy(1200);
        set(&mut s, 600, 1200, "loss", |step, v| {
            v * (1.0 + (step - 600) as f64 * 0.01)
        });
        let fired = replay(&s, CONFIG);
        assert_eq!(fired.len(), 1, "{fired:?}");
        assert_eq!(fired[0].0, "divergence");
        assert!((640..760).contains(&fired[0].1), "{fired:?}");
    }

    #[test]
    fn ten_x_grad_norm_fires_after_consecutive_steps() {
        let mut s = healthy(400);
        set(&mut s, 200, 260, "grad_norm", |_, v| v * 15.0);
        assert_eq!(replay(&s, CONFIG), vec![("grad_explosion", 202)]);
    }

    #[test]
    fn missing_warmup_and_lr_reset_on_resume() {
        let mut s = healthy(400);
        // Warmup configured but the lr starts at its peak.
        set(&mut s, 1, 100, "lr", |_, _| 1e-3);
        assert_eq!(replay(&s, CONFIG), vec![("lr_schedule", 2)]);

        // A jump from ~0 to the peak in one step.
        let mut s = healthy(400);
        set(&mut s, 1, 1, "lr", |_, _| 1e-9);
        set(&mut s, 2, 100, "lr", |_, _| 1e-3);
        assert_eq!(replay(&s, "{}"), vec![("lr_schedule", 3)]);
        // A warmup that starts at exactly 0 is fine.
        let mut s = healthy(400);
        set(&mut s, 1, 1, "lr", |_, _| 0.0);
        assert_eq!(replay(&s, "{}"), vec![]);

        // A resume at step 300 that restarts the schedule at the peak.
        let mut s = healthy(600);
        let mut resumed: Vec<Step> = healthy(600).into_iter().filter(|x| x.step > 250).collect();
        for r in resumed.iter_mut() {
            for v in r.values.iter_mut().filter(|(n, _)| *n == "lr") {
                v.1 = 1e-3;
            }
        }
        s.truncate(400);
        s.extend(resumed);
        assert_eq!(replay(&s, CONFIG).first(), Some(&("lr_schedule", 251)));
    }

    #[test]
    fn throughput_collapse_and_stalled_data() {
        let mut s = healthy(400);
        set(&mut s, 300, 400, "samples_per_sec", |_, _| 50.0);
        assert_eq!(replay(&s, CONFIG), vec![("throughput_drop", 309)]);
        let mut s = healthy(400);
        set(&mut s, 300, 320, "step_time", |_, _| 1.5);
        assert_eq!(replay(&s, CONFIG), vec![("stalled_data", 309)]);
    }

    #[test]
    fn accelerator_memory_near_its_limit() {
        let rules = Rules::default();
        let mut st = RunRules::new("{}");
        let ok = [("gpu0/mem_used_gb", 70.0), ("gpu0/mem_total_gb", 80.0)];
        assert!(st.findings(&rules, 1, &ok).is_empty());
        let full = [("gpu0/mem_used_gb", 79.5), ("gpu0/mem_total_gb", 80.0)];
        let f = st.findings(&rules, 2, &full);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].rule, "memory");
        assert!(f[0].message.contains("gpu0"));
    }

    #[test]
    fn straggler_needs_a_persistently_slower_rank() {
        let rules = Rules::default();
        let mut id = stepstream_protocol::RunIdentity {
            run_id: stepstream_protocol::RunId::new("r3").unwrap(),
            project: "p".into(),
            name: "llama-rank3".into(),
            config_json: "{}".into(),
            host: "h".into(),
            rank: 3,
            world_size: 4,
            job: String::new(),
            framework: String::new(),
            started_at: 0.0,
        };
        // A name suffix is not a job: only the identity the collector sent groups ranks.
        assert_eq!(job_of(&id), None);
        id.job = "torchrun-42".into();
        assert_eq!(job_of(&id), Some(("p".into(), "torchrun-42".into())));
        let mut fast = RunRules::new("{}");
        let mut slow = RunRules::new("{}");
        let mut fired = None;
        for step in 0..200i64 {
            let t = 0.1 * (1.0 + 0.1 * noise(step));
            assert!(fast
                .straggler(&rules, &[("step_time", t)], &[0.1, 0.1, 0.1])
                .is_none());
            if slow
                .straggler(&rules, &[("step_time", 2.0 * t)], &[0.1, 0.1, 0.1])
                .is_some()
                && fired.is_none()
            {
                fired = Some(step);
            }
        }
        assert!(fired.is_some_and(|s| s < 60), "{fired:?}");
    }

    #[test]
    fn dedup_resolve_and_cooldown() {
        let rules = Rules::default();
        let mut st = RunRules::new("{}");
        let nan = |s| vec![("loss", if s < 0 { 1.0 } else { f64::NAN })];
        let mut all = Vec::new();
        for (i, step) in [1, 2, 3].iter().enumerate() {
            let f = st.findings(&rules, *step, &nan(*step));
            all.extend(st.events(&rules, *step, f, i as f64));
        }
        assert_eq!(all.len(), 1, "fires once while it holds: {all:?}");
        let f = st.findings(&rules, 4, &nan(-1));
        let e = st.events(&rules, 4, f, 10.0);
        assert!(matches!(
            e[0],
            Event::Resolved {
                rule: "non_finite",
                step: 4,
                ..
            }
        ));
        // Within the cooldown it does not fire again.
        let f = st.findings(&rules, 5, &nan(5));
        assert!(st.events(&rules, 5, f, 20.0).is_empty());
    }
}
