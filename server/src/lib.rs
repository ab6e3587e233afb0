//! The stepstream hub: collectors stream step records in, the hub stores them durably and
//! fans them out to subscribed viewers, and serves a JSON API. This file is the table of
//! contents and the routes; each module says what it owns.
//!
//! Connections, from the outside in:
//! * `listen` — accepting connections, and the timers that free stalled ones.
//! * `tls` — the certificate, reloaded on renewal.
//! * `guard` — `Host` and `Origin` checks: who may talk to the hub at all.
//! * `auth` — tokens: who may write or read what.
//! * `sockets` — counting connections against the limits; `limits` — the limits.
//! * `upgrade` — the collector socket's WebSocket upgrade and its pre-hello gate.
//!
//! What they carry:
//! * `ingest` — the collector WebSocket (`/ws/collector`).
//! * `viewer` — the viewer WebSocket (`/ws/viewer`): history, then live, exactly once.
//! * `api` — JSON, CSV and config over HTTP; `prometheus` — `/metrics`.
//! * `web` — the embedded web app and the embeddable widget's files.
//!
//! Behind them:
//! * `hub` — runs in memory, live fan-out, run status, the cluster's meaning.
//! * `alerts` — the rules; `notify` — where alerts go.
//! * `store` — SQLite or PostgreSQL: the only code that touches the database.
//! * `cluster` — the NATS transport between hubs.
//! * `downsample` — M4 point budgets.
//!
//! Starting: `settings` (what `serve` is told), `state` (what handlers share), `serve`.

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
pub mod notify;
pub mod prometheus;
pub mod serve;
pub mod settings;
pub mod sockets;
pub mod state;
pub mod store;
pub mod tls;
pub mod upgrade;
pub mod viewer;
pub mod web;

use axum::routing::get;
use axum::Router;
use std::sync::Arc;

pub use auth::Auth;
pub use hub::{Hub, StatusPolicy};
pub use serve::{Running, ServeError};
pub use settings::{Settings, TlsFiles, DEFAULT_COMMIT_INTERVAL};
pub use state::AppState;

/// Opens the database, binds, and starts serving in the background.
pub async fn start(settings: Settings) -> Result<Running, ServeError> {
    serve::start(settings, router).await
}

/// The routes, over an opened hub, behind the `Host`/`Origin` guard.
pub fn router(state: AppState, guard: guard::Guard) -> Router {
    let reads = Router::new()
        .route("/api/runs", get(api::list_runs))
        .route(
            "/api/runs/{id}",
            get(api::run_detail).delete(api::delete::delete),
        )
        .route("/api/runs/{id}/series", get(api::series))
        .route("/api/runs/{id}/metrics.csv", get(api::export_csv))
        .route("/api/runs/{id}/metrics.parquet", get(api::parquet::export))
        .route("/api/runs/{id}/config.json", get(api::export_config))
        .route("/api/runs/{id}/alerts", get(api::alerts))
        .route(
            "/api/runs/{id}/commands",
            get(api::commands::list).post(api::commands::post),
        )
        .route(
            "/api/projects/{project}/rules",
            get(api::rules::list).post(api::rules::add),
        )
        .route(
            "/api/projects/{project}/rules/{id}",
            axum::routing::delete(api::rules::delete),
        )
        .route(
            "/api/projects/{project}/rules/preview",
            axum::routing::post(api::rules::preview),
        )
        .route(
            "/api/projects/{project}/rules/test",
            axum::routing::post(api::rules::test),
        )
        .route(
            "/api/runs/{id}/alerts/{rule}/ack",
            axum::routing::post(api::commands::acknowledge),
        )
        .route("/api/runs/{id}/console", get(api::items::console))
        .route("/api/runs/{id}/samples", get(api::items::samples))
        .route("/api/runs/{id}/image", get(api::items::image))
        .route("/ws/viewer", get(viewer::viewer_socket))
        .route("/metrics", get(prometheus::metrics))
        .route_layer(axum::middleware::from_fn_with_state(
            state.auth.clone(),
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
