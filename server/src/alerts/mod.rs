//! Alert rules, evaluated in the hub on each run's live stream.
//!
//! Each rule keeps a little state per run (rolling windows) and says, per record, whether
//! its condition holds. An alert *fires* when a condition starts holding and *resolves* when
//! it stops; while it holds nothing new is said (de-duplication), and `cooldown_s` keeps a
//! flapping condition from firing again and again. Defaults stay quiet on a healthy run with
//! ordinary noise: rules need a warm-up, compare against robust baselines (median, MAD) and
//! most need several consecutive steps.
//!
//! * `rules` — the rules, one file each: thresholds, per-run state, judging.
//! * `config` — the `[rules]` table that gathers every rule's thresholds.
//! * `sample` — what the rules read of one record, found once per record by metric id.
//! * `window` — the rolling windows the rules compare against.
//! * `custom` — rules made in the page, per project, and their preview on a run's history.
//! * `actions` — what an alert does besides notify (stop, checkpoint, after a grace
//!   period), and which endings of a run are notified.

pub mod actions;
mod config;
pub mod custom;
pub mod rules;
mod sample;
mod window;

pub use config::*;
pub use rules::{
    divergence::Divergence, grad_explosion::GradExplosion, loss_spike::LossSpike,
    lr_schedule::LrSchedule, memory::Memory, non_finite::NonFinite, stalled_data::StalledData,
    straggler::Straggler, throughput::Throughput,
};
use rules::{Judging, RecordRule};
use sample::Lookup;
pub use sample::Sample;
use std::collections::HashMap;

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
pub struct RunRules {
    /// The rules judged on each record, each with its state for this run.
    record: Vec<Box<dyn RecordRule>>,
    straggler: rules::straggler::State,
    /// Rules whose condition holds now, and since which step.
    active: HashMap<&'static str, i64>,
    /// When each rule last resolved (hub clock), for the cooldown.
    resolved_at: HashMap<&'static str, f64>,
    /// The run's config says it warms up.
    pub expects_warmup: bool,
    /// Which rules read each of the run's metrics.
    lookup: Lookup,
}

impl Default for RunRules {
    fn default() -> RunRules {
        RunRules {
            record: rules::every(),
            straggler: Default::default(),
            active: HashMap::new(),
            resolved_at: HashMap::new(),
            expects_warmup: false,
            lookup: Lookup::default(),
        }
    }
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

    /// Conditions that hold at this record: each record rule in turn.
    pub fn judge(&mut self, rules: &Rules, step: i64, s: &Sample<'_>) -> Judged {
        let mut out = Judged::default();
        let judging = Judging {
            rules,
            step,
            active: &self.active,
            expects_warmup: self.expects_warmup,
        };
        for rule in &mut self.record {
            if rule.evidence(rules, s) {
                out.evidence.push(rule.name());
            }
            rule.judge(&judging, s, &mut out.findings);
        }
        out
    }

    /// This rank's smoothed step time, for the other ranks of its job.
    pub fn step_time_ema(&self) -> Option<f64> {
        self.straggler.step_time_ema
    }

    /// Updates this rank's smoothed step time and compares it with the other ranks'.
    pub fn straggler(&mut self, rules: &Rules, values: &[(&str, f64)], others: &[f64]) -> Judged {
        self.straggler_at(rules, &Sample::from_names(rules, values), others)
    }

    /// [`RunRules::straggler`] for a sampled record.
    pub fn straggler_at(&mut self, rules: &Rules, s: &Sample<'_>, others: &[f64]) -> Judged {
        self.straggler.judge(rules, s, others)
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

    /// The stale rule, judged by the hub's status clock, not by records
    /// (`rules/stale.rs`).
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
        rules::stale::event(
            &mut self.active,
            &mut self.resolved_at,
            stale,
            step,
            message,
            now,
        )
    }
}

#[cfg(test)]
mod tests;
