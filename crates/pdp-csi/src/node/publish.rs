//! Publishing and unpublishing a volume: the checks of a request, the record of the volume, the bind mount and
//! the wait for the node's PDP, each undone when a later step fails.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use tonic::Status;
use tracing::{info, warn};

use super::{Plugin, SINGLE_NODE_MODES};
use crate::gate;
use crate::mount::{self, WalkError};
use crate::published::{Published, Refused};
use crate::target::{self, BadTarget, MOUNT_DIR, Target};
use crate::v1::volume_capability::AccessType;
use crate::v1::{
    NodePublishVolumeRequest, NodePublishVolumeResponse, NodeUnpublishVolumeRequest,
    NodeUnpublishVolumeResponse,
};

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
