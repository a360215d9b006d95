//! The HTTPS webhook: a thin axum layer around the admission stages (`review.rs`). It bounds and times requests,
//! records metrics and logs; every decision stays in the core.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum_server::Handle;
use axum_server::tls_rustls::{RustlsAcceptor, RustlsConfig};
use tokio::sync::Semaphore;
use tracing::{error, info, warn};

use crate::limits::{self, ConnectionLimit, MemoryBounds};
use crate::metrics::Metrics;
use crate::review;
use pdp_cluster::namespaces::NamespaceSource;
use pdp_core::config::{ClusterFit, Config, ConfigError};
use pdp_core::duration::duration_flag;
use pdp_tls::{self as tls, TlsError, TlsFiles, TlsMaterial};

pub use crate::review::{Entry, OPTED_IN_PATH};
pub use crate::state::AppState;

/// Where the serving certificate comes from.
#[derive(Debug, Clone)]
pub enum TlsSource {
    /// PEM files, watched and reloaded.
    Files(TlsFiles),
    /// Fixed material (the local self-signed certificate); a `watch::Receiver` in self-managed mode.
    Fixed(TlsMaterial),
    /// Material that changes over time (self-managed certificates kept in a Secret).
    Watched(tokio::sync::watch::Receiver<TlsMaterial>),
}

/// The flags of `serve` that tune the server, with their defaults and environment variables: the one place
/// they are written (the binary flattens this into its command line; [`Default`] parses no arguments).
#[derive(Debug, Clone, clap::Args)]
pub struct ServeFlags {
    /// Address to listen on.
    #[arg(long, env = "PDP_INJECTOR_LISTEN", default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,
    /// Config file (YAML), reloaded when it changes; the built-in config when absent.
    #[arg(long = "config", env = "PDP_INJECTOR_CONFIG")]
    pub config_path: Option<PathBuf>,
    /// Admission requests answered at once; more get a fast 503.
    #[arg(long, env = "PDP_INJECTOR_MAX_IN_FLIGHT", default_value_t = 256)]
    pub max_in_flight: usize,
    /// Largest accepted request body, in bytes.
    #[arg(long, env = "PDP_INJECTOR_BODY_LIMIT", default_value_t = DEFAULT_BODY_LIMIT)]
    pub body_limit: usize,
    /// The memory the webhook may use, a Kubernetes quantity from which its connection, body and buffer bounds
    /// derive (about 75% of the container's limit; SECURITY.md, "Memory budget").
    #[arg(long, env = "PDP_INJECTOR_MEMORY_BUDGET", default_value = "96Mi", value_parser = pdp_core::size::parse_size)]
    pub memory_budget: u64,
    /// Upper bound on one request (the apiserver's ?timeout= lowers it).
    #[arg(long, env = "PDP_INJECTOR_REQUEST_TIMEOUT", default_value = "10s", value_parser = duration_flag)]
    pub request_timeout: Duration,
    // Longer than the apiserver's idle connection timeout (client-go's), so that it never races our close with a
    // POST it will not retry.
    /// How long a keep-alive connection may stay idle between requests.
    #[arg(long, env = "PDP_INJECTOR_IDLE_TIMEOUT", default_value = "150s", value_parser = duration_flag)]
    pub idle_timeout: Duration,
    /// Bound on TLS handshakes and on the first request of a connection.
    #[arg(long, env = "PDP_INJECTOR_HANDSHAKE_TIMEOUT", default_value = "5s", value_parser = duration_flag)]
    pub handshake_timeout: Duration,
    /// How often certificate and config files are checked for changes.
    #[arg(long, env = "PDP_INJECTOR_RELOAD_INTERVAL", default_value = "2s", value_parser = duration_flag)]
    pub reload_interval: Duration,
    /// After SIGTERM, keep answering (while not ready) this long before draining (endpoints catch up).
    #[arg(long, env = "PDP_INJECTOR_DRAIN_DELAY", default_value = "0s", value_parser = duration_flag)]
    pub drain_delay: Duration,
    // The Service's routing may lag the endpoints, and a connection cut in its handshake is an error the
    // apiserver does not retry.
    /// After the drain delay, keep accepting until no new connection has arrived for this long (at most half the shutdown grace).
    #[arg(long, env = "PDP_INJECTOR_DRAIN_QUIET", default_value = "1s", value_parser = duration_flag)]
    pub drain_quiet: Duration,
    /// How long in-flight requests get to finish when draining.
    #[arg(long, env = "PDP_INJECTOR_SHUTDOWN_GRACE", default_value = "25s", value_parser = duration_flag)]
    pub shutdown_grace: Duration,
}

impl Default for ServeFlags {
    fn default() -> Self {
        #[derive(clap::Parser)]
        struct Only {
            #[command(flatten)]
            flags: ServeFlags,
        }
        <Only as clap::Parser>::try_parse_from(["serve"])
            .expect("the defaults of the serve flags parse")
            .flags
    }
}

/// Everything `serve` needs: its flags, and what the binary builds from the rest of the command line and the
/// cluster.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The flags.
    pub flags: ServeFlags,
    /// Serving certificate.
    pub tls: TlsSource,
    /// Bound on the first request of a connection (slow or partial headers are cut off after it); the
    /// handshake timeout unless a test sets it apart.
    pub header_timeout: Duration,
    /// What the config must be adapted to in this cluster.
    pub fit: ClusterFit,
    /// Whether the node plugin's CSIDriver exists, kept current in the background
    /// ([`pdp_cluster::csi_driver::watch`]): a change re-applies the config with the new fact.
    pub csi_driver: Option<tokio::sync::watch::Receiver<bool>>,
    /// Counted by the background tasks against the cluster (certificates, namespaces); rendered in /metrics.
    pub cluster_counters: pdp_cluster::ClusterCounters,
}

impl ServeOptions {
    /// Defaults for a listen address and a certificate source.
    pub fn new(listen: SocketAddr, tls: TlsSource) -> Self {
        ServeOptions::with_flags(
            ServeFlags {
                listen,
                ..ServeFlags::default()
            },
            tls,
        )
    }

    /// Options from parsed flags and a certificate source.
    pub fn with_flags(flags: ServeFlags, tls: TlsSource) -> Self {
        ServeOptions {
            header_timeout: flags.handshake_timeout,
            flags,
            tls,
            fit: ClusterFit::default(),
            csi_driver: None,
            cluster_counters: Default::default(),
        }
    }
}

/// 7 MiB: a CREATE review carries one object of at most 3 MiB (the apiserver's limit) and an UPDATE two, plus
/// the envelope. axum's 2 MB default would refuse legal Pods.
pub const DEFAULT_BODY_LIMIT: usize = 7 * 1024 * 1024;

/// Why `serve` could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The certificate is unusable.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The config is unusable.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The memory budget cannot hold what serving needs.
    #[error("{0}")]
    Budget(String),
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// A running server.
pub struct Running {
    /// The bound address (useful with port 0).
    pub addr: SocketAddr,
    /// Shared state, for readiness and metrics.
    pub state: Arc<AppState>,
    handle: Handle<SocketAddr>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    reloader: tokio::task::JoinHandle<()>,
    drain_delay: Duration,
    drain_quiet: Duration,
    shutdown_grace: Duration,
}

impl Running {
    /// Graceful shutdown: readiness fails at once, requests keep being answered for the drain delay and then
    /// until new connections stop arriving (HTTP/1.1 answers say `Connection: close` meanwhile, so clients
    /// leave); then no new connections are accepted, in-flight requests finish (up to the grace period) and the
    /// server stops.
    pub async fn shutdown(self) -> std::io::Result<()> {
        self.state.shutting_down.store(true, Ordering::SeqCst);
        self.state.metrics.set_ready(false);
        info!(drain_delay = ?self.drain_delay, "shutting down: readiness is now false");
        tokio::time::sleep(self.drain_delay).await;
        // At most half the grace, so that requests in flight keep the other half.
        let waited = self
            .state
            .connections
            .wait_quiet(self.drain_quiet, self.shutdown_grace / 2)
            .await;
        info!(
            waited = ?waited,
            since_last_connection = ?self.state.connections.since_last_arrival(),
            "draining: no longer accepting connections"
        );
        self.handle
            .graceful_shutdown(Some(self.shutdown_grace.saturating_sub(waited)));
        self.reloader.abort();
        let result = match self.server.await {
            Ok(r) => r,
            Err(e) => Err(std::io::Error::other(e)),
        };
        info!("stopped");
        result
    }
}

/// Starts the webhook; returns once it listens.
pub async fn start(
    options: ServeOptions,
    namespaces: Arc<dyn NamespaceSource>,
) -> Result<Running, ServeError> {
    review::keep_review_memory();
    let config = match &options.flags.config_path {
        Some(p) => Config::load(p)?,
        None => Config::builtin(),
    };
    let mut options = options;
    if let Some(rx) = &options.csi_driver {
        options.fit.csi_driver = *rx.borrow();
    }
    let config = options.fit.apply(config);
    let material = match &options.tls {
        TlsSource::Files(files) => files.read()?,
        TlsSource::Fixed(m) => m.clone(),
        TlsSource::Watched(rx) => rx.borrow().clone(),
    };
    let (tls_reloader, loaded) = tls::Reloader::start(&material, tls::ALPN_HTTP)?;
    let rustls_config = RustlsConfig::from_config(loaded.config);
    let bounds = MemoryBounds::from_budget(options.flags.memory_budget, options.flags.body_limit)
        .map_err(ServeError::Budget)?;
    let metrics = Metrics::with_cluster(options.cluster_counters.clone());
    let connections = ConnectionLimit::new(
        bounds.connections,
        metrics.capacity.connections_refused.clone(),
    );
    let capacity = &metrics.capacity;
    capacity
        .memory_budget_bytes
        .set(i64::try_from(bounds.budget).unwrap_or(i64::MAX));
    capacity.connections_max.set(bounds.connections as i64);
    capacity.body_bytes_max.set(bounds.body_bytes as i64);

    let state = Arc::new(AppState {
        config: RwLock::new(Arc::new(config)),
        namespaces,
        metrics,
        bound: AtomicBool::new(false),
        shutting_down: AtomicBool::new(false),
        permits: Arc::new(Semaphore::new(options.flags.max_in_flight.max(1))),
        readers: Arc::new(Semaphore::new(
            options.flags.max_in_flight.max(1).saturating_mul(4),
        )),
        body_limit: options.flags.body_limit,
        body_budget: Arc::new(Semaphore::new(bounds.body_bytes)),
        bounds,
        connections: connections.clone(),
        request_timeout: options.flags.request_timeout,
    });
    state.metrics.set_cert_expiry(loaded.not_after);

    let app = router(state.clone());
    let handle: Handle<SocketAddr> = Handle::new();
    // The connection limit applies before the TLS handshake, so a refused connection costs no handshake.
    let acceptor = RustlsAcceptor::new(rustls_config.clone())
        .handshake_timeout(options.flags.handshake_timeout)
        .acceptor(connections);
    let mut server = axum_server::bind(options.flags.listen)
        .acceptor(acceptor)
        .handle(handle.clone())
        .first_request_timeout(options.header_timeout);
    let builder = server.http_builder();
    builder
        .http1()
        .header_read_timeout(Some(options.flags.idle_timeout.max(options.header_timeout)))
        .max_buf_size(limits::HTTP1_READ_BUFFER)
        .keep_alive(true);
    // HTTP/2 (the apiserver's choice): what a client may make the server buffer before the handler reads.
    builder
        .http2()
        .initial_stream_window_size(bounds.h2_stream_window)
        .initial_connection_window_size(bounds.h2_connection_window)
        .max_concurrent_streams(bounds.h2_streams)
        .max_header_list_size(bounds.h2_header_list)
        .max_send_buf_size(bounds.h2_stream_window as usize);
    let server = tokio::spawn(server.serve(app.into_make_service()));
    let Some(addr) = handle.listening().await else {
        let source = match server.await {
            Ok(Err(e)) => e,
            Ok(Ok(())) => std::io::Error::other("server stopped before listening"),
            Err(e) => std::io::Error::other(e),
        };
        return Err(ServeError::Bind {
            addr: options.flags.listen,
            source,
        });
    };
    state.bound.store(true, Ordering::SeqCst);
    state.metrics.set_ready(state.ready().is_ok());
    info!(
        %addr,
        memory_budget_mib = bounds.budget / (1024 * 1024),
        max_connections = bounds.connections,
        body_budget_mib = bounds.body_bytes / (1024 * 1024),
        "listening (TLS 1.2/1.3)"
    );

    let reloader = tokio::spawn(reload_loop(
        state.clone(),
        rustls_config,
        options.tls.clone(),
        tls_reloader,
        options.flags.config_path.clone(),
        options.flags.reload_interval,
        Facts {
            fit: options.fit.clone(),
            csi_driver: options.csi_driver.clone(),
        },
    ));
    Ok(Running {
        addr,
        state,
        handle,
        server,
        reloader,
        drain_delay: options.flags.drain_delay,
        drain_quiet: options.flags.drain_quiet,
        shutdown_grace: options.flags.shutdown_grace,
    })
}

/// What the config is adapted to, and the fact that may change while the webhook runs.
struct Facts {
    fit: ClusterFit,
    csi_driver: Option<tokio::sync::watch::Receiver<bool>>,
}

/// Watches certificate and config sources; swaps in new versions atomically, keeps the last good ones when a
/// new one is invalid, and never panics (a panic here would silently freeze both).
async fn reload_loop(
    state: Arc<AppState>,
    rustls_config: RustlsConfig,
    source: TlsSource,
    mut tls_reloader: tls::Reloader,
    config_path: Option<PathBuf>,
    interval: Duration,
    facts: Facts,
) {
    let Facts {
        mut fit,
        csi_driver,
    } = facts;
    let mut config_seen = config_path
        .as_deref()
        .and_then(|p| std::fs::read(p).ok())
        .map(|b| sha(&b));
    let mut watched = match &source {
        TlsSource::Watched(rx) => Some(rx.clone()),
        _ => None,
    };
    loop {
        match &mut watched {
            Some(rx) => {
                tokio::select! {
                    changed = rx.changed() => if changed.is_err() { watched = None; },
                    _ = tokio::time::sleep(interval) => {}
                }
            }
            None => tokio::time::sleep(interval).await,
        }
        let reading = match (&source, &watched) {
            (TlsSource::Files(files), _) => Some(files.read()),
            (TlsSource::Watched(_), Some(rx)) => Some(Ok(rx.borrow().clone())),
            _ => None,
        };
        match reading.map(|r| tls_reloader.offer(r)) {
            None | Some(tls::Reload::Unchanged) => {}
            Some(tls::Reload::Loaded(loaded)) => {
                rustls_config.reload_from_config(loaded.config);
                state.metrics.set_cert_expiry(loaded.not_after);
                state.metrics.cert_reload(true);
                info!(not_after = loaded.not_after, "serving certificate reloaded");
            }
            Some(tls::Reload::Failed(e @ TlsError::Read { .. })) => {
                state.metrics.cert_reload(false);
                warn!(error = %e, "cannot read the serving certificate; keeping the current one");
            }
            Some(tls::Reload::Failed(e)) => {
                state.metrics.cert_reload(false);
                warn!(error = %e, "new serving certificate is invalid; keeping the current one");
            }
        }
        // The CSIDriver appeared or went: the same config, adapted to the new fact (read again below, or the
        // built-in one when there is no file).
        if let Some(installed) = csi_driver.as_ref().map(|rx| *rx.borrow())
            && installed != fit.csi_driver
        {
            fit.csi_driver = installed;
            info!(
                installed,
                "the node plugin's CSIDriver changed: config re-applied"
            );
            match &config_path {
                Some(_) => config_seen = None,
                None => state.set_config(fit.apply(Config::builtin())),
            }
        }
        if let Some(path) = &config_path {
            match std::fs::read(path) {
                Ok(bytes) => {
                    let fp = sha(&bytes);
                    if Some(fp) != config_seen {
                        config_seen = Some(fp);
                        match std::str::from_utf8(&bytes)
                            .map_err(|e| ConfigError::Syntax(e.to_string()))
                            .and_then(Config::from_yaml)
                        {
                            Ok(config) => {
                                let config = fit.apply(config);
                                info!(hash = %config.hash, "config reloaded");
                                state.set_config(config);
                                state.metrics.config_reload(true);
                            }
                            Err(e) => {
                                state.metrics.config_reload(false);
                                error!(error = %e, "new config is invalid; keeping the current one");
                            }
                        }
                    }
                }
                Err(e) => {
                    let fp = sha(e.to_string().as_bytes());
                    if Some(fp) != config_seen {
                        config_seen = Some(fp);
                        state.metrics.config_reload(false);
                        warn!(error = %e, path = %path.display(), "cannot read the config; keeping the current one");
                    }
                }
            }
        }
    }
}

fn sha(bytes: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).into()
}

/// The routes, on any state (the tests and the benchmarks mount it without TLS too).
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/mutate", post(review::mutate_pods))
        .route(OPTED_IN_PATH, post(review::mutate_opted_in))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .fallback(|| async {
            review::json_error(StatusCode::NOT_FOUND, "no such path: use POST /mutate")
        })
        .with_state(state)
}

async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    let ready = state.ready();
    state.metrics.set_ready(ready.is_ok());
    match ready {
        Ok(()) => (StatusCode::OK, "ready\n").into_response(),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        )
            .into_response(),
    }
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let capacity = &state.metrics.capacity;
    capacity
        .connections_open
        .set(state.connections.open() as i64);
    capacity
        .body_bytes_held
        .set((state.bounds.body_bytes - state.body_budget.available_permits()) as i64);
    (
        [(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)],
        state.metrics.render(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::DEFAULT_MEMORY_BUDGET;

    #[test]
    fn flag_defaults_are_the_library_defaults() {
        let flags = ServeFlags::default();
        assert_eq!(flags.listen, "0.0.0.0:8443".parse().unwrap());
        assert_eq!(flags.memory_budget, DEFAULT_MEMORY_BUDGET);
        assert_eq!(flags.body_limit, DEFAULT_BODY_LIMIT);
        // Above the apiserver's 90 s idle timeout, and the apiserver's own request timeout bound.
        assert!(flags.idle_timeout > Duration::from_secs(90));
        assert_eq!(flags.request_timeout, Duration::from_secs(10));
        let options = ServeOptions::new(
            "127.0.0.1:1".parse().unwrap(),
            TlsSource::Fixed(TlsMaterial {
                cert_pem: vec![],
                key_pem: vec![],
                client_ca_pem: None,
            }),
        );
        assert_eq!(options.header_timeout, flags.handshake_timeout);
        assert_eq!(options.flags.shutdown_grace, flags.shutdown_grace);
    }
}
