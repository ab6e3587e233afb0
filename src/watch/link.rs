//! `watch`'s socket to the hub: the viewer WebSocket the page uses (`/ws/viewer`, the same
//! read token), kept open: when it drops, it is opened again (1 s, doubling to 10 s) and the
//! app subscribes again. Messages go both ways through channels, so the terminal never waits
//! on the network.

use futures_util::{SinkExt, StreamExt};
use std::sync::Arc;
use std::time::Duration;
use stepstream_protocol::{FromViewer, ToViewer};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

/// What the link tells the app.
pub enum FromLink {
    /// Opened (again): subscribe.
    Up,
    /// Closed, and why; it retries.
    Down(String),
    Message(Box<ToViewer>),
}

/// `ws://host:port/ws/viewer?token=...` from a hub given as `ws://`, `wss://`, `http://` or
/// `https://` (with or without a trailing `/`).
pub fn viewer_url(hub: &str, token: Option<&str>) -> anyhow::Result<String> {
    let hub = hub.trim_end_matches('/');
    let ws = if let Some(rest) = hub.strip_prefix("http://") {
        format!("ws://{rest}")
    } else if let Some(rest) = hub.strip_prefix("https://") {
        format!("wss://{rest}")
    } else if hub.starts_with("ws://") || hub.starts_with("wss://") {
        hub.to_string()
    } else {
        anyhow::bail!("--hub must start with ws://, wss://, http:// or https://, not {hub:?}");
    };
    let mut url = format!("{ws}/ws/viewer");
    if let Some(t) = token {
        url.push_str("?token=");
        url.extend(t.bytes().map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        }));
    }
    Ok(url)
}

/// Keeps the socket open until the app is gone.
pub async fn run(
    url: String,
    tls: Option<Arc<rustls::ClientConfig>>,
    to_app: mpsc::UnboundedSender<FromLink>,
    mut from_app: mpsc::UnboundedReceiver<FromViewer>,
) {
    let mut backoff = Duration::from_secs(1);
    loop {
        // What the app asked while the socket was down: it subscribes again on `Up`.
        while from_app.try_recv().is_ok() {}
        let connector = tls.clone().map(tokio_tungstenite::Connector::Rustls);
        let opened =
            tokio_tungstenite::connect_async_tls_with_config(&url, None, false, connector).await;
        let mut socket = match opened {
            Ok((socket, _)) => socket,
            Err(e) => {
                let why = match e {
                    tokio_tungstenite::tungstenite::Error::Http(r) => match r.status().as_u16() {
                        401 => "the hub wants a read token (--token-file)".to_string(),
                        403 => "the hub refused this token".to_string(),
                        code => format!("the hub answered {code}"),
                    },
                    e => format!("cannot reach the hub: {e}"),
                };
                if to_app.send(FromLink::Down(why)).is_err() {
                    return;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(10));
                continue;
            }
        };
        backoff = Duration::from_secs(1);
        if to_app.send(FromLink::Up).is_err() {
            return;
        }
        let why = loop {
            tokio::select! {
                msg = socket.next() => match msg {
                    Some(Ok(Message::Binary(bytes))) => match ToViewer::decode(&bytes) {
                        Ok(m) => {
                            if to_app.send(FromLink::Message(Box::new(m))).is_err() {
                                return;
                            }
                        }
                        Err(e) => tracing::debug!(error = %e, "a frame watch does not read"),
                    },
                    Some(Ok(Message::Close(_))) | None => break "the hub closed the socket".to_string(),
                    Some(Ok(_)) => {}
                    Some(Err(e)) => break format!("the socket failed: {e}"),
                },
                out = from_app.recv() => match out {
                    Some(m) => {
                        if let Err(e) = socket.send(Message::Binary(m.encode().into())).await {
                            break format!("the socket failed: {e}");
                        }
                    }
                    None => return,
                },
            }
        };
        if to_app.send(FromLink::Down(why)).is_err() {
            return;
        }
        tokio::time::sleep(backoff).await;
    }
}
