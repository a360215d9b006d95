//! Serving the generated gRPC services on the kubelet's Unix sockets: the caller check before any route, and
//! the `:authority` mend ([`super::authority`]) on every connection.

use std::future::Future;
use std::path::Path;

use tokio::net::UnixListener;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::Status;
use tonic::body::Body;
use tonic::service::Routes;
use tonic::transport::server::UdsConnectInfo;
use tower::ServiceExt;
use tracing::warn;

use super::authority::FixAuthority;

/// Serves the kubelet alone: the caller's uid (`SO_PEERCRED`, taken by the kernel at connect) must be 0, the
/// kubelet's, or this plugin's own; anyone else, even one who could open the socket, is PermissionDenied.
fn caller_allowed(request: &http::Request<Body>) -> Result<(), Status> {
    let Some(cred) = request
        .extensions()
        .get::<UdsConnectInfo>()
        .and_then(|info| info.peer_cred)
    else {
        return Err(Status::permission_denied(
            "the caller's credentials are unknown: only the kubelet (uid 0) is served",
        ));
    };
    let uid = cred.uid();
    if uid == 0 || uid == rustix::process::geteuid().as_raw() {
        return Ok(());
    }
    Err(Status::permission_denied(format!(
        "the caller (uid {uid}, pid {}) is not the kubelet: only uid 0 is served",
        cred.pid().map_or("unknown".into(), |p| p.to_string())
    )))
}

/// Binds a Unix socket for the kubelet: a stale file at the path is removed first (the plugin's own, left by a
/// crash or a restart: the kubelet's directories are the kubelet's and this plugin's alone), and the socket is
/// given mode 0600 (the kubelet runs as root).
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type()) => {
            std::fs::remove_file(path)?
        }
        Ok(_) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!(
                    "{} exists and is not a socket; it is left alone",
                    path.display()
                ),
            ));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    Ok(listener)
}

/// Serves `routes` on `listener` until `stop` resolves, to allowed callers only; each connection's `:authority` is mended first
/// ([`super::authority`]: the kubelet sends the socket's path there, which h2 refuses).
pub async fn serve(
    listener: UnixListener,
    routes: Routes,
    stop: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let checked = tower::service_fn(move |request: http::Request<Body>| {
        let routes = routes.clone();
        async move {
            if let Err(status) = caller_allowed(&request) {
                let method = request.uri().path();
                warn!(method, reason = status.message(), "caller refused");
                return Ok(status.into_http());
            }
            routes.oneshot(request).await
        }
    });
    let incoming = UnixListenerStream::new(listener).map(|c| c.map(FixAuthority::new));
    tonic::transport::Server::builder()
        .serve_with_incoming_shutdown(checked, incoming, stop)
        .await
}
