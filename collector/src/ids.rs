//! The metric table: this process's metric ids (dense, in first-use order) and the ids the
//! hub knows them by.
//!
//! `log` numbers a metric the first time it sees it, once; a new run's hub takes those
//! numbers as they are. That order may differ between a run and its resumption (or a
//! restarted tail): the hub's `Welcome` carries its name-to-id table, so a resumed run
//! sends each name under the id the hub already has, and numbers new names above them.
//! Only then is a batch translated on its way out (batches sealed before a `Welcome`, or
//! spooled, go under the table of the hub actually connected); otherwise it goes as held.
//! Names the hub's limits refuse (too long, one too many) are not sent, and their values are
//! counted as refused instead of wedging the connection.

use std::collections::HashMap;
use stepstream_protocol::{Limits, MetricDef, MetricId, StepRecord, Welcome};

#[derive(Default)]
pub(crate) struct MetricTable {
    /// Local id `i` is `names[i]`.
    names: Vec<String>,
    /// Local id -> the id the connected hub knows it by; `None` when refused.
    wire: Vec<Option<MetricId>>,
    next_wire: u32,
    limits: Limits,
    /// The connected hub's table, by name.
    hub: HashMap<String, MetricId>,
    /// Names the connected hub has.
    defined: usize,
    /// Definitions not yet sent on this connection.
    unsent: Vec<MetricDef>,
    /// Every local id is its wire id.
    as_numbered: bool,
}

impl MetricTable {
    /// A metric `log` just numbered (its local id is the next one).
    pub fn push(&mut self, def: MetricDef) {
        debug_assert_eq!(def.id.0 as usize, self.names.len());
        self.names.push(def.name);
        let wire = self.assign(self.names.len() - 1);
        let local = MetricId(self.wire.len() as u32);
        self.wire.push(wire);
        self.as_numbered &= wire == Some(local);
    }

    /// Whether every local id is the id the connected hub knows it by (a new run, or a
    /// resumed one whose names were first logged in the same order, none refused): then
    /// records go out as `log` numbered them, untranslated.
    pub fn numbered_as_the_hub(&self) -> bool {
        self.as_numbered
    }

    /// Recomputes [`MetricTable::numbered_as_the_hub`] after the table changed.
    fn check_numbering(&mut self) {
        self.as_numbered = self
            .wire
            .iter()
            .enumerate()
            .all(|(i, w)| *w == Some(MetricId(i as u32)));
    }

    /// Whether the connected hub takes local id `local`'s values (its limits may refuse a
    /// name).
    pub fn sent(&self, local: MetricId) -> bool {
        self.wire.get(local.0 as usize).copied().flatten().is_some()
    }

    /// Values per record the connected hub takes.
    /// The limits of the hub last met (the defaults before any).
    pub fn limits(&self) -> Limits {
        self.limits
    }

    pub fn record_values(&self) -> u32 {
        self.limits.record_values
    }

    /// The name of a local id.
    pub fn name(&self, local: MetricId) -> Option<&str> {
        self.names.get(local.0 as usize).map(String::as_str)
    }

    fn assign(&mut self, local: usize) -> Option<MetricId> {
        let name = &self.names[local];
        if let Some(&id) = self.hub.get(name) {
            return Some(id);
        }
        if self.limits.check_name("metric name", name).is_err()
            || self.defined >= self.limits.run_metrics as usize
        {
            tracing::warn!(metric = %name, "stepstream: the hub's limits refuse this metric; its values are not sent");
            return None;
        }
        let id = MetricId(self.next_wire);
        self.next_wire += 1;
        self.defined += 1;
        self.hub.insert(name.clone(), id);
        self.unsent.push(MetricDef {
            id,
            name: name.clone(),
        });
        Some(id)
    }

    /// A hub welcomed us: adopt its ids for the names it has, number the rest above them.
    pub fn welcome(&mut self, w: &Welcome) {
        self.limits = w.limits;
        self.hub = w.metrics.iter().map(|d| (d.name.clone(), d.id)).collect();
        self.next_wire = w.metrics.iter().map(|d| d.id.0 + 1).max().unwrap_or(0);
        self.defined = w.metrics.len();
        self.unsent.clear();
        self.wire = (0..self.names.len())
            .map(|local| self.assign(local))
            .collect();
        self.check_numbering();
    }

    /// Definitions the connected hub does not have yet.
    pub fn take_unsent(&mut self) -> Vec<MetricDef> {
        std::mem::take(&mut self.unsent)
    }

    /// A record as the connected hub reads it; returns the number of values refused.
    pub fn translate(&self, record: &StepRecord) -> (StepRecord, usize) {
        let most = self.limits.record_values as usize;
        let values: Vec<(MetricId, f64)> = record
            .values
            .iter()
            .filter_map(|&(id, v)| Some((self.wire.get(id.0 as usize).copied().flatten()?, v)))
            .take(most)
            .collect();
        let refused = record.values.len() - values.len();
        (
            StepRecord {
                step: record.step,
                wall_time: record.wall_time,
                values,
            },
            refused,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def(id: u32, name: &str) -> MetricDef {
        MetricDef {
            id: MetricId(id),
            name: name.into(),
        }
    }

    #[test]
    fn a_resumed_run_uses_the_hubs_ids_whatever_the_order() {
        let mut t = MetricTable::default();
        t.push(def(0, "lr"));
        t.push(def(1, "loss"));
        t.push(def(2, "acc"));
        t.welcome(&Welcome {
            run_id: stepstream_protocol::RunId::new("r").unwrap(),
            last_seq: 5,
            last_step: Some(9),
            metrics: vec![def(0, "loss"), def(1, "lr")],
            limits: Limits::default(),
            linger_ms: 0,
        });
        assert_eq!(t.take_unsent(), vec![def(2, "acc")]);
        assert!(!t.numbered_as_the_hub(), "lr and loss swapped: translated");
        // A name first logged after the welcome also gets the hub's id.
        t.push(def(3, "loss"));
        assert!(t.take_unsent().is_empty());
        let r = StepRecord {
            step: 1,
            wall_time: 0.0,
            values: vec![(MetricId(0), 0.1), (MetricId(1), 2.0), (MetricId(2), 0.5)],
        };
        let (out, refused) = t.translate(&r);
        assert_eq!(refused, 0);
        assert_eq!(
            out.values,
            vec![(MetricId(1), 0.1), (MetricId(0), 2.0), (MetricId(2), 0.5)]
        );
        let again = StepRecord {
            values: vec![(MetricId(3), 7.0)],
            ..r
        };
        assert_eq!(t.translate(&again).0.values, vec![(MetricId(0), 7.0)]);
    }

    /// A new run's hub takes the ids as `log` numbered them: nothing is translated, until
    /// a name the hub's limits refuse breaks the numbering.
    #[test]
    fn a_new_runs_ids_are_the_hubs() {
        let mut t = MetricTable::default();
        t.push(def(0, "loss"));
        t.welcome(&Welcome {
            run_id: stepstream_protocol::RunId::new("r").unwrap(),
            last_seq: 0,
            last_step: None,
            metrics: vec![],
            limits: Limits {
                name_bytes: 8,
                ..Limits::default()
            },
            linger_ms: 0,
        });
        t.push(def(1, "lr"));
        assert!(t.numbered_as_the_hub());
        assert_eq!(t.take_unsent(), vec![def(0, "loss"), def(1, "lr")]);
        t.push(def(2, "much-too-long"));
        assert!(!t.numbered_as_the_hub());
    }

    #[test]
    fn metrics_over_the_hubs_limits_are_refused_not_sent() {
        let mut t = MetricTable::default();
        t.welcome(&Welcome {
            run_id: stepstream_protocol::RunId::new("r").unwrap(),
            last_seq: 0,
            last_step: None,
            metrics: vec![],
            limits: Limits {
                run_metrics: 2,
                name_bytes: 8,
                ..Limits::default()
            },
            linger_ms: 0,
        });
        t.push(def(0, "a"));
        t.push(def(1, "much-too-long"));
        t.push(def(2, "b"));
        t.push(def(3, "c"));
        assert_eq!(t.take_unsent(), vec![def(0, "a"), def(1, "b")]);
        let r = StepRecord {
            step: 1,
            wall_time: 0.0,
            values: (0..4).map(|i| (MetricId(i), 1.0)).collect(),
        };
        let (out, refused) = t.translate(&r);
        assert_eq!(refused, 2);
        assert_eq!(out.values.len(), 2);
    }
}
