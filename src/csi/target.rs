//! Where a volume may be mounted: the target path the kubelet sends is checked before anything is created or
//! mounted there. Pure functions over strings and paths (the file system walk is in [`super::mount`]).
//!
//! The kubelet publishes an inline CSI volume at
//! `<kubelet dir>/pods/<pod uid>/volumes/kubernetes.io~csi/<volume name>/mount`; that shape, under this node's
//! kubelet directory, with no `.` or `..` component, is the only one accepted. Symbolic links along the path are
//! refused when the path is walked ([`super::mount::walk_to_parent`]).

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

/// Checks a target path; returns it as a path.
pub fn check_target(target: &str, pods_dir: &Path) -> Result<PathBuf, BadTarget> {
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
        [uid, "volumes", "kubernetes.io~csi", name, "mount"]
            if !uid.is_empty() && !name.is_empty() =>
        {
            Ok(path)
        }
        _ => Err(BadTarget::Shape(target.into())),
    }
}

/// Whether `target` is a mount point in a `/proc/self/mountinfo` text (field 5 is the mount point, with
/// space, tab, newline and backslash written as octal escapes).
pub fn mounted_at(mountinfo: &str, target: &Path) -> bool {
    let Some(target) = target.to_str() else {
        return false;
    };
    mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .any(|point| unescape(point) == target)
}

fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let value =
                (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(value);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PODS: &str = "/var/lib/kubelet/pods";
    const GOOD: &str = "/var/lib/kubelet/pods/0f3c/volumes/kubernetes.io~csi/pdp-socket/mount";

    #[test]
    fn only_a_csi_volume_mount_under_the_pods_dir_is_a_target() {
        let pods = Path::new(PODS);
        assert_eq!(check_target(GOOD, pods), Ok(PathBuf::from(GOOD)));
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

    #[test]
    fn a_mount_point_is_found_in_mountinfo_with_its_escapes() {
        let info = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
98 22 0:5 /cerbos /var/lib/kubelet/pods/0f3c/volumes/kubernetes.io~csi/pdp-socket/mount ro,nosuid,nodev,noexec shared:2 - tmpfs tmpfs rw
99 22 0:5 /cerbos /var/lib/kubelet/pods/a\\040b/volumes/kubernetes.io~csi/v/mount ro - tmpfs tmpfs rw
";
        assert!(mounted_at(info, Path::new(GOOD)));
        assert!(mounted_at(
            info,
            Path::new("/var/lib/kubelet/pods/a b/volumes/kubernetes.io~csi/v/mount")
        ));
        assert!(!mounted_at(info, Path::new("/var/lib/kubelet/pods/0f3c")));
        assert!(!mounted_at("", Path::new(GOOD)));
    }
}
