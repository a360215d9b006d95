//! The flag sync fan-out benchmark of `scripts/bench.sh --flag-sync`: one `pdp-injector flag-sync` serving a
//! directory of flag files, N subscribed SyncFlags streams, K changes to the flag file; prints one JSON object per
//! variant on stdout and a table on stderr.
//!
//! For each variant (streams per HTTP/2 connection: 1 is one connection per stream, what N Pods on a node open),
//! it starts a fresh server (or uses the one given with `--addr`), opens the streams, waits until each got its
//! first configuration, and then, K times, replaces the flag file (write, then rename over it) and waits until
//! every stream received the new configuration. Measured:
//! - change to subscriber: from the rename to each stream's receipt of the configuration (p50/p99/max over all
//!   stream x change samples); the dir source polls every `--poll-interval`, so this includes the wait for the
//!   next scan, reported on its own as the first stream's receipt of each change ("detection");
//! - the server's own `pdp_flag_sync_update_lag_seconds` histogram over the changes (from its snapshot of the
//!   change to the configuration handed to the stream), quantiles interpolated in its buckets;
//! - the server's CPU (utime+stime from /proc/PID/stat) over the changes, per change, gross and net of the idle
//!   rate measured with the streams open and no change (the poll loop, keep-alives);
//! - the server's RSS (VmRSS) before any stream and with all streams open (and its anonymous part, RssAnon),
//!   and its peak (VmHWM) at the end.
//!
//! Any stream that misses a change, ends, or sees a configuration out of order fails the run (exit 1), as does
//! an unreadable /proc.
//!
//! ```text
//! sync-fanout --bin target/release/pdp-injector --streams 1000 --per-connection 1,16 --changes 20 \
//!             [--server-cpu 0] [--flags 20] [--poll-interval-ms 100]
//! sync-fanout --addr 127.0.0.1:8015 --management 127.0.0.1:8014 --pid PID --flags-dir DIR --per-connection 1
//! ```
//! Runs on a single-threaded tokio runtime (the script pins it to one core, the server to the other).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use pdp_flagsync::proto::SyncFlagsRequest;
use pdp_flagsync::proto::flag_sync_service_client::FlagSyncServiceClient;
use pdp_testkit::proc::{cpu_ticks, open_files_limit, status_kib};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tonic::transport::{Channel, Endpoint};

mod metrics;

use metrics::{histogram_quantile, http_get, scrape};

/// The namespace the server counts every caller in, and the directory under which the flag file lives.
const NAMESPACE: &str = "team-a";
/// The flag set's file name (DIR/team-a/bench.flagd.json).
const FILE: &str = "bench.flagd.json";
/// The string flag whose value carries the change number, found in each received configuration.
const MARK: &str = "bench-rev-";

/// The flags; `--help` prints them.
#[derive(Parser)]
#[command(
    name = "sync-fanout",
    about = "Flag sync fan-out benchmark: N SyncFlags streams on one flag-sync server, K flag file changes; prints one JSON object per variant"
)]
struct Args {
    /// The pdp-injector binary to start as `flag-sync --flags-dir` (one fresh server per variant).
    #[arg(long, value_name = "FILE", required_unless_present = "addr")]
    bin: Option<PathBuf>,
    /// Pin the started server to this CPU list (`taskset -c`).
    #[arg(long, value_name = "CPUS")]
    server_cpu: Option<String>,
    /// A running server's gRPC address instead of starting one (needs --management, --pid, --flags-dir).
    #[arg(long, value_name = "IP:PORT", requires_all = ["management", "pid", "flags_dir"])]
    addr: Option<SocketAddr>,
    /// The running server's management address (/metrics).
    #[arg(long, value_name = "IP:PORT")]
    management: Option<SocketAddr>,
    /// The running server's process.
    #[arg(long, value_name = "PID")]
    pid: Option<u32>,
    /// The running server's --flags-dir (started servers get a fresh one under --work-dir).
    #[arg(long, value_name = "DIR")]
    flags_dir: Option<PathBuf>,
    /// Where started servers' flag directories and logs go.
    #[arg(long, value_name = "DIR", default_value = "target/bench/flag-sync")]
    work_dir: PathBuf,
    /// Subscribed streams.
    #[arg(long, short = 'n', value_name = "N", default_value = "1000",
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    streams: u32,
    /// Streams per HTTP/2 connection, one variant each (comma-separated); 1: one connection per stream.
    #[arg(
        long,
        value_name = "M,...",
        value_delimiter = ',',
        default_value = "1,16"
    )]
    per_connection: Vec<u32>,
    /// Changes to the flag file.
    #[arg(long, short = 'k', value_name = "K", default_value = "20",
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    changes: u32,
    /// Flags in the flag set (each a small boolean flag with targeting), besides the change marker.
    #[arg(long, value_name = "N", default_value = "20")]
    flags: u32,
    /// The started server's --poll-interval, in milliseconds.
    #[arg(long, value_name = "MS", default_value = "100")]
    poll_interval_ms: u64,
    /// Idle window (streams open, no change) for the server's idle CPU rate, in seconds.
    #[arg(long, value_name = "S", default_value = "2")]
    idle: f64,
    /// How long each stream may take to get a configuration (the first, and each change), in seconds.
    #[arg(long, value_name = "S", default_value = "15")]
    timeout: f64,
    /// Clock ticks per second of /proc/PID/stat (`getconf CLK_TCK`).
    #[arg(long, value_name = "N", default_value = "100")]
    clk_tck: f64,
    /// Label of the run, echoed in the JSON.
    #[arg(long, value_name = "TEXT", default_value = "")]
    label: String,
}

/// A failed run: printed, exit 1.
type Fail = String;

fn main() {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut failed = false;
    for &per in &args.per_connection {
        match rt.block_on(variant(&args, per.max(1))) {
            Ok(line) => {
                print_table(&line);
                println!("{line}");
            }
            Err(e) => {
                eprintln!(
                    "sync-fanout: {} streams, {per} per connection: {e}",
                    args.streams
                );
                failed = true;
            }
        }
    }
    if failed {
        std::process::exit(1);
    }
}

/// The server under test: started here (killed on drop) or given.
struct Server {
    child: Option<Child>,
    pid: u32,
    addr: SocketAddr,
    management: SocketAddr,
    dir: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn free_port() -> Result<SocketAddr, Fail> {
    Ok(SocketAddr::from((
        [127, 0, 0, 1],
        pdp_testkit::net::free_port(),
    )))
}

fn start_server(args: &Args, per: u32) -> Result<Server, Fail> {
    if let Some(addr) = args.addr {
        let (Some(management), Some(pid), Some(dir)) = (args.management, args.pid, &args.flags_dir)
        else {
            return Err("--addr needs --management, --pid and --flags-dir".into());
        };
        return Ok(Server {
            child: None,
            pid,
            addr,
            management,
            dir: dir.clone(),
        });
    }
    let bin = args.bin.as_ref().ok_or("--bin or --addr is needed")?;
    let dir = args
        .work_dir
        .join(format!("flags-{}-{per}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join(NAMESPACE)).map_err(|e| format!("{}: {e}", dir.display()))?;
    write_flags(&dir, 0, args.flags)?;
    let (addr, management) = (free_port()?, free_port()?);
    let log = std::fs::File::create(args.work_dir.join(format!("server-{per}.log")))
        .map_err(|e| format!("server log: {e}"))?;
    let mut cmd = match &args.server_cpu {
        Some(cpus) => {
            let mut c = Command::new("taskset");
            c.args(["-c", cpus]).arg(bin);
            c
        }
        None => Command::new(bin),
    };
    cmd.arg("flag-sync")
        .arg("--flags-dir")
        .arg(&dir)
        .args(["--caller-namespace", NAMESPACE])
        .args(["--listen", &addr.to_string()])
        .args(["--management-listen", &management.to_string()])
        .args(["--poll-interval", &format!("{}ms", args.poll_interval_ms)])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    let child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
    Ok(Server {
        pid: child.id(),
        child: Some(child),
        addr,
        management,
        dir,
    })
}

/// flagd's flag document at change `rev`: `flags` boolean flags with a targeting rule, and the marker flag.
fn document(rev: u32, flags: u32) -> String {
    let mut doc = json!({"flags": {}});
    let map = doc["flags"].as_object_mut().expect("object");
    for i in 0..flags {
        map.insert(
            format!("feature-{i:03}"),
            json!({
                "state": "ENABLED",
                "variants": {"on": true, "off": false},
                "defaultVariant": if (i + rev).is_multiple_of(2) { "on" } else { "off" },
                "targeting": {"if": [{"in": ["@example.com", {"var": "email"}]}, "on", "off"]}
            }),
        );
    }
    map.insert(
        "bench-revision".into(),
        json!({
            "state": "ENABLED",
            "variants": {"current": format!("{MARK}{rev}")},
            "defaultVariant": "current"
        }),
    );
    doc.to_string()
}

/// Replaces the flag file at once: written beside it, then renamed over it.
fn write_flags(dir: &Path, rev: u32, flags: u32) -> Result<(), Fail> {
    let tmp = dir.join(NAMESPACE).join(".bench.tmp");
    std::fs::write(&tmp, document(rev, flags)).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, dir.join(NAMESPACE).join(FILE))
        .map_err(|e| format!("rename onto {FILE}: {e}"))
}

/// The change number a configuration carries.
fn revision(config: &str) -> Option<u32> {
    let at = config.find(MARK)? + MARK.len();
    let digits: String = config[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().ok()
}

/// What a stream reports to the run.
enum Event {
    /// Stream `stream` received the configuration of change `rev`.
    Got { stream: u32, rev: u32, at: Instant },
    /// Stream `stream` failed or ended.
    Ended { stream: u32, why: String },
}

/// One SyncFlags stream on `channel`, reporting each configuration's change number.
async fn subscribe(stream: u32, channel: Channel, tx: mpsc::UnboundedSender<Event>) {
    let mut client = FlagSyncServiceClient::new(channel);
    let mut request = tonic::Request::new(SyncFlagsRequest::default());
    // Empty: every set of the caller's namespace.
    request.metadata_mut().insert(
        "flagd-selector",
        tonic::metadata::MetadataValue::from_static(""),
    );
    let why = match client.sync_flags(request).await {
        Err(status) => format!("refused: {status}"),
        Ok(response) => {
            let mut messages = response.into_inner();
            loop {
                match messages.message().await {
                    Ok(Some(m)) => {
                        let at = Instant::now();
                        let Some(rev) = revision(&m.flag_configuration) else {
                            break format!(
                                "a configuration without the marker flag: {:.200}",
                                m.flag_configuration
                            );
                        };
                        if tx.send(Event::Got { stream, rev, at }).is_err() {
                            return;
                        }
                    }
                    Ok(None) => break "the server ended the stream".into(),
                    Err(status) => break format!("stream failed: {status}"),
                }
            }
        }
    };
    let _ = tx.send(Event::Ended { stream, why });
}

/// Waits until every stream received change `rev`; each receipt's time goes to `at[stream]`.
async fn await_change(
    rx: &mut mpsc::UnboundedReceiver<Event>,
    rev: u32,
    at: &mut [Option<Instant>],
    timeout: Duration,
) -> Result<(), Fail> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut missing = at.iter().filter(|a| a.is_none()).count();
    while missing > 0 {
        let event = match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(e)) => e,
            Ok(None) => return Err("every stream ended".into()),
            Err(_) => {
                let first = at.iter().position(|a| a.is_none()).unwrap_or(0);
                return Err(format!(
                    "{missing} of {} streams missed change {rev} within {:.1} s (stream {first} among them)",
                    at.len(),
                    timeout.as_secs_f64()
                ));
            }
        };
        match event {
            Event::Got {
                stream,
                rev: got,
                at: when,
            } => {
                if got != rev {
                    return Err(format!(
                        "stream {stream} got change {got} while change {rev} was awaited (a change missed or repeated)"
                    ));
                }
                let slot = &mut at[stream as usize];
                if slot.is_some() {
                    return Err(format!("stream {stream} got change {rev} twice"));
                }
                *slot = Some(when);
                missing -= 1;
            }
            Event::Ended { stream, why } => {
                return Err(format!("stream {stream} ended: {why}"));
            }
        }
    }
    Ok(())
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn ms(s: f64) -> f64 {
    (s * 1e5).round() / 100.0
}

async fn variant(args: &Args, per: u32) -> Result<Value, Fail> {
    let n = args.streams;
    let connections = n.div_ceil(per);
    if let Some(limit) = open_files_limit()
        && limit < u64::from(connections) + 64
    {
        return Err(format!(
            "the open files limit is {limit}, too low for {connections} connections: raise it (ulimit -n {})",
            connections + 256
        ));
    }
    std::fs::create_dir_all(&args.work_dir)
        .map_err(|e| format!("{}: {e}", args.work_dir.display()))?;
    let server = start_server(args, per)?;
    let timeout = Duration::from_secs_f64(args.timeout);
    let poll = Duration::from_millis(args.poll_interval_ms);

    // Ready: /readyz answers 200 once the directory was listed.
    let start = Instant::now();
    loop {
        if let Ok((200, _)) = http_get(server.management, "/readyz") {
            break;
        }
        if start.elapsed() > Duration::from_secs(10) {
            return Err(format!(
                "the server was not ready on {} within 10 s",
                server.management
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let rss_idle = status_kib(server.pid, "VmRSS:")?;
    cpu_ticks(server.pid)?;
    // The run starts at change 0: a given server's file is rewritten with it, and scanned before any stream.
    if server.child.is_none() {
        write_flags(&server.dir, 0, args.flags)?;
        tokio::time::sleep(poll * 3).await;
    }

    // The connections, one after another; the streams as tasks.
    let (tx, mut rx) = mpsc::unbounded_channel();
    let opened = Instant::now();
    let endpoint = Endpoint::from_shared(format!("http://{}", server.addr))
        .map_err(|e| e.to_string())?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(5));
    let mut stream = 0;
    for c in 0..connections {
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| format!("connection {c} of {connections}: {e}"))?;
        for _ in 0..per.min(n - stream) {
            tokio::spawn(subscribe(stream, channel.clone(), tx.clone()));
            stream += 1;
        }
    }
    drop(tx);
    let mut at = vec![None; n as usize];
    await_change(&mut rx, 0, &mut at, timeout).await?;
    let open_s = opened.elapsed().as_secs_f64();
    let open = scrape(server.management)?;
    if open.subscribers as u32 != n {
        return Err(format!(
            "the server counts {} subscribers, {n} streams are open",
            open.subscribers
        ));
    }
    let rss_open = status_kib(server.pid, "VmRSS:")?;
    // RSS less the binary's and libraries' resident pages (file-backed, shared, reclaimable).
    let anon_open = status_kib(server.pid, "RssAnon:")?;

    // Idle: the server's CPU with every stream open and no change.
    let idle = Duration::from_secs_f64(args.idle);
    let (c0, t0) = (cpu_ticks(server.pid)?, Instant::now());
    tokio::time::sleep(idle).await;
    let (c1, t1) = (cpu_ticks(server.pid)?, Instant::now());
    let idle_ticks_per_s = (c1 - c0) as f64 / (t1 - t0).as_secs_f64();

    // The changes.
    let before = scrape(server.management)?;
    let (cpu_before, changes_start) = (cpu_ticks(server.pid)?, Instant::now());
    let mut lags = Vec::with_capacity((n * args.changes) as usize);
    let mut detection = Vec::with_capacity(args.changes as usize);
    let mut spread = Vec::with_capacity(args.changes as usize);
    for rev in 1..=args.changes {
        at.iter_mut().for_each(|a| *a = None);
        write_flags(&server.dir, rev, args.flags)?;
        let written = Instant::now();
        await_change(&mut rx, rev, &mut at, timeout).await?;
        let times: Vec<Instant> = at.iter().map(|a| a.expect("every stream got it")).collect();
        let first = *times.iter().min().expect("one stream at least");
        let last = *times.iter().max().expect("one stream at least");
        detection.push(first.saturating_duration_since(written).as_secs_f64());
        spread.push((last - first).as_secs_f64());
        lags.extend(
            times
                .iter()
                .map(|t| t.saturating_duration_since(written).as_secs_f64()),
        );
        // The next write lands at another point of the poll cycle (golden-ratio steps through it).
        let phase = (f64::from(rev) * 0.618_034).fract();
        tokio::time::sleep(poll.mul_f64(phase) + Duration::from_millis(5)).await;
    }
    let (cpu_after, changes_end) = (cpu_ticks(server.pid)?, Instant::now());
    let after = scrape(server.management)?;
    let rss_end = status_kib(server.pid, "VmRSS:")?;
    let hwm = status_kib(server.pid, "VmHWM:")?;
    let expected = f64::from(n) * f64::from(args.changes);
    if after.sent - before.sent != expected {
        return Err(format!(
            "the server sent {} configurations over the changes, {expected} were expected",
            after.sent - before.sent
        ));
    }

    lags.sort_by(f64::total_cmp);
    detection.sort_by(f64::total_cmp);
    spread.sort_by(f64::total_cmp);
    let k = f64::from(args.changes);
    let window = (changes_end - changes_start).as_secs_f64();
    let gross_ms = (cpu_after - cpu_before) as f64 / args.clk_tck / k * 1e3;
    let net_ms = gross_ms - idle_ticks_per_s / args.clk_tck * window / k * 1e3;
    let lag_q = |q| histogram_quantile(&before, &after, q).map(ms);
    Ok(json!({
        "kind": "flag_sync",
        "label": args.label,
        "streams": n,
        "per_connection": per,
        "connections": connections,
        "changes": args.changes,
        "flags": args.flags,
        "config_bytes": document(0, args.flags).len(),
        "poll_interval_ms": args.poll_interval_ms,
        "open_s": (open_s * 1e3).round() / 1e3,
        "lag_ms": {
            "p50": ms(quantile(&lags, 0.5)),
            "p99": ms(quantile(&lags, 0.99)),
            "max": ms(quantile(&lags, 1.0)),
        },
        "detection_ms": {"p50": ms(quantile(&detection, 0.5)), "max": ms(quantile(&detection, 1.0))},
        "spread_ms": {"p50": ms(quantile(&spread, 0.5)), "max": ms(quantile(&spread, 1.0))},
        "server_lag_ms": {"p50": lag_q(0.5), "p99": lag_q(0.99), "count": after.count - before.count},
        "cpu_ms_per_change": {"gross": (gross_ms * 100.0).round() / 100.0, "net": (net_ms * 100.0).round() / 100.0},
        "cpu_us_per_subscriber": (net_ms * 1e3 / f64::from(n) * 100.0).round() / 100.0,
        "idle_cpu_percent": (idle_ticks_per_s / args.clk_tck * 1e4).round() / 100.0,
        "rss_kib": {"before_streams": rss_idle, "streams_open": rss_open, "anon_streams_open": anon_open, "end": rss_end, "peak": hwm},
        "target_rss_met": hwm <= 32 * 1024,
        "target_p99_met": quantile(&lags, 0.99) < 1.0,
    }))
}

fn print_table(v: &Value) {
    let f = |p: &str| v.pointer(p).cloned().unwrap_or(Value::Null);
    let mib = |p: &str| f(p).as_f64().map_or(f64::NAN, |k| k / 1024.0);
    eprintln!(
        "flag sync: {} streams, {} per connection ({} connections), {} changes of a {} B configuration, poll {} ms",
        f("/streams"),
        f("/per_connection"),
        f("/connections"),
        f("/changes"),
        f("/config_bytes"),
        f("/poll_interval_ms")
    );
    eprintln!(
        "  change to subscriber    p50 {} ms, p99 {} ms, max {} ms (detection p50 {} ms, fan-out spread p50 {} ms, max {} ms)",
        f("/lag_ms/p50"),
        f("/lag_ms/p99"),
        f("/lag_ms/max"),
        f("/detection_ms/p50"),
        f("/spread_ms/p50"),
        f("/spread_ms/max")
    );
    eprintln!(
        "  server update_lag       p50 {} ms, p99 {} ms ({} samples, from its buckets)",
        f("/server_lag_ms/p50"),
        f("/server_lag_ms/p99"),
        f("/server_lag_ms/count")
    );
    eprintln!(
        "  server CPU per change   {} ms net ({} ms gross; idle {}% of a core), {} us per subscriber",
        f("/cpu_ms_per_change/net"),
        f("/cpu_ms_per_change/gross"),
        f("/idle_cpu_percent"),
        f("/cpu_us_per_subscriber")
    );
    eprintln!(
        "  server RSS              {:.1} MiB before the streams, {:.1} MiB with them open ({:.1} MiB anonymous), peak {:.1} MiB (target 32 MiB: {})",
        mib("/rss_kib/before_streams"),
        mib("/rss_kib/streams_open"),
        mib("/rss_kib/anon_streams_open"),
        mib("/rss_kib/peak"),
        if f("/target_rss_met") == Value::Bool(true) {
            "met"
        } else {
            "MISSED"
        }
    );
}
