//! The web app's and the embeddable widget's files, embedded at build time by `build.rs`,
//! compressed at build time too (brotli and gzip beside each file), and served with entity
//! tags: a browser revalidates and gets `304` until a new build.
//!
//! The widget's files (`embed.js`, `embed-HASH.wasm`) are public code any page may load
//! (`Access-Control-Allow-Origin: *`); its wasm's name carries its hash, so browsers keep it
//! for a year. Whether a page may then *use* the hub (its socket and API) is the guard's
//! allow-list. `/embed` is the widget alone in a page, for places that take an iframe but
//! not a script; only the hub's own pages and allowed origins may frame it.

use crate::state::AppState;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
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

/// The widget's wasm, named by its hash: it never changes under that name.
fn is_hashed(path: &str) -> bool {
    path.starts_with("/embed-") && path.ends_with(".wasm")
}

/// The widget's files, which any page may load.
pub fn is_public(path: &str) -> bool {
    path == "/embed.js" || is_hashed(path)
}

fn lookup(name: &str) -> Option<(&'static [u8], &'static str)> {
    assets::ASSETS
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, bytes, tag)| (*bytes, *tag))
}

/// Whether `Accept-Encoding` lists `coding` with a non-zero weight.
fn accepts(headers: &HeaderMap, coding: &str) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|item| {
            let mut parts = item.split(';').map(str::trim);
            parts.next().is_some_and(|c| c.eq_ignore_ascii_case(coding))
                && parts.all(|p| p.replace(' ', "") != "q=0")
        })
}

fn file(name: &str, request: &HeaderMap) -> Option<Response> {
    let (mut bytes, mut tag) = lookup(name)?;
    let mut encoding = None;
    for coding in [("br", "br"), ("gzip", "gz")] {
        if accepts(request, coding.0) {
            if let Some((b, t)) = lookup(&format!("{name}.{}", coding.1)) {
                (bytes, tag, encoding) = (b, t, Some(coding.0));
                break;
            }
        }
    }
    let path = format!("/{name}");
    let cache = if is_hashed(&path) {
        "public, max-age=31536000, immutable"
    } else {
        "no-cache"
    };
    let mut headers = HeaderMap::new();
    headers.insert(header::ETAG, HeaderValue::from_static(tag));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    headers.insert(header::VARY, HeaderValue::from_static("Accept-Encoding"));
    if is_public(&path) {
        headers.insert(
            header::ACCESS_CONTROL_ALLOW_ORIGIN,
            HeaderValue::from_static("*"),
        );
        headers.insert(
            "cross-origin-resource-policy",
            HeaderValue::from_static("cross-origin"),
        );
    }
    let fresh = request
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim() == tag || t.trim() == "*");
    if fresh {
        return Some((StatusCode::NOT_MODIFIED, headers).into_response());
    }
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(content_type(name)),
    );
    if let Some(e) = encoding {
        headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static(e));
    }
    Some((headers, bytes).into_response())
}

/// `frame-ancestors` for a page: the hub itself, plus `extra` when given.
fn framed_by(mut response: Response, extra: &str) -> Response {
    let policy = format!("frame-ancestors 'self'{extra}");
    if let Ok(v) = HeaderValue::from_str(&policy) {
        response
            .headers_mut()
            .insert(header::CONTENT_SECURITY_POLICY, v);
    }
    response
}

pub async fn index(headers: HeaderMap) -> Response {
    let page = file("index.html", &headers).unwrap_or_else(|| {
        Html(
            "<!doctype html><title>stepstream</title><h1>stepstream hub</h1>\
             <p>This binary was built without the web app: run <code>scripts/build-web</code>, \
             then rebuild. The JSON API is at <a href=\"/api/runs\">/api/runs</a>.</p>",
        )
        .into_response()
    });
    framed_by(page, "")
}

/// The widget alone, for iframes (`/embed?run=...&metric=...`).
pub async fn embed(State(app): State<AppState>, headers: HeaderMap) -> Response {
    let page = file("embed.html", &headers)
        .unwrap_or_else(|| (StatusCode::NOT_FOUND, "built without the widget").into_response());
    framed_by(page, &app.frame_ancestors)
}

pub async fn asset(
    State(app): State<AppState>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Response {
    let Some(found) = file(&name, &headers) else {
        return (StatusCode::NOT_FOUND, "not found").into_response();
    };
    // Every page carries its frame policy, by whichever path it is asked for
    // (`/index.html` is `/`, `/embed.html` is `/embed`).
    match name.as_str() {
        "embed.html" => framed_by(found, &app.frame_ancestors),
        n if n.ends_with(".html") => framed_by(found, ""),
        _ => found,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_encoding_weights() {
        let mut h = HeaderMap::new();
        h.insert(
            header::ACCEPT_ENCODING,
            "gzip, deflate, br;q=0".parse().unwrap(),
        );
        assert!(accepts(&h, "gzip") && !accepts(&h, "br") && !accepts(&h, "zstd"));
        h.insert(header::ACCEPT_ENCODING, "BR;q=0.5".parse().unwrap());
        assert!(accepts(&h, "br"));
    }
}
