//! The node-local front (`pdp-injector node-proxy`): owns the node's stable PDP endpoints, a TCP address (the
//! hostPort apps reach as `$(CERBOS_PDP_HOST):3593`) and the stable socket path apps mount
//! (`/var/run/cerbos/cerbos.sock`), and forwards each connection at L4, bytes both ways, to the newest PDP
//! instance that accepts it among the per-instance sockets of a directory ([`super::route`] says which).
//!
//! The PDP behind it can therefore be replaced surge-style, new instance first: the front's endpoints never go
//! away while it does, new connections move to the new instance as soon as it listens, and connections already
//! open stay on the old one until they end or it drains them. When no instance is ready (the first start on a
//! node, or a crash), a new connection waits up to `--wait` and is forwarded as soon as one appears: an app sees
//! latency, not a refused connection.
//!
//! **Finding instances: a directory read per new connection, no file watcher.** The directory holds a handful
//! of sockets on a local filesystem (a hostPath under /var/run, tmpfs on most nodes); reading it and stat-ing
//! each entry takes microseconds (BENCHMARKS.md, "Node-local front"), next to a connection that carries many
//! checks. It is always current: no event to miss, no queue to overflow, no inotify instance or watch limit
//! to hit on a busy node (`fs.inotify.max_user_instances` is a classic node-agent failure), no extra crate
//! (`notify` would add a thread and its own dependency tree), and the connect attempt that follows is the
//! readiness check a watcher could not replace anyway. It is a plain `std::fs` call on the async thread, on
//! purpose: `tokio::fs` would send each read to the blocking pool, which costs more than the read itself.
//!
//! **TLS terminates here, on the TCP path only** (`--tls-cert`, `--tls-key`, optionally `--tls-client-ca`).
//! Cerbos, given `server.tls`, wraps every listener in TLS, its node socket too, and only verifies a client
//! certificate when one is presented; the front instead requires one when a client CA is set, keeps the stable
//! socket plaintext (local, permissioned by the filesystem) and the instances on plain Unix sockets, and
//! forwards the decrypted bytes of a TCP connection exactly as it forwards a plaintext one. ALPN offers `h2`
//! only: the TCP backend is the instance's gRPC listener. The files are read again every
//! `--tls-reload-interval` and a changed, valid set is used for the next handshake; a broken one is logged and
//! the last good one stays.

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

use crate::duration::duration_flag;
use crate::node::route::{self, Candidate};
use crate::node::slots::{Activity, COPY_BUFFER, FrontBounds, Refused, Slot, Slots};
use crate::tls::{self, Reload, Reloader, TlsError, TlsFiles};

/// The flags of `node-proxy`, with their defaults and environment variables (the binary flattens this).
#[derive(Debug, Clone, clap::Args)]
pub struct NodeProxyFlags {
    /// TCP address of the node's PDP port (apps reach it as $(CERBOS_PDP_HOST):3593); repeatable or comma-separated. Default [::]:3593: one socket for IPv4 and IPv6 where net.ipv6.bindv6only is 0 (the Linux default), and 0.0.0.0:3593 on a node whose kernel has no IPv6. An address given here is bound exactly as written (no fallback); do not add 0.0.0.0:3593 next to [::]:3593 where bindv6only is 0.
    #[arg(long, env = "PDP_NODE_PROXY_LISTEN", value_delimiter = ',')]
    pub listen: Option<Vec<SocketAddr>>,
    /// Port of the default TCP address, [::]:PORT (with its IPv4 fallback on a node without IPv6), when --listen is not given: another PDP's port, such as flagd's 8013.
    #[arg(long, env = "PDP_NODE_PROXY_PORT", default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// Serve no TCP address (socket only).
    #[arg(long, env = "PDP_NODE_PROXY_NO_TCP")]
    pub no_tcp: bool,
    /// The stable socket apps use (CERBOS_PDP_SOCKET); its directory must exist.
    #[arg(
        long,
        env = "PDP_NODE_PROXY_SOCKET",
        default_value = "/var/run/cerbos/cerbos.sock"
    )]
    pub socket: PathBuf,
    /// Serve no stable socket (TCP only).
    #[arg(long, env = "PDP_NODE_PROXY_NO_SOCKET")]
    pub no_socket: bool,
    /// Permission bits of the stable socket, octal. connect(2) needs write permission and app containers run as any user, so the default lets every local user connect, like the shipped PDP config (udsFileMode 0o777).
    #[arg(long, env = "PDP_NODE_PROXY_SOCKET_MODE", default_value = "666", value_parser = route::mode_flag)]
    pub socket_mode: u32,
    /// When a process already answers on --socket, replace its socket atomically (rename) instead of refusing to start: the front's own upgrade.
    #[arg(long, env = "PDP_NODE_PROXY_TAKE_OVER")]
    pub take_over: bool,
    /// Directory of the per-instance sockets, <instance><suffix>, one set per PDP Pod.
    #[arg(
        long,
        env = "PDP_NODE_PROXY_INSTANCES",
        default_value = "/var/run/cerbos/instances"
    )]
    pub instances: PathBuf,
    /// Suffix of the instance sockets TCP connections go to (Cerbos: its gRPC listener).
    #[arg(long, env = "PDP_NODE_PROXY_TCP_BACKEND", default_value = ".grpc.sock", value_parser = route::suffix_flag)]
    pub tcp_backend: String,
    /// Suffix of the instance sockets stable-socket connections go to (Cerbos: its HTTP listener, which also serves gRPC over h2c).
    #[arg(long, env = "PDP_NODE_PROXY_SOCKET_BACKEND", default_value = ".http.sock", value_parser = route::suffix_flag)]
    pub socket_backend: String,
    /// How long a new connection waits for a ready instance before it is closed.
    #[arg(long, env = "PDP_NODE_PROXY_WAIT", default_value = "30s", value_parser = duration_flag)]
    pub wait: Duration,
    /// How often a waiting connection looks for an instance again.
    #[arg(long, env = "PDP_NODE_PROXY_RETRY_INTERVAL", default_value = "50ms", value_parser = duration_flag)]
    pub retry_interval: Duration,
    /// Bound on connecting to one instance (a Unix connect is immediate unless the instance's backlog is full).
    #[arg(long, env = "PDP_NODE_PROXY_CONNECT_TIMEOUT", default_value = "1s", value_parser = duration_flag)]
    pub connect_timeout: Duration,
    /// After SIGTERM, how long open connections get to finish before they are closed.
    #[arg(long, env = "PDP_NODE_PROXY_DRAIN_TIMEOUT", default_value = "25s", value_parser = duration_flag)]
    pub drain_timeout: Duration,
    /// What the front may use (Kubernetes quantity: 48Mi): its connection bounds are derived from it
    /// (docs/deployment-models.md, "Bounds"). Keep it at about 75% of the container's memory limit.
    #[arg(long, env = "PDP_NODE_PROXY_MEMORY_BUDGET", default_value = "48Mi",
          value_parser = crate::size::parse_size)]
    pub memory_budget: u64,
    /// TCP client connections served at once (default: derived from --memory-budget); at the bound, a new one takes
    /// the place of the connection quiet the longest, or is closed at accept when every one is busy.
    #[arg(long, env = "PDP_NODE_PROXY_MAX_TCP_CONNECTIONS",
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_tcp_connections: Option<u32>,
    /// Stable-socket client connections served at once (default: derived from --memory-budget); at the bound, as
    /// for TCP.
    #[arg(long, env = "PDP_NODE_PROXY_MAX_SOCKET_CONNECTIONS",
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_socket_connections: Option<u32>,
    /// TCP connections one client address may hold at once; more are closed at accept.
    #[arg(long, env = "PDP_NODE_PROXY_MAX_CONNECTIONS_PER_PEER", default_value_t = 128,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_connections_per_peer: u32,
    /// A connection that carried no byte either way for this long is closed: far above the ping interval of
    /// gRPC keep-alive clients (servers refuse pings more often than every 5 minutes by default), so only
    /// clients that hold a connection and never use it lose it.
    #[arg(long, env = "PDP_NODE_PROXY_IDLE_TIMEOUT", default_value = "15m", value_parser = duration_flag)]
    pub idle_timeout: Duration,
    /// A connection older than this is closed at its next pause between two exchanges (as a gRPC server's
    /// MaxConnectionAge does with GOAWAY): no client holds a place for ever; clients reconnect at once.
    #[arg(long, env = "PDP_NODE_PROXY_MAX_CONNECTION_AGE", default_value = "1h", value_parser = duration_flag)]
    pub max_connection_age: Duration,
    /// How often the front looks for a newer PDP instance and moves idle connections to it (see "Moving
    /// connections" in the module docs); 0s never moves a connection (it stays until either side closes it).
    #[arg(long, env = "PDP_NODE_PROXY_REBALANCE_INTERVAL", default_value = "250ms", value_parser = duration_flag)]
    pub rebalance_interval: Duration,
    /// How often the counters are logged, when they changed; 0s never.
    #[arg(long, env = "PDP_NODE_PROXY_STATS_INTERVAL", default_value = "60s", value_parser = duration_flag)]
    pub stats_interval: Duration,
    /// Serving certificate chain (PEM) of the TCP address: with --tls-key, TCP clients speak TLS to the front, which forwards the decrypted bytes; the stable socket stays plaintext.
    #[arg(long, env = "PDP_NODE_PROXY_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert.
    #[arg(long, env = "PDP_NODE_PROXY_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// CA (PEM) that every TCP client's certificate must chain to; a client without one, or with one from another CA, fails the handshake. Needs --tls-cert.
    #[arg(long, env = "PDP_NODE_PROXY_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// How often the TLS files are read again; a change is used from the next handshake on, a broken new file is logged and the last good one kept.
    #[arg(long, env = "PDP_NODE_PROXY_TLS_RELOAD_INTERVAL", default_value = "10s", value_parser = duration_flag)]
    pub tls_reload_interval: Duration,
    /// Bound on a TLS handshake: a client that has not finished it by then is closed (and gives back its place).
    #[arg(long, env = "PDP_NODE_PROXY_TLS_HANDSHAKE_TIMEOUT", default_value = "10s", value_parser = duration_flag)]
    pub tls_handshake_timeout: Duration,
}

/// The port of the default TCP address (Cerbos's gRPC port).
pub const DEFAULT_PORT: u16 = 3593;

impl NodeProxyFlags {
    /// The TCP addresses to bind: --listen, or the default `[::]:<--port>`.
    pub fn listen_addrs(&self) -> Vec<SocketAddr> {
        match &self.listen {
            Some(addrs) => addrs.clone(),
            None => vec![SocketAddr::new(
                IpAddr::V6(Ipv6Addr::UNSPECIFIED),
                self.port,
            )],
        }
    }

    /// The TLS files of the TCP path, when it is TLS.
    pub fn tls_files(&self) -> Option<TlsFiles> {
        Some(TlsFiles {
            cert: self.tls_cert.clone()?,
            key: self.tls_key.clone()?,
            client_ca: self.tls_client_ca.clone(),
        })
    }
}

impl Default for NodeProxyFlags {
    fn default() -> Self {
        #[derive(clap::Parser)]
        struct Only {
            #[command(flatten)]
            flags: NodeProxyFlags,
        }
        <Only as clap::Parser>::try_parse_from(["node-proxy"])
            .expect("the defaults of the node-proxy flags parse")
            .flags
    }
}

/// Why the front cannot start.
#[derive(Debug, thiserror::Error)]
pub enum NodeProxyError {
    /// The flags contradict each other.
    #[error("{0}")]
    Flags(String),
    /// The stable socket cannot be created, or its path holds something the front must not remove.
    #[error("stable socket {path}: {reason}")]
    Socket {
        /// The --socket path.
        path: PathBuf,
        /// What is wrong, and what to do.
        reason: String,
    },
    /// The TLS files of the TCP path cannot be read or used.
    #[error("TLS of the TCP address: {0}")]
    Tls(#[from] TlsError),
    /// A TCP address cannot be bound (in use, or not an address of this node).
    #[error("cannot listen on {addr}: {source}")]
    Tcp {
        /// The --listen address.
        addr: SocketAddr,
        /// The bind error.
        source: io::Error,
    },
}

/// Counters of one instance, by its name.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct InstanceCounts {
    /// Connections forwarded to it.
    pub forwarded: u64,
    /// Times it was passed over: it refused, its socket was gone, or it did not accept within the timeout.
    pub skipped: u64,
    /// Forwarded connections that ended with an I/O error (either side).
    pub errors: u64,
    /// Connections to it that the front closed between two exchanges because a newer instance serves.
    pub moved: u64,
}

/// What the front has done since it started (logged every --stats-interval, read by tests).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Stats {
    /// Client connections accepted.
    pub accepted: u64,
    /// Connections that found no ready instance at first and waited.
    pub waited: u64,
    /// Connections closed because no instance became ready within --wait.
    pub gave_up: u64,
    /// Connections closed at the end of the drain.
    pub cut_at_drain: u64,
    /// TCP connections whose TLS handshake failed or timed out (nothing was forwarded).
    pub tls_failed: u64,
    /// New TLS files put in use after the start.
    pub tls_reloaded: u64,
    /// New TLS files refused (unreadable or invalid); the last good ones stayed.
    pub tls_reload_failed: u64,
    /// TCP connections closed at accept: their client address held --max-connections-per-peer already.
    pub refused_peer: u64,
    /// Connections closed at accept: their endpoint was at its bound and every connection was in an exchange.
    pub refused_full: u64,
    /// Connections closed because a new connection took their place at the bound (they were quiet the longest).
    pub taken: u64,
    /// Connections closed after --idle-timeout without a byte.
    pub idle_closed: u64,
    /// Connections closed at a pause after --max-connection-age.
    pub aged_closed: u64,
    /// Per instance.
    pub instances: BTreeMap<String, InstanceCounts>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Serving,
    Draining,
    Stopped,
}

/// Where the connections of one front endpoint go.
struct Route {
    /// `tcp` or `socket`, in logs.
    kind: &'static str,
    dir: PathBuf,
    suffix: String,
    /// The newest instance known to accept connections (by [`track_newest`]); `None` before the first look,
    /// or when none accepts.
    newest: watch::Sender<Option<String>>,
    /// TLS terminated before forwarding (the TCP route, when configured).
    tls: Option<Arc<FrontTls>>,
    /// The places of its connections.
    slots: Arc<Slots>,
}

/// The TLS side of the TCP route: the configuration in use, swapped by the reload task.
struct FrontTls {
    config: RwLock<Arc<rustls::ServerConfig>>,
    handshake_timeout: Duration,
    /// When a handshake failure was last logged at `info` (the others go to `debug`).
    noted: Mutex<Option<Instant>>,
}

/// At most one handshake failure per this interval is logged at `info`; every one is at `debug` and counted.
const TLS_FAILURE_NOTE_EVERY: Duration = Duration::from_secs(10);

impl FrontTls {
    fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(
            self.config
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        )
    }

    fn set(&self, config: Arc<rustls::ServerConfig>) {
        *self.config.write().unwrap_or_else(|e| e.into_inner()) = config;
    }

    /// Whether this failure is the one logged at `info` in its interval.
    fn note(&self) -> bool {
        let mut noted = self.noted.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if noted.is_some_and(|at| now.duration_since(at) < TLS_FAILURE_NOTE_EVERY) {
            return false;
        }
        *noted = Some(now);
        true
    }
}

struct Shared {
    stats: Mutex<Stats>,
    phase: watch::Sender<Phase>,
    idle_timeout: Duration,
    max_age: Duration,
    /// When a refusal at accept was last logged at `info`.
    refusal_noted: Mutex<Option<Instant>>,
    wait: Duration,
    retry_interval: Duration,
    connect_timeout: Duration,
}

impl Shared {
    fn count(&self, f: impl FnOnce(&mut Stats)) {
        // A poisoned lock only means a panic elsewhere while counting: the counters stay usable.
        let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut stats);
    }

    fn instance(&self, name: &str, f: impl FnOnce(&mut InstanceCounts)) {
        self.count(|s| f(s.instances.entry(name.to_string()).or_default()));
    }
}

/// The stable socket as this process created it: removed on exit only if the path still is this socket.
struct OwnedSocket {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl OwnedSocket {
    fn release(&self) {
        match std::fs::symlink_metadata(&self.path) {
            Ok(m) if m.dev() == self.dev && m.ino() == self.ino => {
                match std::fs::remove_file(&self.path) {
                    Ok(()) => info!(socket = %self.path.display(), "stable socket removed"),
                    Err(e) => {
                        warn!(socket = %self.path.display(), error = %e, "cannot remove the stable socket")
                    }
                }
            }
            Ok(_) => info!(
                socket = %self.path.display(),
                "the stable socket now belongs to another process (a newer front took over); left in place"
            ),
            Err(_) => {}
        }
    }
}

/// A running front; [`Running::shutdown`] drains it.
pub struct Running {
    tcp: Vec<SocketAddr>,
    socket: Option<PathBuf>,
    owned: Option<OwnedSocket>,
    shared: Arc<Shared>,
    accept_tasks: Vec<JoinHandle<()>>,
    stats_task: Option<JoinHandle<()>>,
    trackers: Vec<JoinHandle<()>>,
    tls_task: Option<JoinHandle<()>>,
    routes: Vec<Arc<Route>>,
    bounds: FrontBounds,
    drain_timeout: Duration,
}

/// How a drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drained {
    /// Connections still open at the end of --drain-timeout, closed by the front.
    pub cut: u32,
}

impl Running {
    /// The bound TCP addresses (the real port when --listen asked for port 0).
    pub fn tcp_addrs(&self) -> &[SocketAddr] {
        &self.tcp
    }

    /// The stable socket, when served.
    pub fn socket(&self) -> Option<&Path> {
        self.socket.as_deref()
    }

    /// The bounds in force.
    pub fn bounds(&self) -> FrontBounds {
        self.bounds
    }

    /// Connections open now, all endpoints.
    pub fn open(&self) -> usize {
        self.routes.iter().map(|r| r.slots.open()).sum()
    }

    async fn emptied(&self) {
        for route in &self.routes {
            route.slots.emptied().await;
        }
    }

    /// The counters so far.
    pub fn stats(&self) -> Stats {
        self.shared
            .stats
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Stops accepting (the TCP listeners close, the stable socket is removed if still ours), lets open
    /// connections finish for up to --drain-timeout, then closes the rest.
    pub async fn shutdown(mut self) -> Drained {
        self.shared.phase.send_replace(Phase::Draining);
        for task in self.accept_tasks.drain(..) {
            let _ = task.await;
        }
        if let Some(owned) = self.owned.take() {
            owned.release();
        }
        info!(
            open = self.open(),
            drain_timeout = ?self.drain_timeout,
            "stopped accepting; draining open connections"
        );
        let cut = match tokio::time::timeout(self.drain_timeout, self.emptied()).await {
            Ok(()) => 0,
            Err(_) => {
                let cut = self.open();
                warn!(cut, "drain timeout: closing the connections still open");
                cut as u32
            }
        };
        self.shared.phase.send_replace(Phase::Stopped);
        if let Some(task) = self.stats_task.take() {
            task.abort();
        }
        for task in self.trackers.drain(..) {
            task.abort();
        }
        if let Some(task) = self.tls_task.take() {
            task.abort();
        }
        // The connections cut above end at their next poll; give them that moment before the runtime goes.
        if cut > 0 {
            let _ = tokio::time::timeout(Duration::from_secs(1), self.emptied()).await;
        }
        let stats = self.stats();
        info!(?stats, "node-proxy stopped");
        Drained { cut }
    }
}

/// Starts the front: binds every endpoint first (an error names the one that failed), then serves.
pub async fn start(flags: NodeProxyFlags) -> Result<Running, NodeProxyError> {
    check(&flags)?;
    let serves_tcp = !flags.no_tcp && !flags.listen_addrs().is_empty();
    let bounds = FrontBounds::derive(
        flags.memory_budget,
        serves_tcp.then_some((flags.tls_files().is_some(), flags.max_tcp_connections)),
        (!flags.no_socket).then_some(flags.max_socket_connections),
        flags.max_connections_per_peer,
    )
    .map_err(NodeProxyError::Flags)?;
    // The certificate first: a front that cannot serve TLS must not take the port.
    let tls_start = match flags.tls_files() {
        Some(files) => {
            let (reloader, loaded) = Reloader::start(&files.read()?, tls::ALPN_H2)?;
            Some((files, reloader, loaded))
        }
        None => None,
    };
    let mut tcp_listeners = Vec::new();
    if !flags.no_tcp {
        for addr in flags.listen_addrs() {
            tcp_listeners.push(bind_tcp(addr, flags.listen.is_none()).await?);
        }
    }
    let tcp: Vec<SocketAddr> = tcp_listeners
        .iter()
        .filter_map(|l| l.local_addr().ok())
        .collect();
    let (unix_listener, owned) = if flags.no_socket {
        (None, None)
    } else {
        let (listener, owned) = bind_stable(&flags.socket, flags.socket_mode, flags.take_over)?;
        (Some(listener), Some(owned))
    };
    if !flags.instances.is_dir() {
        warn!(
            instances = %flags.instances.display(),
            "the instances directory does not exist (yet): connections wait until a PDP instance serves there"
        );
    }
    let (phase, _) = watch::channel(Phase::Serving);
    let shared = Arc::new(Shared {
        stats: Mutex::new(Stats::default()),
        phase,
        idle_timeout: flags.idle_timeout,
        max_age: flags.max_connection_age,
        refusal_noted: Mutex::new(None),
        wait: flags.wait,
        retry_interval: flags.retry_interval,
        connect_timeout: flags.connect_timeout,
    });
    let mut accept_tasks = Vec::new();
    let mut tls_task = None;
    let front_tls = tls_start.map(|(files, reloader, loaded)| {
        info!(
            cert = %files.cert.display(),
            client_ca = ?files.client_ca,
            not_after = loaded.not_after,
            "TLS on the TCP address (ALPN h2)"
        );
        let front_tls = Arc::new(FrontTls {
            config: RwLock::new(loaded.config),
            handshake_timeout: flags.tls_handshake_timeout,
            noted: Mutex::new(None),
        });
        tls_task = Some(tokio::spawn(reload_tls(
            files,
            reloader,
            front_tls.clone(),
            shared.clone(),
            flags.tls_reload_interval,
        )));
        front_tls
    });
    let tcp_route = Arc::new(Route {
        kind: "tcp",
        dir: flags.instances.clone(),
        suffix: flags.tcp_backend.clone(),
        newest: watch::Sender::new(None),
        tls: front_tls,
        slots: Slots::new(bounds.tcp, Some(bounds.per_peer)),
    });
    let mut routes = vec![tcp_route.clone()];
    for listener in tcp_listeners {
        accept_tasks.push(tokio::spawn(accept_loop(
            Listener::Tcp(listener),
            tcp_route.clone(),
            shared.clone(),
        )));
    }
    if let Some(listener) = unix_listener {
        let route = Arc::new(Route {
            kind: "socket",
            dir: flags.instances.clone(),
            suffix: flags.socket_backend.clone(),
            newest: watch::Sender::new(None),
            tls: None,
            slots: Slots::new(bounds.socket, None),
        });
        routes.push(route.clone());
        accept_tasks.push(tokio::spawn(accept_loop(
            Listener::Unix(listener),
            route,
            shared.clone(),
        )));
    }
    let stats_task = (!flags.stats_interval.is_zero())
        .then(|| tokio::spawn(log_stats(shared.clone(), flags.stats_interval)));
    let trackers = if flags.rebalance_interval.is_zero() {
        Vec::new()
    } else {
        routes
            .iter()
            .map(|r| {
                tokio::spawn(track_newest(
                    r.clone(),
                    shared.clone(),
                    flags.rebalance_interval,
                ))
            })
            .collect()
    };
    let socket = owned.as_ref().map(|o| o.path.clone());
    info!(
        tcp = ?tcp,
        tls = tcp_route.tls.is_some(),
        socket = ?socket,
        instances = %flags.instances.display(),
        tcp_backend = %flags.tcp_backend,
        socket_backend = %flags.socket_backend,
        wait = ?flags.wait,
        memory_budget_mib = bounds.budget / (1024 * 1024),
        max_tcp_connections = bounds.tcp,
        max_socket_connections = bounds.socket,
        max_connections_per_peer = bounds.per_peer,
        "node-proxy serving"
    );
    Ok(Running {
        tcp,
        socket,
        owned,
        shared,
        accept_tasks,
        stats_task,
        trackers,
        tls_task,
        routes,
        bounds,
        drain_timeout: flags.drain_timeout,
    })
}

/// Linux errno values of a kernel without IPv6 (booted with ipv6.disable=1): no such address family, or the
/// address cannot be assigned.
const EAFNOSUPPORT: i32 = 97;
const EADDRNOTAVAIL: i32 = 99;

/// Whether binding the default `[::]` failed only because the node has no IPv6.
fn no_ipv6(error: &io::Error) -> bool {
    matches!(error.raw_os_error(), Some(EAFNOSUPPORT | EADDRNOTAVAIL))
}

/// Binds one TCP address; the default `[::]:3593` falls back to `0.0.0.0:3593` on a node without IPv6 (an
/// address the operator wrote is bound as written, or the start fails).
async fn bind_tcp(addr: SocketAddr, is_default: bool) -> Result<TcpListener, NodeProxyError> {
    let error = match TcpListener::bind(addr).await {
        Ok(listener) => return Ok(listener),
        Err(e) => e,
    };
    if is_default && addr.ip() == IpAddr::V6(Ipv6Addr::UNSPECIFIED) && no_ipv6(&error) {
        let v4 = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), addr.port());
        info!(
            %addr,
            error = %error,
            fallback = %v4,
            "this node has no IPv6: listening on IPv4 only"
        );
        return TcpListener::bind(v4)
            .await
            .map_err(|source| NodeProxyError::Tcp { addr: v4, source });
    }
    Err(NodeProxyError::Tcp {
        addr,
        source: error,
    })
}

fn check(flags: &NodeProxyFlags) -> Result<(), NodeProxyError> {
    let serves_tcp = !flags.no_tcp && !flags.listen_addrs().is_empty();
    match (&flags.tls_cert, &flags.tls_key, &flags.tls_client_ca) {
        (Some(_), None, _) => {
            return Err(NodeProxyError::Flags(
                "--tls-cert needs --tls-key (the private key of the certificate)".into(),
            ));
        }
        (None, Some(_), _) => {
            return Err(NodeProxyError::Flags(
                "--tls-key needs --tls-cert (the certificate of the key)".into(),
            ));
        }
        (None, None, Some(_)) => {
            return Err(NodeProxyError::Flags(
                "--tls-client-ca needs --tls-cert and --tls-key: client certificates are checked in the TLS handshake".into(),
            ));
        }
        (Some(_), Some(_), _) if !serves_tcp => {
            return Err(NodeProxyError::Flags(
                "--tls-cert is for the TCP address, and --no-tcp serves none (the stable socket is always plaintext)".into(),
            ));
        }
        _ => {}
    }
    if flags.tls_reload_interval.is_zero() {
        return Err(NodeProxyError::Flags(
            "--tls-reload-interval must be more than 0s".into(),
        ));
    }
    if flags.tls_handshake_timeout.is_zero() {
        return Err(NodeProxyError::Flags(
            "--tls-handshake-timeout must be more than 0s".into(),
        ));
    }
    if !serves_tcp && flags.no_socket {
        return Err(NodeProxyError::Flags(
            "nothing to serve: --no-tcp and --no-socket together".into(),
        ));
    }
    if flags.idle_timeout.is_zero() || flags.max_connection_age.is_zero() {
        return Err(NodeProxyError::Flags(
            "--idle-timeout and --max-connection-age must be more than 0s".into(),
        ));
    }
    if flags.retry_interval.is_zero() {
        return Err(NodeProxyError::Flags(
            "--retry-interval must be more than 0s (a waiting connection would spin)".into(),
        ));
    }
    if flags.connect_timeout.is_zero() {
        return Err(NodeProxyError::Flags(
            "--connect-timeout must be more than 0s".into(),
        ));
    }
    if !flags.no_socket {
        // The front must not find its own socket among the instances: it would forward to itself.
        let file = flags.socket.file_name().and_then(|f| f.to_str());
        let in_instances = flags.socket.parent() == Some(flags.instances.as_path());
        let looks_like_instance = file.is_some_and(|f| {
            route::instance_name(f, &flags.tcp_backend).is_some()
                || route::instance_name(f, &flags.socket_backend).is_some()
        });
        if file.is_none() {
            return Err(NodeProxyError::Flags(format!(
                "--socket {} names no file",
                flags.socket.display()
            )));
        }
        if in_instances && looks_like_instance {
            return Err(NodeProxyError::Flags(format!(
                "--socket {} would be taken for a PDP instance in --instances {}: put it outside, or use another name",
                flags.socket.display(),
                flags.instances.display()
            )));
        }
    }
    Ok(())
}

/// Creates the stable socket without a moment where its path is missing or has the wrong permissions: bound
/// under a temporary name in the same directory, given its mode, then renamed over the path. What already is at
/// the path is replaced only if it is a socket nobody answers on (stale, left by a crash), or with --take-over.
fn bind_stable(
    path: &Path,
    mode: u32,
    take_over: bool,
) -> Result<(UnixListener, OwnedSocket), NodeProxyError> {
    let fail = |reason: String| NodeProxyError::Socket {
        path: path.to_path_buf(),
        reason,
    };
    match std::fs::symlink_metadata(path) {
        Ok(meta) if !meta.file_type().is_socket() => {
            return Err(fail(
                "exists and is not a socket; it is left alone (remove it or choose another --socket)".into(),
            ));
        }
        Ok(_) => match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) if !take_over => {
                return Err(fail(
                    "a process answers on it (another node-proxy?): stop it first, or pass --take-over to replace its socket atomically".into(),
                ));
            }
            Ok(_) => {
                info!(socket = %path.display(), "taking over the stable socket from the process serving it")
            }
            Err(_) => {
                info!(socket = %path.display(), "replacing a stale socket (nothing answers on it)")
            }
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(fail(format!("cannot inspect: {e}"))),
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(fail(format!(
            "its directory {} does not exist",
            dir.display()
        )));
    }
    let file = path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temp = dir.join(format!(".{file}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&temp);
    let listener = UnixListener::bind(&temp).map_err(|e| fail(format!("cannot bind: {e}")))?;
    let placed = std::fs::set_permissions(&temp, std::fs::Permissions::from_mode(mode))
        .and_then(|()| std::fs::rename(&temp, path))
        .and_then(|()| std::fs::symlink_metadata(path));
    match placed {
        Ok(meta) => Ok((
            listener,
            OwnedSocket {
                path: path.to_path_buf(),
                dev: meta.dev(),
                ino: meta.ino(),
            },
        )),
        Err(e) => {
            let _ = std::fs::remove_file(&temp);
            Err(fail(format!("cannot put the socket in place: {e}")))
        }
    }
}

enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

async fn accept_loop(listener: Listener, route: Arc<Route>, shared: Arc<Shared>) {
    let mut phase = shared.phase.subscribe();
    loop {
        let accepted = tokio::select! {
            biased;
            _ = phase.wait_for(|p| *p != Phase::Serving) => break,
            accepted = accept(&listener) => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors and the like: say so, and do not spin.
                warn!(route = route.kind, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // A place for the client, or it is closed now: excess costs an accept, never memory.
        let ip = match &stream {
            Stream::Tcp(tcp) => tcp.peer_addr().ok().map(|a| a.ip()),
            Stream::Unix(_) => None,
        };
        let slot = match route.slots.admit(ip) {
            Ok((slot, took)) => {
                if took {
                    shared.count(|s| s.taken += 1);
                }
                slot
            }
            Err(refused) => {
                refuse(&route, &shared, refused, &peer);
                continue;
            }
        };
        shared.count(|s| s.accepted += 1);
        match stream {
            Stream::Tcp(stream) => {
                // The front relays small request/response messages: no Nagle delay on top of the PDP's.
                let _ = stream.set_nodelay(true);
                match &route.tls {
                    Some(tls) => tokio::spawn(serve_tls(
                        stream,
                        peer,
                        tls.clone(),
                        route.clone(),
                        shared.clone(),
                        slot,
                    )),
                    None => tokio::spawn(serve(stream, peer, route.clone(), shared.clone(), slot)),
                };
            }
            Stream::Unix(stream) => {
                tokio::spawn(serve(stream, peer, route.clone(), shared.clone(), slot));
            }
        }
    }
    debug!(route = route.kind, "listener closed");
}

/// At most one refusal per this interval is logged at `info`; every one is counted.
const REFUSAL_NOTE_EVERY: Duration = Duration::from_secs(10);

/// Counts (and now and then logs) a connection closed at accept.
fn refuse(route: &Route, shared: &Shared, refused: Refused, peer: &str) {
    let why = match refused {
        Refused::Peer => {
            shared.count(|s| s.refused_peer += 1);
            "its address holds --max-connections-per-peer connections already"
        }
        Refused::Full => {
            shared.count(|s| s.refused_full += 1);
            "the endpoint is at its connection bound and every connection is in an exchange"
        }
    };
    let mut noted = shared
        .refusal_noted
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let now = Instant::now();
    if noted.is_none_or(|at| now.duration_since(at) >= REFUSAL_NOTE_EVERY) {
        *noted = Some(now);
        info!(
            route = route.kind,
            peer,
            reason = why,
            "connection closed at accept (further ones in the next 10 s are only counted: refused_peer, refused_full)"
        );
    } else {
        debug!(
            route = route.kind,
            peer,
            reason = why,
            "connection closed at accept"
        );
    }
}

enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

async fn accept(listener: &Listener) -> io::Result<(Stream, String)> {
    match listener {
        Listener::Tcp(l) => {
            let (s, peer) = l.accept().await?;
            Ok((Stream::Tcp(s), peer.to_string()))
        }
        Listener::Unix(l) => {
            let (s, _) = l.accept().await?;
            let peer = s
                .peer_cred()
                .ok()
                .and_then(|c| c.pid())
                .map_or_else(|| "unix".to_string(), |pid| format!("unix pid {pid}"));
            Ok((Stream::Unix(s), peer))
        }
    }
}

/// One TCP client connection on the TLS port: the handshake (bounded, holding the connection's place), then
/// [`serve`] on the decrypted stream. A failed handshake forwards nothing.
async fn serve_tls(
    client: TcpStream,
    peer: String,
    tls: Arc<FrontTls>,
    route: Arc<Route>,
    shared: Arc<Shared>,
    slot: Slot,
) {
    let mut phase = shared.phase.subscribe();
    let handshake = tokio::time::timeout(tls.handshake_timeout, tls.acceptor().accept(client));
    let done = tokio::select! {
        done = handshake => done,
        _ = phase.wait_for(|p| *p == Phase::Stopped) => {
            shared.count(|s| s.cut_at_drain += 1);
            return;
        }
        _ = slot.conn.taken() => return,
    };
    let failure = match done {
        Ok(Ok(stream)) => return serve(stream, peer, route, shared, slot).await,
        Ok(Err(e)) => handshake_failure(&e),
        Err(_) => format!(
            "no complete handshake within --tls-handshake-timeout ({:?})",
            tls.handshake_timeout
        ),
    };
    shared.count(|s| s.tls_failed += 1);
    if tls.note() {
        info!(
            route = route.kind,
            peer,
            reason = failure,
            "TLS handshake failed: connection closed (further failures in the next 10 s at debug; all counted in tls_failed)"
        );
    } else {
        debug!(
            route = route.kind,
            peer,
            reason = failure,
            "TLS handshake failed: connection closed"
        );
    }
}

/// Why a handshake failed, in the words an operator needs.
fn handshake_failure(error: &io::Error) -> String {
    let Some(tls) = error
        .get_ref()
        .and_then(|e| e.downcast_ref::<rustls::Error>())
    else {
        return match error.kind() {
            io::ErrorKind::UnexpectedEof => {
                "the client closed the connection during the handshake".into()
            }
            _ => error.to_string(),
        };
    };
    match tls {
        rustls::Error::NoApplicationProtocol => {
            "the client offers no h2 in ALPN (an HTTP/1.1-only client?): this port speaks gRPC over HTTP/2 only".into()
        }
        rustls::Error::NoCertificatesPresented => {
            "the client presented no certificate, and --tls-client-ca requires one".into()
        }
        rustls::Error::InvalidCertificate(why) => {
            format!("the client's certificate is refused: {why:?} (--tls-client-ca)")
        }
        rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => {
            format!("not a TLS client hello (a plaintext client on the TLS port?): {tls}")
        }
        rustls::Error::AlertReceived(alert) => {
            format!("the client aborted the handshake ({alert:?}; does it trust the front's certificate?)")
        }
        other => other.to_string(),
    }
}

/// Reads the TLS files every `every` and puts a changed, valid set in use for the next handshakes; a broken
/// set is logged once and the last good configuration stays. Never panics: the front keeps serving.
async fn reload_tls(
    files: TlsFiles,
    mut reloader: Reloader,
    tls: Arc<FrontTls>,
    shared: Arc<Shared>,
    every: Duration,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        match reloader.offer(files.read()) {
            Reload::Unchanged => {}
            Reload::Loaded(loaded) => {
                tls.set(loaded.config);
                shared.count(|s| s.tls_reloaded += 1);
                info!(
                    cert = %files.cert.display(),
                    not_after = loaded.not_after,
                    "TLS certificate reloaded: new handshakes use it"
                );
            }
            Reload::Failed(e) => {
                shared.count(|s| s.tls_reload_failed += 1);
                warn!(error = %e, "new TLS files cannot be used; keeping the current certificate");
            }
        }
    }
}

/// One client connection: find an instance (waiting if none is ready), then copy bytes both ways until
/// either side closes, or the drain ends.
async fn serve<S>(client: S, peer: String, route: Arc<Route>, shared: Arc<Shared>, slot: Slot)
where
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
    let copied = tokio::select! {
        (up, down) = async { tokio::join!(up, down) } => up.and_then(|up| down.map(|down| (up, down))),
        _ = slot.conn.taken() => {
            debug!(route = route.kind, peer, instance = name, "closed: a new connection took its place at the bound");
            return;
        }
        ended = idle_or_aged(activity, shared.idle_timeout, shared.max_age) => {
            match ended {
                Ended::Idle => shared.count(|s| s.idle_closed += 1),
                Ended::Aged => shared.count(|s| s.aged_closed += 1),
            }
            debug!(route = route.kind, peer, instance = name, ?ended, "closed: idle or old");
            return;
        }
        _ = until_moved(&name, newest, activity) => {
            shared.instance(&name, |c| c.moved += 1);
            debug!(route = route.kind, peer, instance = name, "moved: closed between two exchanges, a newer instance serves");
            return;
        }
        _ = phase.wait_for(|p| *p == Phase::Stopped) => {
            shared.count(|s| s.cut_at_drain += 1);
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
async fn pipe<R, W>(mut from: R, mut to: W) -> io::Result<u64>
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
enum Ended {
    /// No byte either way for --idle-timeout.
    Idle,
    /// Older than --max-connection-age, at a pause between two exchanges.
    Aged,
}

/// Resolves when the connection has been quiet for `idle`, or is older than `max_age` and between two exchanges.
async fn idle_or_aged(activity: &Activity, idle: Duration, max_age: Duration) -> Ended {
    loop {
        let quiet = activity.quiet();
        if quiet >= idle {
            return Ended::Idle;
        }
        let age = activity.age();
        let nap = if age >= max_age {
            match activity.quiet_after_answer() {
                Some(q) if q >= MOVE_QUIET => return Ended::Aged,
                _ => MOVE_QUIET,
            }
        } else {
            (idle - quiet).min(max_age - age)
        };
        tokio::time::sleep(nap).await;
    }
}

/// A reader that records in [`Activity`] when it returned bytes.
struct Tracked<'a, R> {
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
const MOVE_QUIET: Duration = crate::node::slots::QUIET;

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
async fn until_moved(name: &str, mut newest: watch::Receiver<Option<String>>, activity: &Activity) {
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
                Some(quiet) if quiet >= MOVE_QUIET => return,
                Some(quiet) => tokio::time::sleep(MOVE_QUIET - quiet).await,
                None => tokio::time::sleep(MOVE_QUIET).await,
            }
            if !elsewhere(&newest.borrow()) {
                break;
            }
        }
    }
}

/// Keeps `route.newest` current: every `every`, the newest instance socket that accepts a connection. Probes
/// only a candidate newer than the current one, so a steady node costs one directory read per tick and no
/// connection; a stale socket (left by a crash) is probed and passed over.
async fn track_newest(route: Arc<Route>, shared: Arc<Shared>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let mut found = candidates(&route);
        route::newest_first(&mut found);
        let current = route.newest.borrow().clone();
        let mut chosen = None;
        for candidate in found {
            if current.as_deref() == Some(candidate.name.as_str()) {
                chosen = current.clone();
                break;
            }
            let path = route
                .dir
                .join(format!("{}{}", candidate.name, route.suffix));
            if let Ok(Ok(_probe)) =
                tokio::time::timeout(shared.connect_timeout, UnixStream::connect(&path)).await
            {
                chosen = Some(candidate.name);
                break;
            }
        }
        if chosen != current {
            info!(route = route.kind, from = ?current, to = ?chosen, "newest PDP instance");
            route.newest.send_replace(chosen);
        }
    }
}

/// The instance sockets of a route, as found now.
fn candidates(route: &Route) -> Vec<Candidate> {
    let entries = match std::fs::read_dir(&route.dir) {
        Ok(entries) => entries,
        Err(e) => {
            debug!(instances = %route.dir.display(), error = %e, "cannot read the instances directory");
            return Vec::new();
        }
    };
    entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let file_name = entry.file_name();
            let name = route::instance_name(file_name.to_str()?, &route.suffix)?;
            // Follows a symbolic link, so an instance may also be published as a link to its socket.
            let meta = std::fs::metadata(entry.path()).ok()?;
            if !meta.file_type().is_socket() {
                return None;
            }
            Some(Candidate {
                name: name.to_string(),
                bound_at: meta.modified().ok()?,
            })
        })
        .collect()
}

/// A connection to the newest instance that accepts one; `None` when none does now.
async fn connect_newest(route: &Route, shared: &Shared) -> Option<(String, UnixStream)> {
    let mut found = candidates(route);
    route::newest_first(&mut found);
    for candidate in found {
        let path = route
            .dir
            .join(format!("{}{}", candidate.name, route.suffix));
        match tokio::time::timeout(shared.connect_timeout, UnixStream::connect(&path)).await {
            Ok(Ok(stream)) => return Some((candidate.name, stream)),
            Ok(Err(e)) => {
                shared.instance(&candidate.name, |c| c.skipped += 1);
                debug!(route = route.kind, instance = candidate.name, error = %e, "instance skipped");
            }
            Err(_) => {
                shared.instance(&candidate.name, |c| c.skipped += 1);
                warn!(
                    route = route.kind,
                    instance = candidate.name,
                    timeout = ?shared.connect_timeout,
                    "instance skipped: it did not accept in time"
                );
            }
        }
    }
    None
}

async fn log_stats(shared: Arc<Shared>, every: Duration) {
    let mut last = Stats::default();
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    loop {
        tick.tick().await;
        let now = shared
            .stats
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if now != last {
            info!(
                accepted = now.accepted,
                waited = now.waited,
                gave_up = now.gave_up,
                tls_failed = now.tls_failed,
                tls_reloaded = now.tls_reloaded,
                tls_reload_failed = now.tls_reload_failed,
                instances = ?now.instances,
                "node-proxy counters"
            );
            last = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_kernel_without_ipv6_makes_the_default_fall_back() {
        assert!(no_ipv6(&io::Error::from_raw_os_error(EAFNOSUPPORT)));
        assert!(no_ipv6(&io::Error::from_raw_os_error(EADDRNOTAVAIL)));
        // In use, or not allowed: an error to report, not a reason to serve IPv4 only.
        assert!(!no_ipv6(&io::Error::from_raw_os_error(98))); // EADDRINUSE
        assert!(!no_ipv6(&io::Error::from_raw_os_error(13))); // EACCES
        assert!(!no_ipv6(&io::Error::other("x")));
    }
}
