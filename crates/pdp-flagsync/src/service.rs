//! `flagd.sync.v1.FlagSyncService` over a [`Store`]: each stream gets the sets its selector names, scoped to its
//! caller, at once and after every change that alters them.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use futures_util::Stream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tonic::transport::server::UdsConnectInfo;
use tonic::{Request, Response, Status};

use crate::metrics::Metrics;
use crate::proto::flag_sync_service_server::FlagSyncService;
use crate::proto::{
    FetchAllFlagsRequest, FetchAllFlagsResponse, GetMetadataRequest, GetMetadataResponse,
    SyncFlagsRequest, SyncFlagsResponse,
};
use crate::select::{Caller, Selection, SelectorError};
use crate::source::pods::PodIndex;
use crate::store::{Snapshot, Store};
use pdp_core::peer::pod_uid_of_cgroup;

/// The header in which providers send their selector (flagd v0.11+); the request field is the older way.
pub const SELECTOR_HEADER: &str = "flagd-selector";

/// Where a call comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// A TCP connection from this address.
    Tcp(SocketAddr),
    /// A Unix socket connection from this process (its pid as this process sees it, when it can).
    Unix { pid: Option<i32> },
    /// Neither (an in-memory transport).
    Unknown,
}

impl Peer {
    /// The peer of `request`, from the connection information the server attached.
    pub fn of<T>(request: &Request<T>) -> Peer {
        if let Some(addr) = request.remote_addr() {
            return Peer::Tcp(addr);
        }
        match request.extensions().get::<UdsConnectInfo>() {
            Some(info) => Peer::Unix {
                pid: info.peer_cred.and_then(|c| c.pid()),
            },
            None => Peer::Unknown,
        }
    }
}

/// How a call's caller is known.
pub trait Identify: Send + Sync + 'static {
    /// The caller of a call from `peer`, or the status that refuses it.
    fn identify(&self, peer: Peer) -> Result<Caller, Status>;

    /// Where a caller not known yet may become known (a new Pod's address arriving): the call then waits, up to
    /// [`IDENTIFY_WAIT`], for a change before it is refused.
    fn changes(&self) -> Option<watch::Receiver<u64>> {
        None
    }
}

/// How long a call from a caller not known yet waits for the Pods to catch up (a Pod's first call can come before
/// its address reaches the index).
pub const IDENTIFY_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Every caller is of one namespace: a single-tenant install, or local use.
#[derive(Debug, Clone)]
pub struct FixedNamespace(pub String);

impl Identify for FixedNamespace {
    fn identify(&self, _: Peer) -> Result<Caller, Status> {
        Ok(Caller {
            namespace: self.0.clone(),
        })
    }
}

/// Callers known as Pods: a TCP caller by its address, a socket caller by the Pod UID in its process's cgroup
/// (`/proc/PID/cgroup`: the relay runs in the host's PID namespace). hostNetwork Pods share their node's address
/// and are refused.
#[derive(Debug, Clone)]
pub struct Pods(pub Arc<PodIndex>);

impl Identify for Pods {
    fn identify(&self, peer: Peer) -> Result<Caller, Status> {
        let found = match peer {
            Peer::Tcp(addr) => {
                let ip = addr.ip().to_canonical();
                self.0.namespace_of_ip(ip).ok_or_else(|| {
                    format!("no running Pod has the address {ip} (hostNetwork Pods share their node's and are refused)")
                })
            }
            Peer::Unix { pid: Some(pid) } if pid > 0 => {
                std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                    .ok()
                    .and_then(|text| pod_uid_of_cgroup(&text))
                    .ok_or_else(|| format!("the process {pid} on the socket is in no Pod's cgroup"))
                    .and_then(|uid| {
                        self.0
                            .namespace_of_uid(&uid)
                            .ok_or_else(|| format!("no running Pod has the UID {uid}"))
                    })
            }
            Peer::Unix { .. } => Err("the socket caller's process is not visible here".to_string()),
            Peer::Unknown => {
                Err("the caller's connection is neither TCP nor a Unix socket".to_string())
            }
        };
        found.map(|namespace| Caller { namespace }).map_err(|why| {
            Status::permission_denied(format!("flag sets are served to Pods only: {why}"))
        })
    }
}

/// The service: one per listener, sharing the store.
pub struct SyncService {
    store: Arc<Store>,
    identify: Arc<dyn Identify>,
    shared_namespace: String,
    metrics: Arc<Metrics>,
    streams: Arc<Semaphore>,
    stop: watch::Receiver<bool>,
}

impl SyncService {
    /// A service of `store`; at most `max_streams` SyncFlags streams at once; streams end when `stop` turns true.
    pub fn new(
        store: Arc<Store>,
        identify: Arc<dyn Identify>,
        shared_namespace: String,
        metrics: Arc<Metrics>,
        max_streams: usize,
        stop: watch::Receiver<bool>,
    ) -> SyncService {
        SyncService {
            store,
            identify,
            shared_namespace,
            metrics,
            streams: Arc::new(Semaphore::new(max_streams)),
            stop,
        }
    }

    /// The caller of `peer`, waiting up to [`IDENTIFY_WAIT`] for one not known yet.
    async fn caller(&self, peer: Peer) -> Result<Caller, Status> {
        let mut changes = self.identify.changes();
        let deadline = tokio::time::Instant::now() + IDENTIFY_WAIT;
        loop {
            let refused = match self.identify.identify(peer) {
                Ok(caller) => return Ok(caller),
                Err(status) => status,
            };
            let Some(rx) = changes.as_mut() else {
                return Err(refused);
            };
            if tokio::time::timeout_at(deadline, rx.changed())
                .await
                .is_err()
            {
                tracing::info!(
                    ?peer,
                    reason = refused.message(),
                    "flag sync caller refused"
                );
                return Err(refused);
            }
        }
    }

    async fn selection<T>(
        &self,
        request: &Request<T>,
        body_selector: &str,
    ) -> Result<Selection, Status> {
        let caller = self.caller(Peer::of(request)).await.inspect_err(|_| {
            self.metrics.refuse("permission_denied");
        })?;
        let header = request.metadata().get(SELECTOR_HEADER).map(|v| v.to_str());
        let selector = match header {
            Some(Ok(s)) => s,
            Some(Err(_)) => {
                self.metrics.refuse("invalid_argument");
                return Err(Status::invalid_argument(
                    "the flagd-selector header is not text",
                ));
            }
            None => body_selector,
        };
        Selection::resolve(selector, &caller, &self.shared_namespace).map_err(|e| {
            let status = match e {
                SelectorError::Forbidden { .. } => Status::permission_denied(e.to_string()),
                SelectorError::Syntax(_) => Status::invalid_argument(e.to_string()),
            };
            self.metrics
                .refuse(if status.code() == tonic::Code::PermissionDenied {
                    "permission_denied"
                } else {
                    "invalid_argument"
                });
            tracing::info!(caller = %caller.namespace, selector, reason = %e, "flag sync refused");
            status
        })
    }
}

/// One open stream's state: its receiver, what it sent last, its share of the bound.
struct StreamState {
    rx: watch::Receiver<Arc<Snapshot>>,
    stop: watch::Receiver<bool>,
    selection: Selection,
    last: Option<Arc<str>>,
    started: bool,
    ended: bool,
    metrics: Arc<Metrics>,
    _permit: OwnedSemaphorePermit,
}

impl Drop for StreamState {
    fn drop(&mut self) {
        self.metrics.subscribers.dec();
    }
}

impl StreamState {
    /// The next configuration to send. When the server stops, an UNAVAILABLE status: providers reconnect on an
    /// error, while some (Node's) take a stream's clean end as final.
    async fn next(&mut self) -> Option<Result<SyncFlagsResponse, Status>> {
        loop {
            if self.ended {
                return None;
            }
            if self.started {
                let stopped = tokio::select! {
                    changed = self.rx.changed() => changed.is_err(),
                    _ = self.stop.wait_for(|stop| *stop) => true,
                };
                if stopped {
                    self.ended = true;
                    return Some(Err(Status::unavailable(
                        "the sync source is stopping; reconnect",
                    )));
                }
            }
            self.started = true;
            let snapshot = self.rx.borrow_and_update().clone();
            if !snapshot.ready {
                continue;
            }
            let text = snapshot.render(&self.selection);
            if self.last.as_deref() == Some(&*text) {
                continue;
            }
            self.metrics
                .update_lag
                .observe(snapshot.made.elapsed().as_secs_f64());
            self.metrics.sent.inc();
            self.last = Some(text.clone());
            return Some(Ok(SyncFlagsResponse {
                flag_configuration: text.to_string(),
                sync_context: None,
            }));
        }
    }
}

/// A SyncFlags stream.
pub type FlagStream = Pin<Box<dyn Stream<Item = Result<SyncFlagsResponse, Status>> + Send>>;

#[tonic::async_trait]
impl FlagSyncService for SyncService {
    type SyncFlagsStream = FlagStream;

    async fn sync_flags(
        &self,
        request: Request<SyncFlagsRequest>,
    ) -> Result<Response<FlagStream>, Status> {
        #[allow(deprecated)]
        let selection = self
            .selection(&request, &request.get_ref().selector)
            .await?;
        let Ok(permit) = self.streams.clone().try_acquire_owned() else {
            self.metrics.refuse("resource_exhausted");
            return Err(Status::resource_exhausted(
                "this sync source serves its most streams; retry later",
            ));
        };
        self.metrics.subscribers.inc();
        let state = StreamState {
            rx: self.store.subscribe(),
            stop: self.stop.clone(),
            selection,
            last: None,
            started: false,
            ended: false,
            metrics: self.metrics.clone(),
            _permit: permit,
        };
        let stream = futures_util::stream::unfold(state, |mut state| async move {
            let item = state.next().await?;
            Some((item, state))
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn fetch_all_flags(
        &self,
        request: Request<FetchAllFlagsRequest>,
    ) -> Result<Response<FetchAllFlagsResponse>, Status> {
        #[allow(deprecated)]
        let selection = self
            .selection(&request, &request.get_ref().selector)
            .await?;
        let snapshot = self.store.current();
        if !snapshot.ready {
            self.metrics.refuse("unavailable");
            return Err(Status::unavailable(
                "the sync source has not listed its flag sets yet",
            ));
        }
        Ok(Response::new(FetchAllFlagsResponse {
            flag_configuration: snapshot.render(&selection).to_string(),
        }))
    }

    async fn get_metadata(
        &self,
        _: Request<GetMetadataRequest>,
    ) -> Result<Response<GetMetadataResponse>, Status> {
        Ok(Response::new(GetMetadataResponse {
            metadata: Some(prost_types::Struct::default()),
        }))
    }
}
