//! The CSI Identity and Node services of the plugin, and the kubelet's registration service: what each RPC
//! checks and does. A request is answered with the gRPC code the CSI spec gives its failure: a malformed or
//! refused request InvalidArgument, a missing directory of the kubelet's NotFound, a socket directory that does
//! not exist FailedPrecondition, a PDP that does not answer within the gate's bound Unavailable (the kubelet
//! retries), an operation already running on the same target Aborted, a volume beyond the bounds per Pod or per
//! node ResourceExhausted, and the unpublish of a volume this plugin did not publish PermissionDenied.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tonic::service::Routes;
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use super::gate::{self, Ready};
use super::mount::{self, Dir, WalkError};
use super::published::{Published, Refused};
use super::registration::registration_server::{Registration, RegistrationServer};
use super::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use super::target::{self, BadTarget, MOUNT_DIR, Target};
use super::v1::identity_server::{Identity, IdentityServer};
use super::v1::node_server::{Node, NodeServer};
use super::v1::volume_capability::AccessType;
use super::v1::*;

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

/// Releases a target's busy mark when the operation ends, however it ends.
struct Busy<'a> {
    set: &'a Mutex<HashSet<PathBuf>>,
    target: PathBuf,
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.set
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.target);
    }
}

fn walk_status(e: WalkError) -> Status {
    match e {
        WalkError::Missing(_) => Status::not_found(e.to_string()),
        WalkError::NotADirectory(_) => Status::invalid_argument(e.to_string()),
        WalkError::Io { .. } => Status::internal(e.to_string()),
    }
}

fn target_status(e: BadTarget) -> Status {
    Status::invalid_argument(e.to_string())
}

fn refused_status(e: Refused) -> Status {
    match e {
        Refused::Io { .. } => Status::internal(e.to_string()),
        e => Status::resource_exhausted(e.to_string()),
    }
}

fn record_status(target: &Target) -> impl FnOnce(std::io::Error) -> Status + '_ {
    move |e| Status::internal(format!("the record of {}: {e}", target.path.display()))
}

/// Drops a new record when the publish it was made for fails, however it fails.
struct Reserved<'a> {
    published: &'a Published,
    target: &'a Target,
    kept: bool,
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        if !self.kept
            && let Err(e) = self.published.remove(self.target)
        {
            warn!(target = %self.target.path.display(), error = %e, "cannot drop the record of a failed publish");
        }
    }
}

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

    fn claim(&self, target: &Path) -> Result<Busy<'_>, Status> {
        let mut busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        if !busy.insert(target.to_path_buf()) {
            return Err(Status::aborted(format!(
                "an operation on {} is already in progress",
                target.display()
            )));
        }
        Ok(Busy {
            set: &self.busy,
            target: target.to_path_buf(),
        })
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

    /// `csi.v1.Node/NodePublishVolume`: the profile's directory, bind-mounted read-only at the target, once
    /// the node's PDP answers.
    pub async fn publish(
        &self,
        request: NodePublishVolumeRequest,
    ) -> Result<NodePublishVolumeResponse, Status> {
        if request.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is empty"));
        }
        if request.target_path.is_empty() {
            return Err(Status::invalid_argument("target_path is empty"));
        }
        let capability = request
            .volume_capability
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("volume_capability is missing"))?;
        match &capability.access_type {
            Some(AccessType::Mount(m)) if m.fs_type.is_empty() && m.mount_flags.is_empty() => {}
            Some(AccessType::Mount(_)) => {
                return Err(Status::invalid_argument(
                    "a socket volume takes no fs_type and no mount flags",
                ));
            }
            Some(AccessType::Block(_)) => {
                return Err(Status::invalid_argument(
                    "a socket volume is not a block volume",
                ));
            }
            None => {
                return Err(Status::invalid_argument(
                    "volume_capability has no access type",
                ));
            }
        }
        match &capability.access_mode {
            Some(mode) if SINGLE_NODE_MODES.contains(&mode.mode) => {}
            Some(mode) => {
                return Err(Status::invalid_argument(format!(
                    "access mode {} is not served: a socket volume is for one node (SINGLE_NODE_WRITER or SINGLE_NODE_READER_ONLY)",
                    mode.mode
                )));
            }
            None => {
                return Err(Status::invalid_argument(
                    "volume_capability has no access mode",
                ));
            }
        }
        if !request.readonly {
            return Err(Status::invalid_argument(
                "the volume must be read-only: set readOnly: true on the Pod's csi volume",
            ));
        }
        if request
            .volume_context
            .get("csi.storage.k8s.io/ephemeral")
            .is_none_or(|v| v != "true")
        {
            return Err(Status::invalid_argument(
                "only inline (ephemeral) volumes are served: a Pod's spec.volumes[].csi, not a PersistentVolume",
            ));
        }
        let profile = self.profile(&request.volume_context)?.clone();
        let target = target::check_target(&request.target_path, &self.settings.pods_dir)
            .map_err(target_status)?;
        let _busy = self.claim(&target.path)?;
        let parent =
            mount::open_parent(&self.settings.pods_dir, &target.path).map_err(walk_status)?;
        let known = self
            .published
            .has(&target)
            .map_err(record_status(&target))?;
        let mounted = self
            .mounter
            .is_mounted(&parent, MOUNT_DIR)
            .map_err(walk_status)?;
        match (known, mounted) {
            (true, true) => return Ok(NodePublishVolumeResponse {}),
            (false, true) => {
                return Err(Status::failed_precondition(format!(
                    "{} is a mount point this plugin did not make: left alone",
                    target.path.display()
                )));
            }
            _ => {}
        }
        drop(parent);
        if !known {
            self.published
                .add(&target, &request.volume_id)
                .map_err(refused_status)?;
        }
        let mut reserved = Reserved {
            published: &self.published,
            target: &target,
            kept: known,
        };
        if !profile.dir.is_dir() {
            return Err(Status::failed_precondition(format!(
                "the socket directory {} of profile {} does not exist on this node (is the node's front running?)",
                profile.dir.display(),
                profile.name
            )));
        }
        let pod = format!(
            "{}/{}",
            request
                .volume_context
                .get("csi.storage.k8s.io/pod.namespace")
                .map_or("?", |s| s),
            request
                .volume_context
                .get("csi.storage.k8s.io/pod.name")
                .map_or("?", |s| s)
        );
        if let Some(ready) = &profile.ready {
            match gate::wait(
                ready,
                self.settings.ready_timeout,
                self.settings.ready_interval,
            )
            .await
            {
                Ok(waited) if waited >= self.settings.ready_interval => info!(
                    pod,
                    profile = profile.name,
                    waited_ms = waited.as_millis() as u64,
                    "the node's PDP answers: publishing after the wait"
                ),
                Ok(_) => {}
                Err(why) => {
                    warn!(
                        pod,
                        profile = profile.name,
                        reason = why,
                        "volume not published: the kubelet retries"
                    );
                    return Err(Status::unavailable(why));
                }
            }
        }
        // Walked again after the wait, and mounted through that walk's descriptors: what was checked is used.
        let parent =
            mount::open_parent(&self.settings.pods_dir, &target.path).map_err(walk_status)?;
        let created = parent.make_child(MOUNT_DIR).map_err(walk_status)?;
        if let Err(e) = self
            .mounter
            .bind_read_only(&profile.dir, &parent, MOUNT_DIR)
        {
            if created {
                let _ = parent.remove_child(MOUNT_DIR);
            }
            return Err(Status::internal(format!(
                "bind mount of {} on {}: {e}",
                profile.dir.display(),
                target.path.display()
            )));
        }
        reserved.kept = true;
        info!(
            pod,
            volume = request.volume_id,
            profile = profile.name,
            source = %profile.dir.display(),
            target = %target.path.display(),
            "published (read-only bind mount)"
        );
        Ok(NodePublishVolumeResponse {})
    }

    /// `csi.v1.Node/NodeUnpublishVolume`: unmounts and removes the target; a target already gone is success.
    pub async fn unpublish(
        &self,
        request: NodeUnpublishVolumeRequest,
    ) -> Result<NodeUnpublishVolumeResponse, Status> {
        if request.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is empty"));
        }
        if request.target_path.is_empty() {
            return Err(Status::invalid_argument("target_path is empty"));
        }
        let target = target::check_target(&request.target_path, &self.settings.pods_dir)
            .map_err(target_status)?;
        let _busy = self.claim(&target.path)?;
        let known = self
            .published
            .has(&target)
            .map_err(record_status(&target))?;
        let parent = match mount::open_parent(&self.settings.pods_dir, &target.path) {
            Ok(parent) => parent,
            // Nothing there any more: nothing to undo.
            Err(WalkError::Missing(_)) => {
                self.published
                    .remove(&target)
                    .map_err(record_status(&target))?;
                return Ok(NodeUnpublishVolumeResponse {});
            }
            Err(e) => return Err(walk_status(e)),
        };
        let there = parent
            .has(MOUNT_DIR)
            .map_err(|e| Status::internal(format!("{}: {e}", target.path.display())))?;
        if !known {
            if !there {
                return Ok(NodeUnpublishVolumeResponse {});
            }
            return Err(Status::permission_denied(format!(
                "{} was not published by this plugin (no record in {}): left untouched",
                target.path.display(),
                self.published.dir().display()
            )));
        }
        if self
            .mounter
            .is_mounted(&parent, MOUNT_DIR)
            .map_err(walk_status)?
        {
            self.mounter
                .unmount(&parent, MOUNT_DIR)
                .map_err(|e| Status::internal(format!("unmount {}: {e}", target.path.display())))?;
        }
        match parent.remove_child(MOUNT_DIR) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => {
                return Err(Status::invalid_argument(format!(
                    "{} is not a directory: left alone",
                    target.path.display()
                )));
            }
            Err(e) => {
                return Err(Status::internal(format!(
                    "remove {}: {e}",
                    target.path.display()
                )));
            }
        }
        self.published
            .remove(&target)
            .map_err(record_status(&target))?;
        info!(volume = request.volume_id, target = %target.path.display(), "unpublished");
        Ok(NodeUnpublishVolumeResponse {})
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
mod tests {
    use super::*;
    use crate::csi::v1::volume_capability::{AccessMode, BlockVolume, MountVolume};
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tonic::Code;

    /// Records mounts in memory: the request handling without root.
    #[derive(Default)]
    struct FakeMounts {
        mounted: Mutex<HashSet<PathBuf>>,
        binds: AtomicUsize,
    }

    impl Mounter for Arc<FakeMounts> {
        fn is_mounted(&self, parent: &Dir, name: &str) -> Result<bool, WalkError> {
            Ok(self
                .mounted
                .lock()
                .unwrap()
                .contains(&parent.path().join(name)))
        }
        fn bind_read_only(&self, _: &Path, parent: &Dir, name: &str) -> std::io::Result<()> {
            self.binds.fetch_add(1, Ordering::SeqCst);
            self.mounted
                .lock()
                .unwrap()
                .insert(parent.path().join(name));
            Ok(())
        }
        fn unmount(&self, parent: &Dir, name: &str) -> std::io::Result<()> {
            self.mounted
                .lock()
                .unwrap()
                .remove(&parent.path().join(name));
            Ok(())
        }
    }

    struct Fixture {
        root: PathBuf,
        mounts: Arc<FakeMounts>,
        plugin: Plugin,
    }

    impl Drop for Fixture {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }

    fn fixture(name: &str) -> Fixture {
        let root = std::env::temp_dir().join(format!("pdp-csi-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("kubelet/pods/uid1/volumes/kubernetes.io~csi/pdp"))
            .unwrap();
        std::fs::create_dir_all(root.join("cerbos")).unwrap();
        let mounts = Arc::new(FakeMounts::default());
        let settings = Settings {
            driver: "csi.pdp-injector.io".into(),
            node_id: "node-1".into(),
            pods_dir: root.join("kubelet/pods"),
            profiles: vec![
                Profile {
                    name: "cerbos".into(),
                    dir: root.join("cerbos"),
                    ready: None,
                },
                Profile {
                    name: "flagd".into(),
                    dir: root.join("flagd-missing"),
                    ready: None,
                },
            ],
            ready_timeout: Duration::from_millis(200),
            ready_interval: Duration::from_millis(20),
            endpoint: root.join("kubelet/plugins/csi.pdp-injector.io/csi.sock"),
            state_dir: root.join("state"),
            max_volumes_per_pod: 4,
            max_volumes_per_node: 1024,
        };
        let plugin = Plugin::new(settings, Box::new(mounts.clone()));
        Fixture {
            root,
            mounts,
            plugin,
        }
    }

    impl Fixture {
        fn target(&self) -> String {
            self.root
                .join("kubelet/pods/uid1/volumes/kubernetes.io~csi/pdp/mount")
                .display()
                .to_string()
        }
    }

    fn request(target: &str) -> NodePublishVolumeRequest {
        NodePublishVolumeRequest {
            volume_id: "csi-abc".into(),
            target_path: target.into(),
            volume_capability: Some(VolumeCapability {
                access_type: Some(AccessType::Mount(MountVolume::default())),
                access_mode: Some(AccessMode { mode: 1 }),
            }),
            readonly: true,
            volume_context: HashMap::from([
                (
                    "csi.storage.k8s.io/ephemeral".to_string(),
                    "true".to_string(),
                ),
                ("csi.storage.k8s.io/pod.name".to_string(), "app".to_string()),
            ]),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn publish_and_unpublish_are_idempotent() {
        let f = fixture("idem");
        let target = f.target();
        f.plugin.publish(request(&target)).await.unwrap();
        assert!(
            Path::new(&target).is_dir(),
            "the target directory is created"
        );
        f.plugin.publish(request(&target)).await.unwrap();
        assert_eq!(
            f.mounts.binds.load(Ordering::SeqCst),
            1,
            "published once, answered twice"
        );
        let unpublish = NodeUnpublishVolumeRequest {
            volume_id: "csi-abc".into(),
            target_path: target.clone(),
        };
        f.plugin.unpublish(unpublish.clone()).await.unwrap();
        assert!(
            !Path::new(&target).exists(),
            "the target directory is removed"
        );
        assert!(f.mounts.mounted.lock().unwrap().is_empty());
        f.plugin.unpublish(unpublish.clone()).await.unwrap();
        // The whole Pod directory gone (the kubelet removed it): still success.
        std::fs::remove_dir_all(f.root.join("kubelet/pods/uid1")).unwrap();
        f.plugin.unpublish(unpublish).await.unwrap();
    }

    #[tokio::test]
    async fn bad_requests_get_their_grpc_codes() {
        let f = fixture("codes");
        let target = f.target();
        let code = |r: Result<NodePublishVolumeResponse, Status>| {
            r.map(|_| ())
                .map_err(|s| (s.code(), s.message().to_string()))
        };
        type Change = Box<dyn Fn(&mut NodePublishVolumeRequest)>;
        let cases: Vec<(Change, Code, &str)> = vec![
            (
                Box::new(|r| r.volume_id.clear()),
                Code::InvalidArgument,
                "volume_id",
            ),
            (
                Box::new(|r| r.target_path.clear()),
                Code::InvalidArgument,
                "target_path",
            ),
            (
                Box::new(|r| r.volume_capability = None),
                Code::InvalidArgument,
                "volume_capability",
            ),
            (
                Box::new(|r| {
                    r.volume_capability.as_mut().unwrap().access_type =
                        Some(AccessType::Block(BlockVolume {}))
                }),
                Code::InvalidArgument,
                "block",
            ),
            (
                Box::new(|r| {
                    r.volume_capability.as_mut().unwrap().access_type =
                        Some(AccessType::Mount(MountVolume {
                            fs_type: "ext4".into(),
                            ..Default::default()
                        }))
                }),
                Code::InvalidArgument,
                "fs_type",
            ),
            (
                Box::new(|r| {
                    r.volume_capability.as_mut().unwrap().access_mode = Some(AccessMode { mode: 5 })
                }),
                Code::InvalidArgument,
                "access mode 5",
            ),
            (
                Box::new(|r| r.readonly = false),
                Code::InvalidArgument,
                "readOnly: true",
            ),
            (
                Box::new(|r| {
                    r.volume_context.remove("csi.storage.k8s.io/ephemeral");
                }),
                Code::InvalidArgument,
                "inline",
            ),
            // A path is never taken from the request: an attribute naming one is refused.
            (
                Box::new(|r| {
                    r.volume_context.insert("dir".into(), "/etc".into());
                }),
                Code::InvalidArgument,
                "\"dir\" is not known",
            ),
            (
                Box::new(|r| {
                    r.volume_context.insert("profile".into(), "../etc".into());
                }),
                Code::InvalidArgument,
                "names no profile",
            ),
            (
                Box::new(|r| {
                    r.target_path = "/etc/kubernetes/volumes/kubernetes.io~csi/x/mount".into()
                }),
                Code::InvalidArgument,
                "not under",
            ),
            (
                Box::new(|r| r.target_path.push_str("/../../../../../../../etc")),
                Code::InvalidArgument,
                "'..'",
            ),
            (
                Box::new(|r| {
                    r.target_path = r.target_path.replace("uid1", "uid-missing");
                }),
                Code::NotFound,
                "does not exist",
            ),
            (
                Box::new(|r| {
                    r.volume_context.insert("profile".into(), "flagd".into());
                }),
                Code::FailedPrecondition,
                "flagd-missing",
            ),
        ];
        for (change, want, says) in cases {
            let mut r = request(&target);
            change(&mut r);
            let (got, message) = code(f.plugin.publish(r).await).unwrap_err();
            assert_eq!(got, want, "{says}: {message}");
            assert!(message.contains(says), "{says}: {message}");
        }
        assert_eq!(
            f.mounts.binds.load(Ordering::SeqCst),
            0,
            "no refused request mounted anything"
        );
        assert!(
            !Path::new(&target).exists(),
            "no refused request created the target"
        );
        // The named default profile is accepted like the implicit one.
        let mut r = request(&target);
        r.volume_context.insert("profile".into(), "cerbos".into());
        f.plugin.publish(r).await.unwrap();
    }

    #[tokio::test]
    async fn a_symbolic_link_on_the_way_to_the_target_is_refused() {
        let f = fixture("link");
        // The volume's directory replaced by a link to somewhere else on the node.
        let volume = f
            .root
            .join("kubelet/pods/uid1/volumes/kubernetes.io~csi/pdp");
        std::fs::remove_dir(&volume).unwrap();
        std::fs::create_dir_all(f.root.join("elsewhere")).unwrap();
        std::os::unix::fs::symlink(f.root.join("elsewhere"), &volume).unwrap();
        let err = f.plugin.publish(request(&f.target())).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert!(err.message().contains("symbolic link"), "{err:?}");
        assert!(
            !f.root.join("elsewhere/mount").exists(),
            "nothing created through the link"
        );
        // The target itself a link.
        std::fs::remove_file(&volume).unwrap();
        std::fs::create_dir(&volume).unwrap();
        std::os::unix::fs::symlink(f.root.join("elsewhere"), volume.join("mount")).unwrap();
        let err = f.plugin.publish(request(&f.target())).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert_eq!(f.mounts.binds.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn the_gate_holds_the_volume_until_the_pdp_answers_and_fails_past_its_bound() {
        let mut f = fixture("gate");
        let socket = f.root.join("cerbos/cerbos.sock");
        f.plugin.settings.profiles[0].ready = Some(Ready {
            socket: socket.clone(),
            path: "/_cerbos/health".into(),
        });
        // Nothing answers: Unavailable after the bound, nothing mounted.
        let err = f.plugin.publish(request(&f.target())).await.unwrap_err();
        assert_eq!(err.code(), Code::Unavailable, "{err:?}");
        assert!(err.message().contains("did not answer"), "{err:?}");
        assert_eq!(f.mounts.binds.load(Ordering::SeqCst), 0);
        // A PDP that answers 503 first, then 200: published after the second answer.
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let answered = Arc::new(AtomicUsize::new(0));
        let count = answered.clone();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            while let Ok((mut s, _)) = listener.accept().await {
                let mut buf = [0u8; 256];
                let _ = s.read(&mut buf).await;
                let status = if count.fetch_add(1, Ordering::SeqCst) == 0 {
                    "503 Service Unavailable"
                } else {
                    "200 OK"
                };
                let _ = s
                    .write_all(format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n").as_bytes())
                    .await;
            }
        });
        f.plugin.settings.ready_timeout = Duration::from_secs(5);
        f.plugin.publish(request(&f.target())).await.unwrap();
        assert_eq!(answered.load(Ordering::SeqCst), 2);
        assert_eq!(f.mounts.binds.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn registration_names_the_csi_socket_and_a_version_the_kubelet_speaks() {
        let f = fixture("reg");
        let info = f.plugin.info();
        assert_eq!(info.r#type, "CSIPlugin");
        assert_eq!(info.name, "csi.pdp-injector.io");
        assert!(
            info.endpoint
                .ends_with("kubelet/plugins/csi.pdp-injector.io/csi.sock")
        );
        assert_eq!(info.supported_versions, vec!["1.0.0".to_string()]);
        assert_eq!(f.plugin.node_info().node_id, "node-1");
        // The flagd profile's directory is missing: not ready.
        assert_eq!(f.plugin.probe().ready, Some(false));
    }
}
