//! Connections before and under HTTP: accepting them within the connection cap, and the
//! timers that free a connection whose peer stalls (one that sends no request head, one
//! that takes nothing the hub writes).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;

/// A connection that has not sent a whole request head within this is closed (also between
/// the requests of a kept-alive connection): a peer that sends nothing, or headers a byte at
/// a time, holds no task for long. axum's own `serve` sets no timer, so it had no such limit.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// A stream whose writes fail once the peer has taken nothing for `stall`: a response (a
/// `/series` answer, a CSV download, a WebSocket's frames) to a client that stopped reading
/// then frees what it holds, instead of waiting on a full socket for ever.
pub struct WriteDeadline<T> {
    inner: T,
    stall: Duration,
    /// Started when a write first found the socket full; reset by any progress.
    stalled: Option<Pin<Box<Sleep>>>,
    /// The connection's place under the hub's cap, held as long as the connection.
    _place: Option<OwnedSemaphorePermit>,
}

impl<T> WriteDeadline<T> {
    pub fn new(inner: T, stall: Duration) -> WriteDeadline<T> {
        WriteDeadline {
            inner,
            stall,
            stalled: None,
            _place: None,
        }
    }

    /// `Pending` from the inner stream: an error once it has lasted `stall`.
    fn pending<R>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<R>> {
        let stall = self.stall;
        let timer = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(stall)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the peer took nothing for {stall:?}"),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn progressed<R>(
        &mut self,
        outcome: Poll<io::Result<R>>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<R>> {
        match outcome {
            Poll::Ready(r) => {
                self.stalled = None;
                Poll::Ready(r)
            }
            Poll::Pending => self.pending(cx),
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WriteDeadline<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let outcome = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.progressed(outcome, cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let outcome = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.progressed(outcome, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let outcome = Pin::new(&mut self.inner).poll_flush(cx);
        self.progressed(outcome, cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let outcome = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.progressed(outcome, cx)
    }
}

/// The TLS server's acceptor under TLS: the connection cap, `TCP_NODELAY` and
/// [`WriteDeadline`], as plain connections get them.
#[derive(Clone)]
pub struct DeadlineAcceptor {
    pub stall: Duration,
    /// Places for open connections (`--limit connections`).
    pub open: Arc<Semaphore>,
}

impl<S> axum_server::accept::Accept<TcpStream, S> for DeadlineAcceptor {
    type Stream = WriteDeadline<TcpStream>;
    type Service = S;
    type Future = std::future::Ready<io::Result<(Self::Stream, S)>>;

    fn accept(&self, stream: TcpStream, service: S) -> Self::Future {
        let Ok(place) = self.open.clone().try_acquire_owned() else {
            tracing::warn!(
                "connection refused: the hub has its most open connections (limit connections)"
            );
            return std::future::ready(Err(io::Error::other(
                "the hub has its most open connections",
            )));
        };
        std::future::ready(stream.set_nodelay(true).map(|()| {
            let mut io = WriteDeadline::new(stream, self.stall);
            io._place = Some(place);
            (io, service)
        }))
    }
}

/// Serves plain HTTP (and its WebSocket upgrades): at most `open`'s permits of connections at
/// once (`--limit connections`; past it a new connection is closed at once, with a log line),
/// each with [`HEADER_READ_TIMEOUT`], `TCP_NODELAY` and a [`WriteDeadline`] of `stall`.
pub async fn serve_plain(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    open: Arc<Semaphore>,
    stall: Duration,
) -> io::Result<()> {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let builder = Arc::new(builder);
    loop {
        let (tcp, peer): (TcpStream, SocketAddr) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors, say: wait rather than spin.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            tracing::warn!(%peer, "connection refused: the hub has its most open connections (limit connections)");
            drop(tcp);
            continue;
        };
        // Frames are small and each is worth sending now: without `TCP_NODELAY` a frame
        // waits for the peer's delayed ACK of the one before (up to 40 ms on Linux)
        // whenever the peer sends nothing back, as viewers, and collectors between
        // acknowledgements, do.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        let service = hyper_util::service::TowerToHyperService::new(
            app.clone()
                .layer(axum::Extension(axum::extract::ConnectInfo(peer))),
        );
        let builder = builder.clone();
        tokio::spawn(async move {
            let _permit = permit;
            // hyper's timer starts at a request's first byte: a peer that sends nothing at
            // all is timed out here.
            let mut first = [0u8; 1];
            if !matches!(
                tokio::time::timeout(HEADER_READ_TIMEOUT, tcp.peek(&mut first)).await,
                Ok(Ok(1..))
            ) {
                tracing::debug!(%peer, "connection sent nothing within the header-read timeout");
                return;
            }
            let io = TokioIo::new(WriteDeadline::new(tcp, stall));
            if let Err(e) = builder.serve_connection_with_upgrades(io, service).await {
                tracing::debug!(error = %e, %peer, "connection ended");
            }
        });
    }
}
