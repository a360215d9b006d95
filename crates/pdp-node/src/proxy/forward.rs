//! One client connection: waiting for an instance, copying bytes both ways, telling its client to go (or closing
//! it) when it is old or a newer instance serves, closing it when idle.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_util::either::Either;
use tracing::{debug, info, warn};

use super::graceful::{self, Frames, Wire};
use crate::proxy::instances::connect_newest;
use crate::proxy::stats::Shared;
use crate::proxy::{Phase, Route};
use crate::slots::{Activity, COPY_BUFFER, Slot};

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
        if let Some((name, stream)) = connect_newest(&route, &shared).await {
            let (r, w) = stream.into_split();
            break (name, (Either::Left(r), Either::Left(w)));
        }
        if let Some(stream) = connect_fallback(&route, &shared).await {
            shared.instance(FALLBACK, |c| c.forwarded += 1);
            info!(
                route = route.kind,
                peer,
                fallback = route.fallback.as_deref().unwrap_or_default(),
                "no PDP instance ready: forwarding to the fallback"
            );
            let (r, w) = stream.into_split();
            break (FALLBACK.to_string(), (Either::Right(r), Either::Right(w)));
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
    if name != FALLBACK {
        shared.instance(&name, |c| c.forwarded += 1);
    }
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
    let wire = Wire::new();
    // Set (with the reason) when the connection is to go: the copy to the client then tells an HTTP/2 client
    // with a GOAWAY at the instance's next frame boundary, an HTTP/1.1 client with `Connection: close` in
    // the next answer.
    let (to_tell, told) = watch::channel(None::<&'static str>);
    let tell = |why: &'static str| {
        to_tell.send_replace(Some(why));
    };
    let (client_r, client_w) = tokio::io::split(client);
    let (backend_r, backend_w) = backend;
    let up = pipe(
        Tracked::new(client_r, Activity::UP, activity).watching(&wire),
        backend_w,
    );
    // What telling the client counts as: a connection told to go is moved (or aged) then, whoever closes it.
    let count_told = |why: &'static str| match why {
        graceful::MOVED => shared.instance(&name, |c| c.moved += 1),
        graceful::AGED => shared.count(|s| s.aged_closed += 1),
        _ => {}
    };
    let down = pipe_down(
        Tracked::new(backend_r, Activity::DOWN, activity),
        client_w,
        &wire,
        told,
        &count_told,
    );
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
                Ended::Aged => {
                    leave(&wire, activity, &tell, graceful::AGED, shared.idle_timeout).await;
                    if !wire.was_told() {
                        shared.count(|s| s.aged_closed += 1);
                    }
                    linger(&wire, activity).await;
                }
            }
            ended
        } => {
            debug!(route = route.kind, peer, instance = name, ?ended, "closed: idle or old");
            return;
        }
        _ = async {
            until_moved(&name, newest).await;
            leave(&wire, activity, &tell, graceful::MOVED, shared.idle_timeout).await;
            if !wire.was_told() {
                shared.instance(&name, |c| c.moved += 1);
            }
            linger(&wire, activity).await;
        } => {
            debug!(route = route.kind, peer, instance = name, told = wire.was_told(), "moved: a newer instance serves");
            return;
        }
        cut = async {
            // `wait_for` errs only when the phase's sender is gone, which is the end of the drain too.
            if phase.wait_for(|p| *p != Phase::Serving).await.is_ok() {
                // An HTTP client is told to go and closed as a moved connection is, so that the drain need not
                // last its bound; any other finishes what it does (a close at a pause could cross a call).
                let gone = async {
                    leave(&wire, activity, &tell, graceful::DRAINING, shared.idle_timeout).await;
                    if wire.is_other() {
                        std::future::pending::<()>().await;
                    }
                    linger(&wire, activity).await;
                };
                tokio::select! {
                    _ = gone => return false,
                    _ = phase.wait_for(|p| *p == Phase::Stopped) => {}
                }
            }
            shared.count(|s| s.cut_at_drain += 1);
            true
        } => {
            debug!(route = route.kind, peer, instance = name, cut, "closed in the drain");
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

/// The instance name under which connections to the fallback are counted; no Pod has this name.
pub(super) const FALLBACK: &str = "(fallback)";

/// A connection to the route's fallback, when it has one and it accepts within the connect bound.
async fn connect_fallback(route: &Route, shared: &Shared) -> Option<TcpStream> {
    let address = route.fallback.as_deref()?;
    match tokio::time::timeout(shared.connect_timeout, TcpStream::connect(address)).await {
        Ok(Ok(stream)) => {
            let _ = stream.set_nodelay(true);
            Some(stream)
        }
        Ok(Err(e)) => {
            shared.instance(FALLBACK, |c| c.errors += 1);
            warn!(route = route.kind, fallback = address, error = %e, "the fallback refused");
            None
        }
        Err(_) => {
            shared.instance(FALLBACK, |c| c.errors += 1);
            warn!(
                route = route.kind,
                fallback = address,
                "the fallback did not accept in time"
            );
            None
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

/// Copies the instance's bytes to the client until end of stream, like [`pipe`]; once told that the connection
/// is to go, tells the client: an HTTP/2 client with a GOAWAY between two of the instance's frames, an HTTP/1.1
/// client with `Connection: close` in the next answer (see [`graceful`]).
async fn pipe_down<R, W>(
    mut from: R,
    mut to: W,
    wire: &Wire,
    mut told: watch::Receiver<Option<&'static str>>,
    count_told: &impl Fn(&'static str),
) -> io::Result<u64>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; COPY_BUFFER];
    let mut frames = Frames::default();
    let mut copied = 0u64;
    let (mut why, mut listening) = (None, true);
    loop {
        if let Some(why) = why
            && wire.is_h2()
            && !wire.was_told()
        {
            if frames.went_away() {
                // The instance told the client itself: it is told, and the front must not send another.
                wire.mark_told();
                count_told(why);
            } else if frames.may_insert() {
                wire.mark_told();
                count_told(why);
                to.write_all(&graceful::goaway(why)).await?;
                to.flush().await?;
            }
        }
        tokio::select! {
            biased;
            read = from.read(&mut buf) => {
                let n = read?;
                if n == 0 {
                    break;
                }
                let chunk = &buf[..n];
                let asked = wire.take_asked();
                let telling = why.filter(|_| !wire.was_told());
                // Where the front's words go in this read: a GOAWAY at the first gap between the instance's
                // frames (a busy connection's reads rarely end at one), `Connection: close` after the status
                // line of an answer.
                let insert = if wire.is_h2() && telling.is_some() {
                    frames.advance_to_gap(chunk).map(|at| (at, graceful::goaway(telling.unwrap_or_default())))
                } else {
                    // Until the client's first bytes tell, the instance's may be HTTP/2 frames (a server may
                    // send its SETTINGS first).
                    if !wire.is_h1() && !wire.is_other() {
                        frames.advance(chunk);
                    }
                    (telling.is_some() && asked && wire.is_h1())
                        .then(|| graceful::after_status_line(chunk))
                        .flatten()
                        .map(|at| (at, graceful::CONNECTION_CLOSE.to_vec()))
                };
                match insert {
                    Some((at, words)) => {
                        wire.mark_told();
                        count_told(telling.unwrap_or_default());
                        to.write_all(&chunk[..at]).await?;
                        to.write_all(&words).await?;
                        if wire.is_h2() {
                            frames.advance(&chunk[at..]);
                        }
                        to.write_all(&chunk[at..]).await?;
                    }
                    None => to.write_all(chunk).await?,
                }
                to.flush().await?;
                copied += n as u64;
            }
            // The value is copied out of the channel's guard at once: its lock is not held across a write.
            told = async { told.wait_for(Option::is_some).await.ok().and_then(|why| *why) },
                if listening && why.is_none() => {
                why = told;
                listening = told.is_some();
            }
        }
    }
    to.shutdown().await?;
    Ok(copied)
}

/// Tells the connection's client that it is to go, and resolves when it is gone for the front, which closes it
/// (after [`linger`]):
/// - once the client was told (a GOAWAY, or an answer with `Connection: close`);
/// - an HTTP/1.1 connection with no call to answer: at a pause of [`H1_IDLE_PAUSE`] after an answer;
/// - a connection that speaks neither HTTP/2 nor HTTP/1.1: at its next pause between two exchanges
///   ([`MOVE_QUIET`] after an answer), as a server closes an idle keep-alive connection.
///
/// Until the client's first bytes tell its protocol, it may be an HTTP/2 client about to send its preface, and
/// it is not closed, unless it has been quiet for `idle` (--idle-timeout).
async fn leave(
    wire: &Wire,
    activity: &Activity,
    tell: &impl Fn(&'static str),
    why: &'static str,
    idle: Duration,
) {
    tell(why);
    let mut nap = MOVE_QUIET;
    loop {
        if wire.was_told() || activity.quiet() >= idle {
            return;
        }
        let pause = if wire.is_h1() {
            Some(H1_IDLE_PAUSE)
        } else if wire.is_other() {
            Some(MOVE_QUIET)
        } else {
            None
        };
        if let Some(pause) = pause
            && at_pause(activity, pause).await
        {
            return;
        }
        match (pause, activity.quiet_after_answer()) {
            // Short of the pause: looked at again when it is reached (at once if it was reached since the look
            // above).
            (Some(pause), Some(quiet)) => tokio::time::sleep(pause.saturating_sub(quiet)).await,
            // No answer yet, a request under way, or a client that has not said what it speaks: looked at
            // again, less and less often (a telling answer, or the GOAWAY, comes in the meantime).
            _ => {
                tokio::time::sleep(nap).await;
                nap = (nap * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// After [`leave`]: a connection whose client was told to go is closed once it has been quiet for [`TOLD_LINGER`]
/// (the client sends no new call on it, and most clients close it themselves first), or, if the client keeps
/// using it, at the pause right after one of its answers once [`TOLD_GRACE`] is over; any other at once.
async fn linger(wire: &Wire, activity: &Activity) {
    if !wire.was_told() {
        return;
    }
    let told = Instant::now();
    loop {
        let quiet = activity.quiet();
        if quiet >= TOLD_LINGER {
            return;
        }
        if told.elapsed() < TOLD_GRACE {
            tokio::time::sleep((TOLD_LINGER - quiet).min(TOLD_GRACE - told.elapsed())).await;
            continue;
        }
        // Only just after an answer: the grace ends at any point of a pause, and a client that calls every
        // so often sends its next call at the end of one, where a close would cross it.
        let after_answer = activity.quiet_after_answer();
        if after_answer.is_some_and(|q| q < MOVE_QUIET + TOLD_CLOSE_SLACK)
            && at_pause(activity, MOVE_QUIET).await
        {
            return;
        }
        tokio::time::sleep(match after_answer {
            Some(q) if q < MOVE_QUIET => MOVE_QUIET - q,
            // Past the moment: the next answer is waited for (or the linger).
            _ => MOVE_QUIET,
        })
        .await;
    }
}

/// How late after [`MOVE_QUIET`] a told client's connection past its grace may still be closed: a runtime busy
/// elsewhere wakes the front late, and a pause already this long is left for the next one.
const TOLD_CLOSE_SLACK: Duration = Duration::from_millis(40);

/// How long a client told to go may keep using its connection (one that ignores what it was told): then it is
/// closed at a pause, as any connection is, so none stays on an old instance or past its age for ever.
const TOLD_GRACE: Duration = Duration::from_secs(30);

/// How long a connection whose client was told to go may stay quiet before the front closes it: only a client
/// that ignores what it was told, or a call with no byte for this long, is left when it is closed.
const TOLD_LINGER: Duration = Duration::from_secs(10);

/// How long an HTTP/1.1 connection that is to go, with no call since, must have been quiet after its last answer
/// before the front closes it: an active client gets `Connection: close` in an answer before that, which
/// fails nothing; a close, even at a pause, can cross a request sent at that instant, and a client that calls
/// less often than this rarely sends one then.
const H1_IDLE_PAUSE: Duration = Duration::from_secs(1);

/// Why a connection was closed by its own clock.
#[derive(Debug)]
pub(super) enum Ended {
    /// No byte either way for --idle-timeout.
    Idle,
    /// Older than --max-connection-age, at a pause between two exchanges.
    Aged,
}

/// Resolves when the connection has been quiet for `idle` (it is then closed), or is older than `max_age` (it
/// then leaves as a moved one does, see [`leave`]).
pub(super) async fn idle_or_aged(activity: &Activity, idle: Duration, max_age: Duration) -> Ended {
    loop {
        let quiet = activity.quiet();
        if quiet >= idle {
            return Ended::Idle;
        }
        let age = activity.age();
        if age >= max_age {
            return Ended::Aged;
        }
        tokio::time::sleep((idle - quiet).min(max_age - age)).await;
    }
}

/// Whether the connection has been quiet for `pause` after an answer, and still is after the copy has had one
/// more turn: a client's next request may be in the socket already, unread, and closing then would reset the
/// connection (the kernel answers unread data with RST) and fail that request. `yield_now` lets the runtime poll
/// its I/O driver and the (biased) copy read what arrived, which marks the activity; only a connection still
/// quiet after an answer is closed. What is left is the instant between that read and the close: a close crossing a request on the
/// wire, which no server that closes idle keep-alive connections avoids.
async fn at_pause(activity: &Activity, pause: Duration) -> bool {
    let paused = || {
        activity
            .quiet_after_answer()
            .is_some_and(|quiet| quiet >= pause)
    };
    if !paused() {
        return false;
    }
    tokio::task::yield_now().await;
    paused()
}

/// A reader that records in [`Activity`] when it returned bytes.
pub(super) struct Tracked<'a, R> {
    inner: R,
    dir: u8,
    activity: &'a Activity,
    /// Shown the client's bytes, to tell its protocol and its requests.
    wire: Option<&'a Wire>,
}

impl<'a, R> Tracked<'a, R> {
    fn new(inner: R, dir: u8, activity: &'a Activity) -> Self {
        Self {
            inner,
            dir,
            activity,
            wire: None,
        }
    }

    fn watching(self, wire: &'a Wire) -> Self {
        Self {
            wire: Some(wire),
            ..self
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
            if let Some(wire) = self.wire {
                wire.client_sent(&buf.filled()[before..]);
            }
        }
        polled
    }
}

/// How long a connection must have been quiet after an answer before it is moved: the pause between two
/// exchanges. Closing then is what an HTTP/1.1 server does with an idle keep-alive connection, which clients
/// expect; closing in the middle of an exchange would fail it.
pub(super) const MOVE_QUIET: Duration = crate::slots::QUIET;

/// Resolves when a newer instance than this connection's accepts connections: the connection is then to go
/// (see [`leave`]), so that its client reconnects to the newest.
///
/// Why: a terminating instance may fail requests on connections it still has. Cerbos stops its gRPC server
/// before its HTTP server, and its HTTP API calls its own gRPC listener, so an HTTP/1.1 keep-alive connection
/// to a terminating Cerbos gets 503s until it is closed. Moving connections as soon as the new instance serves
/// (long before the old one is stopped) leaves it nothing to fail.
///
/// Only a change announced after the connection was forwarded counts (`newest` is subscribed then): a
/// connection that went to an instance newer than the tracker knew of yet is not moved back and forth.
pub(super) async fn until_moved(name: &str, mut newest: watch::Receiver<Option<String>>) {
    loop {
        if newest.changed().await.is_err() {
            return std::future::pending().await;
        }
        if newest
            .borrow_and_update()
            .as_deref()
            .is_some_and(|n| n != name)
        {
            return;
        }
    }
}
