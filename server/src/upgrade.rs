//! The collector socket's WebSocket upgrade, done here rather than by axum's extractor, so
//! that what a peer sends before its hello is accepted is bounded as it arrives.
//!
//! A batch frame may hold 16 MiB, so the socket's message limit must be that large; but a
//! peer that has not presented a token yet gets no more than [`HELLO_LIMIT`]: [`Gated`] reads
//! each frame's header as its bytes arrive and refuses a frame that announces more (or a
//! connection that sends more in all) before a byte of its payload is buffered. Forty sockets
//! that each began a 15 MiB frame once made the hub hold ~630 MB before any hello; now each
//! costs its read buffer. What all peers without an accepted hello sent is bounded too: each
//! byte takes a permit from the hub's pre-hello budget (`--limit prehello_bytes`), given back
//! when its hello is accepted or its socket closes, so many sockets each sending a little
//! less than the limit in small frames cannot add up to gigabytes. Once the hello is
//! accepted ([`Gate::open`]) the wrapper passes bytes through untouched.

use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::WebSocketStream;

/// Until a hello is accepted, at most this many bytes (frames and their headers, in all)
/// are read: a hello with its config JSON fits.
pub const HELLO_LIMIT: usize = 256 * 1024;

/// Whether the hello was accepted, and whether the gate refused the peer (and why).
pub struct Gate {
    open: AtomicBool,
    refused: std::sync::Mutex<Option<String>>,
    /// The hub's pre-hello byte budget, and this peer's share of it.
    budget: Arc<Semaphore>,
    held: std::sync::Mutex<Option<OwnedSemaphorePermit>>,
}

impl Gate {
    /// A closed gate drawing on the hub's pre-hello byte `budget`.
    pub fn new(budget: Arc<Semaphore>) -> Gate {
        Gate {
            open: AtomicBool::new(false),
            refused: std::sync::Mutex::default(),
            budget,
            held: std::sync::Mutex::default(),
        }
    }

    /// The hello was accepted: from now on bytes pass untouched, and what this peer sent
    /// before is no longer counted against the pre-hello budget.
    pub fn open(&self) {
        self.open.store(true, Ordering::Release);
        if let Ok(mut held) = self.held.lock() {
            held.take();
        }
    }

    /// Counts `n` more bytes against the hub's pre-hello budget.
    fn take(&self, n: usize) -> std::io::Result<()> {
        let Ok(more) = self.budget.clone().try_acquire_many_owned(n as u32) else {
            return Err(self.refuse(
                "the hub holds its most bytes from sockets without an accepted hello (limit \
                 prehello_bytes); retry later"
                    .to_string(),
            ));
        };
        if let Ok(mut held) = self.held.lock() {
            match held.as_mut() {
                Some(h) => h.merge(more),
                None => *held = Some(more),
            }
        }
        Ok(())
    }

    /// Why the gate refused the peer, if it did.
    pub fn refusal(&self) -> Option<String> {
        self.refused.lock().ok()?.clone()
    }

    fn refuse(&self, why: String) -> std::io::Error {
        if let Ok(mut r) = self.refused.lock() {
            r.get_or_insert(why.clone());
        }
        std::io::Error::new(std::io::ErrorKind::InvalidData, why)
    }
}

/// Where the reader is in the frame stream.
enum Frames {
    /// Gathering a frame header (2 to 14 bytes).
    Header { bytes: [u8; 14], have: usize },
    /// Inside a payload: this many bytes to go.
    Payload(u64),
}

impl Frames {
    /// At the start of a frame.
    fn header() -> Frames {
        Frames::Header {
            bytes: [0; 14],
            have: 0,
        }
    }
}

/// A socket whose bytes are checked against [`HELLO_LIMIT`] until its gate opens.
pub struct Gated<S> {
    inner: S,
    gate: Arc<Gate>,
    read: usize,
    frames: Frames,
}

impl<S> Gated<S> {
    pub fn new(inner: S, gate: Arc<Gate>) -> Gated<S> {
        Gated {
            inner,
            gate,
            read: 0,
            frames: Frames::header(),
        }
    }

    /// Follows frame headers through `data` (bytes just read); an error refuses the peer.
    fn inspect(&mut self, mut data: &[u8]) -> std::io::Result<()> {
        self.read += data.len();
        if self.read > HELLO_LIMIT {
            return Err(self.gate.refuse(format!(
                "more than {HELLO_LIMIT} bytes before an accepted hello"
            )));
        }
        self.gate.take(data.len())?;
        while !data.is_empty() {
            match &mut self.frames {
                Frames::Payload(left) => {
                    let skip = (*left).min(data.len() as u64);
                    *left -= skip;
                    data = &data[skip as usize..];
                    if *left == 0 {
                        self.frames = Frames::header();
                    }
                }
                Frames::Header { bytes, have } => {
                    bytes[*have] = data[0];
                    *have += 1;
                    data = &data[1..];
                    if *have < 2 {
                        continue;
                    }
                    let len7 = bytes[1] & 0x7f;
                    let masked = bytes[1] & 0x80 != 0;
                    let extended = match len7 {
                        126 => 2,
                        127 => 8,
                        _ => 0,
                    };
                    let need = 2 + extended + if masked { 4 } else { 0 };
                    if *have < need {
                        continue;
                    }
                    let len = match extended {
                        0 => u64::from(len7),
                        2 => u64::from(u16::from_be_bytes([bytes[2], bytes[3]])),
                        _ => u64::from_be_bytes(bytes[2..10].try_into().expect("8 bytes")),
                    };
                    if len > HELLO_LIMIT as u64 {
                        return Err(self.gate.refuse(format!(
                            "a frame of {len} bytes before an accepted hello; until then frames \
                             are limited to {HELLO_LIMIT} bytes"
                        )));
                    }
                    self.frames = if len == 0 {
                        Frames::header()
                    } else {
                        Frames::Payload(len)
                    };
                }
            }
        }
        Ok(())
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Gated<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            if !this.gate.open.load(Ordering::Acquire) {
                if let Err(e) = this.inspect(&buf.filled()[before..]) {
                    return Poll::Ready(Err(e));
                }
            }
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Gated<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The collector socket once upgraded.
pub type Socket = WebSocketStream<Gated<hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>>>;

/// Answers a WebSocket handshake (RFC 6455) and hands the upgraded, gated socket to `serve`
/// once the client has switched protocols; a request that is no handshake gets a 400.
pub fn upgrade<F, Fut>(
    mut req: Request,
    config: WebSocketConfig,
    budget: Arc<Semaphore>,
    serve: F,
) -> Response
where
    F: FnOnce(Socket, Arc<Gate>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let headers = req.headers();
    let has = |name: header::HeaderName, token: &str| {
        headers.get_all(name).iter().any(|v| {
            v.to_str()
                .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
        })
    };
    let key = headers.get(header::SEC_WEBSOCKET_KEY).cloned();
    let version_ok = headers
        .get(header::SEC_WEBSOCKET_VERSION)
        .is_some_and(|v| v == "13");
    let (Some(key), true, true, true) = (
        key,
        has(header::UPGRADE, "websocket"),
        has(header::CONNECTION, "upgrade"),
        version_ok,
    ) else {
        return (
            StatusCode::BAD_REQUEST,
            "a WebSocket handshake (Upgrade: websocket, Sec-WebSocket-Version: 13) is expected\n",
        )
            .into_response();
    };
    let Some(on_upgrade) = req.extensions_mut().remove::<hyper::upgrade::OnUpgrade>() else {
        return (
            StatusCode::BAD_REQUEST,
            "this connection cannot be upgraded\n",
        )
            .into_response();
    };
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => {
                let gate = Arc::new(Gate::new(budget));
                let io = Gated::new(hyper_util::rt::TokioIo::new(upgraded), gate.clone());
                let socket = WebSocketStream::from_raw_socket(io, Role::Server, Some(config)).await;
                serve(socket, gate).await;
            }
            Err(e) => tracing::debug!(error = %e, "WebSocket upgrade failed"),
        }
    });
    let mut response = StatusCode::SWITCHING_PROTOCOLS.into_response();
    let h = response.headers_mut();
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    if let Ok(v) = HeaderValue::from_str(&accept) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new_gate() -> Arc<Gate> {
        Arc::new(Gate::new(Arc::new(Semaphore::new(1 << 30))))
    }

    fn header(len: u64, masked: bool) -> Vec<u8> {
        let mut h = vec![0x82];
        let m = if masked { 0x80 } else { 0 };
        if len < 126 {
            h.push(m | len as u8);
        } else if len <= 0xffff {
            h.push(m | 126);
            h.extend_from_slice(&(len as u16).to_be_bytes());
        } else {
            h.push(m | 127);
            h.extend_from_slice(&len.to_be_bytes());
        }
        if masked {
            h.extend_from_slice(&[1, 2, 3, 4]);
        }
        h
    }

    #[test]
    fn a_large_frame_is_refused_at_its_header_even_a_byte_at_a_time() {
        let gate = new_gate();
        let mut g = Gated::new((), gate.clone());
        let h = header(16 << 20, true);
        let mut refused = false;
        for b in &h {
            if g.inspect(std::slice::from_ref(b)).is_err() {
                refused = true;
                break;
            }
        }
        assert!(refused);
        assert!(gate.refusal().unwrap().contains("16777216 bytes"));
    }

    #[test]
    fn small_frames_pass_until_the_total_is_spent() {
        let gate = new_gate();
        let mut g = Gated::new((), gate.clone());
        let mut frame = header(1000, true);
        frame.extend(std::iter::repeat_n(7u8, 1000));
        let mut sent = 0;
        while g.inspect(&frame).is_ok() {
            sent += frame.len();
            assert!(sent <= HELLO_LIMIT);
        }
        assert!(sent > HELLO_LIMIT - 2 * frame.len(), "{sent}");
        assert!(gate.refusal().unwrap().contains("before an accepted hello"));
        // Frames split anywhere are followed: a header across two reads, payload in pieces.
        let gate = new_gate();
        let mut g = Gated::new((), gate);
        let mut two = header(70_000, true);
        two.extend(std::iter::repeat_n(0u8, 70_000));
        two.extend(header(5, true));
        two.extend([1, 2, 3, 4, 5]);
        for piece in two.chunks(3) {
            g.inspect(piece).unwrap();
        }
        assert!(matches!(g.frames, Frames::Header { have: 0, .. }));
    }
}

#[cfg(test)]
mod budget_tests {
    use super::*;

    /// Peers without an accepted hello share one byte budget: past it a peer is refused,
    /// and an accepted hello gives its bytes back.
    #[test]
    fn sockets_before_their_hello_share_one_byte_budget() {
        let budget = Arc::new(Semaphore::new(10_000));
        let gates: Vec<Arc<Gate>> = (0..3)
            .map(|_| Arc::new(Gate::new(budget.clone())))
            .collect();
        let mut first = Gated::new((), gates[0].clone());
        let mut second = Gated::new((), gates[1].clone());
        let mut third = Gated::new((), gates[2].clone());
        // Payload bytes of a frame announced earlier: only the counting matters here.
        first.frames = Frames::Payload(u64::MAX);
        second.frames = Frames::Payload(u64::MAX);
        third.frames = Frames::Payload(u64::MAX);
        first.inspect(&[0; 6_000]).unwrap();
        second.inspect(&[0; 4_000]).unwrap();
        let refused = third.inspect(&[0; 1]).unwrap_err();
        assert!(refused.to_string().contains("prehello_bytes"), "{refused}");
        // The first peer's hello is accepted: its 6,000 bytes are free again.
        gates[0].open();
        let mut fourth = Gated::new((), Arc::new(Gate::new(budget.clone())));
        fourth.frames = Frames::Payload(u64::MAX);
        fourth.inspect(&[0; 6_000]).unwrap();
        // Sockets that close give their shares back too: only the fourth's is held now.
        drop((second, third, gates));
        assert_eq!(budget.available_permits(), 4_000);
    }
}
