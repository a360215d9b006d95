//! Hostile clients, drain under load and resource bounds, against the real `pdp-injector serve` binary on
//! 127.0.0.1 (spawned, killed on drop).
//!
//! The short cases run with `cargo test`. The long ones are `#[ignore]`d and run by `scripts/hostile.sh`
//! (`cargo test --release --test hostile -- --include-ignored --test-threads=1`), which CI runs on the debug
//! build: 1,000 idle connections, 30 s of connections without keep-alive (descriptors and memory), a keep-alive
//! connection still open and answering after 120 s idle.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hyper::StatusCode;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

#[path = "../common/mod.rs"]
mod common;
mod cpu_quota;
use common::{lines::*, process::*};
use pdp_testkit::skip::cannot_run;

/// The answer-time bound for a normal client: 100 ms as the issue asks, looser in unoptimised builds (a debug
/// server does the same work several times slower, and `cargo test` shares the machine with other test binaries).
fn answer_bound() -> Duration {
    if cfg!(debug_assertions) {
        Duration::from_millis(400)
    } else {
        Duration::from_millis(100)
    }
}

/// A "normal client" next to the hostile ones: one review every `every` on a keep-alive connection (as the
/// apiserver does) and one on a fresh connection every fourth time. Returns all latencies and errors.
async fn normal_client(
    addr: std::net::SocketAddr,
    client: Arc<rustls::ClientConfig>,
    every: Duration,
    stop: Arc<AtomicBool>,
) -> (Vec<Duration>, Vec<String>) {
    let mut latencies = Vec::new();
    let mut errors = Vec::new();
    let mut keep = connect(addr, &client)
        .await
        .expect("normal client connects");
    let mut n = 0u64;
    let mut tick = tokio::time::interval(every);
    while !stop.load(Ordering::SeqCst) {
        tick.tick().await;
        n += 1;
        let uid = format!("normal-{n}");
        let started = Instant::now();
        let result = if n.is_multiple_of(4) {
            call(
                addr,
                &client,
                "POST",
                "/mutate",
                Some("application/json"),
                review_body(&uid, "daemonset"),
            )
            .await
        } else {
            if keep.is_closed() {
                // The server may close an idle keep-alive connection; a client then opens a new one.
                keep = match connect(addr, &client).await {
                    Ok(k) => k,
                    Err(e) => {
                        errors.push(format!("{uid}: reconnect: {e}"));
                        continue;
                    }
                };
            }
            send(
                &mut keep,
                "POST",
                "/mutate",
                Some("application/json"),
                review_body(&uid, "daemonset"),
            )
            .await
        };
        latencies.push(started.elapsed());
        if let Err(e) = check_answer(result, &uid, "injected_daemonset") {
            errors.push(e);
        }
    }
    (latencies, errors)
}

fn assert_normal_client(what: &str, latencies: &mut [Duration], errors: &[String]) {
    assert_normal_client_within(what, latencies, errors, answer_bound());
}

fn assert_normal_client_within(
    what: &str,
    latencies: &mut [Duration],
    errors: &[String],
    bound: Duration,
) {
    latencies.sort();
    let max = latencies.last().copied().unwrap_or_default();
    eprintln!(
        "{what}: normal client: {} answers, p50 {:?}, p99 {:?}, max {:?}, {} errors",
        latencies.len(),
        percentile(latencies, 50.0),
        percentile(latencies, 99.0),
        max,
        errors.len()
    );
    assert!(
        errors.is_empty(),
        "{what}: normal client errors: {errors:?}"
    );
    assert!(latencies.len() >= 5, "{what}: too few answers");
    assert!(
        max < bound,
        "{what}: a normal answer took {max:?} (bound {bound:?})"
    );
}

/// Waits for the descriptor count to come back to `baseline` (+`slack`); returns the last count.
async fn fds_settle(
    server: &ServerProcess,
    baseline: usize,
    slack: usize,
    limit: Duration,
) -> usize {
    let deadline = Instant::now() + limit;
    loop {
        let n = server.fds();
        if n <= baseline + slack || Instant::now() > deadline {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What a hostile connection did: its kind and how long the server let it live (None: still open at the bound).
type Outcome = (&'static str, Option<Duration>, Vec<u8>);

async fn silent_tcp(addr: std::net::SocketAddr, bound: Duration) -> Outcome {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let closed = closed_within(&mut tcp, bound).await;
    ("silent TCP", closed.as_ref().map(|c| c.0), vec![])
}

async fn partial_hello(addr: std::net::SocketAddr, bound: Duration) -> Outcome {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(&partial_client_hello()).await.unwrap();
    let closed = closed_within(&mut tcp, bound).await;
    ("partial ClientHello", closed.map(|c| c.0), vec![])
}

async fn tls_no_request(
    addr: std::net::SocketAddr,
    client: Arc<rustls::ClientConfig>,
    bound: Duration,
) -> Outcome {
    let mut tls = tls_connect(addr, &client).await.unwrap();
    let closed = closed_within(&mut tls, bound).await;
    ("TLS, no request", closed.map(|c| c.0), vec![])
}

async fn partial_headers(
    addr: std::net::SocketAddr,
    client: Arc<rustls::ClientConfig>,
    bound: Duration,
) -> Outcome {
    let mut tls = tls_connect(addr, &client).await.unwrap();
    tls.write_all(b"POST /mutate HTTP/1.1\r\nHost: loc")
        .await
        .unwrap();
    tls.flush().await.unwrap();
    let closed = closed_within(&mut tls, bound).await;
    ("partial headers", closed.map(|c| c.0), vec![])
}

/// Writes `bytes` one a second until the server closes or `bound` passes; returns when and what it answered.
async fn trickle<S>(stream: &mut S, bytes: &[u8], bound: Duration) -> Option<(Duration, Vec<u8>)>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let started = Instant::now();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    for b in bytes {
        if started.elapsed() > bound {
            return None;
        }
        if stream.write_all(&[*b]).await.is_err() || stream.flush().await.is_err() {
            break;
        }
        // Wait a second for an answer or a close before the next byte.
        match tokio::time::timeout(
            Duration::from_secs(1),
            tokio::io::AsyncReadExt::read(stream, &mut buf),
        )
        .await
        {
            Err(_) => continue,
            Ok(Ok(0)) | Ok(Err(_)) => return Some((started.elapsed(), answer)),
            Ok(Ok(n)) => {
                answer.extend_from_slice(&buf[..n]);
                // Answered: the server must now close (the body was not read to its end).
                let rest = closed_within(stream, bound.saturating_sub(started.elapsed())).await?;
                answer.extend(rest.1);
                return Some((started.elapsed(), answer));
            }
        }
    }
    closed_within(stream, bound.saturating_sub(started.elapsed()))
        .await
        .map(|(_, rest)| {
            answer.extend(rest);
            (started.elapsed(), answer)
        })
}

async fn trickled_headers(
    addr: std::net::SocketAddr,
    client: Arc<rustls::ClientConfig>,
    bound: Duration,
) -> Outcome {
    let mut tls = tls_connect(addr, &client).await.unwrap();
    let headers = b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";
    let r = trickle(&mut tls, headers, bound).await;
    (
        "headers trickled 1 B/s",
        r.as_ref().map(|r| r.0),
        r.map(|r| r.1).unwrap_or_default(),
    )
}

async fn trickled_body(
    addr: std::net::SocketAddr,
    client: Arc<rustls::ClientConfig>,
    bound: Duration,
) -> Outcome {
    let mut tls = tls_connect(addr, &client).await.unwrap();
    let body = review_body("trickle", "daemonset");
    let head = format!(
        "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).await.unwrap();
    let r = trickle(&mut tls, &body, bound).await;
    (
        "body trickled 1 B/s",
        r.as_ref().map(|r| r.0),
        r.map(|r| r.1).unwrap_or_default(),
    )
}

async fn idle_after_request(
    addr: std::net::SocketAddr,
    client: Arc<rustls::ClientConfig>,
    bound: Duration,
) -> Outcome {
    let mut tls = tls_connect(addr, &client).await.unwrap();
    tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = tokio::io::AsyncReadExt::read(&mut tls, &mut buf)
        .await
        .unwrap();
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&buf[..n])
    );
    let closed = closed_within(&mut tls, bound).await;
    (
        "keep-alive idle after a request",
        closed.map(|c| c.0),
        vec![],
    )
}

/// Every hostile connection was closed by the server within `bound`.
fn assert_all_closed(outcomes: &[Outcome], bound: Duration) {
    let mut by_kind: std::collections::BTreeMap<&str, (usize, Duration)> = Default::default();
    for (kind, closed, answer) in outcomes {
        let took = closed.unwrap_or_else(|| panic!("{kind}: still open after {bound:?}"));
        let e = by_kind.entry(kind).or_default();
        e.0 += 1;
        e.1 = e.1.max(took);
        if !answer.is_empty() {
            let text = String::from_utf8_lossy(answer);
            // Slow requests are answered with a timeout status (408 from hyper, 504 from the handler) or dropped.
            assert!(
                text.starts_with("HTTP/1.1 408") || text.starts_with("HTTP/1.1 504"),
                "{kind}: answered {text}"
            );
        }
    }
    for (kind, (n, max)) in by_kind {
        eprintln!("{n:>5} x {kind:<32} closed by the server, the slowest after {max:?}");
    }
}

/// A partial ClientHello, partial headers, headers and a body trickled one byte a second, silent TCP, TLS with no
/// request and a keep-alive connection left idle: the server closes each by its timeouts, while a normal client
/// keeps getting correct answers in time; afterwards the server holds no more descriptors than before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_partial_clients_are_cut_off_while_a_normal_client_is_answered() {
    let _serial = serial().await;
    let flags = with_idle_timeout(
        &["--handshake-timeout", "1s", "--request-timeout", "2s"],
        "1s",
    );
    let server = ServerProcess::start("slow", &flags).await;
    let (addr, client) = (server.addr, server.client());
    // Handshake and header bound 1 s, request bound 2 s, plus scheduling slack.
    let bound = Duration::from_secs(5);
    let baseline = server.fds();

    let stop = Arc::new(AtomicBool::new(false));
    let normal = tokio::spawn(normal_client(
        addr,
        client.clone(),
        Duration::from_millis(50),
        stop.clone(),
    ));
    tokio::time::sleep(Duration::from_millis(200)).await;

    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..20 {
        tasks.spawn(silent_tcp(addr, bound));
        tasks.spawn(tls_no_request(addr, client.clone(), bound));
    }
    for _ in 0..5 {
        tasks.spawn(partial_hello(addr, bound));
        tasks.spawn(partial_headers(addr, client.clone(), bound));
        tasks.spawn(idle_after_request(addr, client.clone(), bound));
    }
    for _ in 0..2 {
        tasks.spawn(trickled_headers(addr, client.clone(), bound));
        tasks.spawn(trickled_body(addr, client.clone(), bound));
    }
    let mut outcomes = vec![];
    while let Some(o) = tasks.join_next().await {
        outcomes.push(o.unwrap());
    }
    stop.store(true, Ordering::SeqCst);
    let (mut latencies, errors) = normal.await.unwrap();
    assert_all_closed(&outcomes, bound);
    assert_normal_client("slow clients", &mut latencies, &errors);

    let after = fds_settle(&server, baseline, 2, Duration::from_secs(3)).await;
    eprintln!("descriptors: {baseline} before, {after} after");
    assert!(
        after <= baseline + 2,
        "descriptors grew from {baseline} to {after}"
    );
}

/// SIGTERM while a client drives about 200 reviews a second over keep-alive connections (and some on fresh
/// connections): readiness fails at once; during the drain delay every request, on open and on new connections,
/// is answered correctly; requests still in flight when draining starts are finished; the process exits 0;
/// the client sees no error at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_under_load_answers_every_request() {
    let _serial = serial().await;
    let drain_delay = Duration::from_secs(2);
    let mut server = ServerProcess::start(
        "drain",
        &[
            "--drain-delay",
            "2s",
            "--shutdown-grace",
            "10s",
            "--request-timeout",
            "8s",
        ],
    )
    .await;
    let (addr, client) = (server.addr, server.client());

    // Load: 4 keep-alive connections at 50 requests a second each, and a fresh connection 10 times a second.
    // Each stops sending at `stop_at`: by then a real cluster has taken the Pod out of the Service's endpoints
    // (that is what the drain delay is for).
    let answered = Arc::new(AtomicUsize::new(0));
    let stop_at: Arc<std::sync::Mutex<Option<Instant>>> = Default::default();
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..5 {
        let (client, answered, stop_at) = (client.clone(), answered.clone(), stop_at.clone());
        workers.spawn(async move {
            let fresh = w == 4;
            let mut errors = vec![];
            let mut sent = 0usize;
            let mut reconnects = 0usize;
            let mut keep = if fresh {
                None
            } else {
                Some(connect(addr, &client).await.unwrap())
            };
            let mut tick =
                tokio::time::interval(Duration::from_millis(if fresh { 100 } else { 20 }));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            for n in 0.. {
                tick.tick().await;
                if stop_at.lock().unwrap().is_some_and(|t| Instant::now() >= t) {
                    break;
                }
                let uid = format!("w{w}-{n}");
                let body = review_body(&uid, "sidecar");
                // As a pooling client does (client-go, hyper's pool): a connection the server closed after an
                // answer that said `Connection: close` (it does while draining) is replaced by a new one.
                if let Some(k) = keep.as_mut()
                    && k.ready().await.is_err()
                {
                    reconnects += 1;
                    match connect(addr, &client).await {
                        Ok(fresh) => *k = fresh,
                        Err(e) => {
                            errors.push(format!("reconnect: {e}"));
                            continue;
                        }
                    }
                }
                let result = match keep.as_mut() {
                    Some(k) => send(k, "POST", "/mutate", Some("application/json"), body).await,
                    None => {
                        call(
                            addr,
                            &client,
                            "POST",
                            "/mutate",
                            Some("application/json"),
                            body,
                        )
                        .await
                    }
                };
                sent += 1;
                match check_answer(result, &uid, "injected_sidecar") {
                    Ok(()) => {
                        answered.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(e) => errors.push(e),
                }
            }
            (sent, errors, reconnects)
        });
    }
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Two requests that will be in flight when draining starts: headers and half a body now, the rest after
    // the drain delay has passed.
    let body = review_body("in-flight", "sidecar");
    let mut slow = vec![];
    for _ in 0..2 {
        let mut tls = tls_connect(addr, &client).await.unwrap();
        let head = format!(
            "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        tls.write_all(head.as_bytes()).await.unwrap();
        tls.write_all(&body[..body.len() / 2]).await.unwrap();
        tls.flush().await.unwrap();
        slow.push(tls);
    }

    let sigterm = Instant::now();
    server.signal("TERM");
    *stop_at.lock().unwrap() = Some(sigterm + drain_delay - Duration::from_millis(300));

    // Readiness fails at once.
    let mut not_ready_after = None;
    while sigterm.elapsed() < Duration::from_secs(1) {
        let (s, _) = call(addr, &client, "GET", "/readyz", None, vec![])
            .await
            .unwrap();
        if s == StatusCode::SERVICE_UNAVAILABLE {
            not_ready_after = Some(sigterm.elapsed());
            break;
        }
    }
    let not_ready_after = not_ready_after.expect("readiness still passing 1 s after SIGTERM");
    eprintln!("readiness failed {not_ready_after:?} after SIGTERM");
    assert!(not_ready_after < Duration::from_millis(500));

    // Finish the in-flight requests once draining has begun.
    tokio::time::sleep(
        (sigterm + drain_delay + Duration::from_millis(500))
            .saturating_duration_since(Instant::now()),
    )
    .await;
    let mut slow_answers = vec![];
    for mut tls in slow {
        tls.write_all(&body[body.len() / 2..]).await.unwrap();
        tls.flush().await.unwrap();
        let (_, answer) = closed_within(&mut tls, Duration::from_secs(5))
            .await
            .expect("in-flight request: connection not closed after its answer");
        slow_answers.push(String::from_utf8_lossy(&answer).to_string());
    }

    let mut sent = 0;
    let mut errors = vec![];
    let mut reconnects = vec![];
    while let Some(r) = workers.join_next().await {
        let (s, e, n) = r.unwrap();
        sent += s;
        errors.extend(e);
        reconnects.push(n);
    }
    let status = server
        .wait_exit(Duration::from_secs(12))
        .await
        .expect("server did not exit");
    let answered = answered.load(Ordering::SeqCst);
    let seconds = (sigterm + drain_delay - Duration::from_millis(300))
        .duration_since(sigterm - Duration::from_secs(1));
    eprintln!(
        "drain: {sent} requests in {seconds:?} ({:.0}/s), {answered} answered correctly, {} errors; exit {status}",
        sent as f64 / seconds.as_secs_f64(),
        errors.len()
    );
    assert!(
        errors.is_empty(),
        "client errors during the drain: {errors:?}"
    );
    assert_eq!(answered, sent);
    // Draining answers on keep-alive connections say `Connection: close`: every keep-alive worker moved to a
    // fresh connection at least once, and the answers on those were correct too.
    eprintln!("keep-alive reconnects per worker after `Connection: close`: {reconnects:?}");
    assert!(
        reconnects.iter().filter(|&&n| n > 0).count() >= 4,
        "keep-alive connections were not told to close while draining: {reconnects:?}"
    );
    // The client paces itself at 200/s; an unoptimised build on a busy machine may fall somewhat behind.
    let floor = if cfg!(debug_assertions) { 0.5 } else { 0.75 };
    assert!(
        sent as f64 >= floor * 200.0 * seconds.as_secs_f64(),
        "load too low: {sent} requests"
    );
    for a in &slow_answers {
        assert!(a.starts_with("HTTP/1.1 200"), "in-flight request: {a}");
        assert!(
            a.contains("\"uid\":\"in-flight\"") && a.contains("injected_sidecar"),
            "in-flight request: {a}"
        );
    }
    assert!(status.success(), "exit status {status}");
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "still accepting after exit"
    );
}

/// 1,000 idle connections of three kinds (silent TCP, TLS without a request, keep-alive idle after a request),
/// open at the same time: all closed by the handshake and header timeouts (default 5 s) while a normal client
/// keeps being answered in time; the descriptors come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: run by scripts/hostile.sh"]
async fn thousand_idle_connections_are_closed_by_timeouts() {
    let _serial = serial().await;
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    eprintln!(
        "{}",
        limits
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .unwrap_or("")
    );
    // The default handshake and first-request timeout (5 s), and an idle timeout of 5 s where `serve` has one:
    // all 1,000 are open at once before the first is closed.
    let server = ServerProcess::start("idle", &with_idle_timeout(&[], "5s")).await;
    let (addr, client) = (server.addr, server.client());
    let bound = Duration::from_secs(9);
    let baseline = server.fds();

    let stop = Arc::new(AtomicBool::new(false));
    let normal = tokio::spawn(normal_client(
        addr,
        client.clone(),
        Duration::from_millis(50),
        stop.clone(),
    ));
    let mut tasks = tokio::task::JoinSet::new();
    let peak = Arc::new(AtomicUsize::new(0));
    for i in 0..1000 {
        match i % 10 {
            0..=3 => tasks.spawn(silent_tcp(addr, bound)),
            4..=6 => tasks.spawn(tls_no_request(addr, client.clone(), bound)),
            _ => tasks.spawn(idle_after_request(addr, client.clone(), bound)),
        };
        if i % 50 == 49 {
            // 50 new connections every 125 ms: all 1,000 are open within about 2.5 s.
            tokio::time::sleep(Duration::from_millis(125)).await;
            peak.fetch_max(server.fds(), Ordering::SeqCst);
        }
    }
    let mut outcomes = vec![];
    while let Some(o) = tasks.join_next().await {
        outcomes.push(o.unwrap());
    }
    stop.store(true, Ordering::SeqCst);
    let (mut latencies, errors) = normal.await.unwrap();
    assert_eq!(outcomes.len(), 1000);
    assert_all_closed(&outcomes, bound);
    assert_normal_client("1,000 idle connections", &mut latencies, &errors);
    let after = fds_settle(&server, baseline, 2, Duration::from_secs(5)).await;
    eprintln!(
        "descriptors: {baseline} before, peak {} while open, {after} after",
        peak.load(Ordering::SeqCst)
    );
    assert!(
        peak.load(Ordering::SeqCst) > baseline + 500,
        "the connections were not open at once"
    );
    assert!(
        after <= baseline + 2,
        "descriptors grew from {baseline} to {after}"
    );
}

/// 30 s of reviews, each on a new connection closed after it (no keep-alive): descriptors come back to the
/// baseline and resident memory does not grow after the warm-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: run by scripts/hostile.sh"]
async fn no_descriptor_or_memory_growth_over_30s_without_keep_alive() {
    let _serial = serial().await;
    let server = ServerProcess::start("growth", &[]).await;
    let (addr, client) = (server.addr, server.client());
    let baseline = server.fds();
    let started = Instant::now();
    let run = Duration::from_secs(30);
    let warm = Duration::from_secs(5);
    let samples: Arc<std::sync::Mutex<Vec<(Duration, usize, u64)>>> = Default::default();
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..4 {
        let client = client.clone();
        workers.spawn(async move {
            let (mut n, mut errors) = (0usize, vec![]);
            while started.elapsed() < run {
                let uid = format!("g{w}-{n}");
                let r = call(
                    addr,
                    &client,
                    "POST",
                    "/mutate",
                    Some("application/json"),
                    review_body(&uid, "daemonset"),
                )
                .await;
                if let Err(e) = check_answer(r, &uid, "injected_daemonset") {
                    errors.push(e);
                }
                n += 1;
            }
            (n, errors)
        });
    }
    {
        let samples = samples.clone();
        let pid = server.pid();
        let probe = ServerProbe(pid);
        tokio::spawn(async move {
            while started.elapsed() < run {
                samples
                    .lock()
                    .unwrap()
                    .push((started.elapsed(), probe.fds(), probe.rss_kib()));
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
    }
    let (mut total, mut errors) = (0, vec![]);
    while let Some(r) = workers.join_next().await {
        let (n, e) = r.unwrap();
        total += n;
        errors.extend(e);
    }
    let after = fds_settle(&server, baseline, 2, Duration::from_secs(5)).await;
    let rss_end = server.rss_kib();
    let samples = samples.lock().unwrap().clone();
    let rss_warm = samples
        .iter()
        .find(|s| s.0 >= warm)
        .map(|s| s.2)
        .expect("a sample after the warm-up");
    let fd_peak = samples.iter().map(|s| s.1).max().unwrap_or(0);
    let rss_peak = samples.iter().map(|s| s.2).max().unwrap_or(0);
    eprintln!(
        "{total} connections in {run:?} ({:.0}/s), {} errors; descriptors {baseline} before, peak {fd_peak}, {after} after; \
         RSS {rss_warm} KiB after {warm:?}, peak {rss_peak} KiB, {rss_end} KiB at the end",
        total as f64 / run.as_secs_f64(),
        errors.len()
    );
    assert!(errors.is_empty(), "{errors:?}");
    assert!(total > 300, "only {total} connections");
    assert!(
        after <= baseline + 2,
        "descriptors grew from {baseline} to {after}"
    );
    assert!(
        fd_peak <= baseline + 16,
        "descriptors peaked at {fd_peak} for 4 clients"
    );
    assert!(
        rss_end <= rss_warm + 8 * 1024,
        "resident memory grew from {rss_warm} KiB to {rss_end} KiB after the warm-up"
    );
}

/// /proc readings for a pid, usable from a spawned task.
struct ServerProbe(u32);
impl ServerProbe {
    fn fds(&self) -> usize {
        proc_fds(self.0)
    }
    fn rss_kib(&self) -> u64 {
        proc_rss_kib(self.0)
    }
}

/// The apiserver's webhook client keeps idle connections for 90 s (Go's `IdleConnTimeout` in client-go's
/// transport defaults) and does not retry a POST that fails on a connection the server closed at that moment.
/// The server keeps an idle keep-alive connection longer than that: after 120 s idle the same connection is
/// still open and its next review is answered correctly. (This also covers what a pooling client needs, so the
/// weaker test that allowed a clean close and a new connection, and waited another 120 s, is gone.)
#[tokio::test]
#[ignore = "long: run by scripts/hostile.sh"]
async fn idle_keep_alive_connection_outlives_the_apiservers_idle_timeout() {
    let _serial = serial().await;
    let server = ServerProcess::start("keepalive", &[]).await;
    let (addr, client) = (server.addr, server.client());
    let mut conn = connect(addr, &client).await.unwrap();
    check_answer(
        send(
            &mut conn,
            "POST",
            "/mutate",
            Some("application/json"),
            review_body("before", "daemonset"),
        )
        .await,
        "before",
        "injected_daemonset",
    )
    .unwrap();
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert!(
        !conn.is_closed(),
        "the server closed the idle keep-alive connection"
    );
    check_answer(
        send(
            &mut conn,
            "POST",
            "/mutate",
            Some("application/json"),
            review_body("after", "daemonset"),
        )
        .await,
        "after",
        "injected_daemonset",
    )
    .unwrap();
}

/// `--max-in-flight` clients that send their headers and then trickle the body hold every admission permit
/// until the request timeout: meanwhile the apiserver gets 503 for every review.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: run by scripts/hostile.sh"]
async fn slow_bodies_do_not_exhaust_the_review_permits() {
    let _serial = serial().await;
    let server = ServerProcess::start(
        "permits",
        &["--max-in-flight", "8", "--request-timeout", "10s"],
    )
    .await;
    let (addr, client) = (server.addr, server.client());
    let mut holders = vec![];
    for _ in 0..8 {
        let mut tls = tls_connect(addr, &client).await.unwrap();
        tls.write_all(
            b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{",
        )
        .await
        .unwrap();
        tls.flush().await.unwrap();
        holders.push(tls);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = call(
        addr,
        &client,
        "POST",
        "/mutate",
        Some("application/json"),
        review_body("victim", "daemonset"),
    )
    .await;
    check_answer(r, "victim", "injected_daemonset")
        .expect("a normal review while slow bodies are pending");
    drop(holders);
}

/// The memory budget (SECURITY.md, threat "memory exhaustion"): 200 connections each sending a 3 MiB review
/// slowly and holding its last byte, plus 1,000 idle keep-alive connections, while a normal client keeps
/// reviewing. The server's peak resident memory stays under the shipped limit (128 MiB) minus 25%, the normal
/// client is answered throughout, every flood connection gets an answer (a review, or a fast 503 over budget)
/// or is closed, and the server is still serving afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: run by scripts/hostile.sh"]
async fn flood_of_large_slow_bodies_stays_within_the_memory_budget() {
    let _serial = serial().await;
    let (server, stop, sampler, normal) = watched_server("flood").await;
    let (addr, client) = (server.addr, server.client());
    let rss_start = ServerProbe(server.pid()).rss_kib();
    let limit_kib: u64 = 128 * 1024 * 3 / 4;

    // 1,000 keep-alive connections that made one request and stay idle until the end.
    let mut idle = Vec::with_capacity(1000);
    for _ in 0..1000 {
        let mut sender = connect(addr, &client).await.expect("idle connection");
        let (status, _) = send(&mut sender, "GET", "/healthz", None, vec![])
            .await
            .expect("healthz");
        assert_eq!(status, StatusCode::OK);
        idle.push(sender);
    }
    let rss_idle = ServerProbe(server.pid()).rss_kib();

    // 200 large reviews, written in 64 KiB pieces every 20 ms (about 1 s each), the last byte held for 3 s.
    let mut big: serde_json::Value =
        serde_json::from_slice(&review_body("flood", "daemonset")).unwrap();
    big["request"]["object"]["metadata"]["annotations"]["flood.example/padding"] =
        "x".repeat(3 * 1024 * 1024 - 8 * 1024).into();
    let big = Arc::new(serde_json::to_vec(&big).unwrap());
    let started = Instant::now();
    let mut flood = tokio::task::JoinSet::new();
    for i in 0..200 {
        let (client, big) = (client.clone(), big.clone());
        // Opened 5 ms apart (all 200 within a second): the test is about memory, not a handshake storm.
        tokio::time::sleep(Duration::from_millis(5)).await;
        flood.spawn(async move {
            let Ok(mut tls) = tls_connect(addr, &client).await else {
                return "refused at connect".to_string();
            };
            let head = format!(
                "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                big.len()
            );
            if tls.write_all(head.as_bytes()).await.is_err() {
                return "closed".to_string();
            }
            let (body, last) = big.split_at(big.len() - 1);
            for piece in body.chunks(64 * 1024) {
                if tls.write_all(piece).await.is_err() {
                    return "closed while sending".to_string();
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            tokio::time::sleep(Duration::from_secs(3)).await;
            let _ = tls.write_all(last).await;
            let _ = tls.flush().await;
            let mut answer = vec![0u8; 64];
            match tokio::time::timeout(
                Duration::from_secs(30),
                tokio::io::AsyncReadExt::read(&mut tls, &mut answer),
            )
            .await
            {
                Ok(Ok(n)) if n >= 12 => String::from_utf8_lossy(&answer[9..12]).to_string(),
                Ok(_) => "closed".to_string(),
                Err(_) => format!("no answer in 30 s (connection {i})"),
            }
        });
    }
    let mut outcomes: std::collections::BTreeMap<String, usize> = Default::default();
    while let Some(o) = flood.join_next().await {
        *outcomes.entry(o.unwrap()).or_default() += 1;
    }
    let flood_time = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    let peak = sampler.await.unwrap();
    let (mut latencies, errors) = normal.await.unwrap();
    eprintln!(
        "flood: 200 x {} KiB slow reviews + 1,000 idle connections in {flood_time:.1?}: answers {outcomes:?}; \
         server RSS {rss_start} KiB at start, {rss_idle} KiB with the idle connections, peak {peak} KiB \
         (bound {limit_kib} KiB); normal client: {} reviews, {} errors",
        big.len() / 1024,
        latencies.len(),
        errors.len()
    );
    assert!(
        !outcomes.keys().any(|k| k.starts_with("no answer")),
        "{outcomes:?}"
    );
    assert!(
        outcomes.get("200").copied().unwrap_or(0) >= 1,
        "no large review was answered: {outcomes:?}"
    );
    // Every normal review is answered inside the Ignore entry's 2 s timeout: the flood's 1,200 TLS handshakes
    // share the CPU with it, so the bound is looser than for the other hostile clients.
    assert_normal_client_within("the flood", &mut latencies, &errors, Duration::from_secs(2));
    assert!(peak < limit_kib, "peak RSS {peak} KiB over {limit_kib} KiB");
    // Still serving.
    let r = call(
        addr,
        &client,
        "POST",
        "/mutate",
        Some("application/json"),
        review_body("after", "daemonset"),
    )
    .await;
    check_answer(r, "after", "injected_daemonset").expect("a review after the flood");
    drop(idle);
}

/// Samples a process's resident memory every 20 ms until `stop`; the task returns the peak in KiB.
fn peak_rss(pid: u32, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let probe = ServerProbe(pid);
        let mut peak = probe.rss_kib();
        while !stop.load(Ordering::SeqCst) {
            peak = peak.max(probe.rss_kib());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        peak.max(probe.rss_kib())
    })
}

/// The normal client's answers and errors.
type NormalClient = tokio::task::JoinHandle<(Vec<Duration>, Vec<String>)>;

/// `serve` with default flags, watched until `stop`: its peak resident memory (KiB) and a normal client
/// reviewing every 100 ms.
async fn watched_server(
    name: &str,
) -> (
    ServerProcess,
    Arc<AtomicBool>,
    tokio::task::JoinHandle<u64>,
    NormalClient,
) {
    let server = ServerProcess::start(name, &[]).await;
    let stop = Arc::new(AtomicBool::new(false));
    let peak = peak_rss(server.pid(), stop.clone());
    let normal = tokio::spawn(normal_client(
        server.addr,
        server.client(),
        Duration::from_millis(100),
        stop.clone(),
    ));
    (server, stop, peak, normal)
}

/// A review of a Pod that opts in with `containers` app containers (`{"name":"cN","image":"x"}`, 26 bytes or so
/// each), and its size.
fn review_with_containers(uid: &str, containers: usize) -> Vec<u8> {
    let mut r: serde_json::Value = serde_json::from_slice(&review_body(uid, "daemonset")).unwrap();
    r["request"]["object"]["spec"]["containers"] = (0..containers)
        .map(|i| serde_json::json!({"name": format!("c{i}"), "image": "x"}))
        .collect();
    serde_json::to_vec(&r).unwrap()
}

/// The largest review with numbered containers that fits in `bytes`.
fn containers_within(bytes: usize) -> usize {
    // Names grow by a digit every power of ten: measure the cost of one container around the answer.
    let base = review_with_containers("size", 0).len();
    let per = (review_with_containers("size", 200_000).len()
        - review_with_containers("size", 100_000).len()) as f64
        / 100_000.0;
    ((bytes - base) as f64 / per) as usize - 1_000
}

/// A Pod with 100,000 containers (within the apiserver's 3 MiB) and one at the 7 MiB body limit are
/// answered (denied, `pod_too_large`) well within the deadline, the server's peak resident memory stays within
/// its budget (96 MiB), and a normal client is answered meanwhile. Prints the figures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: run by scripts/hostile.sh"]
async fn huge_pods_are_denied_within_the_deadline_and_the_memory_budget() {
    let _serial = serial().await;
    let (server, stop, peak, normal) = watched_server("huge").await;
    let (addr, client) = (server.addr, server.client());
    let budget_kib: u64 = 96 * 1024;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let at_limit = containers_within(7 * 1024 * 1024 - 1024);
    let mut figures = Vec::new();
    for (what, n, rounds) in [
        ("45,000 containers", 45_000, 1),
        ("100,000 containers", 100_000, 1),
        ("the 7 MiB body limit", at_limit, 1),
    ] {
        let body = review_with_containers(what, n);
        for _ in 0..rounds {
            let started = Instant::now();
            let answer = call(
                addr,
                &client,
                "POST",
                "/mutate",
                Some("application/json"),
                body.clone(),
            )
            .await;
            let took = started.elapsed();
            let (outcome, size) = match answer {
                Ok((status, bytes)) => {
                    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
                    let r = &v["response"];
                    let reason = r["auditAnnotations"]["reason"].as_str().unwrap_or("-");
                    (
                        format!("HTTP {} allowed={} {reason}", status.as_u16(), r["allowed"]),
                        bytes.len(),
                    )
                }
                Err(e) => (e, 0),
            };
            figures.push((what, n, body.len(), took, outcome, size));
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::SeqCst);
    let peak = peak.await.unwrap();
    let (mut latencies, errors) = normal.await.unwrap();
    for (what, n, size, took, outcome, answer) in &figures {
        eprintln!(
            "huge Pods: {what}: {n} containers, {} KiB: {outcome} in {took:.2?}, answer {answer} bytes",
            size / 1024
        );
    }
    eprintln!("huge Pods: server peak RSS {peak} KiB (budget {budget_kib} KiB)");
    for (what, _, _, _, outcome, _) in &figures {
        assert_eq!(outcome, "HTTP 200 allowed=false pod_too_large", "{what}");
    }
    // Within the 10 s deadline by far: a denial costs a parse (looser in unoptimised builds).
    let bound = Duration::from_secs(if cfg!(debug_assertions) { 8 } else { 2 });
    let slowest = figures.iter().map(|f| f.3).max().unwrap();
    assert!(
        slowest < bound,
        "a huge Pod took {slowest:?} (bound {bound:?})"
    );
    assert!(
        peak < budget_kib,
        "peak RSS {peak} KiB over the budget {budget_kib} KiB"
    );
    assert_normal_client_within("huge Pods", &mut latencies, &errors, Duration::from_secs(2));
}

/// A review of the fixture Pod wired by the server itself, then made hostile: `n` variables of its own in front
/// of the wiring, all claimed by its status, which also names its one container `n` times. Each claim is true,
/// so the status is believed; checking it must cost about one read of the Pod, not claims times entries.
async fn review_with_long_claims(server: &ServerProcess, n: usize) -> Vec<u8> {
    use base64::Engine;
    let body = review_body("claims", "daemonset");
    let (status, bytes) = call(
        server.addr,
        &server.client(),
        "POST",
        "/mutate",
        Some("application/json"),
        body.clone(),
    )
    .await
    .expect("the fixture is answered");
    assert_eq!(status, StatusCode::OK);
    let answer: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    let patch = base64::engine::general_purpose::STANDARD
        .decode(
            answer["response"]["patch"]
                .as_str()
                .expect("the fixture is wired"),
        )
        .unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
    let mut review: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let pod = &mut review["request"]["object"];
    json_patch::patch(pod, &patch).unwrap();
    let key = "pdp-injector.io/status";
    let mut claims: serde_json::Value =
        serde_json::from_str(pod["metadata"]["annotations"][key].as_str().unwrap()).unwrap();
    let own: Vec<String> = (0..n).map(|i| format!("OWN_{i}")).collect();
    let env = pod["spec"]["containers"][0]["env"].as_array_mut().unwrap();
    env.splice(
        0..0,
        own.iter()
            .map(|name| serde_json::json!({"name": name, "value": "x"})),
    );
    claims["env"]
        .as_array_mut()
        .unwrap()
        .extend(own.iter().map(|name| serde_json::json!(name)));
    let container = claims["containers"][0].clone();
    claims["containers"] = vec![container; n].into();
    pod["metadata"]["annotations"][key] = claims.to_string().into();
    serde_json::to_vec(&review).unwrap()
}

/// A status annotation is the Pod author's: one that claims 100,000 variables, each really defined, and names
/// its container 100,000 times is believed (`already_injected`) within the bound of a huge Pod, and a normal
/// client is answered meanwhile. Checking claims against entries pairwise took 10^10 comparisons here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: run by scripts/hostile.sh"]
async fn a_status_with_long_true_claims_costs_one_read_of_the_pod() {
    let _serial = serial().await;
    let (server, stop, peak, normal) = watched_server("claims").await;
    let body = review_with_long_claims(&server, 100_000).await;
    let started = Instant::now();
    let answer = call(
        server.addr,
        &server.client(),
        "POST",
        "/mutate",
        Some("application/json"),
        body.clone(),
    )
    .await;
    let took = started.elapsed();
    // The normal client keeps asking a little longer: enough answers to judge it.
    tokio::time::sleep(Duration::from_millis(600)).await;
    stop.store(true, Ordering::SeqCst);
    let _ = peak.await;
    let (mut latencies, errors) = normal.await.unwrap();
    let (status, bytes) = answer.expect("answered");
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    eprintln!(
        "long claims: {} KiB: HTTP {} {} in {took:.2?}",
        body.len() / 1024,
        status.as_u16(),
        v["response"]["auditAnnotations"]["reason"]
    );
    assert_eq!(status, StatusCode::OK);
    assert_eq!(v["response"]["allowed"], true);
    assert_eq!(
        v["response"]["auditAnnotations"]["reason"], "already_injected",
        "{v}"
    );
    let bound = Duration::from_secs(if cfg!(debug_assertions) { 8 } else { 2 });
    assert!(took < bound, "long claims took {took:?} (bound {bound:?})");
    assert_normal_client_within(
        "long claims",
        &mut latencies,
        &errors,
        Duration::from_secs(2),
    );
}

/// A review of a Pod of about `bytes` that names two profiles (`cerbos,flagd`): its size is in what rendering
/// reads and extends (16 app containers with long `env` and `volumeMounts`, a long `volumes` list), in many
/// small entries.
fn review_with_two_profiles(uid: &str, bytes: usize) -> Vec<u8> {
    use std::fmt::Write;
    let mut r: serde_json::Value = serde_json::from_slice(&review_body(uid, "daemonset")).unwrap();
    let pod = &mut r["request"]["object"];
    pod["metadata"]["annotations"]["pdp-injector.io/profile"] = "cerbos,flagd".into();
    pod["spec"]["containers"] = "CONTAINERS".into();
    pod["spec"]["volumes"] = "VOLUMES".into();
    let review = serde_json::to_string(&r).unwrap();
    // Written as text: a debug build takes seconds to serialize a tree of this size, and the size is searched.
    let build = |per: usize| {
        let list = |n: usize, f: &dyn Fn(&mut String, usize)| {
            let mut out = String::from("[");
            for i in 0..n {
                if i > 0 {
                    out.push(',');
                }
                f(&mut out, i);
            }
            out.push(']');
            out
        };
        let env = list(per, &|o, i| {
            write!(o, r#"{{"name":"V{i}","value":"x"}}"#).unwrap()
        });
        let mounts = list(per / 16, &|o, i| {
            write!(o, r#"{{"name":"v{i}","mountPath":"/m/{i}"}}"#).unwrap()
        });
        let containers: Vec<String> = (0..16)
            .map(|c| {
                format!(r#"{{"name":"c{c}","image":"x","env":{env},"volumeMounts":{mounts}}}"#)
            })
            .collect();
        let volumes = list(per, &|o, i| {
            write!(o, r#"{{"name":"v{i}","emptyDir":{{}}}}"#).unwrap()
        });
        review
            .replacen(r#""CONTAINERS""#, &format!("[{}]", containers.join(",")), 1)
            .replacen(r#""VOLUMES""#, &volumes, 1)
    };
    // The smallest number of entries that reaches the size.
    let (mut low, mut high) = (1, 1 << 20);
    while low < high {
        let mid = (low + high) / 2;
        if build(mid).len() >= bytes {
            high = mid;
        } else {
            low = mid + 1;
        }
    }
    let body = build(low);
    serde_json::from_str::<serde_json::Value>(&body).expect("the review is JSON");
    body.into_bytes()
}

/// 30 concurrent reviews of a 2.5 MiB Pod naming two profiles: each answered with both wirings (a review the
/// body budget cannot hold yet gets its fast 503 and is sent again, as a controller would), the server's peak
/// resident memory within its 96 MiB budget, a normal client answered meanwhile. Rendering the second profile
/// must cost no copy of the Pod's lists outside the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: run by scripts/hostile.sh"]
async fn concurrent_large_pods_with_two_profiles_stay_within_the_memory_budget() {
    use base64::Engine;
    let _serial = serial().await;
    let (server, stop, peak, normal) = watched_server("profiles").await;
    let (addr, client) = (server.addr, server.client());
    let budget_kib: u64 = 96 * 1024;
    let size = 5 * 1024 * 1024 / 2;
    let template = review_with_two_profiles("profiles-00", size);
    assert!(
        template.len() < size + 64 * 1024,
        "{} bytes",
        template.len()
    );
    let template = String::from_utf8(template).unwrap();
    let started = Instant::now();
    let deadline = Duration::from_secs(if cfg!(debug_assertions) { 180 } else { 60 });
    let mut reviews = tokio::task::JoinSet::new();
    for i in 0..30 {
        let uid = format!("profiles-{i:02}");
        let body = template
            .replacen("\"profiles-00\"", &format!("{uid:?}"), 1)
            .into_bytes();
        let client = client.clone();
        reviews.spawn(async move {
            let mut tries = 0u32;
            loop {
                tries += 1;
                let answer = call(
                    addr,
                    &client,
                    "POST",
                    "/mutate",
                    Some("application/json"),
                    body.clone(),
                )
                .await;
                let over_budget =
                    matches!(&answer, Ok((s, _)) if *s == StatusCode::SERVICE_UNAVAILABLE);
                if over_budget && started.elapsed() < deadline {
                    // Spread out, so that the retries do not all meet the next free slot at once.
                    let wait = 50 + u64::from(tries.min(10)) * 20 + (i as u64 * 7) % 50;
                    tokio::time::sleep(Duration::from_millis(wait)).await;
                    continue;
                }
                let patch = answer.as_ref().ok().and_then(|(_, bytes)| {
                    let v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
                    let p = v["response"]["patch"].as_str()?;
                    base64::engine::general_purpose::STANDARD.decode(p).ok()
                });
                let both = patch.is_some_and(|p| {
                    let p = String::from_utf8_lossy(&p);
                    p.contains("pdp-injector.io~1status\"")
                        && p.contains("pdp-injector.io~1status-flagd\"")
                });
                let outcome = check_answer(answer, &uid, "injected_daemonset").and_then(|()| {
                    both.then_some(())
                        .ok_or_else(|| "not both profiles wired".into())
                });
                return (uid, tries, outcome);
            }
        });
    }
    let mut failures = Vec::new();
    let mut tries = 0;
    while let Some(r) = reviews.join_next().await {
        let (uid, n, outcome) = r.unwrap();
        tries += n;
        if let Err(e) = outcome {
            failures.push(format!("{uid}: {}", &e[..e.len().min(300)]));
        }
    }
    let took = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    let peak = peak.await.unwrap();
    let (mut latencies, errors) = normal.await.unwrap();
    eprintln!(
        "two profiles: 30 x {} KiB reviews naming cerbos,flagd in {took:.1?} ({tries} requests with the 503 \
         retries), {} not answered with both wirings; server peak RSS {peak} KiB (budget {budget_kib} KiB)",
        size / 1024,
        failures.len()
    );
    assert!(failures.is_empty(), "{failures:?}");
    assert!(
        peak < budget_kib,
        "peak RSS {peak} KiB over the budget {budget_kib} KiB"
    );
    assert_normal_client_within(
        "two profiles",
        &mut latencies,
        &errors,
        Duration::from_secs(2),
    );
}

/// Over HTTP/1.1, a client that writes its whole over-limit body before reading gets the 413, not a
/// connection closed under it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_written_whole_before_reading_gets_its_413() {
    let _serial = serial().await;
    let server = ServerProcess::start("drain413", &["--body-limit", "1048576"]).await;
    let mut tls = tls_connect(server.addr, &server.client()).await.unwrap();
    let body = vec![b' '; 2 * 1024 * 1024];
    let head = format!(
        "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).await.unwrap();
    tls.write_all(&body).await.expect("the whole body is taken");
    tls.flush().await.unwrap();
    // The status line, within 10 s (the connection may stay open for the next request).
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), async {
        let mut buf = [0u8; 1024];
        while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
            match tokio::io::AsyncReadExt::read(&mut tls, &mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    let text = String::from_utf8_lossy(&answer);
    assert!(read.is_ok(), "no answer within 10 s: {text:?}");
    assert!(text.starts_with("HTTP/1.1 413"), "{text:?}");
}

/// Fake PDP instances on `paths`, answering each line `x` with `x`, on a thread and runtime of their own (the
/// test's runtime is busy with the hostile client); they stop when the returned sender is dropped.
fn echo_instances(paths: Vec<std::path::PathBuf>) -> tokio::sync::oneshot::Sender<()> {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (bound, is_bound) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            for path in paths {
                let listener = tokio::net::UnixListener::bind(path).unwrap();
                tokio::spawn(async move {
                    while let Ok((stream, _)) = listener.accept().await {
                        tokio::spawn(async move {
                            use tokio::io::AsyncBufReadExt;
                            let (read, mut write) = stream.into_split();
                            let mut lines = tokio::io::BufReader::new(read).lines();
                            while let Ok(Some(line)) = lines.next_line().await {
                                let echo = format!("{line}\n");
                                if write.write_all(echo.as_bytes()).await.is_err() {
                                    return;
                                }
                            }
                        });
                    }
                });
            }
            bound.send(()).unwrap();
            let _ = stopped.await;
        });
    });
    is_bound.recv().unwrap();
    stop
}

/// One check through the front on a new connection: a line out, the same line back, within 3 s (the bound the
/// issue measured the unbounded front against: 3 of 3 checks timed out).
async fn front_check<S>(
    connect: impl Future<Output = std::io::Result<S>>,
    text: &str,
) -> Result<Duration, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let started = Instant::now();
    let limit = Duration::from_secs(3);
    let stream = tokio::time::timeout(limit, connect)
        .await
        .map_err(|_| "no connection within 3 s".to_string())?
        .map_err(|e| format!("connect: {e}"))?;
    let mut stream = tokio::io::BufReader::new(stream);
    let answer = ask_line(&mut stream, text, limit.saturating_sub(started.elapsed())).await?;
    if answer == text {
        Ok(started.elapsed())
    } else {
        Err(format!("answer {answer:?}"))
    }
}

/// The real `pdp-injector node-proxy` with its default bounds, serving TCP on 127.0.0.1 and a socket, in front
/// of echo instances; killed, and its directory removed, on drop.
struct Front {
    child: std::process::Child,
    addr: std::net::SocketAddr,
    socket: std::path::PathBuf,
    _instances: tokio::sync::oneshot::Sender<()>,
    dir: pdp_testkit::dir::TempDir,
}

impl Front {
    async fn start(name: &str) -> Front {
        let dir = pdp_testkit::dir::TempDir::new(&format!("hostile-{name}"));
        // Writable by its owner alone, whatever the umask (the front refuses instance directories others can
        // write), and open to other users' clients (the socket is theirs to connect to).
        dir.mkdir("", 0o755);
        dir.mkdir("instances", 0o755);
        let instances = echo_instances(vec![
            dir.join("instances/pdp-a.grpc.sock"),
            dir.join("instances/pdp-a.http.sock"),
        ]);
        let port = pdp_testkit::net::free_port();
        let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let socket = dir.join("cerbos.sock");
        let log = dir.join("front.log");
        let child = std::process::Command::new(bin())
            .arg("node-proxy")
            .args(["--listen", &addr.to_string()])
            .arg("--socket")
            .arg(&socket)
            .arg("--instances")
            .arg(dir.join("instances"))
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn pdp-injector node-proxy");
        let front = Front {
            child,
            addr,
            socket,
            _instances: instances,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while front_check(TcpStream::connect(addr), "ready")
            .await
            .is_err()
        {
            assert!(
                Instant::now() < deadline,
                "the front never answered:\n{}",
                front.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        front
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("front.log")).unwrap_or_default()
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One client holds 5,000 idle TCP connections (from 127.0.0.2) and 5,000 idle socket connections (as user
/// 65534) to the real `pdp-injector node-proxy` with its default bounds, while a normal client (127.0.0.1) checks every
/// 100 ms through both: every check is answered, and the front's resident memory stays within its budget
/// (48 MiB). Prints the normal client's failures and p99, what became of the idle connections, and the RSS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: run by scripts/hostile.sh"]
async fn idle_connections_to_the_front_leave_every_check_answered() {
    let _serial = serial().await;
    let need = 2 * 5_000 + 3_000;
    let limit = std::fs::read_to_string("/proc/self/limits")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3).map(str::to_string))
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(usize::MAX);
    assert!(
        limit >= need,
        "open-file limit {limit}: this test needs {need} (scripts/hostile.sh raises it with ulimit -n)"
    );
    if !root() {
        return cannot_run("the socket flood runs as another user (65534): needs root");
    }
    let front = Front::start("idle").await;
    let (addr, socket, pid) = (front.addr, front.socket.clone(), front.pid());
    let rss_idle = ServerProbe(pid).rss_kib();
    let budget_kib: u64 = 48 * 1024;

    let stop = Arc::new(AtomicBool::new(false));
    let peak = peak_rss(pid, stop.clone());
    let normal = {
        let (stop, socket) = (stop.clone(), socket.clone());
        tokio::spawn(async move {
            let (mut tcp, mut unix) = (Vec::new(), Vec::new());
            let mut failures = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                tick.tick().await;
                n += 1;
                match front_check(TcpStream::connect(addr), &format!("tcp-{n}")).await {
                    Ok(t) => tcp.push(t),
                    Err(e) => failures.push(format!("tcp {n}: {e}")),
                }
                match front_check(
                    tokio::net::UnixStream::connect(&socket),
                    &format!("unix-{n}"),
                )
                .await
                {
                    Ok(t) => unix.push(t),
                    Err(e) => failures.push(format!("unix {n}: {e}")),
                }
            }
            (tcp, unix, failures)
        })
    };

    // The hostile client, on a thread and runtime of its own: 5,000 TCP connections from 127.0.0.2 and 5,000 on
    // the socket as user 65534 (the thread's own credentials, which the socket's peer sees), opened as fast as the
    // front takes them, then held idle for 5 s while the normal client checks.
    let hostile = {
        let socket = socket.clone();
        std::thread::spawn(move || {
            rustix::thread::set_thread_res_uid(None, rustix::thread::Uid::from_raw(65534), None)
                .expect("setresuid of one thread");
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let started = Instant::now();
                let (mut tcp, mut unix) = (Vec::new(), Vec::new());
                for _ in 0..5_000 {
                    if started.elapsed() > Duration::from_secs(40) {
                        break; // what is not open by now counts as not opened
                    }
                    let s = tokio::net::TcpSocket::new_v4().unwrap();
                    s.bind("127.0.0.2:0".parse().unwrap()).unwrap();
                    // Bounded: a front that stops accepting leaves connects hanging in SYN retries.
                    let bound = Duration::from_secs(1);
                    if let Ok(Ok(c)) = tokio::time::timeout(bound, s.connect(addr)).await {
                        tcp.push(c);
                    }
                    let unix_connect = tokio::net::UnixStream::connect(&socket);
                    if let Ok(Ok(c)) = tokio::time::timeout(bound, unix_connect).await {
                        unix.push(c);
                    }
                }
                let opened = started.elapsed();
                // Refused, timed out, or not tried within the 40 s.
                let errors = 2 * 5_000 - tcp.len() - unix.len();
                tokio::time::sleep(Duration::from_secs(5)).await;
                // How many the front still serves: a closed one reads end of stream at once.
                let mut buf = [0u8; 1];
                let open = |would_block: std::io::Result<usize>| {
                    matches!(would_block, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
                };
                let tcp_open = tcp.iter().filter(|c| open(c.try_read(&mut buf))).count();
                let unix_open = unix.iter().filter(|c| open(c.try_read(&mut buf))).count();
                let made = (tcp.len(), unix.len());
                (opened, errors, tcp_open, unix_open, made)
            })
        })
    };
    while !hostile.is_finished() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (opened, connect_errors, tcp_open, unix_open, hostile_opened) = hostile.join().unwrap();
    stop.store(true, Ordering::SeqCst);
    let (mut tcp, mut unix, failures) = normal.await.unwrap();
    let peak = peak.await.unwrap();
    tcp.sort();
    unix.sort();
    eprintln!(
        "front: 5,000 + 5,000 idle connections opened in {opened:.1?} ({connect_errors} not opened); after 5 s \
         the front still holds {tcp_open} TCP and {unix_open} socket ones of them; normal client: {} TCP checks \
         p99 {:?} max {:?}, {} socket checks p99 {:?} max {:?}, {} failures {:?}; front RSS {rss_idle} KiB idle, \
         peak {peak} KiB (budget {budget_kib} KiB)",
        tcp.len(),
        percentile(&tcp, 99.0),
        tcp.last().copied().unwrap_or_default(),
        unix.len(),
        percentile(&unix, 99.0),
        unix.last().copied().unwrap_or_default(),
        failures.len(),
        failures.iter().take(5).collect::<Vec<_>>()
    );
    assert!(failures.is_empty(), "normal client failures: {failures:?}");
    assert!(tcp.len() >= 20 && unix.len() >= 20, "too few checks");
    // The flood was there: more connections than the per-client bound (128 by default) on each path were opened,
    // and the front held some of each, within that bound.
    let (tcp_opened, unix_opened) = hostile_opened;
    assert!(
        tcp_opened > 128 && unix_opened >= 1_000,
        "the hostile client opened only {tcp_opened} TCP and {unix_opened} socket connections"
    );
    assert!(
        (1..=128).contains(&tcp_open) && (1..=128).contains(&unix_open),
        "the front held {tcp_open} TCP and {unix_open} socket connections of the flood (bound 128 each)"
    );
    assert!(
        peak < budget_kib,
        "front peak RSS {peak} KiB over its budget {budget_kib} KiB"
    );
}

/// The trickling client of the socket test: opens N connections to the socket, sends a byte on each every
/// PERIOD seconds for HOLD seconds (each stays in the middle of a request, never stalled), opening again each one
/// the front closed, and prints how many it opened, then how many the front still held at the end.
const TRICKLER: &str = r#"
import json, socket, sys, time
path, n, period, hold = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])

def connect():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1)
    try:
        s.connect(path)
        s.send(b"x")
        return s
    except OSError:
        s.close()
        return None

conns = [connect() for _ in range(n)]
print(json.dumps({"opened": sum(c is not None for c in conns)}), flush=True)
end = time.monotonic() + hold
while time.monotonic() < end:
    # A byte on each; one the front closed is opened again, to take any place that comes free.
    for i, s in enumerate(conns):
        try:
            if s is None:
                raise OSError
            s.send(b"x")
        except OSError:
            if s is not None:
                s.close()
            conns[i] = connect()
    time.sleep(period)
held = 0
for s in conns:
    if s is None:
        continue
    s.setblocking(False)
    try:
        held += s.recv(1) != b""
    except BlockingIOError:
        held += 1
    except OSError:
        pass
print(json.dumps({"held": held}), flush=True)
"#;

/// Whether this process runs as root (the socket floods run as another user, as another Pod is another client).
fn root() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:")?.split_whitespace().nth(1))
        == Some("0")
}

/// The trickler's next line as JSON (`null` when none came within `within` seconds).
async fn next_json(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    within: u64,
) -> serde_json::Value {
    let line = tokio::time::timeout(Duration::from_secs(within), rx.recv())
        .await
        .ok()
        .flatten()
        .unwrap_or_default();
    serde_json::from_str(&line).unwrap_or_default()
}

/// One client (another user, as another Pod is another Pod) opens 2,000 connections on the front's socket and
/// trickles bytes on each, more than the socket's bound (1,280 by default): it holds at most its own bound
/// (`--max-connections-per-peer`, 128), and another client's first check, made once the flood is open, is
/// answered within 1 s, as is every check it makes every 100 ms meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: run by scripts/hostile.sh"]
async fn trickling_socket_connections_of_one_client_leave_other_clients_served() {
    use std::io::BufRead;
    use std::os::unix::process::CommandExt;
    let _serial = serial().await;
    if !root() {
        return cannot_run("the flood runs as another user (65534): needs root");
    }
    let front = Front::start("trickle").await;
    let mut trickler = match std::process::Command::new("python3")
        .arg("-c")
        .arg(TRICKLER)
        .arg(&front.socket)
        .args(["2000", "0.5", "6"])
        .uid(65534)
        .gid(65534)
        .stdout(std::process::Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(e) => return cannot_run(&format!("python3: {e}")),
    };
    let lines = std::io::BufReader::new(trickler.stdout.take().unwrap()).lines();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let opened = next_json(&mut rx, 60).await;
    let opened_n = opened["opened"].as_u64().unwrap_or(0);
    let first = front_check(tokio::net::UnixStream::connect(&front.socket), "first").await;
    let mut checks = Vec::new();
    let mut failures = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut n = 0;
    let during = Instant::now();
    while during.elapsed() < Duration::from_secs(4) {
        tick.tick().await;
        n += 1;
        match front_check(
            tokio::net::UnixStream::connect(&front.socket),
            &format!("c{n}"),
        )
        .await
        {
            Ok(t) => checks.push(t),
            Err(e) => failures.push(format!("check {n}: {e}")),
        }
    }
    let held = next_json(&mut rx, 30).await;
    let _ = trickler.kill();
    let _ = trickler.wait();
    checks.sort();
    eprintln!(
        "socket flood: {opened} connections of one client, {held} held at the end; the other client's first \
         check {first:?}, then {} checks p99 {:?} max {:?}, {} failures {:?}",
        checks.len(),
        percentile(&checks, 99.0),
        checks.last().copied().unwrap_or_default(),
        failures.len(),
        failures.iter().take(5).collect::<Vec<_>>()
    );
    assert!(
        opened_n >= 1_500,
        "the flood opened only {opened_n} connections: {opened}\n{}",
        front.log()
    );
    let held_n = held["held"].as_u64().unwrap_or(u64::MAX);
    assert!(
        (1..=128).contains(&held_n),
        "the front held {held_n} of the flood's connections (its client's bound: 128)"
    );
    let first = first.unwrap_or_else(|e| panic!("the other client's first check: {e}"));
    assert!(first < Duration::from_secs(1), "first check in {first:?}");
    assert!(
        failures.is_empty(),
        "the other client's failures: {failures:?}"
    );
    assert!(checks.len() >= 20, "too few checks: {}", checks.len());
}

/// A namespace cache that knows one opted-in namespace, and an apiserver double behind [`FetchGuard`] (as the
/// cluster source uses it) that counts its GETs: no other namespace exists.
struct CountingApiserver {
    guard: pdp_cluster::namespaces::FetchGuard,
    gets: AtomicUsize,
}

impl pdp_cluster::NamespaceSource for CountingApiserver {
    fn lookup(&self, name: &str) -> Option<pdp_core::core::NamespaceInfo> {
        (name == "shop").then(|| pdp_core::core::NamespaceInfo {
            name: name.into(),
            injection: Some("daemonset".into()),
            pss_enforce: Some("privileged".into()),
            required: false,
        })
    }
    fn synced(&self) -> bool {
        true
    }
    fn fetch<'a>(&'a self, name: &'a str) -> pdp_cluster::FetchFuture<'a> {
        Box::pin(self.guard.fetch(name, || async {
            self.gets.fetch_add(1, Ordering::SeqCst);
            // An apiserver round trip.
            tokio::time::sleep(Duration::from_millis(2)).await;
            Ok(None)
        }))
    }
}

/// 10,000 reviews naming random namespaces (half on each webhook entry, from 8 connections) make at
/// most the fetch rate's GETs (10 a second, as many at once), and an opted-in Pod in a real namespace is wired
/// meanwhile. Before the bound, each of them was one GET.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: run by scripts/hostile.sh"]
async fn random_namespaces_cost_at_most_the_fetch_rate() {
    use pdp_webhook::server::{self, OPTED_IN_PATH, ServeOptions, TlsSource};
    let _serial = serial().await;
    pdp_tls::install_default_provider();
    let bundle = pdp_tls::certs::generate(&["localhost".into()], 2, 1).unwrap();
    let material = pdp_tls::TlsMaterial {
        cert_pem: bundle.cert_pem.clone().into_bytes(),
        key_pem: bundle.key_pem.clone().into_bytes(),
        client_ca_pem: None,
    };
    let source = Arc::new(CountingApiserver {
        guard: Default::default(),
        gets: AtomicUsize::new(0),
    });
    let running = server::start(
        ServeOptions::new("127.0.0.1:0".parse().unwrap(), TlsSource::Fixed(material)),
        source.clone(),
    )
    .await
    .unwrap();
    let (addr, client) = (running.addr, client_config(&bundle.ca_cert_pem));
    let review = |uid: &str, namespace: &str, annotated: bool| {
        let mut r: serde_json::Value = serde_json::from_str(FIXTURE).unwrap();
        r["request"]["uid"] = uid.into();
        r["request"]["namespace"] = namespace.into();
        r["request"]["object"]["metadata"]["namespace"] = namespace.into();
        if annotated {
            r["request"]["object"]["metadata"]["annotations"] =
                serde_json::json!({"pdp-injector.io/inject": "daemonset"});
        }
        serde_json::to_vec(&r).unwrap()
    };
    let stop = Arc::new(AtomicBool::new(false));
    let normal = {
        let (stop, client) = (stop.clone(), client.clone());
        tokio::spawn(async move {
            let (mut answered, mut errors) = (0, Vec::new());
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                tick.tick().await;
                n += 1;
                let uid = format!("shop-{n}");
                let r = call(
                    addr,
                    &client,
                    "POST",
                    OPTED_IN_PATH,
                    Some("application/json"),
                    review(&uid, "shop", false),
                )
                .await;
                match check_answer(r, &uid, "injected_daemonset") {
                    Ok(()) => answered += 1,
                    Err(e) => errors.push(e),
                }
            }
            (answered, errors)
        })
    };
    let started = Instant::now();
    let mut flood = tokio::task::JoinSet::new();
    for c in 0..8u64 {
        let client = client.clone();
        flood.spawn(async move {
            let mut sender = connect(addr, &client).await.unwrap();
            let mut answers = std::collections::BTreeMap::<String, usize>::new();
            for i in 0..1250u64 {
                // Random enough: a different name every time, never one that exists.
                let name = format!("r{:x}", (c * 1250 + i).wrapping_mul(0x9e37_79b9_7f4a_7c15));
                let path = if i % 2 == 0 { "/mutate" } else { OPTED_IN_PATH };
                let (status, body) = send(
                    &mut sender,
                    "POST",
                    path,
                    Some("application/json"),
                    review(&name, &name, true),
                )
                .await
                .unwrap();
                let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                let reason = v["response"]["auditAnnotations"]["reason"]
                    .as_str()
                    .unwrap_or("")
                    .to_string();
                *answers
                    .entry(format!("{path} {status} {reason}"))
                    .or_default() += 1;
            }
            answers
        });
    }
    let mut answers = std::collections::BTreeMap::<String, usize>::new();
    while let Some(a) = flood.join_next().await {
        for (k, n) in a.unwrap() {
            *answers.entry(k).or_default() += n;
        }
    }
    let took = started.elapsed();
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::SeqCst);
    let (answered, errors) = normal.await.unwrap();
    let gets = source.gets.load(Ordering::SeqCst);
    let rate = pdp_cluster::namespaces::FETCHES_PER_SECOND as f64;
    let allowed = (rate * (1.0 + took.as_secs_f64())).ceil() as usize;
    eprintln!(
        "random namespaces: 10,000 reviews in {took:.1?}: {gets} apiserver GETs (bound {allowed}: {rate}/s and a \
         burst as large; one GET per review before the bound); answers {answers:?}; the opted-in Pod in \"shop\": \
         {answered} wired, {} errors",
        errors.len()
    );
    assert_eq!(answers.values().sum::<usize>(), 10_000);
    assert!(gets <= allowed, "{gets} GETs over {allowed}");
    assert!(errors.is_empty(), "the real namespace's Pod: {errors:?}");
    assert!(answered >= 5, "too few checks of the real namespace");
    running.shutdown().await.unwrap();
}

#[test]
#[should_panic(expected = "refused under CI=true")]
fn another_binary_in_hostile_bin_is_refused_under_ci() {
    chosen_bin(Some("/bin/sh".into()), true);
}

#[test]
fn this_build_in_hostile_bin_is_taken_under_ci_and_another_one_elsewhere() {
    assert_eq!(chosen_bin(Some(BIN.into()), true), BIN);
    assert_eq!(chosen_bin(Some("/bin/sh".into()), false), "/bin/sh");
    assert_eq!(chosen_bin(None, true), BIN);
}

/// No process has this id (above Linux's pid_max): its figures cannot be read.
const NO_PROCESS: u32 = u32::MAX;

#[test]
#[should_panic(expected = "cannot read resident memory")]
fn an_unreadable_resident_memory_is_an_error_not_zero() {
    proc_rss_kib(NO_PROCESS);
}

#[test]
#[should_panic(expected = "cannot count descriptors")]
fn an_unreadable_descriptor_count_is_an_error_not_zero() {
    proc_fds(NO_PROCESS);
}
