//! Where a volume may be mounted: the target path the kubelet sends is checked before anything is created or
//! mounted there. Pure functions over strings and paths (the file system walk is in [`super::mount`]).
//!
//! The kubelet publishes an inline CSI volume at
//! `<kubelet dir>/pods/<pod uid>/volumes/kubernetes.io~csi/<volume name>/mount`; that shape, under this node's
//! kubelet directory, with no `.` or `..` component, is the only one accepted. Symbolic links along the path are
//! refused when the path is walked ([`super::mount::open_parent`]).

use std::path::{Component, Path, PathBuf};

/// Why a target path is refused (answered InvalidArgument).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadTarget {
    #[error("target path {0:?} is not absolute")]
    NotAbsolute(String),
    #[error("target path {0:?} has a '.' or '..' component, or an empty one")]
    NotNormal(String),
    #[error("target path {path:?} is not under the kubelet's pods directory {pods}")]
    Outside { path: String, pods: String },
    #[error(
        "target path {0:?} is not <pods>/<pod uid>/volumes/kubernetes.io~csi/<volume>/mount, where the kubelet publishes a CSI volume"
    )]
    Shape(String),
}

/// An accepted target: its path, and the Pod and volume it is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub path: PathBuf,
    /// The Pod's UID, as the kubelet names its directory.
    pub pod: String,
    /// The volume's name in the Pod.
    pub volume: String,
}

/// The last component of every target path: the directory mounted on.
pub const MOUNT_DIR: &str = "mount";

/// Checks a target path.
pub fn check_target(target: &str, pods_dir: &Path) -> Result<Target, BadTarget> {
    if !target.starts_with('/') {
        return Err(BadTarget::NotAbsolute(target.into()));
    }
    // Path::components drops "." and repeated slashes silently: look at the text itself.
    if target[1..]
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(BadTarget::NotNormal(target.into()));
    }
    let path = PathBuf::from(target);
    let rest = path
        .strip_prefix(pods_dir)
        .map_err(|_| BadTarget::Outside {
            path: target.into(),
            pods: pods_dir.display().to_string(),
        })?;
    let parts: Vec<&str> = rest
        .components()
        .map(|c| match c {
            Component::Normal(s) => s.to_str().unwrap_or(""),
            _ => "",
        })
        .collect();
    match parts.as_slice() {
        [uid, "volumes", "kubernetes.io~csi", name, MOUNT_DIR]
            if !uid.is_empty() && !name.is_empty() =>
        {
            Ok(Target {
                pod: uid.to_string(),
                volume: name.to_string(),
                path,
            })
        }
        _ => Err(BadTarget::Shape(target.into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PODS: &str = "/var/lib/kubelet/pods";
    const GOOD: &str = "/var/lib/kubelet/pods/0f3c/volumes/kubernetes.io~csi/pdp-socket/mount";

    #[test]
    fn only_a_csi_volume_mount_under_the_pods_dir_is_a_target() {
        let pods = Path::new(PODS);
        assert_eq!(
            check_target(GOOD, pods),
            Ok(Target {
                path: PathBuf::from(GOOD),
                pod: "0f3c".into(),
                volume: "pdp-socket".into(),
            })
        );
        let refused = [
            (
                "var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/v/mount",
                "not absolute",
            ),
            (
                "/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/v/../../../../../etc",
                "'..'",
            ),
            (
                "/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/v/./mount",
                "'.'",
            ),
            (
                "/var/lib/kubelet/pods//u/volumes/kubernetes.io~csi/v/mount",
                "empty",
            ),
            (
                "/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/v/mount/",
                "empty",
            ),
            (
                "/etc/kubernetes/volumes/kubernetes.io~csi/v/mount",
                "not under",
            ),
            (
                "/var/lib/kubelet/podsx/u/volumes/kubernetes.io~csi/v/mount",
                "not under",
            ),
            (
                "/var/lib/kubelet/pods/u/volumes/kubernetes.io~empty-dir/v/mount",
                "<pods>/<pod uid>",
            ),
            (
                "/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/v",
                "<pods>/<pod uid>",
            ),
            (
                "/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/v/mount/x",
                "<pods>/<pod uid>",
            ),
            ("/var/lib/kubelet/pods", "<pods>/<pod uid>"),
        ];
        for (target, says) in refused {
            let err = check_target(target, pods).unwrap_err().to_string();
            assert!(err.contains(says), "{target}: {err}");
        }
    }
}
