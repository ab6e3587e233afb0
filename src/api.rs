//! The hub's HTTP API as the commands call it (`command`, `delete`, `export`): its base URL
//! from the hub named as the collectors name it, the token, and TLS trusting `--ca-file`.

use anyhow::{Context, Result};
use std::path::Path;
use std::sync::Arc;

pub(crate) struct Api {
    pub base: String,
    agent: ureq::Agent,
    token: Option<String>,
    /// The TLS configuration, for a command's WebSocket as well.
    pub tls: Arc<rustls::ClientConfig>,
}

impl Api {
    pub fn new(hub: &str, token: Option<String>, ca_file: Option<&Path>) -> Result<Api> {
        let tls = stepstream_collector::tls_client_config(ca_file).map_err(anyhow::Error::msg)?;
        Ok(Api {
            base: http_base(hub),
            agent: ureq::AgentBuilder::new().tls_config(tls.clone()).build(),
            token,
            tls,
        })
    }

    /// A request for `path` under the hub, with the token.
    pub fn request(&self, method: &str, path: &str) -> ureq::Request {
        let req = self.agent.request(method, &format!("{}{path}", self.base));
        match &self.token {
            Some(token) => req.set("Authorization", &format!("Bearer {token}")),
            None => req,
        }
    }

    /// What a failed call says: a refusal's reason, or why the hub could not be reached.
    pub fn failed(&self, e: ureq::Error) -> Failure {
        match e {
            ureq::Error::Status(code, r) => Failure::Refused(code, why(r)),
            other => Failure::Unreachable(
                anyhow::Error::new(other).context(format!("cannot reach the hub at {}", self.base)),
            ),
        }
    }
}

pub(crate) enum Failure {
    /// The hub answered with an error status, and why.
    Refused(u16, String),
    Unreachable(anyhow::Error),
}

/// The hub as the other commands name it (`ws://...`) or as a browser does (`http://...`),
/// for HTTP.
fn http_base(hub: &str) -> String {
    hub.trim_end_matches('/')
        .replacen("ws://", "http://", 1)
        .replacen("wss://", "https://", 1)
}

/// What a refusal says: its JSON `error`, or its text.
fn why(r: ureq::Response) -> String {
    let text = r.into_string().unwrap_or_default();
    serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| v["error"].as_str().map(str::to_string))
        .unwrap_or(text)
}

/// Reads a JSON answer.
pub(crate) fn json(r: ureq::Response, what: &str) -> Result<serde_json::Value> {
    serde_json::from_reader(r.into_reader()).with_context(|| format!("reading {what}"))
}
