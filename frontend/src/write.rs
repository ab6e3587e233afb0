//! What the page writes to the hub (commands, acknowledgements, rules): JSON requests with
//! a write token of the run's project when the hub guards writes. The page asks its user
//! for one once and keeps it for the tab's session (never in the address bar, never the
//! page's read token).

use crate::fetch::{answered, api_base};

const WRITE_TOKEN_KEY: &str = "stepstream.write_token";
const NAME_KEY: &str = "stepstream.name";

fn session() -> Option<web_sys::Storage> {
    web_sys::window().and_then(|w| w.session_storage().ok().flatten())
}

fn local() -> Option<web_sys::Storage> {
    web_sys::window().and_then(|w| w.local_storage().ok().flatten())
}

/// The name the user signs with (kept in the browser).
pub fn my_name() -> String {
    local()
        .and_then(|s| s.get_item(NAME_KEY).ok().flatten())
        .unwrap_or_default()
}

pub fn set_my_name(name: &str) {
    if let Some(s) = local() {
        let _ = s.set_item(NAME_KEY, name);
    }
}

/// One request with `token`; the status and the answer's text.
async fn request(
    method: &str,
    path: &str,
    body: Option<&str>,
    token: Option<&str>,
) -> Result<(u16, String), String> {
    let window = web_sys::window().ok_or("no window")?;
    let init = web_sys::RequestInit::new();
    init.set_method(method);
    let headers = web_sys::Headers::new().map_err(|e| format!("{e:?}"))?;
    headers
        .set("Content-Type", "application/json")
        .map_err(|e| format!("{e:?}"))?;
    // A read token the page holds lets the request through a guarded hub's reads; a write
    // token, when given, is what may write.
    if let Some(t) = token.map(str::to_string).or_else(crate::page::page_token) {
        headers
            .set("Authorization", &format!("Bearer {t}"))
            .map_err(|e| format!("{e:?}"))?;
    }
    init.set_headers(&headers);
    if let Some(b) = body {
        init.set_body(&wasm_bindgen::JsValue::from_str(b));
    }
    let url = format!("{}{path}", api_base());
    answered(window.fetch_with_str_and_init(&url, &init)).await
}

/// Sends a write, asking once for a write token of `project` if the hub wants one: the
/// answer's JSON, or what to show.
pub async fn send(
    method: &str,
    path: &str,
    project: &str,
    body: Option<String>,
) -> Result<serde_json::Value, String> {
    let mut token = session().and_then(|s| s.get_item(WRITE_TOKEN_KEY).ok().flatten());
    for attempt in 0..2 {
        match request(method, path, body.as_deref(), token.as_deref()).await {
            Ok((200..=299, text)) => return Ok(serde_json::from_str(&text).unwrap_or_default()),
            Ok((401 | 403, text)) if attempt == 0 => {
                let asked = web_sys::window().and_then(|w| {
                    w.prompt_with_message(&format!("A write token of project {project}:"))
                        .ok()
                        .flatten()
                });
                match asked.filter(|t| !t.trim().is_empty()) {
                    Some(t) => {
                        if let Some(s) = session() {
                            let _ = s.set_item(WRITE_TOKEN_KEY, t.trim());
                        }
                        token = Some(t.trim().to_string());
                    }
                    None => return Err(error_of(&text)),
                }
            }
            Ok((_, text)) => return Err(error_of(&text)),
            Err(e) => return Err(format!("not sent: {e}")),
        }
    }
    Err("not sent".into())
}

fn error_of(text: &str) -> String {
    serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|v| v["error"].as_str().map(str::to_string))
        .unwrap_or_else(|| text.to_string())
}
