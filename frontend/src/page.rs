//! What the page is told by its address and its clock: `?query` parameters, the read token
//! (taken out of the address bar at once), the time.

pub fn query_param(name: &str) -> Option<String> {
    web_sys::UrlSearchParams::new_with_str(&location_search())
        .ok()?
        .get(name)
}

/// Where the page keeps its read token for the tab's life (a reload keeps it), once taken
/// out of the address bar.
const TOKEN_KEY: &str = "stepstream.token";

thread_local! {
    static TOKEN: std::cell::OnceCell<Option<String>> = const { std::cell::OnceCell::new() };
}

/// The page's read token: `?token=` as opened, taken out of the address bar at once (with
/// `replaceState`, so neither a copied link, the history nor a bookmark carries it) and kept
/// in the tab's session storage instead.
pub fn page_token() -> Option<String> {
    TOKEN.with(|t| t.get_or_init(take_token).clone())
}

fn take_token() -> Option<String> {
    let session = web_sys::window().and_then(|w| w.session_storage().ok().flatten());
    let Some(given) = query_param("token") else {
        return session.and_then(|s| s.get_item(TOKEN_KEY).ok().flatten());
    };
    if let Some(s) = &session {
        let _ = s.set_item(TOKEN_KEY, &given);
    }
    if let Some(w) = web_sys::window() {
        let loc = w.location();
        if let Ok(q) = web_sys::UrlSearchParams::new_with_str(&location_search()) {
            q.delete("token");
            let rest: String = q.to_string().into();
            let url = format!(
                "{}{}{}",
                loc.pathname().unwrap_or_default(),
                if rest.is_empty() { "" } else { "?" },
                rest
            ) + &loc.hash().unwrap_or_default();
            if let Ok(h) = w.history() {
                let _ = h.replace_state_with_url(&wasm_bindgen::JsValue::NULL, "", Some(&url));
            }
        }
    }
    Some(given).filter(|t| !t.is_empty())
}

/// The page's `?query`.
pub fn location_search() -> String {
    web_sys::window()
        .and_then(|w| w.location().search().ok())
        .unwrap_or_default()
}

pub fn now_ms() -> f64 {
    js_sys::Date::now()
}
