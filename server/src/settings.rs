//! What `stepstream serve` is told: the hub's settings, as the binary's options give them.

use crate::{auth::Auth, cluster, hub::StatusPolicy, limits, notify};
use std::net::SocketAddr;
use std::path::PathBuf;

/// `--commit-interval`'s default. A wait saves CPU with many runs and delays no one who
/// watches: collectors send without waiting for acknowledgements (64 batches may be
/// unacknowledged), and a lone hub publishes a batch to viewers once checked, before its
/// commit (`hub/append.rs`). With the fleet of 100 runs (collectors lingering 30 ms), 500 ms
/// cost ~0.8x the hub CPU of 100 ms at the same p99 to viewers (32-35 ms); 1000 ms saved
/// little more and filled the collectors' window (p99 81-91 ms). Fewer than four busy runs
/// never wait.
pub const DEFAULT_COMMIT_INTERVAL: std::time::Duration = std::time::Duration::from_millis(500);

/// Everything `stepstream serve` needs to know.
#[derive(Clone, Debug)]
pub struct Settings {
    pub bind: SocketAddr,
    pub db: PathBuf,
    /// A PostgreSQL URL: keep everything there instead of the SQLite file at `db`.
    pub store: Option<String>,
    /// A NATS URL: join the other hubs sharing `store` (see `cluster.rs`).
    pub nats: Option<String>,
    /// How this hub authenticates to NATS.
    pub nats_auth: cluster::NatsAuth,
    pub policy: StatusPolicy,
    pub auth: Auth,
    /// The `--tokens` file the scoped tokens came from: re-read when it changes.
    pub tokens_file: Option<PathBuf>,
    /// fsync every commit (SQLite `synchronous=FULL`): survive power loss, not only a crash.
    pub fsync: bool,
    /// While many collectors are busy, a database transaction starts at most once per this
    /// interval (`--commit-interval`): the batches of many runs then share a commit.
    pub commit_interval: std::time::Duration,
    /// The linger the hub asks of collectors always (`--linger MS`); `None`: it follows the
    /// hub's load (`hub/pace.rs`).
    pub linger: Option<u32>,
    /// Which ended runs the hub deletes on its own (`--retain`).
    pub retention: crate::hub::retention::Retention,
    /// Listen beyond loopback without tokens (a trusted network).
    pub insecure_no_auth: bool,
    /// Alert rules and notification channels.
    pub alerts: notify::AlertsConfig,
    /// Names `Host` may carry besides the bound address (`--allow-host`).
    pub allowed_hosts: Vec<String>,
    /// Reverse proxies whose `X-Forwarded-For` names the client the per-address limits key
    /// on (`--trusted-proxy`).
    pub trusted_proxies: Vec<std::net::IpAddr>,
    /// Origins (`scheme://host[:port]`) whose pages may use the hub besides its own
    /// (`--allow-origin`; `*` for any).
    pub allowed_origins: Vec<String>,
    /// Serve HTTPS and `wss://` with this certificate chain and key (PEM), reloaded when
    /// the files change.
    pub tls: Option<TlsFiles>,
    /// What one collector, run, project and address may use (`--limit`).
    pub limits: limits::HubLimits,
}

/// A certificate chain and its private key, PEM files.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}
