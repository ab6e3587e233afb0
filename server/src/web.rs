//! The web app's files, embedded at build time by `build.rs`.

use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};

mod assets {
    include!(concat!(env!("OUT_DIR"), "/web_assets.rs"));
}

/// Whether this binary carries the web app.
pub fn embedded() -> bool {
    !assets::ASSETS.is_empty()
}

fn content_type(name: &str) -> &'static str {
    match name.rsplit('.').next() {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("wasm") => "application/wasm",
        Some("css") => "text/css; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        _ => "application/octet-stream",
    }
}

fn file(name: &str) -> Option<Response> {
    let (_, bytes) = assets::ASSETS.iter().find(|(n, _)| *n == name)?;
    Some(
        (
            [
                (header::CONTENT_TYPE, content_type(name)),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            *bytes,
        )
            .into_response(),
    )
}

pub async fn index() -> Response {
    file("index.html").unwrap_or_else(|| {
        Html(
            "<!doctype html><title>stepstream</title><h1>stepstream hub</h1>\
             <p>This binary was built without the web app: run <code>scripts/build-web</code>, \
             then rebuild. The JSON API is at <a href=\"/api/runs\">/api/runs</a>.</p>",
        )
        .into_response()
    })
}

pub async fn asset(Path(name): Path<String>) -> Response {
    file(&name).unwrap_or_else(|| (StatusCode::NOT_FOUND, "not found").into_response())
}
