//! Finding the PDP instances of a route: a plain `std::fs` read of the instance directory per new connection, on
//! the async thread, and no file watcher: a few local sockets list in microseconds (BENCHMARKS.md, "Node-local
//! front"), no event can be missed nor inotify limit hit, and the connect that follows checks readiness anyway.
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UnixStream;
use tracing::{debug, info, warn};

use crate::proxy::Route;
use crate::proxy::stats::Shared;
use pdp_core::route::{self, Candidate};

/// Keeps `route.newest` current: every `every`, the newest instance socket that accepts a connection. Probes
/// only a candidate newer than the current one, so a steady node costs one directory read per tick and no
/// connection; a stale socket (left by a crash) is probed and passed over.
pub(super) async fn track_newest(route: Arc<Route>, shared: Arc<Shared>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let (mut found, owner) = candidates(&route, &shared);
        route::newest_first(&mut found);
        let current = route.newest.borrow().clone();
        let mut chosen = None;
        for candidate in found {
            if current.as_deref() == Some(candidate.name.as_str()) {
                chosen = current.clone();
                break;
            }
            if connect_checked(&route, &shared, &candidate.name, owner)
                .await
                .is_ok()
            {
                chosen = Some(candidate.name);
                break;
            }
        }
        if chosen != current {
            info!(route = route.kind, from = ?current, to = ?chosen, "newest PDP instance");
            route.newest.send_replace(chosen);
        }
    }
}

/// Why the front does not use what it found in an instance directory (logged once per file, counted in
/// `refused_instances`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Refusal {
    /// The directory is not owned by the instances' user.
    DirOwner { uid: u32, owner: u32 },
    /// Another user than the instances' user may create files in the directory.
    DirWritable { mode: u32 },
    /// The directory is a symbolic link or not a directory.
    DirNotADirectory,
    /// The entry is a symbolic link: an instance publishes its socket itself, never a link to one elsewhere.
    Symlink,
    /// The socket belongs to another user than the instances' user.
    Owner { uid: u32, owner: u32 },
    /// Every local user may connect to the socket, and so may have bound a look-alike in its place.
    WorldWritable { mode: u32 },
    /// The process listening on the socket runs as another user (SO_PEERCRED).
    Peer { uid: u32, owner: u32 },
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::DirOwner { uid, owner } => write!(
                f,
                "the instance directory belongs to uid {uid}, not to the instances' user {owner} (--instance-owner)"
            ),
            Refusal::DirWritable { mode } => write!(
                f,
                "the instance directory has mode {mode:o}: other users than its owner can create files in it (chmod go-w)"
            ),
            Refusal::DirNotADirectory => {
                write!(
                    f,
                    "the instance directory is a symbolic link or not a directory"
                )
            }
            Refusal::Symlink => write!(f, "a symbolic link, not a socket the instance bound"),
            Refusal::Owner { uid, owner } => write!(
                f,
                "the socket belongs to uid {uid}, not to the instances' user {owner} (--instance-owner)"
            ),
            Refusal::WorldWritable { mode } => write!(
                f,
                "the socket has mode {mode:o}: world-writable (the PDP must create it without write for others, e.g. Cerbos udsFileMode 0o770)"
            ),
            Refusal::Peer { uid, owner } => write!(
                f,
                "the process serving the socket runs as uid {uid}, not as the instances' user {owner}"
            ),
        }
    }
}

/// Whether the instance directory may be trusted, from its own metadata (`symlink_metadata`: a link is not
/// followed); returns the instances' user: `--instance-owner`, or the directory's owner when it is not given.
pub(super) fn judge_dir(
    is_dir: bool,
    uid: u32,
    mode: u32,
    owner: Option<u32>,
) -> Result<u32, Refusal> {
    if !is_dir {
        return Err(Refusal::DirNotADirectory);
    }
    let owner = owner.unwrap_or(uid);
    if uid != owner {
        return Err(Refusal::DirOwner { uid, owner });
    }
    // Group or others writable (a sticky /tmp-like directory too): another user could bind a socket there.
    if mode & 0o022 != 0 {
        return Err(Refusal::DirWritable {
            mode: mode & 0o7777,
        });
    }
    Ok(owner)
}

/// Whether a socket of the instance directory may be an instance, from its `symlink_metadata`; `Ok(false)`
/// for an entry that is no socket at all (ignored silently: not a candidate, not an attack).
pub(super) fn judge_socket(
    kind: std::fs::FileType,
    uid: u32,
    mode: u32,
    owner: u32,
) -> Result<bool, Refusal> {
    if kind.is_symlink() {
        return Err(Refusal::Symlink);
    }
    if !kind.is_socket() {
        return Ok(false);
    }
    if uid != owner {
        return Err(Refusal::Owner { uid, owner });
    }
    if mode & 0o002 != 0 {
        return Err(Refusal::WorldWritable {
            mode: mode & 0o7777,
        });
    }
    Ok(true)
}

/// The instance sockets of a route that pass the checks, as found now, and the instances' user (whose
/// processes must be the ones serving them).
pub(super) fn candidates(route: &Route, shared: &Shared) -> (Vec<Candidate>, u32) {
    let dir = match std::fs::symlink_metadata(&route.dir) {
        Ok(meta) => meta,
        Err(e) => {
            debug!(instances = %route.dir.display(), error = %e, "cannot read the instances directory");
            return (Vec::new(), 0);
        }
    };
    let owner = match judge_dir(
        dir.file_type().is_dir(),
        dir.uid(),
        dir.mode(),
        shared.instance_owner,
    ) {
        Ok(owner) => owner,
        Err(refusal) => {
            shared.refuse_instance(route, &route.dir, dir.ino(), &refusal);
            return (Vec::new(), 0);
        }
    };
    let entries = match std::fs::read_dir(&route.dir) {
        Ok(entries) => entries,
        Err(e) => {
            debug!(instances = %route.dir.display(), error = %e, "cannot read the instances directory");
            return (Vec::new(), owner);
        }
    };
    let found = entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let file_name = entry.file_name();
            let name = route::instance_name(file_name.to_str()?, &route.suffix)?;
            let meta = std::fs::symlink_metadata(entry.path()).ok()?;
            match judge_socket(meta.file_type(), meta.uid(), meta.mode(), owner) {
                Ok(true) => {}
                Ok(false) => return None,
                Err(refusal) => {
                    shared.refuse_instance(route, &entry.path(), meta.ino(), &refusal);
                    return None;
                }
            }
            Some(Candidate {
                name: name.to_string(),
                bound_at: meta.modified().ok()?,
            })
        })
        .collect();
    (found, owner)
}

/// Connects to one instance socket and checks who serves it: the peer credentials of the listening process
/// (SO_PEERCRED, taken when it called listen(2)) must be the instances' user. Where the kernel gives none, the
/// file checks of [`candidates`] stand alone.
async fn connect_checked(
    route: &Route,
    shared: &Shared,
    name: &str,
    owner: u32,
) -> Result<UnixStream, Skipped> {
    let path = route.dir.join(format!("{name}{}", route.suffix));
    let stream =
        match tokio::time::timeout(shared.connect_timeout, UnixStream::connect(&path)).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => return Err(Skipped::Refused(e)),
            Err(_) => return Err(Skipped::Timeout),
        };
    if let Ok(cred) = stream.peer_cred()
        && cred.uid() != owner
    {
        let ino = std::fs::symlink_metadata(&path).map_or(0, |m| m.ino());
        let refusal = Refusal::Peer {
            uid: cred.uid(),
            owner,
        };
        shared.refuse_instance(route, &path, ino, &refusal);
        return Err(Skipped::Untrusted);
    }
    Ok(stream)
}

/// Why an instance got no connection.
enum Skipped {
    /// It refused the connection, or its socket is gone.
    Refused(io::Error),
    /// It did not accept within --connect-timeout.
    Timeout,
    /// Another user serves it (logged and counted by [`Shared::refuse_instance`]).
    Untrusted,
}

/// A connection to the newest instance that accepts one; `None` when none does now.
pub(super) async fn connect_newest(route: &Route, shared: &Shared) -> Option<(String, UnixStream)> {
    let (mut found, owner) = candidates(route, shared);
    route::newest_first(&mut found);
    for candidate in found {
        match connect_checked(route, shared, &candidate.name, owner).await {
            Ok(stream) => return Some((candidate.name, stream)),
            Err(Skipped::Refused(e)) => {
                shared.instance(&candidate.name, |c| c.skipped += 1);
                debug!(route = route.kind, instance = candidate.name, error = %e, "instance skipped");
            }
            Err(Skipped::Timeout) => {
                shared.instance(&candidate.name, |c| c.skipped += 1);
                warn!(
                    route = route.kind,
                    instance = candidate.name,
                    timeout = ?shared.connect_timeout,
                    "instance skipped: it did not accept in time"
                );
            }
            Err(Skipped::Untrusted) => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The file types of real files, made here: `FileType` has no constructor.
    fn kinds() -> (std::fs::FileType, std::fs::FileType, std::fs::FileType) {
        let scratch = pdp_testkit::dir::TempDir::new("kinds");
        let dir = scratch.path();
        let sock = dir.join("a.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        std::os::unix::fs::symlink(&sock, dir.join("link")).unwrap();
        std::fs::write(dir.join("file"), b"").unwrap();
        let kind = |n: &str| std::fs::symlink_metadata(dir.join(n)).unwrap().file_type();
        (kind("a.sock"), kind("link"), kind("file"))
    }

    #[test]
    fn only_a_directory_its_owner_alone_can_write_is_trusted() {
        assert_eq!(judge_dir(true, 10001, 0o40755, None), Ok(10001));
        assert_eq!(judge_dir(true, 10001, 0o40700, Some(10001)), Ok(10001));
        assert_eq!(
            judge_dir(true, 0, 0o40755, Some(10001)),
            Err(Refusal::DirOwner {
                uid: 0,
                owner: 10001
            })
        );
        assert_eq!(
            judge_dir(true, 10001, 0o40775, None),
            Err(Refusal::DirWritable { mode: 0o775 })
        );
        assert_eq!(
            judge_dir(true, 0, 0o41777, None),
            Err(Refusal::DirWritable { mode: 0o1777 })
        );
        assert_eq!(
            judge_dir(false, 10001, 0o120777, None),
            Err(Refusal::DirNotADirectory)
        );
    }

    #[test]
    fn only_the_owners_socket_without_write_for_others_is_a_candidate() {
        let (socket, link, file) = kinds();
        assert_eq!(judge_socket(socket, 10001, 0o140770, 10001), Ok(true));
        assert_eq!(judge_socket(socket, 10001, 0o140755, 10001), Ok(true));
        assert_eq!(
            judge_socket(socket, 10002, 0o140770, 10001),
            Err(Refusal::Owner {
                uid: 10002,
                owner: 10001
            })
        );
        assert_eq!(
            judge_socket(socket, 10001, 0o140777, 10001),
            Err(Refusal::WorldWritable { mode: 0o777 })
        );
        // A link is refused whoever owns it and wherever it points: it is not followed.
        assert_eq!(
            judge_socket(link, 10001, 0o120777, 10001),
            Err(Refusal::Symlink)
        );
        // Not a socket at all: ignored, not refused.
        assert_eq!(judge_socket(file, 10001, 0o100644, 10001), Ok(false));
    }

    #[test]
    fn every_refusal_says_what_to_change() {
        let texts = [
            Refusal::DirOwner { uid: 0, owner: 1 }.to_string(),
            Refusal::DirWritable { mode: 0o777 }.to_string(),
            Refusal::Owner { uid: 2, owner: 1 }.to_string(),
            Refusal::WorldWritable { mode: 0o777 }.to_string(),
            Refusal::Peer { uid: 2, owner: 1 }.to_string(),
        ];
        assert!(texts[0].contains("uid 0") && texts[0].contains("--instance-owner"));
        assert!(texts[1].contains("777") && texts[1].contains("chmod go-w"));
        assert!(texts[2].contains("uid 2") && texts[2].contains("user 1"));
        assert!(texts[3].contains("udsFileMode"));
        assert!(texts[4].contains("uid 2"));
    }
}
