// Shared by tests/hostile/main.rs and tests/hostile/cpu_quota.rs: the real `pdp-injector serve` binary as a child process on
// 127.0.0.1 with certificates from `pdp-injector certs`, killed on drop (also when a test fails), and a small
// HTTPS client over hyper's connection API.

use std::io::Read as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

pub const BIN: &str = env!("CARGO_BIN_EXE_pdp-injector");
pub const FIXTURE: &str = include_str!("../fixtures/admissionreview-v1-pod-create.json");
pub const FIXTURE_UID: &str = "2c11f9f4-347e-4028-9bdb-2d01a3c0650c";

/// The binary the tests run: this build's, or another one given in `HOSTILE_BIN` (to print the figures of
/// an older build next to this one's: BENCHMARKS.md). Another binary is announced on stderr, and refused under
/// `CI=true` unless its bytes are this build's: a gate tests the build it gates.
pub fn bin() -> std::ffi::OsString {
    static CHOSEN: std::sync::OnceLock<std::ffi::OsString> = std::sync::OnceLock::new();
    CHOSEN
        .get_or_init(|| chosen_bin(std::env::var_os("HOSTILE_BIN"), ci()))
        .clone()
}

fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// What [`bin`] runs, given `HOSTILE_BIN` and whether this is CI.
pub fn chosen_bin(other: Option<std::ffi::OsString>, ci: bool) -> std::ffi::OsString {
    let Some(other) = other else {
        return BIN.into();
    };
    let read = |p: &Path| std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let same = read(Path::new(&other)) == read(Path::new(BIN));
    if ci && !same {
        panic!(
            "HOSTILE_BIN={} is refused under CI=true: it is not this build ({BIN})",
            Path::new(&other).display()
        );
    }
    let what = if same {
        "the same bytes as this build's"
    } else {
        "another build, NOT this build's"
    };
    eprintln!(
        "\n*** HOSTILE_BIN: these tests run {} ({what} {BIN}) ***\n",
        Path::new(&other).display()
    );
    other
}

/// Open file descriptors of process `pid`; unreadable /proc is a failure, never 0 (that would pass every bound).
pub fn proc_fds(pid: u32) -> usize {
    pdp_testkit::proc::open_fds(pid).unwrap_or_else(|e| panic!("cannot count descriptors: {e}"))
}

/// Resident memory of process `pid` in KiB (VmRSS); unreadable or absent is a failure, never 0.
pub fn proc_rss_kib(pid: u32) -> u64 {
    pdp_testkit::proc::status_kib(pid, "VmRSS:")
        .unwrap_or_else(|e| panic!("cannot read resident memory: {e}"))
}

/// Tests in one binary that measure time or count descriptors must not overlap.
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}

/// The fixture with an opt-in annotation and a uid of our choosing (to check that answers are not crossed).
pub fn review_body(uid: &str, inject: &str) -> Vec<u8> {
    let mut r: serde_json::Value = serde_json::from_str(FIXTURE).unwrap();
    r["request"]["uid"] = uid.into();
    r["request"]["object"]["metadata"]["annotations"] =
        serde_json::json!({"pdp-injector.io/inject": inject});
    serde_json::to_vec(&r).unwrap()
}

/// Whether `serve` has a flag (tests stay valid across a flag's introduction, e.g. `--idle-timeout`).
pub fn serve_has_flag(flag: &str) -> bool {
    let out = Command::new(BIN)
        .args(["serve", "--help"])
        .output()
        .expect("run pdp-injector serve --help");
    String::from_utf8_lossy(&out.stdout).contains(flag)
}

/// `extra` plus `--idle-timeout VALUE` when `serve` has that flag. Without it, an idle keep-alive connection is
/// closed after the handshake timeout; with it, after the idle timeout, which tests of other timeouts shorten.
pub fn with_idle_timeout<'a>(extra: &[&'a str], value: &'a str) -> Vec<&'a str> {
    let mut v = extra.to_vec();
    if serve_has_flag("--idle-timeout") {
        v.extend(["--idle-timeout", value]);
    }
    v
}

/// A running `pdp-injector serve`; killed (SIGKILL) and its directory removed on drop.
pub struct ServerProcess {
    pub child: Child,
    pub addr: SocketAddr,
    pub dir: PathBuf,
    pub ca_pem: String,
    pub log: PathBuf,
}

use pdp_testkit::net::free_port;
use pdp_testkit::tls::tls_client_config;

/// Writes a CA and a serving certificate for localhost and 127.0.0.1 with the binary's own `certs` command.
pub fn make_certs(dir: &Path) -> String {
    let out = Command::new(BIN)
        .args([
            "certs",
            "--extra-san",
            "127.0.0.1",
            "--extra-san",
            "localhost",
            "--days",
            "2",
        ])
        .arg("--out-dir")
        .arg(dir)
        .output()
        .expect("run pdp-injector certs");
    assert!(
        out.status.success(),
        "certs failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read_to_string(dir.join("ca.crt")).unwrap()
}

impl ServerProcess {
    /// Starts `serve` on a free 127.0.0.1 port with `extra` flags; returns once `/readyz` answers 200.
    pub async fn start(name: &str, extra: &[&str]) -> ServerProcess {
        Self::start_with(name, extra, |c| c).await
    }

    /// Like [`start`], with a hook that may replace the command (program and arguments only: environment and
    /// output are set afterwards); the CPU-quota test starts the server inside a cgroup this way.
    pub async fn start_with(
        name: &str,
        extra: &[&str],
        wrap: impl Fn(Command) -> Command,
    ) -> ServerProcess {
        pdp_tls::install_default_provider();
        let dir = std::env::temp_dir().join(format!("pdp-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let ca_pem = make_certs(&dir);
        let log = dir.join("serve.log");
        for attempt in 0..3 {
            let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
            let mut cmd = Command::new(bin());
            cmd.arg("serve")
                .arg("--listen")
                .arg(addr.to_string())
                .arg("--cert")
                .arg(dir.join("tls.crt"))
                .arg("--key")
                .arg(dir.join("tls.key"))
                .args(["--cluster", "off"])
                .args(extra);
            let child = wrap(cmd)
                .env("RUST_LOG", "warn")
                .env_remove("KUBECONFIG")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .expect("spawn pdp-injector serve");
            let mut server = ServerProcess {
                child,
                addr,
                dir: dir.clone(),
                ca_pem: ca_pem.clone(),
                log: log.clone(),
            };
            if server.wait_ready(Duration::from_secs(20)).await {
                return server;
            }
            eprintln!(
                "attempt {attempt}: server did not become ready:\n{}",
                server.log_text()
            );
            let _ = server.child.kill();
            let _ = server.child.wait();
            std::mem::forget(server); // keep the directory for the next attempt
        }
        panic!("pdp-injector serve never became ready");
    }

    async fn wait_ready(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if let Ok((StatusCode::OK, _)) =
                call(self.addr, &self.client(), "GET", "/readyz", None, vec![]).await
            {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn client(&self) -> Arc<rustls::ClientConfig> {
        client_config(&self.ca_pem)
    }

    pub fn log_text(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    /// Sends a signal with the `kill` command.
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid().to_string())
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig} failed");
    }

    /// Open file descriptors of the server, from /proc.
    pub fn fds(&self) -> usize {
        proc_fds(self.pid())
    }

    /// Resident memory of the server in KiB, from /proc.
    pub fn rss_kib(&self) -> u64 {
        proc_rss_kib(self.pid())
    }

    /// Waits for the process to exit on its own; `None` when it is still running after `limit`.
    pub async fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("server log ({}):\n{}", self.log.display(), self.log_text());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn client_config(ca_pem: &str) -> Arc<rustls::ClientConfig> {
    tls_client_config(&[ca_pem], None, rustls::DEFAULT_VERSIONS, &[])
}

pub type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;
pub type Tls = tokio_rustls::client::TlsStream<TcpStream>;

/// A TLS connection, handshake done, no request sent.
pub async fn tls_connect(
    addr: SocketAddr,
    config: &Arc<rustls::ClientConfig>,
) -> Result<Tls, String> {
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    tokio_rustls::TlsConnector::from(config.clone())
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .map_err(|e| e.to_string())
}

/// An HTTP/1.1 keep-alive connection.
pub async fn connect(
    addr: SocketAddr,
    config: &Arc<rustls::ClientConfig>,
) -> Result<Sender, String> {
    let tls = tls_connect(addr, config).await?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    Ok(sender)
}

pub async fn send(
    sender: &mut Sender,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: Vec<u8>,
) -> Result<(StatusCode, Vec<u8>), String> {
    send_with(sender, method, path, content_type, body, false).await
}

/// One request; `close` adds `Connection: close` (no keep-alive).
pub async fn send_with(
    sender: &mut Sender,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: Vec<u8>,
    close: bool,
) -> Result<(StatusCode, Vec<u8>), String> {
    sender
        .ready()
        .await
        .map_err(|e| format!("not ready: {e}"))?;
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "localhost");
    if let Some(ct) = content_type {
        req = req.header("content-type", ct);
    }
    if close {
        req = req.header("connection", "close");
    }
    let resp = sender
        .send_request(req.body(Full::new(Bytes::from(body))).unwrap())
        .await
        .map_err(|e| e.to_string())?;
    let status = resp.status();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, bytes.to_vec()))
}

/// One request on a fresh connection, closed after it.
pub async fn call(
    addr: SocketAddr,
    config: &Arc<rustls::ClientConfig>,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: Vec<u8>,
) -> Result<(StatusCode, Vec<u8>), String> {
    let mut sender = connect(addr, config).await?;
    send_with(&mut sender, method, path, content_type, body, true).await
}

/// Checks one admission answer: HTTP 200, the uid echoed, allowed, the expected reason.
pub fn check_answer(
    result: Result<(StatusCode, Vec<u8>), String>,
    uid: &str,
    reason: &str,
) -> Result<(), String> {
    let (status, body) = result?;
    if status != StatusCode::OK {
        return Err(format!("HTTP {status}: {}", String::from_utf8_lossy(&body)));
    }
    let v: serde_json::Value =
        serde_json::from_slice(&body).map_err(|e| format!("answer is not JSON: {e}"))?;
    let r = &v["response"];
    if r["uid"] != uid || r["allowed"] != true || r["auditAnnotations"]["reason"] != reason {
        return Err(format!("wrong answer for {uid}: {r}"));
    }
    Ok(())
}

/// Reads until the peer closes; the time it took, or `None` if it stayed open past `limit`.
pub async fn closed_within<S: tokio::io::AsyncRead + Unpin>(
    stream: &mut S,
    limit: Duration,
) -> Option<(Duration, Vec<u8>)> {
    let started = Instant::now();
    let mut all = Vec::new();
    let mut buf = [0u8; 4096];
    let read = tokio::time::timeout(limit, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => all.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    read.ok().map(|_| (started.elapsed(), all))
}

/// Latencies in order; `p` in 0..=100 (zero when there are none).
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    pdp_testkit::stats::percentile(sorted, p).unwrap_or_default()
}

/// A ClientHello cut short: the first bytes of a TLS record that never completes.
pub fn partial_client_hello() -> Vec<u8> {
    vec![
        0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03,
    ]
}
