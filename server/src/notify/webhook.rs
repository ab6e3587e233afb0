//! The plain webhook channel: the notice POSTed as JSON, as it is.

use super::notice::Notice;

pub(super) fn request(url: &str, n: &Notice) -> Option<(String, serde_json::Value)> {
    Some((url.to_string(), serde_json::to_value(n).ok()?))
}
