//! The file system side of publishing: walking to the target without following a link, and the read-only bind
//! mount, with rustix's safe wrappers (the crate forbids unsafe code).
//!
//! **No path is used after it is checked.** The walk opens each directory from the kubelet's pods directory down
//! to the target's parent with `openat(O_PATH | O_DIRECTORY | O_NOFOLLOW)` on the descriptor of the one above
//! ([`open_parent`]): the check is the open. The target is then made, found, mounted on, unmounted and removed
//! through that parent's descriptor ([`Dir`]), and `mount(2)` is given `/proc/self/fd/N` of a descriptor, as runc
//! does, so a link swapped into the path at any moment redirects nothing. A bind mount ignores `MS_RDONLY` in the
//! call that creates it, so it is made read-only by a second call, a remount of the new mount (`MS_REMOUNT |
//! MS_BIND | MS_RDONLY`, with nosuid, nodev, noexec), on a descriptor opened after the bind (it names the new
//! mount's root, never the kubelet's file system below it).

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags, StatxFlags};
use rustix::mount::{MountFlags, UnmountFlags};

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

impl WalkError {
    fn at(path: PathBuf, e: rustix::io::Errno) -> WalkError {
        match e {
            rustix::io::Errno::NOENT => WalkError::Missing(path),
            rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR => WalkError::NotADirectory(path),
            e => WalkError::Io {
                path,
                source: e.into(),
            },
        }
    }
}

/// A directory held open (`O_PATH`): what is done below it is done in this directory, wherever it is now.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    path: PathBuf,
}

const DIR_FLAGS: OFlags = OFlags::PATH
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Opens the target's parent, one directory at a time from `pods_dir` (the kubelet's own, opened as it is),
/// each refused if it is a link or not a directory.
pub fn open_parent(pods_dir: &Path, target: &Path) -> Result<Dir, WalkError> {
    let not_below = || WalkError::NotADirectory(target.to_path_buf());
    let below = target
        .parent()
        .ok_or_else(not_below)?
        .strip_prefix(pods_dir)
        .map_err(|_| not_below())?;
    let mut fd = rustix::fs::open(
        pods_dir,
        DIR_FLAGS.difference(OFlags::NOFOLLOW),
        Mode::empty(),
    )
    .map_err(|e| WalkError::at(pods_dir.to_path_buf(), e))?;
    let mut path = pods_dir.to_path_buf();
    for part in below.components() {
        let Component::Normal(name) = part else {
            return Err(not_below());
        };
        path.push(name);
        fd = rustix::fs::openat(&fd, name, DIR_FLAGS, Mode::empty())
            .map_err(|e| WalkError::at(path.clone(), e))?;
    }
    Ok(Dir { fd, path })
}

impl Dir {
    /// The path this directory had when it was opened (for messages).
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn open_child(&self, name: &str) -> Result<OwnedFd, WalkError> {
        rustix::fs::openat(&self.fd, name, DIR_FLAGS, Mode::empty())
            .map_err(|e| WalkError::at(self.path.join(name), e))
    }

    /// Whether `name` exists here (a link or a file counts: it is not to be touched either).
    pub fn has(&self, name: &str) -> io::Result<bool> {
        match rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(_) => Ok(true),
            Err(rustix::io::Errno::NOENT) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Creates the directory `name` (mode 0750) unless it exists; an existing one must be a real directory.
    /// Returns whether it was created.
    pub fn make_child(&self, name: &str) -> Result<bool, WalkError> {
        match rustix::fs::mkdirat(&self.fd, name, Mode::from_raw_mode(0o750)) {
            Ok(()) => Ok(true),
            Err(rustix::io::Errno::EXIST) => self.open_child(name).map(|_| false),
            Err(e) => Err(WalkError::at(self.path.join(name), e)),
        }
    }

    /// Removes the empty directory `name`; one already gone is no error.
    pub fn remove_child(&self, name: &str) -> io::Result<()> {
        match rustix::fs::unlinkat(&self.fd, name, AtFlags::REMOVEDIR) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether the directory `name` is a mount point: its mount is not this directory's (`statx` mount IDs).
    pub fn is_mount_point(&self, name: &str) -> Result<bool, WalkError> {
        let child = match self.open_child(name) {
            Ok(child) => child,
            Err(WalkError::Missing(_)) => return Ok(false),
            Err(e) => return Err(e),
        };
        let id = |fd: &OwnedFd, path: PathBuf| {
            rustix::fs::statx(fd, "", AtFlags::EMPTY_PATH, StatxFlags::MNT_ID)
                .map(|s| s.stx_mnt_id)
                .map_err(|e| WalkError::Io {
                    path,
                    source: e.into(),
                })
        };
        Ok(id(&child, self.path.join(name))? != id(&self.fd, self.path.clone())?)
    }
}

fn fd_path(fd: impl AsFd) -> String {
    format!("/proc/self/fd/{}", fd.as_fd().as_raw_fd())
}

fn io_error(e: WalkError) -> io::Error {
    match e {
        WalkError::Io { source, .. } => source,
        e => io::Error::new(io::ErrorKind::InvalidInput, e.to_string()),
    }
}

/// Bind-mounts `source` on the directory `name` in `parent`, read-only (nosuid, nodev, noexec). On a failed
/// remount the bind is undone: the volume is never left writable.
pub fn bind_read_only(source: &Path, parent: &Dir, name: &str) -> io::Result<()> {
    let under = parent.open_child(name).map_err(io_error)?;
    rustix::mount::mount_bind(source, fd_path(&under).as_str())?;
    let flags = MountFlags::BIND
        | MountFlags::RDONLY
        | MountFlags::NOSUID
        | MountFlags::NODEV
        | MountFlags::NOEXEC;
    match parent.open_child(name) {
        Ok(top) => rustix::mount::mount_remount(fd_path(&top).as_str(), flags, "").map_err(|e| {
            let _ = rustix::mount::unmount(fd_path(&top).as_str(), UnmountFlags::DETACH);
            e.into()
        }),
        Err(e) => {
            // The new mount cannot be opened (no descriptor left?): undone by its path, the last resort.
            let at = parent.path.join(name);
            let _ = rustix::mount::unmount(&at, UnmountFlags::DETACH | UnmountFlags::NOFOLLOW);
            Err(io_error(e))
        }
    }
}

/// Unmounts the mount on the directory `name` in `parent`. Detached (`MNT_DETACH`): the descriptor that names
/// the mount holds it busy until it is closed, right after.
pub fn unmount(parent: &Dir, name: &str) -> io::Result<()> {
    let top = parent.open_child(name).map_err(io_error)?;
    Ok(rustix::mount::unmount(
        fd_path(&top).as_str(),
        UnmountFlags::DETACH,
    )?)
}
