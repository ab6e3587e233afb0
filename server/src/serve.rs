//! Starting a hub: open the store, join a cluster, bind, and serve plain HTTP or TLS in the
//! background (the routes come from the crate root's `router`).

use crate::hub::Hub;
use crate::settings::Settings;
use crate::state::AppState;
use crate::{auth, cluster, guard, hub, listen, sockets, store, tls};
use axum_server::tls_rustls::RustlsConfig;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

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

/// Opens the database, binds, and starts serving `router`'s routes in the background.
pub async fn start(
    settings: Settings,
    router: fn(AppState, guard::Guard) -> axum::Router,
) -> Result<Running, ServeError> {
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
    // Ended runs' batches stored before packs existed, or left short of a pack by a hub that
    // stopped: packed in the background, a few packs per transaction; then the packs made
    // before summaries existed get theirs.
    store.pack_in_background(
        runs.iter()
            .filter(|r| r.status.is_terminal())
            .map(|r| r.key)
            .collect(),
    );
    let hub = Hub::new(
        store,
        runs,
        settings.policy.clone(),
        &settings.alerts,
        settings.limits.clone(),
    );
    hub.set_retention(settings.retention.clone());
    if let Some(ms) = settings.linger {
        hub.pace.fix(ms);
    }
    hub.load_rules().await.map_err(|source| ServeError::Store {
        path: where_.clone(),
        source,
    })?;
    // A lone hub judges every run: the rule actions pending when it stopped wait again.
    // (In a cluster, each hub does so for the runs whose judging it takes.)
    if settings.nats.is_none() {
        hub.resume_actions(None).await;
    }
    if let Some(url) = &settings.nats {
        if !hub.store.shared() {
            return Err(cluster::ClusterError::NotShared.into());
        }
        let (cluster, reconnects) = cluster::Cluster::connect(url, &settings.nats_auth).await?;
        let inbox = cluster.inbox(reconnects).await?;
        hub.join(cluster);
        tokio::spawn(hub::follow(Arc::downgrade(&hub), inbox));
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
        frame_ancestors: settings
            .allowed_origins
            .iter()
            .filter(|o| !o.contains(|c: char| c.is_whitespace() || c == ';' || c == ','))
            .map(|o| format!(" {}", o.trim_end_matches('/')))
            .collect::<String>()
            .into(),
        sockets: Arc::new(sockets::Sockets::new(
            &settings.limits,
            settings.trusted_proxies.clone(),
        )),
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
    let open = state.sockets.open.clone();
    let app = router(state, guard);
    let stall = settings.limits.write_stall;
    let task = match &settings.tls {
        None => tokio::spawn(listen::serve_plain(listener, app, open, stall)),
        Some(files) => {
            let config = RustlsConfig::from_pem_file(&files.cert, &files.key)
                .await
                .map_err(|source| ServeError::Tls {
                    cert: files.cert.clone(),
                    key: files.key.clone(),
                    source,
                })?;
            tokio::spawn(tls::reload_on_change(config.clone(), files.clone()));
            let mut server = axum_server::from_tcp_rustls(listener.into_std()?, config)?
                .map(|tls| tls.acceptor(listen::DeadlineAcceptor { stall, open }));
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
