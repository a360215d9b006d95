//! The front's endpoints: binding the TCP addresses and the stable socket, accepting, refusing at accept.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pdp_core::peer::pod_uid_of_cgroup;
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tracing::{debug, info, warn};

use crate::proxy::forward::serve;
use crate::proxy::front_tls::serve_tls;
use crate::proxy::stats::Shared;
use crate::proxy::{NodeProxyError, Phase, Route};
use crate::slots::{Client, Refused};

/// The stable socket as this process created it: removed on exit only if the path still is this socket.
pub(super) struct OwnedSocket {
    pub(super) path: PathBuf,
    pub(super) dev: u64,
    pub(super) ino: u64,
}

impl OwnedSocket {
    pub(super) fn release(&self) {
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

/// Linux errno values of a kernel without IPv6 (booted with ipv6.disable=1): no such address family, or the
/// address cannot be assigned.
pub(super) const EAFNOSUPPORT: i32 = 97;
pub(super) const EADDRNOTAVAIL: i32 = 99;

/// Whether binding the default `[::]` failed only because the node has no IPv6.
pub(super) fn no_ipv6(error: &io::Error) -> bool {
    matches!(error.raw_os_error(), Some(EAFNOSUPPORT | EADDRNOTAVAIL))
}

/// Binds one TCP address; the default `[::]:3593` falls back to `0.0.0.0:3593` on a node without IPv6 (an
/// address the operator wrote is bound as written, or the start fails).
pub(super) async fn bind_tcp(
    addr: SocketAddr,
    is_default: bool,
) -> Result<TcpListener, NodeProxyError> {
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

/// Creates the stable socket without a moment where its path is missing or has the wrong permissions: bound
/// under a temporary name in the same directory, given its mode, then renamed over the path. What already is at
/// the path is replaced only if it is a socket nobody answers on (stale, left by a crash), or with --take-over.
pub(super) fn bind_stable(
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

pub(super) enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

pub(super) async fn accept_loop(listener: Listener, route: Arc<Route>, shared: Arc<Shared>) {
    let mut phase = shared.phase.subscribe();
    loop {
        let accepted = tokio::select! {
            biased;
            _ = phase.wait_for(|p| *p != Phase::Serving) => break,
            accepted = accept(&listener) => accepted,
        };
        let (stream, peer, client) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors and the like: say so, and do not spin.
                warn!(route = route.kind, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // A place for the client, or it is closed now: excess costs an accept, never memory.
        let slot = match route.slots.admit(client) {
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
pub(super) const REFUSAL_NOTE_EVERY: Duration = Duration::from_secs(10);

/// Counts (and now and then logs) a connection closed at accept.
pub(super) fn refuse(route: &Route, shared: &Shared, refused: Refused, peer: &str) {
    let why = match refused {
        Refused::Peer => {
            shared.count(|s| s.refused_peer += 1);
            "this client (its address, or on the socket its Pod or user) holds --max-connections-per-peer connections already"
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

pub(super) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

/// A connection, its peer as logged, and who it is for the per-client bound.
pub(super) async fn accept(listener: &Listener) -> io::Result<(Stream, String, Option<Client>)> {
    match listener {
        Listener::Tcp(l) => {
            let (s, peer) = l.accept().await?;
            Ok((
                Stream::Tcp(s),
                peer.to_string(),
                Some(Client::addr(peer.ip())),
            ))
        }
        Listener::Unix(l) => {
            let (s, _) = l.accept().await?;
            let cred = s.peer_cred().ok();
            let pid = cred.and_then(|c| c.pid()).filter(|pid| *pid > 0);
            // SO_PEERCRED's pid is in this process's PID namespace (0 when the caller's is not visible): with the
            // host's (hostPID), its cgroup names the caller's Pod.
            let pod = pid.and_then(|pid| {
                let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
                pod_uid_of_cgroup(&text)
            });
            let client = match (pod, pid, cred) {
                (Some(uid), _, _) => Some(Client::Pod(uid.into())),
                (None, Some(_), Some(cred)) => Some(Client::User(cred.uid())),
                _ => None,
            };
            let peer = match (&client, pid) {
                (Some(Client::Pod(uid)), Some(pid)) => format!("unix pid {pid} pod {uid}"),
                (_, Some(pid)) => format!("unix pid {pid}"),
                _ => "unix".to_string(),
            };
            Ok((Stream::Unix(s), peer, client))
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
