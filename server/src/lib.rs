//! The stepstream hub: collectors stream step records in, the hub stores them durably and
//! fans them out to subscribed viewers, and serves a JSON API.
//!
//! * `ingest` — the collector WebSocket (`/ws/collector`).
//! * `viewer` — the viewer WebSocket (`/ws/viewer`): history, then live, exactly once.
//! * `hub` — runs in memory, live fan-out, run status.
//! * `store` — SQLite: the only code that touches the database.
//! * `downsample` — M4 point budgets.
//! * `api` — JSON, CSV and config over HTTP.
//! * `guard` — `Host` and `Origin` checks: who may talk to the hub at all.
//! * `auth` — tokens.
//! * `limits` — what one collector, run, project and address may use.
//! * `listen` — accepting connections, and the timers that free stalled ones.
//! * `metrics` — `/metrics` for Prometheus.
//! * `web` — the embedded web app and the embeddable widget's files.

pub mod alerts;
pub mod api;
pub mod auth;
pub mod cluster;
pub mod downsample;
pub mod guard;
pub mod hub;
pub mod ingest;
pub mod limits;
pub mod listen;
pub mod metrics;
pub mod notify;
pub mod store;
pub mod upgrade;
pub mod viewer;
pub mod web;

use axum::routing::get;
use axum::Router;
use axum_server::tls_rustls::RustlsConfig;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use auth::Auth;
pub use hub::{Hub, StatusPolicy};

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

/// How often the certificate files are looked at for a renewal.
const TLS_RELOAD_CHECK: Duration = Duration::from_secs(2);

/// Shared by every handler.
#[derive(Clone)]
pub struct AppState {
    pub hub: Arc<Hub>,
    pub auth: Arc<auth::LiveAuth>,
    pub stale_after_s: f64,
    /// Open WebSockets per peer address.
    pub connections: Arc<limits::Connections>,
    /// The allowed origins as a `frame-ancestors` source list tail (` https://wiki.example`):
    /// who may frame `/embed`.
    pub frame_ancestors: Arc<str>,
    /// For `/metrics`: open sockets.
    pub sockets: Arc<metrics::Sockets>,
    /// Places for collector sockets awaiting their hello (`pending_hellos`).
    pub pending_hellos: Arc<tokio::sync::Semaphore>,
    /// Bytes all sockets awaiting their hello may have sent (`prehello_bytes`).
    pub prehello_bytes: Arc<tokio::sync::Semaphore>,
    /// See [`Settings::trusted_proxies`].
    pub trusted_proxies: Arc<[std::net::IpAddr]>,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(
        "refusing to listen on {0} without tokens: set a write token and a read token \
             (--write-token/--read-token or STEPSTREAM_WRITE_TOKEN/STEPSTREAM_READ_TOKEN), \
             or pass --insecure-no-auth if this network is trusted"
    )]
    OpenBeyondLoopback(SocketAddr),
    #[error(
        "refusing to serve {0:?} (--allow-host) without tokens: a proxy brings that name's \
         clients from beyond loopback. Set a write token and a read token \
         (--write-token/--read-token or STEPSTREAM_WRITE_TOKEN/STEPSTREAM_READ_TOKEN), or pass \
         --insecure-no-auth if that network is trusted"
    )]
    OpenBehindProxy(String),
    #[error("cannot open the database {path}: {source}")]
    Store {
        path: String,
        source: store::StoreError,
    },
    #[error(transparent)]
    Cluster(#[from] cluster::ClusterError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot load the TLS certificate {cert} / key {key}: {source}")]
    Tls {
        cert: PathBuf,
        key: PathBuf,
        source: std::io::Error,
    },
    #[error("server error: {0}")]
    Io(#[from] std::io::Error),
}

/// The routes, over an opened hub, behind the `Host`/`Origin` guard.
pub fn router(state: AppState, guard: guard::Guard) -> Router {
    let reads = Router::new()
        .route("/api/runs", get(api::list_runs))
        .route("/api/runs/{id}", get(api::run_detail))
        .route("/api/runs/{id}/series", get(api::series))
        .route("/api/runs/{id}/metrics.csv", get(api::export_csv))
        .route("/api/runs/{id}/config.json", get(api::export_config))
        .route("/api/runs/{id}/alerts", get(api::alerts))
        .route("/ws/viewer", get(viewer::viewer_socket))
        .route("/metrics", get(metrics::metrics))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_read,
        ));
    Router::new()
        .route("/", get(web::index))
        .route("/embed", get(web::embed))
        .route("/{file}", get(web::asset))
        .route("/api/health", get(api::health))
        .route("/ws/collector", get(ingest::collector_socket))
        .merge(reads)
        .with_state(state)
        .layer(axum::middleware::from_fn_with_state(
            Arc::new(guard),
            guard::require_known_peer,
        ))
}

/// A bound, running hub.
pub struct Running {
    pub addr: SocketAddr,
    pub hub: Arc<Hub>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Running {
    /// Serves until the server fails or `shutdown` resolves.
    pub async fn wait(self) -> Result<(), ServeError> {
        match self.task.await {
            Ok(r) => Ok(r?),
            Err(e) => Err(ServeError::Io(std::io::Error::other(e))),
        }
    }
}

/// Opens the database, binds, and starts serving in the background.
pub async fn start(settings: Settings) -> Result<Running, ServeError> {
    if !settings.bind.ip().is_loopback()
        && !settings.auth.guards_reads_and_writes()
        && !settings.insecure_no_auth
    {
        return Err(ServeError::OpenBeyondLoopback(settings.bind));
    }
    // Bound to loopback behind a reverse proxy, the hub is reached from beyond loopback all
    // the same: a name other than loopback's in `--allow-host` says so.
    if let Some(name) = settings
        .allowed_hosts
        .iter()
        .find(|h| !guard::names_loopback(h))
    {
        if !settings.auth.guards_reads_and_writes() && !settings.insecure_no_auth {
            return Err(ServeError::OpenBehindProxy(name.clone()));
        }
    }
    let location = match &settings.store {
        Some(url) => store::Location::Postgres { url: url.clone() },
        None => store::Location::Sqlite {
            path: settings.db.clone(),
            fsync: settings.fsync,
        },
    };
    let where_ = match &location {
        store::Location::Sqlite { path, .. } => path.display().to_string(),
        store::Location::Postgres { .. } => "PostgreSQL".to_string(),
    };
    let opened = {
        let location = location.clone();
        let interval = settings.commit_interval;
        tokio::task::spawn_blocking(move || store::Store::open_at(&location, interval))
            .await
            .map_err(|e| ServeError::Store {
                path: where_.clone(),
                source: store::StoreError::Join(e.to_string()),
            })?
    };
    let (store, runs) = opened.map_err(|source| ServeError::Store {
        path: where_.clone(),
        source,
    })?;
    tracing::info!(store = %where_, runs = runs.len(), "database open");
    let stale_after_s = settings.policy.stale_after.as_secs_f64();
    let hub = Hub::new(
        store,
        runs,
        settings.policy.clone(),
        &settings.alerts,
        settings.limits.clone(),
    );
    if let Some(url) = &settings.nats {
        if !hub.store.shared() {
            return Err(cluster::ClusterError::NotShared.into());
        }
        let (cluster, reconnects) = cluster::Cluster::connect(url, &settings.nats_auth).await?;
        hub.join(cluster.clone());
        let follower = cluster.follow(Arc::downgrade(&hub), reconnects);
        tokio::spawn(async move {
            if let Err(e) = follower.await {
                tracing::error!(error = %e, "stopped following the other hubs");
            }
        });
    }
    let listener = tokio::net::TcpListener::bind(settings.bind)
        .await
        .map_err(|source| ServeError::Bind {
            addr: settings.bind,
            source,
        })?;
    let addr = listener.local_addr()?;
    let state = AppState {
        hub: hub.clone(),
        auth: Arc::new(auth::LiveAuth::new(settings.auth.clone())),
        stale_after_s,
        connections: Arc::default(),
        frame_ancestors: settings
            .allowed_origins
            .iter()
            .filter(|o| !o.contains(|c: char| c.is_whitespace() || c == ';' || c == ','))
            .map(|o| format!(" {}", o.trim_end_matches('/')))
            .collect::<String>()
            .into(),
        sockets: Arc::default(),
        pending_hellos: Arc::new(tokio::sync::Semaphore::new(settings.limits.pending_hellos)),
        prehello_bytes: Arc::new(tokio::sync::Semaphore::new(settings.limits.prehello_bytes)),
        trusted_proxies: settings.trusted_proxies.clone().into(),
    };
    if let Some(path) = settings.tokens_file.clone() {
        tokio::spawn(auth::reload_on_change(state.auth.clone(), path));
    }
    let ticker = hub.clone();
    let period = (settings.policy.stale_after / 10)
        .clamp(Duration::from_millis(100), Duration::from_millis(500));
    tokio::spawn(async move {
        let mut every = tokio::time::interval(period);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            every.tick().await;
            ticker.tick().await;
        }
    });
    let guard = guard::Guard::new(
        addr,
        settings.allowed_hosts.clone(),
        settings.allowed_origins.clone(),
    );
    let app = router(state, guard);
    let stall = settings.limits.write_stall;
    let task = match &settings.tls {
        None => {
            let open = Arc::new(tokio::sync::Semaphore::new(settings.limits.connections));
            tokio::spawn(listen::serve_plain(listener, app, open, stall))
        }
        Some(files) => {
            let config = RustlsConfig::from_pem_file(&files.cert, &files.key)
                .await
                .map_err(|source| ServeError::Tls {
                    cert: files.cert.clone(),
                    key: files.key.clone(),
                    source,
                })?;
            tokio::spawn(reload_on_change(config.clone(), files.clone()));
            let mut server = axum_server::from_tcp_rustls(listener.into_std()?, config)?
                .map(|tls| tls.acceptor(listen::DeadlineAcceptor { stall }));
            server
                .http_builder()
                .http1()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(listen::HEADER_READ_TIMEOUT);
            tokio::spawn(async move {
                server
                    .serve(app.into_make_service_with_connect_info::<SocketAddr>())
                    .await
            })
        }
    };
    Ok(Running { addr, hub, task })
}

/// The files' modification times, to notice a renewed certificate.
fn modified(files: &TlsFiles) -> Option<(std::time::SystemTime, std::time::SystemTime)> {
    let m = |p: &std::path::Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    Some((m(&files.cert)?, m(&files.key)?))
}

/// Reloads the certificate when its files change (a renewal), without a restart; new
/// connections get the new one. A pair that does not load keeps the old one in service.
async fn reload_on_change(config: RustlsConfig, files: TlsFiles) {
    let mut seen = modified(&files);
    let mut every = tokio::time::interval(TLS_RELOAD_CHECK);
    loop {
        every.tick().await;
        let now = modified(&files);
        if now.is_none() || now == seen {
            continue;
        }
        match config.reload_from_pem_file(&files.cert, &files.key).await {
            Ok(()) => {
                seen = now;
                tracing::info!(cert = %files.cert.display(), "TLS certificate reloaded");
            }
            // Half-written (the key renewed before the certificate): try again next tick.
            Err(e) => {
                tracing::warn!(error = %e, "TLS certificate not reloaded; keeping the old one")
            }
        }
    }
}
