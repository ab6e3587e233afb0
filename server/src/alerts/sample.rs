//! What the rules read of one record: each rule's metric, found once per record.
//!
//! Which rules read a metric is decided once per metric name ([`Roles::of`]); a run keeps
//! those decisions for its metric table ([`Lookup`]), so judging a record is one pass over
//! its values by id, with no name compared (comparing every rule's metric name against
//! every value was a third of the hub's CPU at full ingest).

use super::Rules;
use stepstream_protocol::{MetricDef, StepRecord};

/// The rules that read one metric, or its part in the memory rule.
#[derive(Clone, Debug, Default)]
pub(super) struct Roles {
    /// Bits of the single-metric slots ([`SPIKE`] ...).
    fixed: u8,
    /// Its position in `rules.throughput.metrics`.
    throughput: Option<usize>,
    /// Its position in `rules.non_finite.metrics`.
    non_finite: Option<usize>,
    memory: Option<Memory>,
}

#[derive(Clone, Copy, Debug)]
enum Memory {
    Used,
    Total,
}

const USED: &str = "/mem_used_gb";
const TOTAL: &str = "/mem_total_gb";

pub(super) const SPIKE: usize = 0;
pub(super) const DIVERGENCE: usize = 1;
pub(super) const GRAD: usize = 2;
pub(super) const LR: usize = 3;
pub(super) const STEP_TIME: usize = 4;
pub(super) const DATA_WAIT: usize = 5;
pub(super) const STRAGGLER: usize = 6;
const SLOTS: usize = 7;

impl Roles {
    /// The rules that read `name`.
    pub(super) fn of(rules: &Rules, name: &str) -> Roles {
        let mut fixed = 0u8;
        for (slot, metric) in [
            (SPIKE, &rules.loss_spike.metric),
            (DIVERGENCE, &rules.divergence.metric),
            (GRAD, &rules.grad_explosion.metric),
            (LR, &rules.lr_schedule.metric),
            (STEP_TIME, &rules.stalled_data.step_time),
            (DATA_WAIT, &rules.stalled_data.data_wait),
            (STRAGGLER, &rules.straggler.metric),
        ] {
            if metric == name {
                fixed |= 1 << slot;
            }
        }
        let memory = if name.ends_with(USED) {
            Some(Memory::Used)
        } else if name.ends_with(TOTAL) {
            Some(Memory::Total)
        } else {
            None
        };
        Roles {
            fixed,
            throughput: rules.throughput.metrics.iter().position(|m| m == name),
            non_finite: rules.non_finite.metrics.iter().position(|m| m == name),
            memory,
        }
    }
}

/// A run's [`Roles`], one per entry of its metric table (sorted by id, as the hub keeps it).
#[derive(Default)]
pub(super) struct Lookup {
    roles: Vec<Roles>,
}

impl Lookup {
    /// Brings the lookup to `metrics`: a run's table only grows (the hub refuses a
    /// redefinition), so its length says whether it changed; the rules themselves are fixed
    /// for the hub's life.
    pub(super) fn refresh(&mut self, rules: &Rules, metrics: &[MetricDef]) {
        if self.roles.len() != metrics.len() {
            self.roles = metrics.iter().map(|m| Roles::of(rules, &m.name)).collect();
        }
    }
}

/// One record's values as the rules read them.
#[derive(Default, Debug)]
pub struct Sample<'a> {
    fixed: [Option<f64>; SLOTS],
    throughput: Vec<Option<f64>>,
    non_finite: Vec<Option<f64>>,
    /// `(device, used)` in the record's order.
    used: Vec<(&'a str, f64)>,
    /// `(device, total)`.
    totals: Vec<(&'a str, f64)>,
}

impl<'a> Sample<'a> {
    /// Empties the sample for the next record (keeping its allocations).
    fn clear(&mut self, rules: &Rules) {
        self.fixed = [None; SLOTS];
        self.throughput.clear();
        self.throughput.resize(rules.throughput.metrics.len(), None);
        self.non_finite.clear();
        self.non_finite.resize(rules.non_finite.metrics.len(), None);
        self.used.clear();
        self.totals.clear();
    }

    /// One value; a metric the record carries twice counts the first time (records that
    /// reach the rules carry each metric once: the hub's limits refuse the rest).
    fn put(&mut self, roles: &Roles, name: &'a str, v: f64) {
        if roles.fixed != 0 {
            for (slot, value) in self.fixed.iter_mut().enumerate() {
                if roles.fixed & (1 << slot) != 0 && value.is_none() {
                    *value = Some(v);
                }
            }
        }
        if let Some(i) = roles.throughput {
            self.throughput[i].get_or_insert(v);
        }
        if let Some(i) = roles.non_finite {
            self.non_finite[i].get_or_insert(v);
        }
        match roles.memory {
            Some(Memory::Used) => self.used.push((&name[..name.len() - USED.len()], v)),
            Some(Memory::Total) => self.totals.push((&name[..name.len() - TOTAL.len()], v)),
            None => {}
        }
    }

    /// A record given by metric names (tests, and anything outside a run's table).
    pub fn from_names(rules: &Rules, values: &[(&'a str, f64)]) -> Sample<'a> {
        let mut sample = Sample::default();
        sample.clear(rules);
        for &(name, v) in values {
            sample.put(&Roles::of(rules, name), name, v);
        }
        sample
    }

    /// Fills the sample with `record`, whose ids `metrics` names (ids it does not know are
    /// skipped).
    pub(super) fn fill(
        &mut self,
        rules: &Rules,
        lookup: &Lookup,
        metrics: &'a [MetricDef],
        record: &StepRecord,
    ) {
        self.clear(rules);
        for &(id, v) in &record.values {
            if let Some(i) = stepstream_protocol::metric_index(metrics, id) {
                if let Some(roles) = lookup.roles.get(i) {
                    self.put(roles, &metrics[i].name, v);
                }
            }
        }
    }

    pub(super) fn get(&self, slot: usize) -> Option<f64> {
        self.fixed[slot]
    }

    pub(super) fn throughput(&self) -> &[Option<f64>] {
        &self.throughput
    }

    pub(super) fn non_finite(&self) -> &[Option<f64>] {
        &self.non_finite
    }

    /// `(device, used, total)` for each device whose used memory the record carries.
    pub(super) fn memory(&self) -> impl Iterator<Item = (&'a str, f64, Option<f64>)> + '_ {
        self.used.iter().map(|&(device, used)| {
            let total = self
                .totals
                .iter()
                .find(|(d, _)| *d == device)
                .map(|&(_, t)| t);
            (device, used, total)
        })
    }

    pub(super) fn carries_memory(&self) -> bool {
        !self.used.is_empty()
    }
}
