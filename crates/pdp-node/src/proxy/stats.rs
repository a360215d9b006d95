//! The front's counters and their periodic log line.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tracing::{info, warn};

use crate::proxy::{Phase, Route};

/// Counters of one instance, by its name.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct InstanceCounts {
    /// Connections forwarded to it.
    pub forwarded: u64,
    /// Times it was passed over: it refused, its socket was gone, or it did not accept within the timeout.
    pub skipped: u64,
    /// Forwarded connections that ended with an I/O error (either side).
    pub errors: u64,
    /// Connections to it that the front closed between two exchanges because a newer instance serves.
    pub moved: u64,
}

/// What the front has done since it started (logged every --stats-interval, read by tests).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Stats {
    /// Client connections accepted.
    pub accepted: u64,
    /// Connections that found no ready instance at first and waited.
    pub waited: u64,
    /// Connections closed because no instance became ready within --wait.
    pub gave_up: u64,
    /// Connections closed at the end of the drain.
    pub cut_at_drain: u64,
    /// TCP connections whose TLS handshake failed or timed out (nothing was forwarded).
    pub tls_failed: u64,
    /// New TLS files put in use after the start.
    pub tls_reloaded: u64,
    /// New TLS files refused (unreadable or invalid); the last good ones stayed.
    pub tls_reload_failed: u64,
    /// TCP connections closed at accept: their client address held --max-connections-per-peer already.
    pub refused_peer: u64,
    /// Connections closed at accept: their endpoint was at its bound and every connection was in an exchange.
    pub refused_full: u64,
    /// Connections closed because a new connection took their place at the bound (they were quiet the longest).
    pub taken: u64,
    /// Connections closed after --idle-timeout without a byte.
    pub idle_closed: u64,
    /// Connections closed at a pause after --max-connection-age.
    pub aged_closed: u64,
    /// Files of the instance directory refused by its checks (another user's socket, a world-writable one, a
    /// symbolic link, a directory others can write, a socket served by another user's process), each counted
    /// once; they get no connection.
    pub refused_instances: u64,
    /// Per instance.
    pub instances: BTreeMap<String, InstanceCounts>,
}

pub(super) struct Shared {
    pub(super) stats: Mutex<Stats>,
    pub(super) phase: watch::Sender<Phase>,
    pub(super) idle_timeout: Duration,
    pub(super) max_age: Duration,
    /// When a refusal at accept was last logged at `info`.
    pub(super) refusal_noted: Mutex<Option<Instant>>,
    pub(super) wait: Duration,
    pub(super) retry_interval: Duration,
    pub(super) connect_timeout: Duration,
    /// --instance-owner: the only user whose instance sockets get connections (none: the directory's owner).
    pub(super) instance_owner: Option<u32>,
    /// The refused files of the instance directories (path and inode) already logged: each is logged and
    /// counted once. Bounded: past [`REFUSED_REMEMBERED`] it starts again (a flood is logged again, not stored).
    pub(super) refused: Mutex<HashSet<(PathBuf, u64)>>,
}

/// How many refused files are remembered, so that each is logged once.
const REFUSED_REMEMBERED: usize = 1024;

impl Shared {
    pub(super) fn count(&self, f: impl FnOnce(&mut Stats)) {
        // A poisoned lock only means a panic elsewhere while counting: the counters stay usable.
        let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut stats);
    }

    /// Logs (once per file) and counts a file of the instance directory that the checks refuse, saying why.
    pub(super) fn refuse_instance(
        &self,
        route: &Route,
        path: &Path,
        ino: u64,
        refusal: &impl std::fmt::Display,
    ) {
        let mut refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        if refused.len() >= REFUSED_REMEMBERED {
            refused.clear();
        }
        if refused.insert((path.to_path_buf(), ino)) {
            drop(refused);
            self.count(|s| s.refused_instances += 1);
            warn!(
                route = route.kind,
                path = %path.display(),
                reason = %refusal,
                "instance socket refused: it gets no connection (logged once; counted in refused_instances)"
            );
        }
    }

    pub(super) fn instance(&self, name: &str, f: impl FnOnce(&mut InstanceCounts)) {
        self.count(|s| f(s.instances.entry(name.to_string()).or_default()));
    }
}

pub(super) async fn log_stats(shared: Arc<Shared>, every: Duration) {
    let mut last = Stats::default();
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    loop {
        tick.tick().await;
        let now = shared
            .stats
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if now != last {
            info!(
                accepted = now.accepted,
                waited = now.waited,
                gave_up = now.gave_up,
                tls_failed = now.tls_failed,
                tls_reloaded = now.tls_reloaded,
                tls_reload_failed = now.tls_reload_failed,
                refused_instances = now.refused_instances,
                instances = ?now.instances,
                "node-proxy counters"
            );
            last = now;
        }
    }
}
