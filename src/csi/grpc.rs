//! The gRPC plumbing of the plugin: a unary RPC is a prost request decoded by tonic's codec, a handler, and a
//! prost response; one tower service per socket routes `/package.Service/Method` paths to their handlers (what
//! tonic-build would generate, for the handful of methods served, without build-time code generation).

use std::convert::Infallible;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::net::UnixListener;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::body::Body;
use tonic::transport::server::UdsConnectInfo;
use tonic::{Request, Response, Status};
use tracing::warn;

use super::authority::FixAuthority;

/// A boxed future, as the services return.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Routes one HTTP/2 request (a gRPC call) to its handler; `None` for an unknown method.
pub type Route =
    dyn Fn(&str, http::Request<Body>) -> Option<BoxFuture<http::Response<Body>>> + Send + Sync;

/// The tower service of one socket.
#[derive(Clone)]
pub struct Routes(pub Arc<Route>);

impl tower_service::Service<http::Request<Body>> for Routes {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<http::Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let path = request.uri().path().to_string();
        if let Err(status) = caller_allowed(&request) {
            warn!(method = path, reason = status.message(), "caller refused");
            return Box::pin(async move { Ok(status.into_http()) });
        }
        match (self.0)(&path, request) {
            Some(answer) => Box::pin(async move { Ok(answer.await) }),
            None => {
                let status = Status::unimplemented(format!("{path}: not served by this plugin"));
                Box::pin(async move { Ok(status.into_http()) })
            }
        }
    }
}

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

/// One unary call: decodes `Req`, runs `handler`, encodes its answer or its status.
pub fn unary<Req, Resp, F, Fut>(
    request: http::Request<Body>,
    handler: F,
) -> BoxFuture<http::Response<Body>>
where
    Req: prost::Message + Default + Send + 'static,
    Resp: prost::Message + Send + 'static,
    F: FnOnce(Req) -> Fut + Send + 'static,
    Fut: Future<Output = Result<Resp, Status>> + Send + 'static,
{
    Box::pin(async move {
        let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::<Resp, Req>::default());
        grpc.unary(Unary(Some(handler)), request).await
    })
}

/// A handler as tonic's [`tonic::server::UnaryService`]; called once per request.
struct Unary<F>(Option<F>);

impl<Req, Resp, F, Fut> tonic::server::UnaryService<Req> for Unary<F>
where
    F: FnOnce(Req) -> Fut + Send + 'static,
    Fut: Future<Output = Result<Resp, Status>> + Send + 'static,
    Req: Send + 'static,
    Resp: Send + 'static,
{
    type Response = Resp;
    type Future = BoxFuture<Result<Response<Resp>, Status>>;

    fn call(&mut self, request: Request<Req>) -> Self::Future {
        let handler = self.0.take();
        Box::pin(async move {
            match handler {
                Some(handler) => handler(request.into_inner()).await.map(Response::new),
                None => Err(Status::internal("a unary handler was called twice")),
            }
        })
    }
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

/// Serves `routes` on `listener` until `stop` resolves; each connection's `:authority` is mended first
/// ([`super::authority`]: the kubelet sends the socket's path there, which h2 refuses).
pub async fn serve(
    listener: UnixListener,
    routes: Routes,
    stop: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let incoming = UnixListenerStream::new(listener).map(|c| c.map(FixAuthority::new));
    tonic::transport::Server::builder()
        .serve_with_incoming_shutdown(routes, incoming, stop)
        .await
}
