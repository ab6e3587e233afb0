//! What a hub accepts: the limits a collector must keep to, sent in every `Welcome` so a
//! collector adapts to the hub it reached instead of being refused batch after batch.
//!
//! Defaults are generous for real jobs; a hub may raise or lower them (`--limit`). The
//! hard caps are the format's own: the record blob stores a record's value count in 16 bits,
//! so no limit may let a record carry more than [`MAX_RECORD_VALUES`].

use serde::{Deserialize, Serialize};

/// The most values one record can ever carry (the store keeps the count in 16 bits).
pub const MAX_RECORD_VALUES: u32 = u16::MAX as u32;

/// A collector seals a batch once its encoded size reaches this, whatever its record count,
/// so a backlog of wide records never builds a frame above [`crate::codec::MAX_FRAME_LEN`].
pub const BATCH_BYTES: usize = 1 << 20;

/// What one hub accepts from one collector.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Values in one record (at most [`MAX_RECORD_VALUES`]); a metric appears once per record.
    pub record_values: u32,
    /// Metrics one run may define.
    pub run_metrics: u32,
    /// Bytes of a metric name, project, run name, host, job, framework or status message.
    pub name_bytes: u32,
    /// Bytes of a run's config JSON.
    pub config_bytes: u32,
    /// Records in one batch.
    pub batch_records: u32,
    /// Bytes of one console line or sample (its text, or a table's cells).
    pub item_bytes: u32,
    /// Console lines and samples in one batch.
    pub batch_items: u32,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            record_values: 10_000,
            run_metrics: 10_000,
            name_bytes: 512,
            config_bytes: 128 * 1024,
            batch_records: 100_000,
            item_bytes: 1 << 20,
            batch_items: 100_000,
        }
    }
}

impl Limits {
    /// Clamps every limit to what the formats can carry.
    pub fn clamped(mut self) -> Limits {
        self.record_values = self.record_values.clamp(1, MAX_RECORD_VALUES);
        self.run_metrics = self.run_metrics.max(1);
        self.name_bytes = self.name_bytes.max(1);
        self.batch_records = self.batch_records.max(1);
        // An item must fit a frame beside its batch's envelope.
        self.item_bytes = self
            .item_bytes
            .clamp(1, (crate::codec::MAX_FRAME_LEN / 2) as u32);
        self.batch_items = self.batch_items.max(1);
        self
    }

    /// Checks one name (a metric's, a project's...): at most `name_bytes`, and no control
    /// character. A name is shown in pages, logs, alert messages and Prometheus labels, where
    /// a line feed or an escape would forge or break what surrounds it, and PostgreSQL refuses
    /// a NUL (which would then wedge the commit that holds it): both engines refuse alike.
    pub fn check_name(&self, field: &str, value: &str) -> Result<(), String> {
        if value.len() > self.name_bytes as usize {
            return Err(format!(
                "{field} is {} bytes; the limit is {} (limit name_bytes)",
                value.len(),
                self.name_bytes
            ));
        }
        if let Some(c) = value.chars().find(|c| c.is_control()) {
            return Err(format!(
                "{field} {value:?} holds the control character {:?} (U+{:04X}); names may not",
                c,
                u32::from(c)
            ));
        }
        Ok(())
    }

    /// Checks a run identity's strings; the error names the field and the limit.
    pub fn check_identity(&self, id: &crate::RunIdentity) -> Result<(), String> {
        let fields = [
            ("project", &id.project),
            ("name", &id.name),
            ("host", &id.host),
            ("job", &id.job),
            ("framework", &id.framework),
        ];
        for (field, value) in fields {
            self.check_name(field, value)?;
        }
        if id.config_json.contains('\0') {
            return Err("config holds a NUL character".into());
        }
        if id.config_json.len() > self.config_bytes as usize {
            return Err(format!(
                "config is {} bytes; the limit is {} (limit config_bytes)",
                id.config_json.len(),
                self.config_bytes
            ));
        }
        if !(id.started_at.is_finite()) {
            return Err("started_at is not a finite time".into());
        }
        Ok(())
    }
}

/// Bytes a record adds to an encoded batch, at most (varints at their widest).
pub fn record_bytes(values: usize) -> usize {
    10 + 8 + 10 + values * (5 + 8)
}

/// Bytes `records` add to an encoded batch, at most.
pub fn records_bytes(records: &[crate::StepRecord]) -> usize {
    records.iter().map(|r| record_bytes(r.values.len())).sum()
}
