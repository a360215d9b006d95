//! The file system side of publishing: walking the target's parents without following a link, and the
//! read-only bind mount, with rustix's safe `mount(2)` wrappers (the crate forbids unsafe code).
//!
//! The mount is made on `/proc/self/fd/N` of a directory opened with `O_PATH | O_NOFOLLOW`, as runc does: the
//! directory checked is the directory mounted on, even if a path component were swapped in between. A bind
//! mount ignores `MS_RDONLY` in the call that creates it, so it is made read-only by a second call, a remount
//! of the new mount (`MS_REMOUNT | MS_BIND | MS_RDONLY`, with nosuid, nodev, noexec), on a descriptor opened
//! after the bind (it names the new mount's root, never the kubelet's file system below it).

use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use rustix::mount::{MountFlags, UnmountFlags};
use std::os::unix::fs::OpenOptionsExt;

/// Why the target's directories cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum WalkError {
    /// A directory the kubelet should have created is missing (answered NotFound).
    #[error("{0} does not exist (the kubelet creates the volume's directory before publishing)")]
    Missing(PathBuf),
    /// A component is a symbolic link or not a directory (answered InvalidArgument).
    #[error("{0} is a symbolic link or not a directory: the target path must be real directories")]
    NotADirectory(PathBuf),
    /// Another error reading the file system (answered Internal).
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

/// Checks every directory from `pods_dir` (excluded: the kubelet's own) down to the target's parent with
/// `symlink_metadata`: each must exist and be a directory, not a link.
pub fn walk_to_parent(pods_dir: &Path, target: &Path) -> Result<(), WalkError> {
    let Some(parent) = target.parent() else {
        return Err(WalkError::NotADirectory(target.to_path_buf()));
    };
    let Ok(below) = parent.strip_prefix(pods_dir) else {
        return Err(WalkError::NotADirectory(parent.to_path_buf()));
    };
    let mut at = pods_dir.to_path_buf();
    for part in below.components() {
        at.push(part);
        match std::fs::symlink_metadata(&at) {
            Ok(meta) if meta.file_type().is_dir() => {}
            Ok(_) => return Err(WalkError::NotADirectory(at)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(WalkError::Missing(at)),
            Err(source) => return Err(WalkError::Io { path: at, source }),
        }
    }
    Ok(())
}

/// Creates the target directory (mode 0750) unless it exists; an existing one must be a real directory.
pub fn make_target(target: &Path) -> Result<(), WalkError> {
    match std::fs::symlink_metadata(target) {
        Ok(meta) if meta.file_type().is_dir() => Ok(()),
        Ok(_) => Err(WalkError::NotADirectory(target.to_path_buf())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o750)
                .create(target)
                .map_err(|source| WalkError::Io {
                    path: target.to_path_buf(),
                    source,
                })
        }
        Err(source) => Err(WalkError::Io {
            path: target.to_path_buf(),
            source,
        }),
    }
}

/// Opens a directory as a path handle (`O_PATH`: no read access needed), refusing a link at the last component.
fn open_dir(path: &Path) -> io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

fn fd_path(fd: &std::fs::File) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

/// Bind-mounts `source` on `target`, read-only (nosuid, nodev, noexec). On a failed remount the bind is undone:
/// the volume is never left writable.
pub fn bind_read_only(source: &Path, target: &Path) -> io::Result<()> {
    let under = open_dir(target)?;
    rustix::mount::mount_bind(source, fd_path(&under).as_str())?;
    let top = open_dir(target);
    let remounted = top.and_then(|top| {
        Ok(rustix::mount::mount_remount(
            fd_path(&top).as_str(),
            MountFlags::BIND
                | MountFlags::RDONLY
                | MountFlags::NOSUID
                | MountFlags::NODEV
                | MountFlags::NOEXEC,
            "",
        )?)
    });
    if let Err(e) = remounted {
        let _ = rustix::mount::unmount(target, UnmountFlags::DETACH | UnmountFlags::NOFOLLOW);
        return Err(e);
    }
    Ok(())
}

/// Unmounts `target` (not following a link).
pub fn unmount(target: &Path) -> io::Result<()> {
    Ok(rustix::mount::unmount(target, UnmountFlags::NOFOLLOW)?)
}

/// Whether `target` is a mount point now (`/proc/self/mountinfo`).
pub fn is_mounted(target: &Path) -> io::Result<bool> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(super::target::mounted_at(&info, target))
}
