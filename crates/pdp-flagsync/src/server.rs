//! Serving the sync service on TCP addresses and Unix sockets until told to stop.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use std::os::unix::fs::PermissionsExt;

use futures_util::Stream;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tonic::transport::server::Connected;

use crate::proto::flag_sync_service_server::FlagSyncServiceServer;
use crate::relay::RelayService;
use crate::relay_proto::node_relay_server::NodeRelayServer;
use crate::service::SyncService;

/// Where the service listens.
#[derive(Debug, Default, Clone)]
pub struct Listeners {
    pub tcp: Vec<SocketAddr>,
    /// Unix sockets, created with mode 0666 (connect(2) needs write permission; app containers run as any user).
    pub sockets: Vec<PathBuf>,
}

/// Why serving failed.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {0}: {1}")]
    Bind(String, std::io::Error),
    #[error("gRPC server on {0}: {1}")]
    Serve(String, tonic::transport::Error),
    #[error("a listener's task ended: {0}")]
    Task(String),
}

/// Serves `service` on every listener until `stop` turns true; streams end first, so providers reconnect.
/// With `relay`, the node relay stream is served beside it.
pub async fn serve(
    service: SyncService,
    relay: Option<RelayService>,
    listeners: Listeners,
    stop: watch::Receiver<bool>,
) -> Result<(), ServeError> {
    let service = Services {
        sync: Arc::new(service),
        relay: relay.map(Arc::new),
    };
    let mut tasks = JoinSet::new();
    for addr in listeners.tcp {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| ServeError::Bind(addr.to_string(), e))?;
        spawn(
            &mut tasks,
            &service,
            TcpListenerStream::new(listener),
            addr.to_string(),
            stop.clone(),
        );
    }
    for path in listeners.sockets {
        let shown = path.display().to_string();
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).map_err(|e| ServeError::Bind(shown.clone(), e))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))
            .map_err(|e| ServeError::Bind(shown.clone(), e))?;
        spawn(
            &mut tasks,
            &service,
            UnixListenerStream::new(listener),
            shown,
            stop.clone(),
        );
    }
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(e) => return Err(ServeError::Task(e.to_string())),
        }
    }
    Ok(())
}

/// What every listener serves.
struct Services {
    sync: Arc<SyncService>,
    relay: Option<Arc<RelayService>>,
}

/// One listener's server, as a task of `tasks`.
fn spawn<I, IO, IE>(
    tasks: &mut JoinSet<Result<(), ServeError>>,
    service: &Services,
    incoming: I,
    name: String,
    mut stop: watch::Receiver<bool>,
) where
    I: Stream<Item = Result<IO, IE>> + Send + 'static,
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
    IO::ConnectInfo: Clone + Send + Sync + 'static,
    IE: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    tracing::info!(listener = %name, "flag sync listening");
    let router = tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .max_concurrent_streams(Some(16))
        .add_service(FlagSyncServiceServer::from_arc(service.sync.clone()))
        .add_optional_service(service.relay.clone().map(NodeRelayServer::from_arc));
    tasks.spawn(async move {
        let shutdown = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        router
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await
            .map_err(|e| ServeError::Serve(name, e))
    });
}
