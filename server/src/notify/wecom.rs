//! WeCom's (enterprise WeChat) group robot: the notice as escaped markdown.

use super::notice::{Escape, Notice};
use serde_json::json;

pub(super) fn request(url: &str, n: &Notice) -> (String, serde_json::Value) {
    (
        url.to_string(),
        json!({ "msgtype": "markdown", "markdown": { "content": n.escaped(Escape::Markdown).markdown() } }),
    )
}
