//! The CSI Identity and Node services of the plugin, and the kubelet's registration service: what each RPC
//! checks and does. A request is answered with the gRPC code the CSI spec gives its failure: a malformed or
//! refused request InvalidArgument, a missing directory of the kubelet's NotFound, a socket directory that does
//! not exist FailedPrecondition, a PDP that does not answer within the gate's bound Unavailable (the kubelet
//! retries), an operation already running on the same target Aborted, a volume beyond the bounds per Pod or per
//! node ResourceExhausted, and the unpublish of a volume this plugin did not publish PermissionDenied.

mod publish;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tonic::service::Routes;
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use super::gate::Ready;
use super::mount::{self, Dir, WalkError};
use super::published::Published;
use super::registration::registration_server::{Registration, RegistrationServer};
use super::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use super::v1::identity_server::{Identity, IdentityServer};
use super::v1::node_server::{Node, NodeServer};
use crate::v1::{
    GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest,
    GetPluginInfoResponse, NodeGetCapabilitiesRequest, NodeGetCapabilitiesResponse,
    NodeGetInfoRequest, NodeGetInfoResponse, NodePublishVolumeRequest, NodePublishVolumeResponse,
    NodeUnpublishVolumeRequest, NodeUnpublishVolumeResponse, ProbeRequest, ProbeResponse,
};

/// The volume attribute that names a profile; the only attribute a Pod may set.
pub const PROFILE_ATTRIBUTE: &str = "profile";

/// Attributes the kubelet adds (podInfoOnMount, the ephemeral marker): read, never chosen by the Pod author.
const KUBELET_PREFIX: &str = "csi.storage.k8s.io/";

/// `csi.v1.VolumeCapability.AccessMode.Mode` values a socket volume accepts: one node, read-only or writer
/// (the kubelet sends SINGLE_NODE_WRITER for an inline volume whatever its readOnly; the mount is read-only
/// regardless).
const SINGLE_NODE_MODES: [i32; 2] = [1, 2];

/// A socket directory the admin configured, which volumes may name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    /// Its name (the `profile` volume attribute; the first profile is the default).
    pub name: String,
    /// The node's directory mounted into the Pod (the front's stable socket is in it).
    pub dir: PathBuf,
    /// The gate: what must answer before a volume of this profile is published (none: no gate).
    pub ready: Option<Ready>,
}

/// The plugin's settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The CSI driver name.
    pub driver: String,
    /// This node's name (NodeGetInfo).
    pub node_id: String,
    /// The kubelet's pods directory (`<kubelet dir>/pods`).
    pub pods_dir: PathBuf,
    /// The profiles, the default first.
    pub profiles: Vec<Profile>,
    /// Bound of the gate.
    pub ready_timeout: Duration,
    /// How often the gate asks again.
    pub ready_interval: Duration,
    /// The CSI socket as the kubelet dials it (PluginInfo.endpoint).
    pub endpoint: PathBuf,
    /// Where the records of published volumes are kept ([`super::published`]).
    pub state_dir: PathBuf,
    /// The most volumes of this driver one Pod may have.
    pub max_volumes_per_pod: usize,
    /// The most volumes of this driver the node may have.
    pub max_volumes_per_node: usize,
}

/// The plugin: its settings and the targets with an operation in progress.
pub struct Plugin {
    settings: Settings,
    busy: Mutex<HashSet<PathBuf>>,
    /// What this plugin published: what it may unpublish, and what counts against the bounds.
    published: Published,
    /// How a published volume is mounted (a fake in unit tests run without root).
    mounter: Box<dyn Mounter>,
}

/// The mount operations on the directory `name` of a target's parent, behind a trait so that the request
/// handling is tested without root.
pub trait Mounter: Send + Sync {
    fn is_mounted(&self, parent: &Dir, name: &str) -> Result<bool, WalkError>;
    fn bind_read_only(&self, source: &Path, parent: &Dir, name: &str) -> std::io::Result<()>;
    fn unmount(&self, parent: &Dir, name: &str) -> std::io::Result<()>;
}

/// The real mounts ([`super::mount`]).
pub struct SystemMounter;

impl Mounter for SystemMounter {
    fn is_mounted(&self, parent: &Dir, name: &str) -> Result<bool, WalkError> {
        parent.is_mount_point(name)
    }
    fn bind_read_only(&self, source: &Path, parent: &Dir, name: &str) -> std::io::Result<()> {
        mount::bind_read_only(source, parent, name)
    }
    fn unmount(&self, parent: &Dir, name: &str) -> std::io::Result<()> {
        mount::unmount(parent, name)
    }
}

/// The CSI version the kubelet is told this plugin speaks.
pub const CSI_VERSIONS: [&str; 1] = ["1.0.0"];

impl Plugin {
    /// A plugin with the given mounts.
    pub fn new(settings: Settings, mounter: Box<dyn Mounter>) -> Plugin {
        Plugin {
            published: Published::new(
                settings.state_dir.clone(),
                settings.pods_dir.clone(),
                settings.max_volumes_per_pod,
                settings.max_volumes_per_node,
            ),
            settings,
            busy: Mutex::new(HashSet::new()),
            mounter,
        }
    }

    /// The settings in force.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// `pluginregistration.Registration/GetInfo`.
    pub fn info(&self) -> PluginInfo {
        PluginInfo {
            r#type: "CSIPlugin".into(),
            name: self.settings.driver.clone(),
            endpoint: self.settings.endpoint.display().to_string(),
            supported_versions: CSI_VERSIONS.iter().map(|v| v.to_string()).collect(),
        }
    }

    /// `pluginregistration.Registration/NotifyRegistrationStatus`.
    pub fn registration_status(&self, status: RegistrationStatus) -> RegistrationStatusResponse {
        if status.plugin_registered {
            info!(driver = self.settings.driver, "registered with the kubelet");
        } else {
            warn!(
                driver = self.settings.driver,
                error = status.error,
                "the kubelet refused the registration"
            );
        }
        RegistrationStatusResponse {}
    }

    /// `csi.v1.Identity/GetPluginInfo`.
    pub fn plugin_info(&self) -> GetPluginInfoResponse {
        GetPluginInfoResponse {
            name: self.settings.driver.clone(),
            vendor_version: env!("CARGO_PKG_VERSION").into(),
            manifest: Default::default(),
        }
    }

    /// `csi.v1.Identity/Probe`: ready when every profile's directory exists (the gate is per volume).
    pub fn probe(&self) -> ProbeResponse {
        let ready = self.settings.profiles.iter().all(|p| p.dir.is_dir());
        ProbeResponse { ready: Some(ready) }
    }

    /// `csi.v1.Node/NodeGetInfo`.
    pub fn node_info(&self) -> NodeGetInfoResponse {
        NodeGetInfoResponse {
            node_id: self.settings.node_id.clone(),
            max_volumes_per_node: 0,
            accessible_topology: None,
        }
    }

    fn profile(
        &self,
        context: &std::collections::HashMap<String, String>,
    ) -> Result<&Profile, Status> {
        for key in context.keys() {
            if key != PROFILE_ATTRIBUTE && !key.starts_with(KUBELET_PREFIX) {
                return Err(Status::invalid_argument(format!(
                    "volume attribute {key:?} is not known: only {PROFILE_ATTRIBUTE:?} (a profile name: {})",
                    self.profile_names()
                )));
            }
        }
        match context.get(PROFILE_ATTRIBUTE) {
            None => self
                .settings
                .profiles
                .first()
                .ok_or_else(|| Status::failed_precondition("the plugin has no profile")),
            Some(name) => self
                .settings
                .profiles
                .iter()
                .find(|p| &p.name == name)
                .ok_or_else(|| {
                    Status::invalid_argument(format!(
                        "volume attribute {PROFILE_ATTRIBUTE}={name:?} names no profile of this driver: {}",
                        self.profile_names()
                    ))
                }),
        }
    }

    fn profile_names(&self) -> String {
        let names: Vec<&str> = self
            .settings
            .profiles
            .iter()
            .map(|p| p.name.as_str())
            .collect();
        names.join(", ")
    }
}

/// The routes of the CSI socket: Identity and Node.
pub fn csi_routes(plugin: Arc<Plugin>) -> Routes {
    Routes::new(IdentityServer::from_arc(plugin.clone())).add_service(NodeServer::from_arc(plugin))
}

/// The routes of the registration socket.
pub fn registration_routes(plugin: Arc<Plugin>) -> Routes {
    Routes::new(RegistrationServer::from_arc(plugin))
}

type Answer<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl Registration for Plugin {
    async fn get_info(&self, _: Request<InfoRequest>) -> Answer<PluginInfo> {
        Ok(Response::new(self.info()))
    }
    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Answer<RegistrationStatusResponse> {
        Ok(Response::new(
            self.registration_status(request.into_inner()),
        ))
    }
}

/// A node-only plugin has no plugin capabilities (no controller service, no topology).
#[tonic::async_trait]
impl Identity for Plugin {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Answer<GetPluginInfoResponse> {
        Ok(Response::new(self.plugin_info()))
    }
    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Answer<GetPluginCapabilitiesResponse> {
        Ok(Response::new(GetPluginCapabilitiesResponse::default()))
    }
    async fn probe(&self, _: Request<ProbeRequest>) -> Answer<ProbeResponse> {
        Ok(Response::new(Plugin::probe(self)))
    }
}

/// No STAGE_UNSTAGE_VOLUME (publish does everything) and no stats: no node capabilities; the methods not
/// written here answer Unimplemented.
#[tonic::async_trait]
impl Node for Plugin {
    async fn node_get_info(&self, _: Request<NodeGetInfoRequest>) -> Answer<NodeGetInfoResponse> {
        Ok(Response::new(self.node_info()))
    }
    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Answer<NodeGetCapabilitiesResponse> {
        Ok(Response::new(NodeGetCapabilitiesResponse::default()))
    }
    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Answer<NodePublishVolumeResponse> {
        self.publish(request.into_inner()).await.map(Response::new)
    }
    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Answer<NodeUnpublishVolumeResponse> {
        self.unpublish(request.into_inner())
            .await
            .map(Response::new)
    }
}

#[cfg(test)]
mod tests;
