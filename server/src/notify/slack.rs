//! Slack's incoming webhook: the notice as plain text, mrkdwn escaped and turned off.

use super::notice::{Escape, Notice};
use serde_json::json;

pub(super) fn request(url: &str, n: &Notice) -> (String, serde_json::Value) {
    (
        url.to_string(),
        json!({ "text": n.escaped(Escape::Slack).text(), "mrkdwn": false }),
    )
}
