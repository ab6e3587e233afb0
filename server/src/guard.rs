//! Who may talk to the hub at all, before any token is looked at: the `Host` a request names
//! (DNS rebinding: a page on `evil.example` whose name resolves to 127.0.0.1 reaches a
//! loopback hub, but still says `Host: evil.example`), and the `Origin` a browser attaches
//! (cross-site WebSocket hijacking: any page a user visits may open `ws://127.0.0.1:7070`).
//!
//! A request passes when its `Host` is the bound address, `localhost` on the bound port, an
//! address literal when the hub listens on every interface, or a configured name; and when
//! its `Origin`, if it has one, is the hub's own (same scheme-less host and port as `Host`)
//! or on the configured allow-list. Non-browser clients (collectors, scripts) send no
//! `Origin` and are judged by their tokens alone.

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

/// The hosts and origins the hub answers.
#[derive(Clone, Debug, Default)]
pub struct Guard {
    bound: Option<SocketAddr>,
    /// Extra names for `Host`, with or without a port (`hub.lab.internal`, `hub:443`).
    hosts: Vec<String>,
    /// Origins allowed besides the hub's own, as `scheme://host[:port]` (`*` allows any).
    origins: Vec<String>,
}

/// Why a request was turned away (said to the client and logged).
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    Host(String),
    Origin(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Host(h) => write!(
                f,
                "Host {h:?} is not this hub's address nor a configured name (--allow-host)"
            ),
            Refusal::Origin(o) => write!(
                f,
                "Origin {o:?} is not this hub's own nor on the allow-list (--allow-origin)"
            ),
        }
    }
}

/// `host:port` split; a bracketed IPv6 literal keeps its brackets off.
fn split_host(hostport: &str) -> (&str, Option<u16>) {
    if let Some(rest) = hostport.strip_prefix('[') {
        if let Some((ip, tail)) = rest.split_once(']') {
            return (ip, tail.strip_prefix(':').and_then(|p| p.parse().ok()));
        }
    }
    match hostport.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => (h, p.parse().ok()),
        _ => (hostport, None),
    }
}

/// Whether an `--allow-host` value names this machine's loopback (`localhost`, `127.0.0.1`,
/// `[::1]`, with or without a port): only clients on this machine use such a name.
pub fn names_loopback(hostport: &str) -> bool {
    let lower = hostport.to_ascii_lowercase();
    let (name, _) = split_host(&lower);
    name == "localhost"
        || name
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

impl Guard {
    pub fn new(bound: SocketAddr, hosts: Vec<String>, origins: Vec<String>) -> Guard {
        Guard {
            bound: Some(bound),
            hosts: hosts.into_iter().map(|h| h.to_ascii_lowercase()).collect(),
            origins: origins
                .into_iter()
                .map(|o| o.trim_end_matches('/').to_ascii_lowercase())
                .collect(),
        }
    }

    /// Whether a `Host` header value names this hub.
    pub fn host_ok(&self, host: &str) -> bool {
        let Some(bound) = self.bound else {
            return true;
        };
        let host = host.to_ascii_lowercase();
        let (name, port) = split_host(&host);
        let port_ok = port.is_none_or(|p| p == bound.port());
        if self.hosts.iter().any(|h| {
            let (n, p) = split_host(h);
            // A browser leaves a scheme's default port out of `Host`: `--allow-host
            // name:443` (or `:80`) is what `Host: name` means behind a TLS proxy.
            n == name
                && match (p, port) {
                    (None, _) => true,
                    (Some(p), Some(port)) => p == port,
                    (Some(p), None) => p == 443 || p == 80,
                }
        }) {
            return true;
        }
        if !port_ok {
            return false;
        }
        match name.parse::<IpAddr>() {
            Ok(ip) if bound.ip().is_unspecified() => ip.is_loopback() || !ip.is_unspecified(),
            Ok(ip) => ip == bound.ip() || (bound.ip().is_loopback() && ip.is_loopback()),
            Err(_) => name == "localhost" && bound.ip().is_loopback(),
        }
    }

    /// Whether an `Origin` header value may talk to this hub, given the request's `Host`.
    pub fn origin_ok(&self, origin: &str, host: &str) -> bool {
        let origin = origin.trim_end_matches('/').to_ascii_lowercase();
        if self.origins.iter().any(|o| o == "*" || *o == origin) {
            return true;
        }
        // The hub's own origin: the same host and port as the request was sent to.
        let Some((scheme, rest)) = origin.split_once("://") else {
            return false;
        };
        let default = if scheme == "https" { 443 } else { 80 };
        let (oh, op) = split_host(rest);
        let (hh, hp) = split_host(host);
        oh == hh.to_ascii_lowercase() && op.unwrap_or(default) == hp.unwrap_or(default)
    }

    /// Checks a request's `Host` and `Origin`; returns the origin of a cross-origin request
    /// that may proceed (its response then names it in `Access-Control-Allow-Origin`).
    pub fn check(&self, req: &Request) -> Result<Option<String>, Refusal> {
        let header = |name| {
            req.headers()
                .get(name)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        };
        // HTTP/2 carries the host in the URI's authority instead.
        let host = header(header::HOST)
            .or_else(|| req.uri().authority().map(|a| a.to_string()))
            .unwrap_or_default();
        if !self.host_ok(&host) {
            return Err(Refusal::Host(host));
        }
        let Some(origin) = header(header::ORIGIN) else {
            return Ok(None);
        };
        // The widget's code is public, like a CDN's; using the hub is not.
        if crate::web::is_public(req.uri().path()) {
            return Ok(None);
        }
        if !self.origin_ok(&origin, &host) {
            return Err(Refusal::Origin(origin));
        }
        Ok(Some(origin))
    }
}

/// The middleware: refuses with 403 and a JSON reason before any handler runs.
///
/// A refused origin's page may read that refusal (it names the origin back), so an
/// embedded widget can say "refused" rather than "unreachable": the reason is all it
/// learns. An allowed cross-origin page gets CORS headers on its answers, and its
/// preflights (a request with an `Authorization` header) are answered here.
pub async fn require_known_peer(
    State(guard): State<Arc<Guard>>,
    req: Request,
    next: Next,
) -> Response {
    match guard.check(&req) {
        Ok(None) => next.run(req).await,
        Ok(Some(origin)) => {
            let preflight = req.method() == axum::http::Method::OPTIONS
                && req
                    .headers()
                    .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
            let mut response = if preflight {
                let mut r = StatusCode::NO_CONTENT.into_response();
                let h = r.headers_mut();
                h.insert(
                    header::ACCESS_CONTROL_ALLOW_METHODS,
                    HeaderValue::from_static("GET, HEAD"),
                );
                h.insert(
                    header::ACCESS_CONTROL_ALLOW_HEADERS,
                    HeaderValue::from_static("authorization"),
                );
                h.insert(
                    header::ACCESS_CONTROL_MAX_AGE,
                    HeaderValue::from_static("600"),
                );
                r
            } else {
                next.run(req).await
            };
            allow(&mut response, &origin);
            response
        }
        Err(refusal) => {
            tracing::warn!(path = %req.uri().path(), reason = %refusal, "request refused");
            let mut response = (
                StatusCode::FORBIDDEN,
                axum::Json(serde_json::json!({ "error": refusal.to_string() })),
            )
                .into_response();
            if let Refusal::Origin(origin) = &refusal {
                allow(&mut response, origin);
            }
            response
        }
    }
}

/// Names `origin` as allowed to read `response`.
fn allow(response: &mut Response, origin: &str) {
    if let Ok(v) = HeaderValue::from_str(origin) {
        let h = response.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
        h.append(header::VARY, HeaderValue::from_static("Origin"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(bind: &str) -> Guard {
        Guard::new(
            bind.parse().unwrap(),
            vec!["hub.lab.internal".into()],
            vec!["https://wiki.lab.internal".into()],
        )
    }

    #[test]
    fn hosts_of_a_loopback_hub() {
        let g = guard("127.0.0.1:7070");
        for ok in [
            "127.0.0.1:7070",
            "localhost:7070",
            "LOCALHOST:7070",
            "[::1]:7070",
            "hub.lab.internal",
            "hub.lab.internal:8443",
        ] {
            assert!(g.host_ok(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:7070",
            "127.0.0.1:7071",
            "10.0.0.5:7070",
            "",
            "localhost.evil.example:7070",
        ] {
            assert!(!g.host_ok(bad), "{bad}");
        }
    }

    /// Behind a TLS proxy the browser sends `Host: name`, without the default port that
    /// `--allow-host name:443` names.
    #[test]
    fn an_allowed_hosts_default_port_matches_a_host_without_one() {
        let g = Guard::new(
            "127.0.0.1:7070".parse().unwrap(),
            vec!["hub.example.org:443".into(), "plain.example.org:80".into()],
            vec![],
        );
        for ok in [
            "hub.example.org",
            "hub.example.org:443",
            "plain.example.org",
            "plain.example.org:80",
        ] {
            assert!(g.host_ok(ok), "{ok}");
        }
        for bad in ["hub.example.org:8443", "plain.example.org:443"] {
            assert!(!g.host_ok(bad), "{bad}");
        }
        assert!(names_loopback("localhost:7070") && names_loopback("[::1]:80"));
        assert!(names_loopback("127.0.0.2") && !names_loopback("hub.example.org:443"));
        assert!(!names_loopback("10.0.0.5"));
    }

    #[test]
    fn hosts_of_a_hub_on_every_interface() {
        let g = guard("0.0.0.0:7070");
        assert!(g.host_ok("10.0.0.5:7070") && g.host_ok("127.0.0.1:7070"));
        assert!(!g.host_ok("evil.example:7070") && !g.host_ok("localhost:7070"));
        assert!(!g.host_ok("0.0.0.0:7070"));
    }

    #[test]
    fn origins() {
        let g = guard("127.0.0.1:7070");
        assert!(g.origin_ok("http://127.0.0.1:7070", "127.0.0.1:7070"));
        assert!(g.origin_ok("https://wiki.lab.internal/", "127.0.0.1:7070"));
        assert!(!g.origin_ok("http://evil.example", "127.0.0.1:7070"));
        assert!(!g.origin_ok("http://127.0.0.1:7071", "127.0.0.1:7070"));
        assert!(!g.origin_ok("null", "127.0.0.1:7070"));
        assert!(g.origin_ok("https://hub.lab.internal", "hub.lab.internal"));
        let any = Guard::new("127.0.0.1:1".parse().unwrap(), vec![], vec!["*".into()]);
        assert!(any.origin_ok("http://evil.example", "127.0.0.1:1"));
    }
}
