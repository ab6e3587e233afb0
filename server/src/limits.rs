//! The hub's limits: what one collector, one run, one project and one address may use.
//!
//! Every limit is enforced where its input arrives, before any work proportional to it, and
//! refused with an error frame (or an HTTP 429) that names the limit and a log line. The wire
//! limits travel to collectors in `Welcome`, so a collector keeps to them instead of being
//! refused. Set with `--limit NAME=VALUE` (repeatable).

use stepstream_protocol::Limits;

/// Every limit of one hub.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HubLimits {
    /// What a collector must keep to (sent in `Welcome`).
    pub wire: Limits,
    /// Runs the hub keeps, in all.
    pub runs: usize,
    /// Runs one project may have.
    pub runs_per_project: usize,
    /// Open WebSockets (collectors and viewers) from one address; a collector's counts once
    /// its hello is accepted.
    pub connections_per_addr: usize,
    /// Collector sockets awaiting their hello, from all addresses together (each costs a
    /// few KiB: see `upgrade.rs`).
    pub pending_hellos: usize,
    /// Bytes all collector sockets awaiting their hello may have sent, together.
    pub prehello_bytes: usize,
    /// Open connections (HTTP and WebSocket) from all addresses together.
    pub connections: usize,
    /// The largest point budget a viewer may ask for.
    pub viewer_budget: u32,
    /// How long a connection may take nothing the hub writes before it is closed.
    pub write_stall: std::time::Duration,
    /// Console lines one run keeps; beyond, the oldest are dropped (and counted).
    pub console_lines: u64,
    /// Bytes of samples (text, tables, histograms, images) one run may store.
    pub run_sample_bytes: u64,
    /// Bytes of samples all runs together may store.
    pub hub_sample_bytes: u64,
}

impl Default for HubLimits {
    fn default() -> HubLimits {
        HubLimits {
            wire: Limits::default(),
            runs: 100_000,
            runs_per_project: 20_000,
            connections_per_addr: 1024,
            pending_hellos: 4096,
            prehello_bytes: 64 << 20,
            connections: 16_384,
            viewer_budget: 1_000_000,
            write_stall: std::time::Duration::from_secs(30),
            console_lines: 100_000,
            run_sample_bytes: 1 << 30,
            hub_sample_bytes: 64 << 30,
        }
    }
}

/// The names `--limit` takes, with what each bounds.
pub const NAMES: &[(&str, &str)] = &[
    ("record_values", "values in one record (at most 65535)"),
    ("run_metrics", "metrics one run may define"),
    (
        "name_bytes",
        "bytes of a metric, project, run, host, job or framework name",
    ),
    ("config_bytes", "bytes of a run's config JSON"),
    ("batch_records", "records in one batch"),
    (
        "item_bytes",
        "bytes of one console line or sample (a text, a table's cells)",
    ),
    ("batch_items", "console lines and samples in one batch"),
    (
        "run_sample_bytes",
        "bytes of samples (text, tables, histograms, images) one run may store",
    ),
    (
        "hub_sample_bytes",
        "bytes of samples all runs together may store",
    ),
    (
        "console_lines",
        "console lines one run keeps (the oldest beyond are dropped, and counted)",
    ),
    ("runs", "runs the hub keeps"),
    ("runs_per_project", "runs one project may have"),
    ("connections_per_addr", "open WebSockets from one address"),
    (
        "connections",
        "open connections, HTTP and WebSocket, from all addresses",
    ),
    (
        "pending_hellos",
        "collector sockets awaiting their hello, from all addresses",
    ),
    (
        "prehello_bytes",
        "bytes all collector sockets awaiting their hello may have sent, together",
    ),
    ("viewer_budget", "points per metric a viewer may ask for"),
    (
        "write_stall_s",
        "seconds a connection may take nothing the hub writes (then it is closed)",
    ),
];

impl HubLimits {
    /// Applies one `NAME=VALUE`.
    pub fn set(&mut self, spec: &str) -> Result<(), String> {
        let known = || NAMES.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ");
        let (name, value) = spec
            .split_once('=')
            .ok_or_else(|| format!("--limit {spec:?}: use NAME=VALUE (names: {})", known()))?;
        let value: u64 = value
            .trim()
            .replace('_', "")
            .parse()
            .ok()
            .filter(|v| *v > 0)
            .ok_or_else(|| format!("--limit {spec:?}: the value must be a positive integer"))?;
        let small = |v: u64| u32::try_from(v).map_err(|_| format!("--limit {spec:?} is too large"));
        match name.trim() {
            "record_values" => {
                if value > u64::from(stepstream_protocol::limits::MAX_RECORD_VALUES) {
                    return Err(format!(
                        "--limit {spec:?}: a record holds at most {} values",
                        stepstream_protocol::limits::MAX_RECORD_VALUES
                    ));
                }
                self.wire.record_values = small(value)?;
            }
            "run_metrics" => self.wire.run_metrics = small(value)?,
            "name_bytes" => self.wire.name_bytes = small(value)?,
            "config_bytes" => self.wire.config_bytes = small(value)?,
            "batch_records" => self.wire.batch_records = small(value)?,
            "item_bytes" => self.wire.item_bytes = small(value)?,
            "batch_items" => self.wire.batch_items = small(value)?,
            "console_lines" => self.console_lines = value,
            "run_sample_bytes" => self.run_sample_bytes = value,
            "hub_sample_bytes" => self.hub_sample_bytes = value,
            "runs" => self.runs = value as usize,
            "runs_per_project" => self.runs_per_project = value as usize,
            "connections_per_addr" => self.connections_per_addr = value as usize,
            "pending_hellos" => self.pending_hellos = value as usize,
            "prehello_bytes" => self.prehello_bytes = value.min(u64::from(u32::MAX)) as usize,
            "connections" => self.connections = value as usize,
            "viewer_budget" => self.viewer_budget = small(value)?,
            "write_stall_s" => self.write_stall = std::time::Duration::from_secs(value),
            other => {
                return Err(format!(
                    "--limit: unknown limit {other:?} (names: {})",
                    known()
                ))
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_parses_and_refuses() {
        let mut l = HubLimits::default();
        l.set("run_metrics=300").unwrap();
        l.set("connections_per_addr = 4").unwrap();
        assert_eq!(l.wire.run_metrics, 300);
        assert_eq!(l.connections_per_addr, 4);
        assert!(l.set("record_values=70000").unwrap_err().contains("65535"));
        assert!(l.set("nope=1").unwrap_err().contains("unknown"));
        assert!(l.set("runs=0").is_err());
        assert!(l.set("runs").is_err());
    }
}
