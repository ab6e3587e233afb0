//! What the robot channels share: posting a JSON body, keeping a robot URL's secrets out of
//! errors, and the HMAC signatures DingTalk and Feishu ask for.

use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::time::Duration;

pub(super) fn hmac_base64(key: &[u8], message: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key");
    mac.update(message);
    base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
}

pub(super) fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub(super) fn post(url: &str, body: &serde_json::Value) -> Result<(), String> {
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(10))
        .build();
    match agent
        .post(url)
        .set("Content-Type", "application/json")
        .send_string(&body.to_string())
    {
        Ok(_) => Ok(()),
        Err(ureq::Error::Status(code, r)) => Err(format!(
            "HTTP {code}: {}",
            r.into_string()
                .unwrap_or_default()
                .chars()
                .take(200)
                .collect::<String>()
        )),
        // Not `e.to_string()`: ureq prints the whole URL, and a robot's URL is its secret
        // (DingTalk's `access_token` and `sign`, WeCom's `key`, Slack's path).
        Err(ureq::Error::Transport(t)) => Err(format!(
            "{} posting to {}{}",
            t.kind(),
            redact(url),
            t.message().map(|m| format!(": {m}")).unwrap_or_default()
        )),
    }
}

/// A URL without what may be secret in it: `scheme://host[:port]/…`.
pub fn redact(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    // `user:password@` is secret too.
    let host = authority.rsplit('@').next().unwrap_or(authority);
    format!("{scheme}://{host}/…")
}
