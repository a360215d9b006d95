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
//! The files: [`flags`] (the command line and its checks), [`listen`] (binding the endpoints, accepting, the
//! stable socket), [`instances`] (finding the PDP instances), [`forward`] (one connection, both ways, and when it
//! moves), [`graceful`] (telling a client to go without failing a call: HTTP/2 GOAWAY, HTTP/1.1
//! `Connection: close`), [`front_tls`] (TLS on the TCP path), [`stats`] (the counters).

mod flags;
mod forward;
mod front_tls;
mod graceful;
mod instances;
mod listen;
mod stats;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::proxy::flags::check;
use crate::proxy::front_tls::{FrontTls, reload_tls};
use crate::proxy::instances::track_newest;
use crate::proxy::listen::{Listener, OwnedSocket, accept_loop, bind_stable, bind_tcp};
use crate::proxy::stats::{Shared, log_stats};
use crate::slots::{FrontBounds, Slots};
use pdp_tls::{self as tls, Reloader};

pub use flags::{DEFAULT_PORT, NodeProxyError, NodeProxyFlags};
pub use stats::{InstanceCounts, Stats};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Serving,
    Draining,
    Stopped,
}

/// The `kind` of the HTTP port's route.
const HTTP_ROUTE: &str = "http";

/// Where the connections of one front endpoint go.
struct Route {
    /// `tcp` (the gRPC port), `http` (the HTTP port) or `socket`, in logs.
    kind: &'static str,
    dir: PathBuf,
    suffix: String,
    /// The newest instance known to accept connections (by [`track_newest`]); `None` before the first look,
    /// or when none accepts.
    newest: watch::Sender<Option<String>>,
    /// TLS terminated before forwarding (the TCP routes, when configured).
    tls: Option<Arc<FrontTls>>,
    /// `host:port` its connections go to while no instance is ready (`--fallback`, `--fallback-http`).
    fallback: Option<String>,
    /// The places of its connections (both TCP ports share one bound: they share the memory budget and the
    /// per-peer bound).
    slots: Arc<Slots>,
}

/// A running front; [`Running::shutdown`] drains it.
pub struct Running {
    tcp: Vec<SocketAddr>,
    http: Vec<SocketAddr>,
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

    /// The bound addresses of the HTTP port (none when it is not served).
    pub fn http_addrs(&self) -> &[SocketAddr] {
        &self.http
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
        self.slots().map(|s| s.open()).sum()
    }

    async fn emptied(&self) {
        for slots in self.slots() {
            slots.emptied().await;
        }
    }

    /// Each bound once (the two TCP ports share theirs).
    fn slots(&self) -> impl Iterator<Item = &Arc<Slots>> {
        self.routes.iter().enumerate().filter_map(|(i, r)| {
            let first = !self.routes[..i]
                .iter()
                .any(|o| Arc::ptr_eq(&o.slots, &r.slots));
            first.then_some(&r.slots)
        })
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
            let (reloader, loaded) =
                Reloader::start_for(&files.read()?, tls::ALPN_H2, flags.tls_client_ids.clone())?;
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
    let mut http_listeners = Vec::new();
    for addr in flags.http_addrs() {
        http_listeners.push(bind_tcp(addr, flags.http_listen.is_none()).await?);
    }
    let bound = |ls: &[tokio::net::TcpListener]| -> Vec<SocketAddr> {
        ls.iter().filter_map(|l| l.local_addr().ok()).collect()
    };
    let (tcp, http) = (bound(&tcp_listeners), bound(&http_listeners));
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
        instance_owner: flags.instance_owner,
        refused: Mutex::new(Default::default()),
    });
    let mut accept_tasks = Vec::new();
    let mut tls_task = None;
    let (grpc_tls, http_tls) = match tls_start {
        Some((files, reloader, loaded)) => {
            info!(
                cert = %files.cert.display(),
                client_ca = ?files.client_ca,
                client_ids = ?flags.tls_client_ids.iter().map(ToString::to_string).collect::<Vec<_>>(),
                not_after = loaded.not_after,
                "TLS on the TCP addresses (ALPN h2 on the gRPC port, h2 and http/1.1 on the HTTP port)"
            );
            let side = |alpn| {
                Arc::new(FrontTls::new(
                    &loaded.config,
                    alpn,
                    flags.tls_handshake_timeout,
                ))
            };
            let (grpc, http) = (side(tls::ALPN_H2), side(tls::ALPN_HTTP));
            tls_task = Some(tokio::spawn(reload_tls(
                files,
                reloader,
                vec![grpc.clone(), http.clone()],
                shared.clone(),
                flags.tls_reload_interval,
            )));
            (Some(grpc), Some(http))
        }
        None => (None, None),
    };
    let tcp_slots = Slots::new(bounds.tcp, Some(bounds.per_peer));
    let tcp_route = Arc::new(Route {
        kind: "tcp",
        dir: flags.instances.clone(),
        suffix: flags.tcp_backend.clone(),
        newest: watch::Sender::new(None),
        tls: grpc_tls,
        fallback: flags.fallback.clone(),
        slots: tcp_slots.clone(),
    });
    let mut routes = vec![tcp_route.clone()];
    for listener in tcp_listeners {
        accept_tasks.push(tokio::spawn(accept_loop(
            Listener::Tcp(listener),
            tcp_route.clone(),
            shared.clone(),
        )));
    }
    if !http_listeners.is_empty() {
        let route = Arc::new(Route {
            kind: HTTP_ROUTE,
            dir: flags.instances.clone(),
            suffix: flags.socket_backend.clone(),
            newest: watch::Sender::new(None),
            tls: http_tls,
            fallback: flags.fallback_http.clone(),
            slots: tcp_slots,
        });
        routes.push(route.clone());
        for listener in http_listeners {
            accept_tasks.push(tokio::spawn(accept_loop(
                Listener::Tcp(listener),
                route.clone(),
                shared.clone(),
            )));
        }
    }
    if let Some(listener) = unix_listener {
        let route = Arc::new(Route {
            kind: "socket",
            dir: flags.instances.clone(),
            suffix: flags.socket_backend.clone(),
            newest: watch::Sender::new(None),
            tls: None,
            fallback: flags.fallback_http.clone(),
            slots: Slots::new(bounds.socket, Some(bounds.per_peer)),
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
        http = ?http,
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
        http,
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
