//! The webhook's memory budget: one setting from which every bound on what clients can make the server hold is
//! derived, so that no mix of clients (many connections, large or slow bodies, HTTP/1.1 or HTTP/2) can push the
//! process past its container's memory limit. Excess gets a fast 503 or a closed connection, never memory.
//!
//! The formula (SECURITY.md, "Memory budget"), for a budget `B`:
//! - request bodies held at once: `B / 6`, at least one largest body (`--body-limit`);
//! - open connections: `(B - BASE - bodies) / PER_CONNECTION`, at least 16;
//! - per connection: HTTP/1.1 read buffer 16 KiB (headers longer than that are refused with 431), HTTP/2 flow
//!   control windows 64 KiB (stream) and 128 KiB (connection), 32 concurrent streams, 16 KiB of headers.
//!
//! `BASE` and `PER_CONNECTION` are measured (tests/hostile/main.rs prints them): the resident size of an idle `serve`
//! and what one idle keep-alive TLS connection adds to it.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum_server::accept::Accept;
use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use pdp_core::size::{KIB, MIB};

/// The default budget: 75% of the Deployment's 128 MiB memory limit, the rest being headroom for the allocator
/// and the kernel's accounting.
pub const DEFAULT_MEMORY_BUDGET: u64 = 96 * MIB;

/// Resident size of an idle `serve` (runtime, TLS config, namespace cache of a small cluster, metrics).
pub const BASE: u64 = 24 * MIB;

/// What one open keep-alive TLS connection costs, idle, measured (about 30 KiB), plus its HTTP/1.1 read buffer
/// when it is filled.
pub const PER_CONNECTION: u64 = 32 * KIB;

/// hyper's HTTP/1.1 read buffer per connection: request headers must fit in it.
pub const HTTP1_READ_BUFFER: usize = 16 * 1024;

/// Every bound derived from one memory budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryBounds {
    /// The budget they come from.
    pub budget: u64,
    /// Bytes of request bodies held at once, across all requests.
    pub body_bytes: usize,
    /// Open connections; one more is closed as soon as it is accepted.
    pub connections: usize,
    /// HTTP/2 flow-control window of one stream: what a client may send before the server reads.
    pub h2_stream_window: u32,
    /// HTTP/2 flow-control window of one connection.
    pub h2_connection_window: u32,
    /// Concurrent HTTP/2 streams per connection.
    pub h2_streams: u32,
    /// HTTP/2 header list size.
    pub h2_header_list: u32,
}

impl MemoryBounds {
    /// Derives the bounds; refuses a budget too small to hold the base, one largest body and 16 connections.
    pub fn from_budget(budget: u64, body_limit: usize) -> Result<MemoryBounds, String> {
        let body_bytes = (budget / 6).max(body_limit as u64);
        let minimum = BASE + body_bytes + 16 * PER_CONNECTION;
        if budget < minimum {
            return Err(format!(
                "memory budget {} MiB is too small: it must hold the process itself ({} MiB), one largest request \
                 body ({} MiB) and 16 connections: at least {} MiB",
                budget / MIB,
                BASE / MIB,
                body_bytes.div_ceil(MIB),
                minimum.div_ceil(MIB)
            ));
        }
        Ok(MemoryBounds {
            budget,
            body_bytes: usize::try_from(body_bytes).unwrap_or(usize::MAX),
            connections: usize::try_from((budget - BASE - body_bytes) / PER_CONNECTION)
                .unwrap_or(usize::MAX),
            h2_stream_window: 64 * 1024,
            h2_connection_window: 128 * 1024,
            h2_streams: 32,
            h2_header_list: 16 * 1024,
        })
    }
}

/// An acceptor that holds one permit per open connection and closes, before the TLS handshake, a connection
/// for which there is none. Clones share the count. It also notes when the last connection arrived, so that a
/// shutdown can wait until the routing has stopped sending new ones ([`ConnectionLimit::wait_quiet`]).
#[derive(Debug, Clone)]
pub struct ConnectionLimit {
    limit: usize,
    free: Arc<Semaphore>,
    refused: Counter,
    arrivals: Arc<Arrivals>,
}

/// When the last connection arrived, in milliseconds since `since` (0: none yet).
#[derive(Debug)]
struct Arrivals {
    since: Instant,
    last_ms: AtomicU64,
}

impl ConnectionLimit {
    /// At most `connections` at once; `refused` counts the connections closed over the limit.
    pub fn new(connections: usize, refused: Counter) -> Self {
        let limit = connections.max(1);
        ConnectionLimit {
            limit,
            free: Arc::new(Semaphore::new(limit)),
            refused,
            arrivals: Arc::new(Arrivals {
                since: Instant::now(),
                last_ms: AtomicU64::new(0),
            }),
        }
    }

    /// Time since the last connection arrived (accepted or refused); `None` if none has.
    pub fn since_last_arrival(&self) -> Option<Duration> {
        match self.arrivals.last_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(
                self.arrivals
                    .since
                    .elapsed()
                    .saturating_sub(Duration::from_millis(ms - 1)),
            ),
        }
    }

    /// Waits until no connection has arrived for `quiet`, or `at_most` has passed; returns the time waited.
    /// A connection dropped in its TLS handshake at shutdown is an `EOF` that the apiserver does not retry, and
    /// the Service's routing (kube-proxy) may keep sending new connections here for a while after the endpoints
    /// changed: stopping once they have stopped arriving, rather than after a fixed time, narrows that window
    /// (a connection that arrives at the very last moment can still be cut). With none arrived yet, the quiet
    /// counts from when the server began accepting: one started a moment ago has not seen its routing stop.
    pub async fn wait_quiet(&self, quiet: Duration, at_most: Duration) -> Duration {
        let started = Instant::now();
        loop {
            let waited = started.elapsed();
            let since = self
                .since_last_arrival()
                .unwrap_or_else(|| self.arrivals.since.elapsed());
            if since >= quiet || waited >= at_most {
                return waited;
            }
            tokio::time::sleep((quiet - since).min(at_most - waited)).await;
        }
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.limit - self.free.available_permits()
    }
}

impl<I, S> Accept<I, S> for ConnectionLimit {
    type Stream = Limited<I>;
    type Service = S;
    type Future = std::future::Ready<io::Result<(Limited<I>, S)>>;

    fn accept(&self, stream: I, service: S) -> Self::Future {
        // +1 keeps 0 for "none yet"; a process up for 584 million years would wrap.
        let ms = self.arrivals.since.elapsed().as_millis() as u64 + 1;
        self.arrivals.last_ms.store(ms, Ordering::Relaxed);
        std::future::ready(match self.free.clone().try_acquire_owned() {
            Ok(permit) => Ok((
                Limited {
                    inner: stream,
                    _permit: permit,
                },
                service,
            )),
            Err(_) => {
                self.refused.inc();
                Err(io::Error::other("connection limit reached"))
            }
        })
    }
}

/// A connection that gives its slot back when it is closed.
#[derive(Debug)]
pub struct Limited<I> {
    inner: I,
    _permit: OwnedSemaphorePermit,
}

impl<I: AsyncRead + Unpin> AsyncRead for Limited<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Limited<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_budget_bounds() {
        let b = MemoryBounds::from_budget(DEFAULT_MEMORY_BUDGET, 7 * 1024 * 1024).unwrap();
        assert_eq!(b.body_bytes, 16 * 1024 * 1024);
        assert_eq!(b.connections, 1792);
    }

    #[test]
    fn small_budgets_are_refused_with_the_minimum() {
        let err = MemoryBounds::from_budget(24 * MIB, 7 * 1024 * 1024).unwrap_err();
        assert!(
            err.contains("at least 32 MiB") || err.contains("at least 3"),
            "{err}"
        );
        // One largest body always fits, even when a sixth of the budget is less.
        let b = MemoryBounds::from_budget(40 * MIB, 7 * 1024 * 1024).unwrap();
        assert_eq!(b.body_bytes, 7 * 1024 * 1024);
    }
}
