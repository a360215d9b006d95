//! A small HTTPS load generator for `scripts/bench.sh`: N keep-alive HTTP/1.1 connections over rustls, each
//! POSTing AdmissionReview bodies drawn from a weighted list, either closed-loop (send, wait, send) or open-loop
//! at a fixed total rate. Prints one JSON object.
//!
//! Open loop avoids coordinated omission: connection k of C sends its i-th request at t0 + (i*C + k)/rate, and
//! when that request could not leave on time because the connection was still waiting for the server, its latency
//! is counted from the scheduled time. (When the connection was free, it counts from the actual send, so the
//! 1 ms granularity of tokio's timer is not charged to the server.)
//!
//! Only requests that complete inside the measurement window (after `--warmup`, which also covers the TLS
//! handshakes) are counted. With `--pid`, the server's CPU time (utime+stime from /proc/PID/stat) is read at the
//! window's edges and divided by the requests completed in it, and its peak RSS (VmHWM) is read at the end.
//!
//! ```text
//! loadgen --url https://127.0.0.1:18443/mutate --ca ca.crt --body inject.json@60 --body opted_out.json@20 \
//!         --connections 8 --warmup 1 --duration 5 [--rate 1000] [--pid PID] [--label mix/c8]
//! ```
//! Runs on a single-threaded tokio runtime (it is pinned to one core by the script); with `--spin` that thread
//! never sleeps (see the flag), and its CPU share reads 100%.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use pdp_testkit::proc::{cpu_ticks, machine_busy_ticks, status_kib};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio::sync::watch;

mod args;

use args::{
    Body, MAX_CONNECTIONS, Target, number, parse_body, parse_server_name, parse_url,
    positive_number, positive_seconds, seconds,
};

/// The flags; `--help` prints them.
#[derive(Parser)]
#[command(
    name = "loadgen",
    about = "HTTPS load generator of scripts/bench.sh: keep-alive connections POSTing weighted bodies, closed or open loop; prints one JSON object"
)]
struct Args {
    /// The server: https://IP:PORT/PATH (an IP address, no name lookup).
    #[arg(long, value_name = "URL", value_parser = parse_url)]
    url: Target,
    /// PEM file of the CA that signed the server's certificate.
    #[arg(long, value_name = "FILE")]
    ca: PathBuf,
    /// Name to check the server's certificate against (default: the URL's IP address).
    #[arg(long, value_name = "NAME", value_parser = parse_server_name)]
    server_name: Option<ServerName<'static>>,
    /// A request body and its weight in the mix (default 1); repeat for a mix.
    #[arg(long = "body", value_name = "FILE[@WEIGHT]", required = true, value_parser = parse_body)]
    bodies: Vec<Body>,
    /// Keep-alive connections.
    #[arg(long, short = 'c', value_name = "N", default_value = "1",
          value_parser = clap::value_parser!(u32).range(1..=MAX_CONNECTIONS))]
    connections: u32,
    /// Measurement window, in seconds (after the warm-up).
    #[arg(long, value_name = "S", default_value = "5", value_parser = positive_seconds)]
    duration: Duration,
    /// Warm-up before the window (also covers the TLS handshakes), in seconds.
    #[arg(long, value_name = "S", default_value = "1", value_parser = seconds)]
    warmup: Duration,
    /// Open loop at this total rate (requests per second); absent or 0: closed loop.
    #[arg(long, value_name = "REQ_PER_S", value_parser = number)]
    rate: Option<f64>,
    /// The server's process: its CPU time over the window and its peak RSS are reported.
    #[arg(long, value_name = "SERVER_PID")]
    pid: Option<u32>,
    /// Clock ticks per second of /proc/PID/stat (`getconf CLK_TCK`).
    #[arg(long, value_name = "N", default_value = "100", value_parser = positive_number)]
    clk_tck: f64,
    /// Label of the run, echoed in the JSON.
    #[arg(long, value_name = "TEXT", default_value = "")]
    label: String,
    /// How long to keep retrying the first connection while the server starts, in seconds.
    #[arg(long, value_name = "S", default_value = "10", value_parser = seconds)]
    wait: Duration,
    /// A request without an answer by then counts as an error, in seconds.
    #[arg(long, value_name = "S", default_value = "30", value_parser = positive_seconds)]
    request_timeout: Duration,
    /// Never sleep between answers: poll the sockets in a loop on this core. Over loopback the server's write
    /// runs the client's TCP receive and wakes its thread in the server's own system call; a sleeping client
    /// on an idle vCPU costs the server an inter-processor interrupt per answer, which an apiserver on another
    /// machine does not.
    #[arg(long)]
    spin: bool,
}

/// Measurement window, published to every connection once all of them are connected.
#[derive(Clone, Copy)]
struct Window {
    /// Open-loop schedule origin (= the moment all connections are up).
    t0: Instant,
    /// Counting starts here.
    measure: Instant,
    /// Sending stops here.
    end: Instant,
}

struct Shared {
    addr: SocketAddr,
    path: String,
    authority: String,
    server_name: ServerName<'static>,
    tls: Arc<rustls::ClientConfig>,
    bodies: Vec<Bytes>,
    /// Body index per slot, shuffled: request n uses slot n mod len.
    slots: Vec<usize>,
    next: AtomicUsize,
    connections: usize,
    rate: Option<f64>,
    request_timeout: Duration,
}

#[derive(Default)]
struct ConnStats {
    /// (status, latency in microseconds) of requests completed inside the window; status 0 for a request that
    /// failed (connection closed or reset before the answer).
    samples: Vec<(u16, u32)>,
    errors: u64,
    error_sample: Option<String>,
    connects: u64,
    /// Open loop: requests that left late because the connection was still busy.
    late: u64,
}

type Sender = SendRequest<Full<Bytes>>;

async fn connect(s: &Shared) -> Result<Sender, String> {
    let tcp = TcpStream::connect(s.addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    tcp.set_nodelay(true).map_err(|e| e.to_string())?;
    let tls = tokio_rustls::TlsConnector::from(s.tls.clone())
        .connect(s.server_name.clone(), tcp)
        .await
        .map_err(|e| format!("tls: {e}"))?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| format!("http: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

fn note_error(stats: &mut ConnStats, e: String) {
    stats.errors += 1;
    if stats.error_sample.is_none() {
        stats.error_sample = Some(e);
    }
}

/// One connection: connect (retrying until the window is published and `give_up`), report ready, then send
/// until the window ends; reconnects whenever the server closes the connection.
async fn run_connection(
    s: Arc<Shared>,
    k: usize,
    ready: tokio::sync::mpsc::UnboundedSender<()>,
    mut window_rx: watch::Receiver<Option<Window>>,
    give_up: Instant,
) -> ConnStats {
    let mut stats = ConnStats::default();
    // First connection: retried while the server starts.
    let mut sender = loop {
        match connect(&s).await {
            Ok(sender) => break Some(sender),
            Err(e) => {
                if Instant::now() >= give_up {
                    note_error(&mut stats, e);
                    break None;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    if sender.is_some() {
        stats.connects += 1;
    }
    let _ = ready.send(());
    drop(ready);
    let window = match window_rx.wait_for(Option::is_some).await {
        Ok(w) => w.expect("published"),
        Err(_) => return stats,
    };
    let mut seq: u64 = 0;
    let mut last_done = window.t0;
    loop {
        let now = Instant::now();
        if now >= window.end {
            break;
        }
        // When the request should leave, and from when its latency counts.
        let scheduled = match s.rate {
            Some(rate) => {
                let offset = Duration::try_from_secs_f64(
                    (seq as f64 * s.connections as f64 + k as f64) / rate,
                );
                seq += 1;
                // Past the window (or past what a Duration holds, at a tiny rate): done.
                let Some(at) = offset.ok().and_then(|o| window.t0.checked_add(o)) else {
                    break;
                };
                if at >= window.end {
                    break;
                }
                if at > now {
                    tokio::time::sleep_until(at.into()).await;
                }
                Some(at)
            }
            None => None,
        };
        let mut conn = match sender.take() {
            Some(c) if !c.is_closed() => c,
            _ => match connect(&s).await {
                Ok(c) => {
                    stats.connects += 1;
                    c
                }
                Err(e) => {
                    note_error(&mut stats, e);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let n = s.next.fetch_add(1, Ordering::Relaxed);
        let body = s.bodies[s.slots[n % s.slots.len()]].clone();
        let request = hyper::Request::post(s.path.as_str())
            .header(hyper::header::HOST, s.authority.as_str())
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .expect("request builds");
        let sent = Instant::now();
        // Late because the connection was busy past the scheduled time: count from the schedule.
        let start = match scheduled {
            Some(at) if last_done > at => {
                stats.late += 1;
                at
            }
            _ => sent,
        };
        let exchange = async {
            conn.ready().await.map_err(|e| format!("ready: {e}"))?;
            let response = conn
                .send_request(request)
                .await
                .map_err(|e| format!("send: {e}"))?;
            let status = response.status().as_u16();
            let close = response
                .headers()
                .get(hyper::header::CONNECTION)
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
            response
                .into_body()
                .collect()
                .await
                .map_err(|e| format!("body: {e}"))?;
            Ok::<_, String>((status, close))
        };
        match tokio::time::timeout(s.request_timeout, exchange).await {
            Ok(Ok((status, close))) => {
                let done = Instant::now();
                last_done = done;
                if done >= window.measure && done < window.end {
                    let micros = done.duration_since(start).as_micros().min(u32::MAX as u128);
                    stats.samples.push((status, micros as u32));
                }
                if !close {
                    sender = Some(conn);
                }
            }
            Ok(Err(e)) => {
                // Typically the server closing the connection mid-request (an early answer to a request whose
                // body it did not read): recorded as status 0 with the time it took.
                let done = Instant::now();
                last_done = done;
                if done >= window.measure && done < window.end {
                    let micros = done.duration_since(start).as_micros().min(u32::MAX as u128);
                    stats.samples.push((0, micros as u32));
                    note_error(&mut stats, e);
                }
            }
            Err(_) => {
                last_done = Instant::now();
                note_error(
                    &mut stats,
                    format!("no answer within {:?}", s.request_timeout),
                );
            }
        }
    }
    stats
}

/// The nearest-rank quantile `q` (0..=1) in microseconds; 0 with no samples.
fn percentile(sorted: &[u32], q: f64) -> u32 {
    pdp_testkit::stats::percentile(sorted, q * 100.0).unwrap_or(0)
}

fn summary(mut lat: Vec<u32>) -> Value {
    lat.sort_unstable();
    let mean = if lat.is_empty() {
        0.0
    } else {
        lat.iter().map(|&v| v as f64).sum::<f64>() / lat.len() as f64
    };
    json!({
        "count": lat.len(),
        "p50": percentile(&lat, 0.50),
        "p90": percentile(&lat, 0.90),
        "p99": percentile(&lat, 0.99),
        "p999": percentile(&lat, 0.999),
        "max": lat.last().copied().unwrap_or(0),
        "mean": (mean * 10.0).round() / 10.0,
    })
}

fn tls_config(ca: &PathBuf) -> Result<Arc<rustls::ClientConfig>, String> {
    let pem = std::fs::read(ca).map_err(|e| format!("cannot read {}: {e}", ca.display()))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        roots
            .add(cert.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let mut config = rustls::ClientConfig::builder_with_provider(pdp_core::pki::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Slot table for the weights, shuffled with a fixed seed so that every run sends the same sequence.
fn slots(weights: &[usize]) -> Vec<usize> {
    let mut slots: Vec<usize> = weights
        .iter()
        .enumerate()
        .flat_map(|(i, &w)| std::iter::repeat_n(i, w))
        .collect();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in (1..slots.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        slots.swap(i, (x % (i as u64 + 1)) as usize);
    }
    slots
}

async fn run(a: Args) -> Result<Value, String> {
    if a.spin {
        // A task that is always ready: the runtime then polls epoll with a zero timeout and never parks.
        tokio::spawn(async {
            loop {
                tokio::task::yield_now().await;
            }
        });
    }
    let mut bodies = vec![];
    let mut weights = vec![];
    for Body { file, weight } in &a.bodies {
        let bytes =
            std::fs::read(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        bodies.push(Bytes::from(bytes));
        weights.push(*weight);
    }
    if weights.iter().all(|&w| w == 0) {
        return Err("every --body has weight 0".into());
    }
    let addr = a.url.addr;
    let connections = a.connections as usize;
    // 0 means closed loop.
    let rate = a.rate.filter(|r| *r > 0.0);
    let server_name = a
        .server_name
        .clone()
        .unwrap_or_else(|| ServerName::IpAddress(addr.ip().into()));
    let shared = Arc::new(Shared {
        addr,
        path: a.url.path.clone(),
        authority: addr.to_string(),
        server_name,
        tls: tls_config(&a.ca)?,
        bodies,
        slots: slots(&weights),
        next: AtomicUsize::new(0),
        connections,
        rate,
        request_timeout: a.request_timeout,
    });

    let (window_tx, window_rx) = watch::channel(None);
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::unbounded_channel();
    let give_up = Instant::now() + a.wait;
    let tasks: Vec<_> = (0..connections)
        .map(|k| {
            tokio::spawn(run_connection(
                shared.clone(),
                k,
                ready_tx.clone(),
                window_rx.clone(),
                give_up,
            ))
        })
        .collect();
    drop(ready_tx);
    let mut ready = 0;
    while ready < connections && ready_rx.recv().await.is_some() {
        ready += 1;
    }
    let t0 = Instant::now();
    let window = Window {
        t0,
        measure: t0 + a.warmup,
        end: t0 + a.warmup + a.duration,
    };
    let _ = window_tx.send(Some(window));

    tokio::time::sleep_until(window.measure.into()).await;
    let cpu_before = a.pid.and_then(|p| cpu_ticks(p).ok());
    let self_before = cpu_ticks(std::process::id()).ok();
    let machine_before = machine_busy_ticks();
    let measured_from = Instant::now();
    tokio::time::sleep_until(window.end.into()).await;
    let cpu_after = a.pid.and_then(|p| cpu_ticks(p).ok());
    let self_after = cpu_ticks(std::process::id()).ok();
    let machine_after = machine_busy_ticks();
    let window_s = measured_from.elapsed().as_secs_f64();

    // Every connection stops sending at the window's end; bound the wait for its last answer.
    let grace = shared.request_timeout + Duration::from_secs(5);
    let mut all = ConnStats::default();
    let mut error_samples = vec![];
    for task in tasks {
        let handle = task.abort_handle();
        match tokio::time::timeout(grace, task).await {
            Ok(Ok(stats)) => {
                all.samples.extend(stats.samples);
                all.errors += stats.errors;
                all.connects += stats.connects;
                all.late += stats.late;
                error_samples.extend(stats.error_sample);
            }
            _ => {
                handle.abort();
                all.errors += 1;
                error_samples.push("connection task did not finish".into());
            }
        }
    }

    let requests = all.samples.len();
    let mut by_status: BTreeMap<u16, Vec<u32>> = BTreeMap::new();
    for &(status, micros) in &all.samples {
        by_status.entry(status).or_default().push(micros);
    }
    let status_counts: BTreeMap<String, usize> = by_status
        .iter()
        .map(|(s, v)| (s.to_string(), v.len()))
        .collect();
    let by_status_json: BTreeMap<String, Value> = by_status
        .into_iter()
        .map(|(s, v)| (s.to_string(), summary(v)))
        .collect();
    let latency = summary(all.samples.iter().map(|&(_, m)| m).collect());

    let server = a.pid.map(|pid| {
        let ticks = match (cpu_before, cpu_after) {
            (Some(b), Some(e)) => Some(e.saturating_sub(b)),
            _ => None,
        };
        let cpu_s = ticks.map(|t| t as f64 / a.clk_tck);
        json!({
            "pid": a.pid,
            "cpu_s": cpu_s,
            "cpu_share": cpu_s.map(|c| c / window_s),
            "cpu_us_per_req": cpu_s.filter(|_| requests > 0).map(|c| c * 1e6 / requests as f64),
            "vmhwm_kib": status_kib(pid, "VmHWM:").ok(),
            "vmrss_kib": status_kib(pid, "VmRSS:").ok(),
            "alive": std::path::Path::new(&format!("/proc/{pid}")).exists(),
        })
    });
    error_samples.sort();
    error_samples.dedup();
    error_samples.truncate(5);
    let loadgen_cpu_share = match (self_before, self_after) {
        (Some(b), Some(e)) => Some((e - b) as f64 / a.clk_tck / window_s),
        _ => None,
    };
    // CPU used by anything but the server and this load generator during the window, in cores: other work on
    // the machine (a compiler, a fuzzer) that makes the figures noisy.
    let delta = |b: Option<u64>, e: Option<u64>| match (b, e) {
        (Some(b), Some(e)) => Some(e.saturating_sub(b) as f64 / a.clk_tck),
        _ => None,
    };
    let foreign_cpu = delta(machine_before, machine_after).map(|busy| {
        let ours = delta(cpu_before, cpu_after).unwrap_or(0.0)
            + delta(self_before, self_after).unwrap_or(0.0);
        ((busy - ours) / window_s).max(0.0)
    });
    let cpu_us = server
        .as_ref()
        .and_then(|s| s["cpu_us_per_req"].as_f64())
        .map_or("-".to_string(), |c| format!("{c:.1}"));
    eprintln!(
        "    {:<32} {:>7.0} req/s  p50 {:>6} us  p99 {:>6} us  p99.9 {:>6} us  server cpu {:>6} us/req  loadgen {:>3.0}%  others {:>3.0}%  {}",
        a.label,
        requests as f64 / window_s,
        latency["p50"],
        latency["p99"],
        latency["p999"],
        cpu_us,
        loadgen_cpu_share.unwrap_or(0.0) * 100.0,
        foreign_cpu.unwrap_or(0.0) * 100.0,
        serde_json::to_string(&status_counts).unwrap_or_default(),
    );
    Ok(json!({
        "label": a.label,
        "connections": connections,
        "rate": rate,
        "bodies": a.bodies.iter().map(|b| json!({"file": b.file, "weight": b.weight})).collect::<Vec<_>>(),
        "window_s": (window_s * 1000.0).round() / 1000.0,
        "requests": requests,
        "rps": (requests as f64 / window_s).round(),
        "latency_us": latency,
        "status": status_counts,
        "by_status": by_status_json,
        "errors": all.errors,
        "error_samples": error_samples,
        "connects": all.connects,
        "late_sends": all.late,
        "server": server,
        "loadgen_cpu_share": loadgen_cpu_share,
        "foreign_cpu": foreign_cpu,
    }))
}

fn main() {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match runtime.block_on(run(args)) {
        Ok(result) => println!("{result}"),
        Err(e) => {
            eprintln!("loadgen: {e}");
            std::process::exit(1);
        }
    }
}
