//! The flags of `node-proxy` and their checks.

use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use pdp_core::duration::duration_flag;
use pdp_core::route;
use pdp_tls::identity::SpiffeIdPattern;
use pdp_tls::{TlsError, TlsFiles};

/// The flags of `node-proxy`, with their defaults and environment variables (the binary flattens this).
#[derive(Debug, Clone, clap::Args)]
pub struct NodeProxyFlags {
    // The default [::]:3593 serves both IP families where net.ipv6.bindv6only is 0, with 0.0.0.0:3593 on a node
    // without IPv6; given addresses have no fallback (docs/deployment-models.md).
    /// TCP addresses of the node's PDP port, bound exactly as written (default [::]:3593; repeatable or comma-separated).
    #[arg(long, env = "PDP_NODE_PROXY_LISTEN", value_delimiter = ',')]
    pub listen: Option<Vec<SocketAddr>>,
    /// Port of the default TCP address [::]:PORT when --listen is not given, such as flagd's 8013.
    #[arg(long, env = "PDP_NODE_PROXY_PORT", default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// Serve no TCP address (socket only).
    #[arg(long, env = "PDP_NODE_PROXY_NO_TCP")]
    pub no_tcp: bool,
    /// TCP port of the PDP's HTTP API on the node (Cerbos 3592), served at [::]:PORT and forwarded to the instances' --socket-backend (unset: no HTTP port).
    #[arg(long, env = "PDP_NODE_PROXY_HTTP_PORT", conflicts_with = "http_listen")]
    pub http_port: Option<u16>,
    /// TCP addresses of the HTTP port instead of [::]:--http-port, bound exactly as written; repeatable or comma-separated.
    #[arg(long, env = "PDP_NODE_PROXY_HTTP_LISTEN", value_delimiter = ',')]
    pub http_listen: Option<Vec<SocketAddr>>,
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
    // connect(2) needs write permission and app containers run as any user: the default lets every local user
    // connect, like the shipped PDP config (udsFileMode 0o777).
    /// Permission bits of the stable socket, in octal.
    #[arg(long, env = "PDP_NODE_PROXY_SOCKET_MODE", default_value = "666", value_parser = route::mode_flag)]
    pub socket_mode: u32,
    /// Replace the socket of a process already answering on --socket atomically instead of refusing to start (the front's own upgrade).
    #[arg(long, env = "PDP_NODE_PROXY_TAKE_OVER")]
    pub take_over: bool,
    /// Directory of the per-instance sockets, <instance><suffix>, one set per PDP Pod.
    #[arg(
        long,
        env = "PDP_NODE_PROXY_INSTANCES",
        default_value = "/var/run/cerbos/instances"
    )]
    pub instances: PathBuf,
    // The directory must be owned by it and writable by it alone, each socket owned by it and not world-writable,
    // and the serving process must run as it (SO_PEERCRED); anything else is refused, logged and counted.
    /// The user (uid) whose instance sockets get connections (default: the owner of --instances).
    #[arg(long, env = "PDP_NODE_PROXY_INSTANCE_OWNER")]
    pub instance_owner: Option<u32>,
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
    /// The memory the front may use, a Kubernetes quantity from which its connection bounds derive (about 75% of
    /// the container's limit; docs/deployment-models.md, "Bounds").
    #[arg(long, env = "PDP_NODE_PROXY_MEMORY_BUDGET", default_value = "48Mi",
          value_parser = pdp_core::size::parse_size)]
    pub memory_budget: u64,
    // At the bound, a new connection takes the place of the one quiet the longest, or is closed at accept when
    // every one is busy.
    /// TCP client connections served at once (default: derived from --memory-budget).
    #[arg(long, env = "PDP_NODE_PROXY_MAX_TCP_CONNECTIONS",
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_tcp_connections: Option<u32>,
    /// Stable-socket client connections served at once (default: derived from --memory-budget).
    #[arg(long, env = "PDP_NODE_PROXY_MAX_SOCKET_CONNECTIONS",
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_socket_connections: Option<u32>,
    /// Connections one client (a TCP address; on the socket its Pod, or its user) may hold at once; more are closed at accept.
    #[arg(long, env = "PDP_NODE_PROXY_MAX_CONNECTIONS_PER_PEER", default_value_t = 128,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_connections_per_peer: u32,
    // Far above the ping interval of gRPC keep-alive clients (servers refuse pings more often than every 5
    // minutes by default): only clients that hold a connection and never use it lose it.
    /// How long a connection that carries no byte either way stays open.
    #[arg(long, env = "PDP_NODE_PROXY_IDLE_TIMEOUT", default_value = "15m", value_parser = duration_flag)]
    pub idle_timeout: Duration,
    // Told as a moved connection is: a GOAWAY to a gRPC client (a gRPC server's MaxConnectionAge), `Connection:
    // close` in an HTTP/1.1 answer; no client holds a place for ever.
    /// The age at which a connection is told to go, and its client reconnects.
    #[arg(long, env = "PDP_NODE_PROXY_MAX_CONNECTION_AGE", default_value = "1h", value_parser = duration_flag)]
    pub max_connection_age: Duration,
    /// How often the front looks for a newer PDP instance and moves connections to it; 0s never moves one
    /// (docs/deployment-models.md, "Moving connections").
    #[arg(long, env = "PDP_NODE_PROXY_REBALANCE_INTERVAL", default_value = "250ms", value_parser = duration_flag)]
    pub rebalance_interval: Duration,
    /// How often the counters are logged, when they changed; 0s never.
    #[arg(long, env = "PDP_NODE_PROXY_STATS_INTERVAL", default_value = "60s", value_parser = duration_flag)]
    pub stats_interval: Duration,
    /// Serving certificate chain (PEM) with which TCP clients speak TLS to the front (the stable socket stays plaintext).
    #[arg(long, env = "PDP_NODE_PROXY_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert.
    #[arg(long, env = "PDP_NODE_PROXY_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// CA (PEM) that every TCP client's certificate must chain to, or its handshake fails (needs --tls-cert).
    #[arg(long, env = "PDP_NODE_PROXY_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// SPIFFE IDs (URI SANs) of which a client certificate must name one, `*` standing for one path segment, as in
    /// spiffe://cluster.local/ns/shop/sa/* (repeatable or comma-separated; needs --tls-client-ca).
    #[arg(long = "tls-client-id", env = "PDP_NODE_PROXY_TLS_CLIENT_ID", value_name = "PATTERN",
          value_delimiter = ',', requires = "tls_client_ca", value_parser = SpiffeIdPattern::parse)]
    pub tls_client_ids: Vec<SpiffeIdPattern>,
    /// How often the TLS files are read again, a broken new file keeping the last good one.
    #[arg(long, env = "PDP_NODE_PROXY_TLS_RELOAD_INTERVAL", default_value = "10s", value_parser = duration_flag)]
    pub tls_reload_interval: Duration,
    /// Bound on a TLS handshake: a client that has not finished it by then is closed (and gives back its place).
    #[arg(long, env = "PDP_NODE_PROXY_TLS_HANDSHAKE_TIMEOUT", default_value = "10s", value_parser = duration_flag)]
    pub tls_handshake_timeout: Duration,
    /// `host:port` that gRPC-port connections go to, plaintext, while no PDP instance on the node is ready (the central Service); they move back when one is.
    #[arg(long, env = "PDP_NODE_PROXY_FALLBACK", value_parser = fallback_flag)]
    pub fallback: Option<String>,
    /// `host:port` that HTTP-port and stable-socket connections go to while no instance is ready (the central Service's HTTP port, which serves gRPC too).
    #[arg(long, env = "PDP_NODE_PROXY_FALLBACK_HTTP", value_parser = fallback_flag)]
    pub fallback_http: Option<String>,
}

/// A fallback address: `host:port`, with a port.
fn fallback_flag(text: &str) -> Result<String, String> {
    match text.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p != 0) => {
            Ok(text.to_string())
        }
        _ => Err(format!("{text:?} is not host:port")),
    }
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

    /// The TCP addresses of the HTTP port: --http-listen, or the default `[::]:<--http-port>`; none without either.
    pub fn http_addrs(&self) -> Vec<SocketAddr> {
        match (&self.http_listen, self.http_port) {
            (Some(addrs), _) => addrs.clone(),
            (None, Some(port)) => vec![SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port)],
            (None, None) => Vec::new(),
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

pub(super) fn check(flags: &NodeProxyFlags) -> Result<(), NodeProxyError> {
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
    if flags.no_tcp && !flags.http_addrs().is_empty() {
        return Err(NodeProxyError::Flags(
            "--http-port and --http-listen are TCP addresses, and --no-tcp serves none".into(),
        ));
    }
    let http = flags.http_addrs();
    // Same port on overlapping addresses (the unspecified one overlaps every address): the second bind fails.
    // Port 0 asks the kernel for a free one each time, so never collides.
    let overlap = |a: &SocketAddr, b: &SocketAddr| {
        a.port() != 0
            && a.port() == b.port()
            && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
    };
    let grpc = if serves_tcp {
        flags.listen_addrs()
    } else {
        Vec::new()
    };
    if let Some(addr) = http.iter().find(|a| grpc.iter().any(|t| overlap(a, t))) {
        return Err(NodeProxyError::Flags(format!(
            "the HTTP port {} is also the gRPC port (--listen/--port): give the HTTP API its own port (Cerbos 3592)",
            addr.port()
        )));
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
