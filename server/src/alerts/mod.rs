//! Alert rules, evaluated in the hub on each run's live stream.
//!
//! Each rule keeps a little state per run (rolling windows) and says, per record, whether
//! its condition holds. An alert *fires* when a condition starts holding and *resolves* when
//! it stops; while it holds nothing new is said (de-duplication), and `cooldown_s` keeps a
//! flapping condition from firing again and again. Defaults stay quiet on a healthy run with
//! ordinary noise: rules need a warm-up, compare against robust baselines (median, MAD) and
//! most need several consecutive steps.
//!
//! * `config` — every rule's switches and thresholds (`[rules.*]` in the alerts file).
//! * `sample` — what the rules read of one record, found once per record by metric id.
//! * `window` — the rolling windows the rules compare against.

mod config;
mod sample;
mod window;

pub use config::*;
pub use sample::Sample;
use sample::{Lookup, DATA_WAIT, DIVERGENCE, GRAD, LR, SPIKE, STEP_TIME, STRAGGLER};
use std::collections::{HashMap, VecDeque};
use window::{median, Window};

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

/// What the rules say about one record: the findings (conditions that hold) and the rules
/// the record was evidence for (it carried their metric). An active alert resolves only on
/// evidence: a system sample says nothing about the loss, a training record nothing about
/// memory.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Judged {
    pub findings: Vec<Finding>,
    /// Inline: every record is evidence for several rules, and there are fewer rules than
    /// its capacity, so judging a record allocates nothing for it.
    pub evidence: smallvec::SmallVec<[&'static str; 12]>,
}

/// A finding's message, written only when its rule is not firing already: a condition that
/// holds for many records in a row is judged on each, and `events` drops the findings of a
/// firing rule, so formatting each one would be spent for nothing.
fn say(
    active: &HashMap<&'static str, i64>,
    rule: &str,
    message: impl FnOnce() -> String,
) -> String {
    if active.contains_key(rule) {
        String::new()
    } else {
        message()
    }
}

impl Judged {
    pub fn merge(&mut self, other: Judged) {
        self.findings.extend(other.findings);
        self.evidence.extend(other.evidence);
    }
}

impl std::ops::Deref for Judged {
    type Target = [Finding];
    fn deref(&self) -> &[Finding] {
        &self.findings
    }
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
    /// Per `rules.throughput.metrics`, in order: its window and low steps in a row.
    throughput: Vec<(Window, usize)>,
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
    /// Which rules read each of the run's metrics.
    lookup: Lookup,
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

    /// The rules firing now, sorted.
    pub fn firing(&self) -> Vec<&'static str> {
        let mut rules: Vec<&'static str> = self.active.keys().copied().collect();
        rules.sort_unstable();
        rules
    }

    /// Conditions that hold at this record, given by metric names.
    pub fn findings(&mut self, rules: &Rules, step: i64, values: &[(&str, f64)]) -> Judged {
        self.judge(rules, step, &Sample::from_names(rules, values))
    }

    /// Fills `out` with `record` as the rules read it; `metrics` is the run's table.
    pub fn sample<'a>(
        &mut self,
        rules: &Rules,
        metrics: &'a [stepstream_protocol::MetricDef],
        record: &stepstream_protocol::StepRecord,
        out: &mut Sample<'a>,
    ) {
        self.lookup.refresh(rules, metrics);
        out.fill(rules, &self.lookup, metrics, record);
    }

    /// Conditions that hold at this record.
    pub fn judge(&mut self, rules: &Rules, step: i64, s: &Sample<'_>) -> Judged {
        let mut out = Judged::default();
        let seen = |rule: &'static str, present: bool, out: &mut Judged| {
            if present {
                out.evidence.push(rule);
            }
        };
        if rules.non_finite.enabled {
            let present = s.non_finite().iter().any(Option::is_some);
            seen("non_finite", present, &mut out);
            for (m, v) in rules.non_finite.metrics.iter().zip(s.non_finite()) {
                if let Some(v) = v.filter(|v| !v.is_finite()) {
                    out.findings.push(Finding {
                        rule: "non_finite",
                        value: v,
                        message: say(&self.active, "non_finite", || {
                            format!("{m} is {v} at step {step}")
                        }),
                    });
                    break;
                }
            }
        }
        let r = &rules.loss_spike;
        seen("loss_spike", r.enabled && s.get(SPIKE).is_some(), &mut out);
        seen(
            "divergence",
            rules.divergence.enabled && s.get(DIVERGENCE).is_some(),
            &mut out,
        );
        seen(
            "grad_explosion",
            rules.grad_explosion.enabled && s.get(GRAD).is_some(),
            &mut out,
        );
        seen(
            "lr_schedule",
            rules.lr_schedule.enabled && s.get(LR).is_some(),
            &mut out,
        );
        seen(
            "throughput_drop",
            rules.throughput.enabled && s.throughput().iter().any(Option::is_some),
            &mut out,
        );
        seen(
            "stalled_data",
            rules.stalled_data.enabled && s.get(STEP_TIME).is_some(),
            &mut out,
        );
        seen(
            "memory",
            rules.memory.enabled && s.carries_memory(),
            &mut out,
        );
        if let Some(v) = s.get(SPIKE).filter(|_| r.enabled) {
            if self.spike.seen >= r.warmup_steps && v.is_finite() {
                if let Some((m, mad)) = self.spike.stats() {
                    let mad = mad.max(m.abs() * 1e-3);
                    if v > m + r.mads * mad && v > r.min_ratio * m {
                        out.findings.push(Finding {
                            rule: "loss_spike",
                            value: v,
                            message: say(&self.active, "loss_spike", || {
                                format!(
                                "{} {v:.4} at step {step} is far above its recent median {m:.4}",
                                r.metric
                            )
                            }),
                        });
                    }
                }
            }
            self.spike.push(v, r.window);
        }
        let r = &rules.divergence;
        if let Some(v) = s.get(DIVERGENCE).filter(|v| r.enabled && v.is_finite()) {
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
                    out.findings.push(Finding {
                        rule: "divergence",
                        value: v,
                        message: say(&self.active, "divergence", || {
                            format!(
                            "{} is trending up: smoothed {ema:.4} vs {before:.4} {} points earlier",
                            r.metric, r.lookback
                        )
                        }),
                    });
                }
            }
        }
        let r = &rules.grad_explosion;
        if let Some(v) = s.get(GRAD).filter(|v| r.enabled && v.is_finite()) {
            let over = self.grad.seen >= r.warmup_steps
                && self
                    .grad
                    .mean()
                    .is_some_and(|m| m > 0.0 && v > r.factor * m);
            self.grad_over = if over { self.grad_over + 1 } else { 0 };
            if self.grad_over >= r.consecutive {
                let mean = self.grad.mean().unwrap_or(0.0);
                out.findings.push(Finding {
                    rule: "grad_explosion",
                    value: v,
                    message: say(&self.active, "grad_explosion", || {
                        format!(
                        "{} {v:.4} has been above {:.0}x its rolling mean ({mean:.4}) for {} steps",
                        r.metric, r.factor, self.grad_over
                    )
                    }),
                });
            }
            // Exploded values stay out of the baseline they are judged against.
            if !over {
                self.grad.push(v, r.window);
            }
        }
        let r = &rules.lr_schedule;
        if let Some(lr) = s.get(LR).filter(|v| r.enabled && v.is_finite()) {
            if let Some(f) = self.lr_finding(r, step, lr) {
                out.findings.push(f);
            }
        }
        let r = &rules.throughput;
        if r.enabled {
            if self.throughput.len() < r.metrics.len() {
                self.throughput
                    .resize_with(r.metrics.len(), Default::default);
            }
            for ((m, v), (w, low)) in r
                .metrics
                .iter()
                .zip(s.throughput())
                .zip(&mut self.throughput)
            {
                let Some(v) = v.filter(|v| v.is_finite()) else {
                    continue;
                };
                let is_low =
                    w.seen >= r.warmup_steps && w.median().is_some_and(|med| v < r.fraction * med);
                *low = if is_low { *low + 1 } else { 0 };
                if *low >= r.consecutive {
                    out.findings.push(Finding {
                        rule: "throughput_drop",
                        value: v,
                        message: say(&self.active, "throughput_drop", || {
                            format!(
                                "{m} {v:.1} is below {:.0}% of its recent median {:.1}",
                                r.fraction * 100.0,
                                w.median().unwrap_or(0.0)
                            )
                        }),
                    });
                }
                if !is_low {
                    w.push(v, r.window);
                }
            }
        }
        let r = &rules.stalled_data;
        if let Some(t) = s
            .get(STEP_TIME)
            .filter(|v| r.enabled && v.is_finite() && *v > 0.0)
        {
            let slow = self.step_times.seen >= r.warmup_steps
                && self.step_times.median().is_some_and(|m| t > r.factor * m);
            self.slow_steps = if slow { self.slow_steps + 1 } else { 0 };
            let waiting = s.get(DATA_WAIT).is_some_and(|w| w > r.wait_fraction * t);
            self.waiting_steps = if waiting { self.waiting_steps + 1 } else { 0 };
            if self.slow_steps >= r.consecutive || self.waiting_steps >= r.consecutive {
                let waited = self.waiting_steps >= r.consecutive;
                let median = self.step_times.median().unwrap_or(t);
                out.findings.push(Finding {
                    rule: "stalled_data",
                    value: t,
                    message: say(&self.active, "stalled_data", || {
                        let why = if waited {
                            "waiting for data takes most of the step".to_string()
                        } else {
                            format!("step time {t:.3} s is {:.0}x its recent median", t / median)
                        };
                        format!("data pipeline stalled at step {step}: {why}")
                    }),
                });
            }
            if !slow {
                self.step_times.push(t, r.window);
            }
        }
        if rules.memory.enabled {
            for (prefix, used, total) in s.memory() {
                if let Some(total) = total.filter(|t| *t > 0.0) {
                    if used > rules.memory.fraction * total {
                        out.findings.push(Finding {
                            rule: "memory",
                            value: used,
                            message: say(&self.active, "memory", || {
                                format!("{prefix} memory {used:.1} of {total:.1} GB in use")
                            }),
                        });
                        break;
                    }
                }
            }
        }
        out
    }

    /// Updates this rank's smoothed step time and compares it with the other ranks'.
    pub fn straggler(&mut self, rules: &Rules, values: &[(&str, f64)], others: &[f64]) -> Judged {
        self.straggler_at(rules, &Sample::from_names(rules, values), others)
    }

    /// [`RunRules::straggler`] for a sampled record.
    pub fn straggler_at(&mut self, rules: &Rules, s: &Sample<'_>, others: &[f64]) -> Judged {
        let r = &rules.straggler;
        let mut out = Judged::default();
        let Some(t) = s.get(STRAGGLER) else {
            return out;
        };
        if !r.enabled || !t.is_finite() {
            return out;
        }
        out.evidence.push("straggler");
        self.step_time_seen += 1;
        let ema = self.step_time_ema.map_or(t, |e| e + 0.1 * (t - e));
        self.step_time_ema = Some(ema);
        let Some(median) = median(others.iter().copied()) else {
            return out;
        };
        let slow = self.step_time_seen >= r.warmup_steps && median > 0.0 && ema > r.factor * median;
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
        if prev <= lr / r.jump_factor && step.checked_sub(prev_step) == Some(1) && prev_step < 10 {
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
    pub fn events(&mut self, rules: &Rules, step: i64, judged: Judged, now: f64) -> Vec<Event> {
        let mut events = Vec::new();
        let holding: Vec<&'static str> = judged.findings.iter().map(|f| f.rule).collect();
        let evidence = judged.evidence;
        for f in judged.findings {
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
        // A rule resolves on the next record that carries its metric and where it no longer
        // holds; a record without its metric says nothing about it.
        let ended: Vec<&'static str> = self
            .active
            .keys()
            .copied()
            .filter(|rule| !holding.contains(rule) && evidence.contains(rule))
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
mod tests;
