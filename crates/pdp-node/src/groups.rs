//! Several listener pairs in one front process (`node-proxy --group ...`): one front per node for every
//! node-local PDP, each PDP endpoint with its own ports, stable socket and instance sockets. flagd has two
//! endpoints (evaluation and sync, each a port and a socket); Cerbos one (its gRPC port and its HTTP socket).
//!
//! A group is the existing listener pair of [`super::proxy`] (TCP addresses to one instance-socket suffix, a
//! stable socket to another), started with [`super::proxy::start`] exactly as the front's own flags are: so
//! each group has its own connection bounds (an equal share of the process's `--memory-budget`, see
//! [`start_all`]), drain and counters, and what differs between
//! groups is only where they listen and where they forward. The rest (waits, timeouts, drain, rebalancing,
//! stats) is the process's flags; TLS stays with the front's own TCP addresses (a group's TCP path is
//! plaintext, said at the start of each group that has one).
//!
//! A group is a YAML mapping of what it serves: `port` for TCP on `[::]:PORT` (falling back to `0.0.0.0:PORT`
//! on a node without IPv6, as the front's default address does) or `listen` (a list of addresses, bound as
//! written), `socket` for a stable socket (`socketMode` its bits), `instances`, and the instance-socket suffixes
//! (`tcpBackend`, `socketBackend`, or `backend` for both): flagd's sync endpoint is [`GROUP_EXAMPLE`].

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::proxy::{self, NodeProxyError, NodeProxyFlags, Running};
use pdp_core::route;

/// One more listener pair, as a `--group` mapping gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// The TCP addresses, bound as written (none: see `port`).
    pub listen: Vec<SocketAddr>,
    /// The port of the default address `[::]:PORT`, with its IPv4 fallback (none, and no `listen`: no TCP).
    pub port: Option<u16>,
    /// The stable socket (none: no socket).
    pub socket: Option<PathBuf>,
    /// Permission bits of the stable socket (default: the process's --socket-mode).
    pub socket_mode: Option<u32>,
    /// The directory of this group's instance sockets.
    pub instances: PathBuf,
    /// Suffix of the instance sockets TCP connections go to.
    pub tcp_backend: Option<String>,
    /// Suffix of the instance sockets stable-socket connections go to.
    pub socket_backend: Option<String>,
}

/// A `--group` value: one YAML mapping, e.g. flagd's sync endpoint.
pub const GROUP_EXAMPLE: &str = "{port: 8015, socket: /var/run/flagd/sync.sock, instances: /var/run/flagd-instances, backend: .sync.sock}";

/// What a `--group` mapping holds, before its checks.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct GroupArg {
    #[serde(default)]
    listen: Vec<SocketAddr>,
    port: Option<u16>,
    socket: Option<PathBuf>,
    socket_mode: Option<String>,
    instances: Option<PathBuf>,
    tcp_backend: Option<String>,
    socket_backend: Option<String>,
    backend: Option<String>,
}

/// Parses and checks a `--group` value (see the module docs).
pub fn group_flag(text: &str) -> Result<Group, String> {
    let arg: GroupArg = serde_saphyr::from_str(text)
        .map_err(|e| format!("{e} (a mapping such as {GROUP_EXAMPLE})"))?;
    let GroupArg {
        listen,
        port,
        socket,
        instances,
        ..
    } = arg;
    if port == Some(0) {
        return Err("group port 0: a TCP port, 1 to 65535".into());
    }
    let socket_mode = arg
        .socket_mode
        .as_deref()
        .map(route::mode_flag)
        .transpose()?;
    let suffix = |s: Option<String>| s.as_deref().map(route::suffix_flag).transpose();
    let backend = suffix(arg.backend)?;
    let (tcp_backend, socket_backend) = match (
        suffix(arg.tcp_backend)?,
        suffix(arg.socket_backend)?,
    ) {
        (t, s) if backend.is_some() && (t.is_some() || s.is_some()) => {
            return Err(format!(
                "a group takes backend or tcpBackend/socketBackend, not both (tcpBackend {t:?}, socketBackend {s:?})"
            ));
        }
        (None, None) => (backend.clone(), backend),
        pair => pair,
    };
    let instances = instances.ok_or("a group needs instances: DIR")?;
    if port.is_some() && !listen.is_empty() {
        return Err("a group takes port or listen, not both".into());
    }
    let tcp = port.is_some() || !listen.is_empty();
    if !tcp && socket.is_none() {
        return Err("a group serves nothing: give port (or listen), socket, or both".into());
    }
    if tcp && tcp_backend.is_none() {
        return Err("a group with port or listen needs tcpBackend (or backend)".into());
    }
    if socket.is_some() && socket_backend.is_none() {
        return Err("a group with socket needs socketBackend (or backend)".into());
    }
    Ok(Group {
        listen,
        port,
        socket,
        socket_mode,
        instances,
        tcp_backend,
        socket_backend,
    })
}

impl Group {
    /// The full flags of this group: the process's, with this group's endpoints, and no TLS.
    pub fn flags(&self, process: &NodeProxyFlags) -> NodeProxyFlags {
        let mut flags = process.clone();
        flags.no_tcp = self.listen.is_empty() && self.port.is_none();
        // No --listen: the default address on `port`, with the front's IPv4 fallback.
        flags.listen = self.port.is_none().then(|| self.listen.clone());
        if let Some(port) = self.port {
            flags.port = port;
        }
        flags.no_socket = self.socket.is_none();
        if let Some(socket) = &self.socket {
            flags.socket = socket.clone();
        }
        if let Some(mode) = self.socket_mode {
            flags.socket_mode = mode;
        }
        flags.instances = self.instances.clone();
        if let Some(suffix) = &self.tcp_backend {
            flags.tcp_backend = suffix.clone();
        }
        if let Some(suffix) = &self.socket_backend {
            flags.socket_backend = suffix.clone();
        }
        flags.tls_cert = None;
        flags.tls_key = None;
        flags.tls_client_ca = None;
        // The process's fallback is its default PDP's central Service, never another group's.
        flags.fallback = None;
        flags.fallback_http = None;
        flags
    }
}

/// Starts every listener pair, in order; if one cannot start, those already started are drained and stopped
/// and its error is returned (a front never runs with a part of its endpoints).
///
/// One process has one memory budget: each listener pair gets an equal share of what connections may use
/// (`--memory-budget` less the process's own base), so N groups never hold more than the container's limit.
pub async fn start_all(all: Vec<NodeProxyFlags>) -> Result<Vec<Running>, NodeProxyError> {
    let mut running = Vec::with_capacity(all.len());
    let groups = all.len().max(1) as u64;
    for mut flags in all {
        let base = crate::slots::BASE;
        flags.memory_budget = base + flags.memory_budget.saturating_sub(base) / groups;
        match proxy::start(flags).await {
            Ok(r) => running.push(r),
            Err(e) => {
                shutdown_all(running).await;
                return Err(e);
            }
        }
    }
    Ok(running)
}

/// Drains every listener pair at once (each for up to its --drain-timeout) and waits for all.
pub async fn shutdown_all(running: Vec<Running>) {
    let tasks: Vec<_> = running
        .into_iter()
        .map(|r| tokio::spawn(r.shutdown()))
        .collect();
    for task in tasks {
        let _ = task.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_names_what_it_serves() {
        let g = group_flag(GROUP_EXAMPLE).unwrap();
        assert_eq!(g.port, Some(8015));
        assert_eq!(g.socket, Some(PathBuf::from("/var/run/flagd/sync.sock")));
        assert_eq!(g.tcp_backend.as_deref(), Some(".sync.sock"));
        assert_eq!(g.socket_backend.as_deref(), Some(".sync.sock"));
        let process = NodeProxyFlags::default();
        let flags = g.flags(&process);
        assert!(!flags.no_tcp && !flags.no_socket);
        // The default address on the group's port: the front falls back to IPv4 on a node without IPv6.
        assert_eq!(flags.listen, None);
        assert_eq!(flags.listen_addrs(), vec!["[::]:8015".parse().unwrap()]);
        assert_eq!(flags.instances, PathBuf::from("/var/run/flagd-instances"));
        // Inherited from the process: everything but the endpoints.
        assert_eq!(flags.wait, process.wait);
        assert_eq!(flags.memory_budget, process.memory_budget);
        assert_eq!(flags.socket_mode, process.socket_mode);
    }

    #[test]
    fn a_tcp_only_group_serves_no_socket_and_no_tls() {
        let g = group_flag(
            r#"{listen: ["0.0.0.0:8013", "[::1]:8013"], instances: /i, tcpBackend: .eval.sock}"#,
        )
        .unwrap();
        let process = NodeProxyFlags {
            tls_cert: Some("/tls/tls.crt".into()),
            tls_key: Some("/tls/tls.key".into()),
            ..NodeProxyFlags::default()
        };
        let flags = g.flags(&process);
        assert!(flags.no_socket);
        assert_eq!(
            flags.listen_addrs(),
            vec![
                "0.0.0.0:8013".parse().unwrap(),
                "[::1]:8013".parse().unwrap()
            ]
        );
        assert!(flags.tls_files().is_none());
        let socket_only = group_flag(
            r#"{socket: /s/x.sock, socketMode: "660", instances: /i, socketBackend: .x}"#,
        )
        .unwrap()
        .flags(&process);
        assert!(socket_only.no_tcp && !socket_only.no_socket);
        assert_eq!(socket_only.socket_mode, 0o660);
    }

    #[test]
    fn a_bad_group_is_refused_with_what_to_write() {
        for (text, says) in [
            (r#"{listen: ["[::]:8015"], backend: .s}"#, "needs instances"),
            ("{instances: /i}", "serves nothing"),
            (
                r#"{listen: ["[::]:8015"], instances: /i}"#,
                "needs tcpBackend",
            ),
            ("{port: 8015, instances: /i}", "needs tcpBackend"),
            (
                r#"{port: 8015, listen: ["[::]:8015"], instances: /i, backend: .s}"#,
                "not both",
            ),
            ("{port: 0, instances: /i, backend: .s}", "1 to 65535"),
            (
                "{port: http, instances: /i, backend: .s}",
                "a mapping such as",
            ),
            (
                "{socket: /s, instances: /i, tcpBackend: .t}",
                "needs socketBackend",
            ),
            (
                r#"{listen: ["8015"], instances: /i, backend: .s}"#,
                "a mapping such as",
            ),
            (
                "{instances: /i, instances: /j, socket: /s, backend: .s}",
                "a mapping such as",
            ),
            (
                "{instances: /i, socket: /s, backend: .s, tcpBackend: .t}",
                "not both",
            ),
            (
                "{instances: /i, socket: /s, backend: a/b}",
                "invalid instance socket suffix",
            ),
            (
                "{instances: /i, socket: /s, backend: .s, tlsCert: /c}",
                "unknown field",
            ),
            ("port=8015,instances=/i", "a mapping such as"),
        ] {
            let err = group_flag(text).unwrap_err();
            assert!(err.contains(says), "{text}: {err}");
        }
    }
}
