//! The CSI node plugin (`pdp-injector csi-node`, driver `csi.pdp-injector.io`): delivers the node's PDP socket
//! directory to app Pods as a read-only CSI inline volume, which every Pod Security level allows (a hostPath
//! only `privileged` does), and holds each such Pod until its node's PDP answers.
//!
//! - It registers itself with the kubelet: a `pluginregistration` v1 socket in the kubelet's
//!   `plugins_registry` directory (what node-driver-registrar does, served here, so the node needs no other
//!   image), whose `GetInfo` names the CSI socket;
//! - on the CSI socket it serves Identity (GetPluginInfo, GetPluginCapabilities, Probe) and Node (NodeGetInfo,
//!   NodeGetCapabilities, NodePublishVolume, NodeUnpublishVolume; the rest is Unimplemented);
//! - `NodePublishVolume` bind-mounts an admin-configured directory (a `--profile`, by default Cerbos's
//!   `/var/run/cerbos`) read-only at the target path, once the node's PDP answers through the front
//!   ([`gate`]). Nothing in the request chooses the source: the only volume attribute is `profile`, a name;
//! - only the kubelet is served (the caller's uid from `SO_PEERCRED` must be 0, or the plugin's own), at most
//!   `--max-volumes-per-pod` and `--max-volumes-per-node` volumes are published, and only what this plugin
//!   published (its records, [`published`]) is unpublished.
//!
//! **gRPC: tonic, messages hand-written with prost's derive, no code generation.** The plugin serves ten small
//! unary RPCs. Generating code at build time needs `protoc` (not on a fresh CI machine) or a pure-Rust compiler
//! (protox: a second protobuf stack in the cold build), and a checked-in generated file needs a regeneration
//! script and a check that it matches; the handful of messages written out in [`proto`] (only the fields used;
//! unknown fields are skipped on decode) and a path router in [`grpc`] cost neither. What it adds to a cold
//! build: tonic (server only, no TLS, no router), tonic-prost, prost and prost-derive, tokio-stream, rustix and
//! linux-raw-sys; hyper, h2, tower and axum's dependencies were in the tree already (BENCHMARKS.md has the
//! figure).
//!
//! The files: [`proto`] (messages), [`grpc`] (routing and serving), [`authority`] (the kubelet's `:authority`,
//! mended before h2 reads it), [`node`] (the RPCs), [`target`] (which
//! target paths are accepted; pure), [`mount`] (the walk and the read-only bind mount), [`published`] (the
//! records of published volumes), [`gate`] (the wait for the node's PDP).

pub mod authority;
pub mod gate;
pub mod grpc;
pub mod mount;
pub mod node;
pub mod proto;
pub mod published;
pub mod target;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use crate::duration::duration_flag;
use node::{Plugin, Profile, Settings};

/// The driver name (shared/SPEC.md; the CSIDriver object and the injector's volumes use it).
pub const DRIVER: &str = "csi.pdp-injector.io";

/// The flags of `csi-node`.
#[derive(Debug, Clone, clap::Args)]
pub struct CsiNodeFlags {
    /// This node's name (NodeGetInfo's node_id); the DaemonSet passes spec.nodeName.
    #[arg(long, env = "NODE_NAME")]
    pub node_id: String,
    /// The CSI driver name.
    #[arg(long, env = "PDP_CSI_DRIVER", default_value = DRIVER)]
    pub driver: String,
    /// The kubelet's root directory (its --root-dir), at the same path in this container as on the node: target paths are accepted only under <this>/pods, and the sockets are <this>/plugins/<driver>/csi.sock and <this>/plugins_registry/<driver>-reg.sock.
    #[arg(long, env = "PDP_CSI_KUBELET_DIR", default_value = "/var/lib/kubelet")]
    pub kubelet_dir: PathBuf,
    /// A socket directory volumes may name (repeatable; the first is the default): comma-separated name=NAME, dir=DIR (the node's directory, mounted read-only into Pods), and optionally ready-socket=FILE and ready-path=PATH (the start-up gate: GET PATH over DIR/FILE must answer 200 before a volume is published).
    #[arg(long = "profile", env = "PDP_CSI_PROFILES", value_delimiter = ';', value_parser = profile_flag,
          default_value = "name=cerbos,dir=/var/run/cerbos,ready-socket=cerbos.sock,ready-path=/_cerbos/health")]
    pub profiles: Vec<Profile>,
    /// Bound of the start-up gate: past it NodePublishVolume fails (Unavailable) and the kubelet retries.
    #[arg(long, env = "PDP_CSI_READY_TIMEOUT", default_value = "60s", value_parser = duration_flag)]
    pub ready_timeout: Duration,
    /// How often the gate asks the node's PDP again.
    #[arg(long, env = "PDP_CSI_READY_INTERVAL", default_value = "250ms", value_parser = duration_flag)]
    pub ready_interval: Duration,
    /// The most volumes of this driver one Pod may have (one per profile is what the injector adds); beyond, NodePublishVolume fails (ResourceExhausted).
    #[arg(long, env = "PDP_CSI_MAX_VOLUMES_PER_POD", default_value_t = 4)]
    pub max_volumes_per_pod: usize,
    /// The most volumes of this driver the node may have, published or being published; beyond, NodePublishVolume fails (ResourceExhausted).
    #[arg(long, env = "PDP_CSI_MAX_VOLUMES_PER_NODE", default_value_t = 1024)]
    pub max_volumes_per_node: usize,
}

/// Parses a `--profile` value.
pub fn profile_flag(text: &str) -> Result<Profile, String> {
    let (mut name, mut dir, mut socket, mut path) = (None, None, None, None);
    for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (key, value) = item
            .split_once('=')
            .ok_or_else(|| format!("profile item {item:?} is not key=value"))?;
        let slot = match key {
            "name" => &mut name,
            "dir" => &mut dir,
            "ready-socket" => &mut socket,
            "ready-path" => &mut path,
            _ => {
                return Err(format!(
                    "unknown profile key {key:?}: name, dir, ready-socket, ready-path"
                ));
            }
        };
        if slot.replace(value.to_string()).is_some() {
            return Err(format!("profile key {key:?} given twice"));
        }
    }
    let name = name.ok_or("a profile needs name=NAME")?;
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        return Err(format!(
            "profile name {name:?}: letters, digits and '-' only"
        ));
    }
    let dir = PathBuf::from(dir.ok_or("a profile needs dir=DIR")?);
    if !dir.is_absolute()
        || dir.components().any(|c| {
            !matches!(
                c,
                std::path::Component::Normal(_) | std::path::Component::RootDir
            )
        })
    {
        return Err(format!(
            "profile dir {}: an absolute path without '.' or '..'",
            dir.display()
        ));
    }
    let ready = match (socket, path) {
        (None, None) => None,
        (Some(socket), Some(path)) => {
            if socket.is_empty() || socket.contains('/') {
                return Err(format!("ready-socket {socket:?}: a file name in dir"));
            }
            if !path.starts_with('/') || path.contains(char::is_whitespace) {
                return Err(format!(
                    "ready-path {path:?}: an HTTP path such as /_cerbos/health"
                ));
            }
            Some(gate::Ready {
                socket: dir.join(socket),
                path,
            })
        }
        _ => return Err("ready-socket and ready-path go together".into()),
    };
    Ok(Profile { name, dir, ready })
}

impl CsiNodeFlags {
    /// The CSI socket.
    pub fn csi_socket(&self) -> PathBuf {
        self.kubelet_dir
            .join("plugins")
            .join(&self.driver)
            .join("csi.sock")
    }

    /// Where the records of published volumes are kept: next to the CSI socket, on the node.
    pub fn state_dir(&self) -> PathBuf {
        self.kubelet_dir
            .join("plugins")
            .join(&self.driver)
            .join("published")
    }

    /// The registration socket the kubelet's plugin watcher finds.
    pub fn registration_socket(&self) -> PathBuf {
        self.kubelet_dir
            .join("plugins_registry")
            .join(format!("{}-reg.sock", self.driver))
    }

    /// The plugin's settings.
    pub fn settings(&self) -> Result<Settings, String> {
        if self.node_id.is_empty() {
            return Err("--node-id (NODE_NAME) is empty".into());
        }
        let mut names = std::collections::HashSet::new();
        for p in &self.profiles {
            if !names.insert(&p.name) {
                return Err(format!("profile {} given twice", p.name));
            }
        }
        if self.ready_interval.is_zero() || self.ready_timeout.is_zero() {
            return Err("--ready-timeout and --ready-interval must be more than 0s".into());
        }
        if self.max_volumes_per_pod == 0 || self.max_volumes_per_node == 0 {
            return Err(
                "--max-volumes-per-pod and --max-volumes-per-node must be at least 1".into(),
            );
        }
        Ok(Settings {
            driver: self.driver.clone(),
            node_id: self.node_id.clone(),
            pods_dir: self.kubelet_dir.join("pods"),
            profiles: self.profiles.clone(),
            ready_timeout: self.ready_timeout,
            ready_interval: self.ready_interval,
            endpoint: self.csi_socket(),
            state_dir: self.state_dir(),
            max_volumes_per_pod: self.max_volumes_per_pod,
            max_volumes_per_node: self.max_volumes_per_node,
        })
    }
}

/// Runs the plugin until `stop` resolves: the CSI socket first, then the registration socket (the kubelet
/// dials the CSI socket as soon as it sees the registration); the registration socket is removed at the end,
/// so the kubelet stops using the driver until the next start registers it again. Mounts already made stay:
/// they belong to the node, not to this process.
pub async fn run(
    flags: CsiNodeFlags,
    stop: impl std::future::Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    let settings = flags.settings().map_err(anyhow::Error::msg)?;
    let plugin = Arc::new(Plugin::new(settings, Box::new(node::SystemMounter)));
    let csi_path = flags.csi_socket();
    let reg_path = flags.registration_socket();
    let csi = grpc::bind(&csi_path)
        .map_err(|e| anyhow::anyhow!("CSI socket {}: {e}", csi_path.display()))?;
    let reg = grpc::bind(&reg_path)
        .map_err(|e| anyhow::anyhow!("registration socket {}: {e}", reg_path.display()))?;
    let (tx, rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let csi_task = tokio::spawn(grpc::serve(
        csi,
        node::csi_routes(plugin.clone()),
        stopped(rx.clone()),
    ));
    let reg_task = tokio::spawn(grpc::serve(
        reg,
        node::registration_routes(plugin.clone()),
        stopped(rx),
    ));
    info!(
        driver = flags.driver,
        node = flags.node_id,
        csi = %csi_path.display(),
        registration = %reg_path.display(),
        profiles = ?plugin.settings().profiles,
        "csi-node serving"
    );
    stop.await;
    let _ = tx.send(true);
    if let Err(e) = std::fs::remove_file(&reg_path) {
        warn!(registration = %reg_path.display(), error = %e, "cannot remove the registration socket");
    }
    for task in [csi_task, reg_task] {
        match task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(error = %e, "a gRPC server ended with an error"),
            Err(e) => warn!(error = %e, "a gRPC server task failed"),
        }
    }
    info!("csi-node stopped");
    Ok(())
}
