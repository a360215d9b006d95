//! The process watch of `watch` and `wait --record`: the Pod's processes in its shared process namespace, by
//! cgroup, and when no app process is left.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The cgroup of a process as this process sees it (the same text for every process of one container).
pub(crate) fn cgroup_of(proc_root: &Path, pid: &str) -> Option<String> {
    std::fs::read_to_string(proc_root.join(pid).join("cgroup")).ok()
}

/// Every process of the Pod's shared process namespace, with its cgroup: `(pid, cgroup)`.
pub(crate) fn processes(proc_root: &Path) -> Vec<(u32, String)> {
    let Ok(entries) = std::fs::read_dir(proc_root) else {
        return vec![];
    };
    entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let pid: u32 = name.parse().ok()?;
            Some((pid, cgroup_of(proc_root, &name)?))
        })
        .collect()
}

/// Writes the PIDs of the processes that share this process's cgroup (its container) to `file`, through a
/// temporary name, so that a reader never sees half a list.
pub(crate) fn record_own(proc_root: &Path, file: &Path) -> Result<(), String> {
    let mine = cgroup_of(proc_root, "self").ok_or("cannot read /proc/self/cgroup")?;
    let pids: Vec<String> = processes(proc_root)
        .into_iter()
        .filter(|(_, cg)| *cg == mine)
        .map(|(pid, _)| pid.to_string())
        .collect();
    let partial = file.with_extension("partial");
    std::fs::write(&partial, pids.join("\n"))
        .and_then(|()| std::fs::rename(&partial, file))
        .map_err(|e| {
            format!(
                "cannot record this container's processes in {}: {e}",
                file.display()
            )
        })
}

/// What `watch` needs.
#[derive(Debug)]
pub(crate) struct WatchOptions {
    /// The shared emptyDir holding the `*.pids` files of the PDP and watch containers.
    pub(crate) state: PathBuf,
    /// The file the PDP's liveness probe reads (`apps-done`), written once the apps have ended.
    pub(crate) stop: PathBuf,
    /// How long no app process must be seen first (`OnFailure`: longer than the kubelet's restart backoff).
    pub(crate) grace: Duration,
    /// The pause between two looks at the Pod's processes (at least 10ms).
    pub(crate) interval: Duration,
}

/// The app processes of the Pod: every process but the sandbox's (PID 1), this container's, and those of the
/// containers recorded in `state` (the PDPs' and the other watchers').
pub(crate) fn app_processes(proc_root: &Path, state: &Path) -> Vec<u32> {
    let all = processes(proc_root);
    let recorded: Vec<u32> = std::fs::read_dir(state)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".pids"))
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .flat_map(|t| {
            t.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect();
    let mut ours: Vec<&str> = all
        .iter()
        .filter(|(pid, _)| *pid == 1 || recorded.contains(pid))
        .map(|(_, cg)| cg.as_str())
        .collect();
    let mine = cgroup_of(proc_root, "self");
    ours.extend(mine.as_deref());
    all.iter()
        .filter(|(_, cg)| !ours.contains(&cg.as_str()))
        .map(|(pid, _)| *pid)
        .collect()
}

/// The watch container of a run-to-completion Pod with a classic sidecar: it starts after the app containers
/// (it is the last container, and the kubelet starts them in order), so once no app process is left (for
/// `grace`), the apps have ended: it writes the stop file, which the PDP's liveness probe reads, and the
/// kubelet stops the PDP. No API access, no Pod write right: only the Pod's shared process namespace.
pub(crate) fn watch(proc_root: &Path, options: &WatchOptions) -> Result<String, String> {
    let own = options
        .state
        .join(format!("watch-{}.pids", std::process::id()));
    record_own(proc_root, &own)?;
    let mut gone_since: Option<Instant> = None;
    loop {
        let apps = app_processes(proc_root, &options.state);
        if !apps.is_empty() {
            gone_since = None;
        } else {
            let since = *gone_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= options.grace {
                std::fs::write(&options.stop, "the app containers have ended")
                    .map_err(|e| format!("cannot write {}: {e}", options.stop.display()))?;
                return Ok(format!(
                    "no app process left: wrote {}, the PDP's liveness probe stops it",
                    options.stop.display()
                ));
            }
        }
        std::thread::sleep(options.interval);
    }
}
