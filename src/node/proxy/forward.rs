//! One client connection: waiting for an instance, copying bytes both ways, closing it when idle, old, or
//! when a newer instance serves.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::instances::*;
use super::stats::*;
use super::*;
use crate::node::slots::{Activity, COPY_BUFFER, Slot};

/// One client connection: find an instance (waiting if none is ready), then copy bytes both ways until
/// either side closes, or the drain ends.
pub(super) async fn serve<S>(
    client: S,
    peer: String,
    route: Arc<Route>,
    shared: Arc<Shared>,
    slot: Slot,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let started = Instant::now();
    let deadline = started + shared.wait;
    let mut phase = shared.phase.subscribe();
    let mut waited = false;
    let (name, backend) = loop {
        if let Some(found) = connect_newest(&route, &shared).await {
            break found;
        }
        let now = Instant::now();
        if now >= deadline {
            shared.count(|s| s.gave_up += 1);
            warn!(
                route = route.kind,
                peer,
                waited_ms = started.elapsed().as_millis() as u64,
                "no PDP instance ready within --wait: connection closed"
            );
            return;
        }
        if !waited {
            waited = true;
            shared.count(|s| s.waited += 1);
            info!(
                route = route.kind,
                peer, "no PDP instance ready: the connection waits"
            );
        }
        let nap = shared.retry_interval.min(deadline - now);
        tokio::select! {
            _ = tokio::time::sleep(nap) => {}
            _ = phase.wait_for(|p| *p == Phase::Stopped) => {
                shared.count(|s| s.cut_at_drain += 1);
                return;
            }
            _ = slot.conn.taken() => return,
        }
    };
    shared.instance(&name, |c| c.forwarded += 1);
    if waited {
        info!(
            route = route.kind,
            peer,
            instance = name,
            waited_ms = started.elapsed().as_millis() as u64,
            "PDP instance ready: forwarding after the wait"
        );
    } else {
        debug!(route = route.kind, peer, instance = name, "forwarding");
    }
    let activity = &slot.conn.activity;
    let (client_r, client_w) = tokio::io::split(client);
    let (backend_r, backend_w) = backend.into_split();
    let up = pipe(Tracked::new(client_r, Activity::UP, activity), backend_w);
    let down = pipe(Tracked::new(backend_r, Activity::DOWN, activity), client_w);
    let newest = route.newest.subscribe();
    // `biased`: the copy is polled first at every wake, so bytes a client has just sent are read (and marked
    // in `activity`) before a move or an age limit may close the connection between two exchanges.
    // Each closing branch counts inside its own future: `select!` drops the copies (and with them the client's
    // connection) before a branch's handler runs, so a count in the handler could trail the client's EOF.
    let copied = tokio::select! {
        biased;
        (up, down) = async { tokio::join!(up, down) } => up.and_then(|up| down.map(|down| (up, down))),
        _ = slot.conn.taken() => {
            debug!(route = route.kind, peer, instance = name, "closed: a new connection took its place at the bound");
            return;
        }
        ended = async {
            let ended = idle_or_aged(activity, shared.idle_timeout, shared.max_age).await;
            match ended {
                Ended::Idle => shared.count(|s| s.idle_closed += 1),
                Ended::Aged => shared.count(|s| s.aged_closed += 1),
            }
            ended
        } => {
            debug!(route = route.kind, peer, instance = name, ?ended, "closed: idle or old");
            return;
        }
        _ = async {
            until_moved(&name, newest, activity).await;
            shared.instance(&name, |c| c.moved += 1);
        } => {
            debug!(route = route.kind, peer, instance = name, "moved: closed between two exchanges, a newer instance serves");
            return;
        }
        _ = async {
            // `wait_for` errs only when the phase's sender is gone, which is the end of the drain too.
            let _ = phase.wait_for(|p| *p == Phase::Stopped).await;
            shared.count(|s| s.cut_at_drain += 1);
        } => {
            debug!(route = route.kind, peer, instance = name, "closed at the end of the drain");
            return;
        }
    };
    match copied {
        Ok((up, down)) => debug!(
            route = route.kind,
            peer,
            instance = name,
            up,
            down,
            "connection closed"
        ),
        Err(e) => {
            shared.instance(&name, |c| c.errors += 1);
            debug!(route = route.kind, peer, instance = name, error = %e, "connection ended with an error");
        }
    }
}

/// Copies one direction until end of stream, then passes the end on (half-close), as `copy_bidirectional`
/// does for each side.
pub(super) async fn pipe<R, W>(mut from: R, mut to: W) -> io::Result<u64>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut from = BufReader::with_capacity(COPY_BUFFER, &mut from);
    let n = tokio::io::copy_buf(&mut from, &mut to).await?;
    to.shutdown().await?;
    Ok(n)
}

/// Why a connection was closed by its own clock.
#[derive(Debug)]
pub(super) enum Ended {
    /// No byte either way for --idle-timeout.
    Idle,
    /// Older than --max-connection-age, at a pause between two exchanges.
    Aged,
}

/// Resolves when the connection has been quiet for `idle`, or is older than `max_age` and between two exchanges.
pub(super) async fn idle_or_aged(activity: &Activity, idle: Duration, max_age: Duration) -> Ended {
    loop {
        let quiet = activity.quiet();
        if quiet >= idle {
            return Ended::Idle;
        }
        let age = activity.age();
        let nap = if age >= max_age {
            match activity.quiet_after_answer() {
                Some(q) if q >= MOVE_QUIET && still_between_exchanges(activity).await => {
                    return Ended::Aged;
                }
                _ => MOVE_QUIET,
            }
        } else {
            (idle - quiet).min(max_age - age)
        };
        tokio::time::sleep(nap).await;
    }
}

/// Whether the connection is still between two exchanges after the copy has had one more turn: a client's next
/// request may be in the socket already, unread, and closing then would reset the connection (the kernel
/// answers unread data with RST) and fail that request. `yield_now` lets the runtime poll its I/O driver and the
/// (biased) copy read what arrived, which marks the activity; only a connection still quiet after an answer is
/// closed. What is left is the instant between that read and the close: a close crossing a request on the
/// wire, which no server that closes idle keep-alive connections avoids.
async fn still_between_exchanges(activity: &Activity) -> bool {
    tokio::task::yield_now().await;
    activity
        .quiet_after_answer()
        .is_some_and(|quiet| quiet >= MOVE_QUIET)
}

/// A reader that records in [`Activity`] when it returned bytes.
pub(super) struct Tracked<'a, R> {
    inner: R,
    dir: u8,
    activity: &'a Activity,
}

impl<'a, R> Tracked<'a, R> {
    fn new(inner: R, dir: u8, activity: &'a Activity) -> Self {
        Self {
            inner,
            dir,
            activity,
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for Tracked<'_, R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.mark(self.dir);
        }
        polled
    }
}

/// How long a connection must have been quiet after an answer before it is moved: the pause between two
/// exchanges. Closing then is what an HTTP/1.1 server does with an idle keep-alive connection, which clients
/// expect; closing in the middle of an exchange would fail it.
pub(super) const MOVE_QUIET: Duration = crate::node::slots::QUIET;

/// Resolves when this connection should be closed so that its client reconnects to a newer instance: a newer
/// instance accepts connections, and the connection is between two exchanges. Never resolves otherwise.
///
/// Why: a terminating instance may fail requests on connections it still has. Cerbos stops its gRPC server
/// before its HTTP server, and its HTTP API calls its own gRPC listener, so an HTTP/1.1 keep-alive connection
/// to a terminating Cerbos gets 503s until it is closed; HTTP/1.1 has no GOAWAY to move it. Moving idle
/// connections as soon as the new instance serves (long before the old one is stopped) leaves it nothing to
/// fail. HTTP/2 connections (gRPC) rarely pause after an answer (the client acknowledges data with
/// WINDOW_UPDATE); they move on the instance's GOAWAY instead.
///
/// Only a change announced after the connection was forwarded counts (`newest` is subscribed then): a
/// connection that went to an instance newer than the tracker knew of yet is not moved back and forth.
pub(super) async fn until_moved(
    name: &str,
    mut newest: watch::Receiver<Option<String>>,
    activity: &Activity,
) {
    let elsewhere = |n: &Option<String>| n.as_deref().is_some_and(|n| n != name);
    loop {
        if newest.changed().await.is_err() {
            return std::future::pending().await;
        }
        if !elsewhere(&newest.borrow_and_update()) {
            continue;
        }
        loop {
            match activity.quiet_after_answer() {
                Some(quiet) if quiet >= MOVE_QUIET && still_between_exchanges(activity).await => {
                    return;
                }
                Some(quiet) => tokio::time::sleep(MOVE_QUIET - quiet).await,
                None => tokio::time::sleep(MOVE_QUIET).await,
            }
            if !elsewhere(&newest.borrow()) {
                break;
            }
        }
    }
}
