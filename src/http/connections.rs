//! The listener `serve` accepts on: at most `max` connections open at once, a connection
//! that moves no byte for `idle` closed, and hyper's own answers to requests it cannot
//! parse put in the error format.
//!
//! Under more load than the instance can serve, clients time out and retry on new
//! connections while the old ones wait to be served, so sockets pile up: the fleet
//! benchmark reached the open-file limit (database connections then fail) and 1.8 GiB of
//! RSS (reports/fleet.md). Past the cap the listener stops accepting, so the kernel's
//! backlog and then the clients' connects wait instead. Written here because neither axum
//! nor tower limits connections (tower's limits count requests, and axum's `serve` gives no
//! hook on the connection's life besides its listener).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::serve::Listener;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

use crate::metrics::ConnectionMetrics;

/// A TCP listener that holds at most `max` connections open at once.
pub struct CappedListener {
    listener: TcpListener,
    places: Arc<Semaphore>,
    max: usize,
    idle: Duration,
    metrics: ConnectionMetrics,
    /// When the log last said the cap was reached: once a minute at most.
    warned_full: Option<Instant>,
}

impl CappedListener {
    pub fn new(
        listener: TcpListener,
        max: usize,
        idle: Duration,
        metrics: ConnectionMetrics,
    ) -> Self {
        CappedListener {
            listener,
            places: Arc::new(Semaphore::new(max)),
            max,
            idle,
            metrics,
            warned_full: None,
        }
    }

    fn warn_full(&mut self) {
        let now = Instant::now();
        if self
            .warned_full
            .is_none_or(|t| now - t >= Duration::from_secs(60))
        {
            self.warned_full = Some(now);
            tracing::warn!(
                max = self.max,
                "every connection the instance may hold is open: new ones wait to be accepted \
                 (RUSH_METER_MAX_CONNECTIONS; the instance is saturated, add instances)"
            );
        }
    }
}

impl Listener for CappedListener {
    type Io = Connection<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Connection<TcpStream>, SocketAddr) {
        // The permit first: past the cap, nothing is accepted until a connection closes.
        let permit = match Arc::clone(&self.places).try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                self.warn_full();
                Arc::clone(&self.places)
                    .acquire_owned()
                    .await
                    .expect("the semaphore is never closed")
            }
        };
        // axum's own accept loop: logs and backs off on errors such as EMFILE.
        let (stream, addr) = Listener::accept(&mut self.listener).await;
        // Answers are small and latency counts: no Nagle delay behind the client's ACK.
        let _ = stream.set_nodelay(true);
        let conn = Connection::new(stream, permit, self.idle, self.metrics.clone());
        (conn, addr)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

/// An accepted connection: gives its place back when dropped; reads end once it has moved
/// no byte for `idle` with nothing waiting to be written (a keep-alive connection its client
/// forgot, a client gone silent mid-request), so it cannot hold a place forever. A client
/// that stops reading a response is the writer's to time out (the export's stall limit).
pub struct Connection<S> {
    stream: S,
    _permit: OwnedSemaphorePermit,
    idle: Duration,
    quiet_since: Instant,
    timer: Pin<Box<Sleep>>,
    write_blocked: bool,
    metrics: ConnectionMetrics,
    /// The error-format answer being written in place of one of hyper's, how much of it
    /// is written, and the length of hyper's (what its write reports).
    refusal: Option<(Vec<u8>, usize, usize)>,
}

impl<S> Drop for Connection<S> {
    fn drop(&mut self) {
        self.metrics.open.dec();
    }
}

impl<S> Connection<S> {
    fn new(
        stream: S,
        permit: OwnedSemaphorePermit,
        idle: Duration,
        metrics: ConnectionMetrics,
    ) -> Self {
        metrics.open.inc();
        Connection {
            metrics,
            stream,
            _permit: permit,
            idle,
            quiet_since: Instant::now(),
            timer: Box::pin(tokio::time::sleep(idle)),
            write_blocked: false,
            refusal: None,
        }
    }

    fn moved(&mut self, bytes: usize) {
        if bytes > 0 {
            self.quiet_since = Instant::now();
        }
    }

    /// Whether the connection has been quiet for `idle`; else the timer wakes at the time
    /// it would be.
    fn idle_out(&mut self, cx: &mut Context<'_>) -> bool {
        let deadline = self.quiet_since + self.idle;
        if self.timer.deadline() != deadline {
            self.timer.as_mut().reset(deadline);
        }
        !self.write_blocked && self.timer.as_mut().poll(cx).is_ready()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Connection<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.stream).poll_read(cx, buf) {
            Poll::Ready(r) => {
                let n = buf.filled().len() - before;
                self.moved(n);
                Poll::Ready(r)
            }
            Poll::Pending if self.idle_out(cx) => {
                self.metrics.idle_closed.inc();
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the connection was idle too long",
                )))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Hyper answers a request it cannot parse (a head past its buffer, a bad request line or
/// header, a URI too long) itself, with an empty body and no hook to shape it; it writes
/// that answer alone and then closes. Such a write is recognised here (a 4xx head with
/// `content-length: 0`, which no answer of the service has: each carries the error body)
/// and the error-format answer of the same status is written in its place.
fn hyper_refusal(bytes: &[u8]) -> Option<Vec<u8>> {
    let status = bytes.strip_prefix(b"HTTP/1.1 ")?.get(..3)?;
    let status: u16 = std::str::from_utf8(status).ok()?.parse().ok()?;
    let head = bytes.len() < 1024 && bytes.ends_with(b"\r\n\r\n");
    let empty = bytes
        .to_ascii_lowercase()
        .windows(19)
        .any(|w| w == b"content-length: 0\r\n");
    (head && empty && matches!(status, 400 | 414 | 431))
        .then(|| super::error::ApiError::unparsed(status).into_raw_response())
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Connection<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.refusal.is_none() {
            self.refusal = hyper_refusal(buf).map(|r| (r, 0, buf.len()));
        }
        if self.refusal.is_some() {
            return self.write_refusal(cx);
        }
        let r = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.wrote(r)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.refusal.is_none() && bufs.first().is_some_and(|b| b.starts_with(b"HTTP/1.1 4")) {
            let whole: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
            self.refusal = hyper_refusal(&whole).map(|r| (r, 0, whole.len()));
        }
        if self.refusal.is_some() {
            return self.write_refusal(cx);
        }
        let r = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.wrote(r)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.refusal.is_some() {
            ready!(self.as_mut().write_refusal(cx))?;
        }
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.refusal.is_some() {
            ready!(self.as_mut().write_refusal(cx))?;
        }
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

impl<S: AsyncWrite + Unpin> Connection<S> {
    /// Write the rest of the refusal; once it is all out, report hyper's write as done.
    fn write_refusal(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        loop {
            let Some((bytes, done, claimed)) = self.refusal.as_mut() else {
                return Poll::Ready(Ok(0));
            };
            if *done == bytes.len() {
                let claimed = *claimed;
                self.refusal = None;
                return Poll::Ready(Ok(claimed));
            }
            let r = Pin::new(&mut self.stream).poll_write(cx, &bytes[*done..]);
            let n = ready!(self.wrote(r))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            if let Some((_, done, _)) = self.refusal.as_mut() {
                *done += n;
            }
        }
    }
}

impl<S> Connection<S> {
    fn wrote(&mut self, r: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        self.write_blocked = r.is_pending();
        let r = ready!(r);
        if let Ok(n) = r {
            self.moved(n);
        }
        Poll::Ready(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn listener(max: usize) -> (CappedListener, SocketAddr, ConnectionMetrics) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let m = ConnectionMetrics::default();
        let idle = Duration::from_secs(3600);
        (CappedListener::new(l, max, idle, m.clone()), addr, m)
    }

    #[tokio::test]
    async fn past_the_cap_nothing_is_accepted_until_a_connection_closes() {
        let (mut l, addr, m) = listener(2).await;
        let c1 = TcpStream::connect(addr).await.unwrap();
        let _c2 = TcpStream::connect(addr).await.unwrap();
        let _c3 = TcpStream::connect(addr).await.unwrap();
        let (a1, from) = l.accept().await;
        assert_eq!(from, c1.local_addr().unwrap());
        let (_a2, _) = l.accept().await;
        assert_eq!(m.open.get(), 2);
        // The third waits in the kernel's backlog: with two open, accept waits for a place.
        let mut third = Box::pin(l.accept());
        assert!(third.as_mut().now_or_never().is_none());
        drop(a1);
        let (_a3, _) = third.await;
        assert_eq!(m.open.get(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_quiet_for_its_idle_time_is_closed_and_one_that_talks_is_not() {
        // In memory, so that the paused clock moves only when told (a socket's wait would
        // let it jump to the timer).
        let places = Arc::new(Semaphore::new(1));
        let permit = Arc::clone(&places).acquire_owned().await.unwrap();
        let (mut client, server) = tokio::io::duplex(64);
        let m = ConnectionMetrics::default();
        let idle = Duration::from_secs(120);
        let mut conn = Connection::new(server, permit, idle, m.clone());
        let mut buf = [0u8; 16];
        // Bytes every 100 s keep it open past 120 s.
        for _ in 0..3 {
            tokio::time::advance(Duration::from_secs(100)).await;
            client.write_all(b"ping").await.unwrap();
            let n = conn.read(&mut buf).await.unwrap();
            assert_eq!(&buf[..n], b"ping");
        }
        // Then 120 s of silence ends the read with an error, and the place is given back.
        let quiet = tokio::time::timeout(Duration::from_secs(3600), conn.read(&mut buf));
        let err = quiet
            .await
            .expect("closed well before an hour")
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(m.idle_closed.get(), 1);
        drop(conn);
        assert_eq!((places.available_permits(), m.open.get()), (1, 0));
    }
}
