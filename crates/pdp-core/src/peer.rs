//! Who is at the other end of a node-local Unix socket: the Pod whose cgroup holds the caller's process.
//! The node's components read `/proc/PID/cgroup` of a socket peer (SO_PEERCRED, in the host's PID namespace) and
//! find the Pod UID here.

/// The Pod UID in a process's cgroup paths (`/proc/PID/cgroup`): cgroupfs `.../pod<uid>/...` or systemd
/// `...-pod<uid_with_underscores>.slice/...`.
pub fn pod_uid_of_cgroup(text: &str) -> Option<String> {
    for line in text.lines() {
        let path = line.rsplit(':').next().unwrap_or("");
        for part in path.split('/') {
            let part = part.strip_suffix(".slice").unwrap_or(part);
            let Some(at) = part.rfind("pod") else {
                continue;
            };
            let uid = part[at + 3..].replace('_', "-");
            if uid.len() == 36 && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
                return Some(uid);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_uids_from_both_cgroup_drivers() {
        let uid = "3f2b8c1e-1a2b-4c3d-8e9f-0123456789ab";
        let cgroupfs = format!("0::/kubepods/besteffort/pod{uid}/0123abcd");
        let systemd = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-0a.scope",
            uid.replace('-', "_")
        );
        assert_eq!(pod_uid_of_cgroup(&cgroupfs).as_deref(), Some(uid));
        assert_eq!(pod_uid_of_cgroup(&systemd).as_deref(), Some(uid));
        assert_eq!(
            pod_uid_of_cgroup("0::/user.slice/user-0.slice/session-1.scope"),
            None
        );
    }
}
