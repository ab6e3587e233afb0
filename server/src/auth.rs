//! Tokens: a write token for collectors, a read token for viewers and the API.
//!
//! With no tokens set everything is open, which `start` allows only on loopback. The write
//! token also grants reading. Tokens travel in the collector's hello, or for HTTP and the
//! viewer socket as `Authorization: Bearer TOKEN` or `?token=TOKEN`, percent-encoded
//! (browsers cannot set headers on a WebSocket).

use crate::AppState;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

#[derive(Clone, Debug, Default)]
pub struct Auth {
    pub write: Option<String>,
    pub read: Option<String>,
}

/// Compares without an early exit, so timing does not reveal a token's prefix.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

impl Auth {
    pub fn guards_reads_and_writes(&self) -> bool {
        self.write.is_some() && self.read.is_some()
    }

    pub fn may_write(&self, token: Option<&str>) -> bool {
        match (&self.write, token) {
            (None, _) => true,
            (Some(w), Some(t)) => same(w, t),
            (Some(_), None) => false,
        }
    }

    pub fn may_read(&self, token: Option<&str>) -> bool {
        match (&self.read, token) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(r), Some(t)) => same(r, t) || self.write.as_deref().is_some_and(|w| same(w, t)),
        }
    }
}

fn token_of(req: &Request) -> Option<String> {
    if let Some(v) = req.headers().get(header::AUTHORIZATION) {
        if let Some(t) = v.to_str().ok().and_then(|s| s.strip_prefix("Bearer ")) {
            return Some(t.trim().to_string());
        }
    }
    // Percent-decoded: base64 tokens hold `+`, `/` and `=`, which a URL carries encoded.
    req.uri().query().and_then(|q| {
        form_urlencoded::parse(q.as_bytes())
            .find(|(k, _)| k == "token")
            .map(|(_, v)| v.into_owned())
    })
}

pub async fn require_read(State(app): State<AppState>, req: Request, next: Next) -> Response {
    if app.auth.may_read(token_of(&req).as_deref()) {
        next.run(req).await
    } else {
        (
            StatusCode::UNAUTHORIZED,
            axum::Json(serde_json::json!({"error": "missing or wrong read token"})),
        )
            .into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens() {
        let open = Auth::default();
        assert!(open.may_write(None) && open.may_read(None));
        let locked = Auth {
            write: Some("w".into()),
            read: Some("r".into()),
        };
        assert!(!locked.may_write(None) && !locked.may_write(Some("r")));
        assert!(locked.may_write(Some("w")));
        assert!(locked.may_read(Some("r")) && locked.may_read(Some("w")));
        assert!(!locked.may_read(Some("x")) && !locked.may_read(None));
    }
}
