//! DingTalk's custom robot: the notice as escaped markdown, the URL signed when a secret is
//! set.

use super::http::{hmac_base64, url_encode};
use super::notice::{Escape, Notice};
use serde_json::json;

/// The URL and body for `n` at unix time `now` (seconds).
pub(super) fn request(
    url: &str,
    secret: Option<&str>,
    n: &Notice,
    now: f64,
) -> (String, serde_json::Value) {
    let body = json!({
        "msgtype": "markdown",
        "markdown": { "title": n.title(), "text": n.escaped(Escape::Markdown).markdown() },
    });
    let url = match secret {
        Some(secret) => {
            // https://open.dingtalk.com: sign = base64(HMAC-SHA256(secret, "ts\nsecret"))
            let ts = (now * 1000.0) as i64;
            let sign = hmac_base64(secret.as_bytes(), format!("{ts}\n{secret}").as_bytes());
            let sep = if url.contains('?') { '&' } else { '?' };
            format!("{url}{sep}timestamp={ts}&sign={}", url_encode(&sign))
        }
        None => url.to_string(),
    };
    (url, body)
}
