//! What of a run one subscription wants: metrics by name, steps from a point.

use std::collections::HashSet;
use stepstream_protocol::{MetricDef, MetricId, StepRecord, Subscribe};

/// What of a run a subscription wants.
#[derive(Clone)]
pub(super) struct Filter {
    pub(super) names: Option<HashSet<String>>,
    /// Ids of the wanted names, learnt as metrics are defined; unused when `names` is None.
    ids: HashSet<MetricId>,
    pub(super) from_step: Option<i64>,
    pub(super) budget: Option<usize>,
    /// What the viewer already holds (a resubscription): batches through this seq.
    pub(super) after_seq: Option<u64>,
    /// Console lines and samples in live frames.
    pub(super) items: bool,
}

impl Filter {
    pub(super) fn new(sub: &Subscribe) -> Filter {
        Filter {
            names: sub.metrics.as_ref().map(|m| m.iter().cloned().collect()),
            ids: HashSet::new(),
            from_step: sub.from_step,
            budget: sub.budget.map(|b| b as usize),
            after_seq: sub.after_seq,
            items: sub.items,
        }
    }

    /// Learns the ids of wanted metrics; returns the definitions the viewer should get.
    pub(super) fn learn(&mut self, defs: &[MetricDef]) -> Vec<MetricDef> {
        let Some(names) = &self.names else {
            return defs.to_vec();
        };
        let wanted: Vec<MetricDef> = defs
            .iter()
            .filter(|d| names.contains(&d.name))
            .cloned()
            .collect();
        self.ids.extend(wanted.iter().map(|d| d.id));
        wanted
    }

    /// Whether a batch goes to this viewer as published, in the frame encoded once for
    /// every viewer: it wants every metric and step, and the batch's items or it has none
    /// (a fleet's viewers of charts take no console, and most batches carry none: encoding a
    /// copy per viewer was a fifth of a busy hub's CPU).
    pub(super) fn takes_all_of(&self, items: &[stepstream_protocol::Item]) -> bool {
        self.names.is_none() && self.from_step.is_none() && (self.items || items.is_empty())
    }

    pub(super) fn wants(&self, id: MetricId) -> bool {
        self.names.is_none() || self.ids.contains(&id)
    }

    pub(super) fn step_ok(&self, step: i64) -> bool {
        self.from_step.is_none_or(|from| step >= from)
    }

    pub(super) fn records(&self, records: &[StepRecord]) -> Vec<StepRecord> {
        records
            .iter()
            .filter(|r| self.step_ok(r.step))
            .map(|r| StepRecord {
                step: r.step,
                wall_time: r.wall_time,
                values: r
                    .values
                    .iter()
                    .copied()
                    .filter(|&(id, _)| self.wants(id))
                    .collect(),
            })
            .filter(|r| !r.values.is_empty())
            .collect()
    }
}
