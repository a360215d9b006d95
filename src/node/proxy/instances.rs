//! Finding the PDP instances of a route in the instance directory.
//!
//! **Finding instances: a directory read per new connection, no file watcher.** The directory holds a handful
//! of sockets on a local filesystem (a hostPath under /var/run, tmpfs on most nodes); reading it and stat-ing
//! each entry takes microseconds (BENCHMARKS.md, "Node-local front"), next to a connection that carries many
//! checks. It is always current: no event to miss, no queue to overflow, no inotify instance or watch limit
//! to hit on a busy node (`fs.inotify.max_user_instances` is a classic node-agent failure), no extra crate
//! (`notify` would add a thread and its own dependency tree), and the connect attempt that follows is the
//! readiness check a watcher could not replace anyway. It is a plain `std::fs` call on the async thread, on
//! purpose: `tokio::fs` would send each read to the blocking pool, which costs more than the read itself.
use std::os::unix::fs::FileTypeExt;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UnixStream;
use tracing::{debug, info, warn};

use super::stats::*;
use super::*;
use crate::node::route::{self, Candidate};

/// Keeps `route.newest` current: every `every`, the newest instance socket that accepts a connection. Probes
/// only a candidate newer than the current one, so a steady node costs one directory read per tick and no
/// connection; a stale socket (left by a crash) is probed and passed over.
pub(super) async fn track_newest(route: Arc<Route>, shared: Arc<Shared>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let mut found = candidates(&route);
        route::newest_first(&mut found);
        let current = route.newest.borrow().clone();
        let mut chosen = None;
        for candidate in found {
            if current.as_deref() == Some(candidate.name.as_str()) {
                chosen = current.clone();
                break;
            }
            let path = route
                .dir
                .join(format!("{}{}", candidate.name, route.suffix));
            if let Ok(Ok(_probe)) =
                tokio::time::timeout(shared.connect_timeout, UnixStream::connect(&path)).await
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

/// The instance sockets of a route, as found now.
pub(super) fn candidates(route: &Route) -> Vec<Candidate> {
    let entries = match std::fs::read_dir(&route.dir) {
        Ok(entries) => entries,
        Err(e) => {
            debug!(instances = %route.dir.display(), error = %e, "cannot read the instances directory");
            return Vec::new();
        }
    };
    entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let file_name = entry.file_name();
            let name = route::instance_name(file_name.to_str()?, &route.suffix)?;
            // Follows a symbolic link, so an instance may also be published as a link to its socket.
            let meta = std::fs::metadata(entry.path()).ok()?;
            if !meta.file_type().is_socket() {
                return None;
            }
            Some(Candidate {
                name: name.to_string(),
                bound_at: meta.modified().ok()?,
            })
        })
        .collect()
}

/// A connection to the newest instance that accepts one; `None` when none does now.
pub(super) async fn connect_newest(route: &Route, shared: &Shared) -> Option<(String, UnixStream)> {
    let mut found = candidates(route);
    route::newest_first(&mut found);
    for candidate in found {
        let path = route
            .dir
            .join(format!("{}{}", candidate.name, route.suffix));
        match tokio::time::timeout(shared.connect_timeout, UnixStream::connect(&path)).await {
            Ok(Ok(stream)) => return Some((candidate.name, stream)),
            Ok(Err(e)) => {
                shared.instance(&candidate.name, |c| c.skipped += 1);
                debug!(route = route.kind, instance = candidate.name, error = %e, "instance skipped");
            }
            Err(_) => {
                shared.instance(&candidate.name, |c| c.skipped += 1);
                warn!(
                    route = route.kind,
                    instance = candidate.name,
                    timeout = ?shared.connect_timeout,
                    "instance skipped: it did not accept in time"
                );
            }
        }
    }
    None
}
