//! Feishu's (Lark) custom bot: the notice as plain text, its `<at>` tags made inert, the body
//! signed when a secret is set.

use super::http::hmac_base64;
use super::notice::{Escape, Notice};
use serde_json::json;

/// The URL and body for `n` at unix time `now` (seconds).
pub(super) fn request(
    url: &str,
    secret: Option<&str>,
    n: &Notice,
    now: f64,
) -> (String, serde_json::Value) {
    let mut body =
        json!({ "msg_type": "text", "content": { "text": n.escaped(Escape::FeishuText).text() } });
    if let Some(secret) = secret {
        // open.feishu.cn: sign = base64(HMAC-SHA256(key = "ts\nsecret", message = ""))
        let ts = now as i64;
        body["timestamp"] = json!(ts.to_string());
        body["sign"] = json!(hmac_base64(format!("{ts}\n{secret}").as_bytes(), b""));
    }
    (url.to_string(), body)
}
