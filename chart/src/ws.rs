//! The viewer WebSocket: binary protocol frames in and out, reconnecting by itself.
//!
//! On every (re)open the socket asks its owner what to send (`on_open`), which is how
//! subscriptions are restored after a hub restart without losing or repeating points.

use std::cell::RefCell;
use std::rc::Rc;
use stepstream_protocol::{FromViewer, ToViewer};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use web_sys::{BinaryType, MessageEvent, WebSocket};

pub struct Handlers {
    /// Called on each open; returns the frames to send first.
    pub on_open: Box<dyn Fn() -> Vec<FromViewer>>,
    pub on_message: Box<dyn Fn(ToViewer)>,
    /// Called when the link changes.
    pub on_state: Box<dyn Fn(Link)>,
}

/// The state of the link to the hub.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    Open,
    /// An open socket closed; reconnecting in `retry_ms`.
    Lost {
        retry_ms: i32,
    },
    /// The socket closed before it opened: the hub is unreachable or refused the handshake
    /// (a browser cannot tell which); trying again in `retry_ms`.
    Failed {
        retry_ms: i32,
    },
}

impl Link {
    pub fn is_open(self) -> bool {
        self == Link::Open
    }
}

struct Inner {
    url: String,
    socket: Option<WebSocket>,
    backoff_ms: i32,
    /// Closed for good by its owner: no more reconnects.
    closed: bool,
}

/// A self-healing connection; clone freely. Handlers are called with no borrow held, so
/// they may send.
#[derive(Clone)]
pub struct Socket(Rc<RefCell<Inner>>, Rc<Handlers>);

/// `ws(s)://<hub or the page's host>/ws/viewer`, carrying `token` if there is one. `hub` may
/// be an http(s) or ws(s) URL.
pub fn viewer_url(hub: Option<&str>, token: Option<&str>) -> String {
    let location = web_sys::window().expect("window").location();
    let base = match hub {
        Some(h) => {
            let h = h.trim_end_matches('/');
            if let Some(rest) = h.strip_prefix("http") {
                format!("ws{rest}")
            } else {
                h.to_string()
            }
        }
        None => {
            let scheme = if location.protocol().ok().as_deref() == Some("https:") {
                "wss"
            } else {
                "ws"
            };
            format!("{scheme}://{}", location.host().unwrap_or_default())
        }
    };
    match token.filter(|t| !t.is_empty()) {
        Some(t) => format!("{base}/ws/viewer?token={}", js_sys::encode_uri_component(t)),
        None => format!("{base}/ws/viewer"),
    }
}

impl Socket {
    pub fn open(url: String, handlers: Handlers) -> Socket {
        let socket = Socket(
            Rc::new(RefCell::new(Inner {
                url,
                socket: None,
                backoff_ms: 250,
                closed: false,
            })),
            Rc::new(handlers),
        );
        socket.connect();
        socket
    }

    pub fn send(&self, msg: &FromViewer) {
        let inner = self.0.borrow();
        if let Some(ws) = &inner.socket {
            if ws.ready_state() == WebSocket::OPEN {
                let _ = ws.send_with_u8_array(&msg.encode());
            }
        }
    }

    /// Closes the socket for good.
    pub fn close(&self) {
        let mut inner = self.0.borrow_mut();
        inner.closed = true;
        if let Some(ws) = inner.socket.take() {
            let _ = ws.close();
        }
    }

    fn connect(&self) {
        if self.0.borrow().closed {
            return;
        }
        let url = self.0.borrow().url.clone();
        let ws = match WebSocket::new(&url) {
            Ok(ws) => ws,
            Err(_) => {
                let retry_ms = self.0.borrow().backoff_ms;
                (self.1.on_state)(Link::Failed { retry_ms });
                self.retry();
                return;
            }
        };
        ws.set_binary_type(BinaryType::Arraybuffer);

        let opened = Rc::new(std::cell::Cell::new(false));
        let me = self.clone();
        let was = opened.clone();
        let onopen = Closure::<dyn FnMut()>::new(move || {
            me.0.borrow_mut().backoff_ms = 250;
            was.set(true);
            (me.1.on_state)(Link::Open);
            for msg in (me.1.on_open)() {
                me.send(&msg);
            }
        });
        ws.set_onopen(Some(onopen.as_ref().unchecked_ref()));
        onopen.forget();

        let me = self.clone();
        let onmessage = Closure::<dyn FnMut(MessageEvent)>::new(move |e: MessageEvent| {
            let Ok(buf) = e.data().dyn_into::<js_sys::ArrayBuffer>() else {
                return;
            };
            let bytes = js_sys::Uint8Array::new(&buf).to_vec();
            match ToViewer::decode(&bytes) {
                Ok(msg) => (me.1.on_message)(msg),
                Err(err) => {
                    web_sys::console::warn_1(&format!("stepstream: bad frame: {err}").into())
                }
            }
        });
        ws.set_onmessage(Some(onmessage.as_ref().unchecked_ref()));
        onmessage.forget();

        let me = self.clone();
        let onclose = Closure::<dyn FnMut()>::new(move || {
            let retry_ms = {
                let mut inner = me.0.borrow_mut();
                inner.socket = None;
                if inner.closed {
                    return;
                }
                inner.backoff_ms
            };
            (me.1.on_state)(if opened.get() {
                Link::Lost { retry_ms }
            } else {
                Link::Failed { retry_ms }
            });
            me.retry();
        });
        ws.set_onclose(Some(onclose.as_ref().unchecked_ref()));
        onclose.forget();

        self.0.borrow_mut().socket = Some(ws);
    }

    fn retry(&self) {
        let delay = {
            let mut inner = self.0.borrow_mut();
            let d = inner.backoff_ms;
            inner.backoff_ms = (d * 2).min(4000);
            d
        };
        let me = self.clone();
        let again = Closure::once_into_js(move || me.connect());
        let _ = web_sys::window()
            .expect("window")
            .set_timeout_with_callback_and_timeout_and_arguments_0(again.unchecked_ref(), delay);
    }
}
