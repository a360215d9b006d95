//! The volumes this plugin published, kept on the node so that a restarted plugin knows them: one file per
//! volume, `<state dir>/<pod uid>/<volume name>`, holding its volume ID and target (the state directory is
//! `<kubelet dir>/plugins/<driver>/published`, next to the CSI socket, mode 0700). A record is written before
//! anything is created or mounted and removed once the volume is gone, so a volume without a record was never
//! touched by this plugin: its unpublish is refused. The records also give the bounds per Pod and per node.

use std::io;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::target::Target;

/// Why a volume gets no record (answered ResourceExhausted, or Internal for an I/O error).
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error(
        "Pod {pod} already has {bound} volumes of this driver, the most one Pod may have (--max-volumes-per-pod)"
    )]
    PerPod { pod: String, bound: usize },
    #[error(
        "this node already has {bound} volumes of this driver, the most it may have (--max-volumes-per-node)"
    )]
    PerNode { bound: usize },
    #[error("the plugin's record of published volumes, {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

/// The records, and the lock that makes a count and the record it allows one step.
pub struct Published {
    dir: PathBuf,
    pods_dir: PathBuf,
    per_pod: usize,
    per_node: usize,
    lock: Mutex<()>,
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> Refused + '_ {
    move |source| Refused::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The entries of a directory; none if it does not exist.
fn entries(dir: &Path) -> io::Result<Vec<std::fs::DirEntry>> {
    match std::fs::read_dir(dir) {
        Ok(list) => list.collect(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

impl Published {
    /// The records in `dir`, for targets under `pods_dir`, at most `per_pod` per Pod and `per_node` in all.
    pub fn new(dir: PathBuf, pods_dir: PathBuf, per_pod: usize, per_node: usize) -> Published {
        Published {
            dir,
            pods_dir,
            per_pod,
            per_node,
            lock: Mutex::new(()),
        }
    }

    /// Where the records are.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn record(&self, target: &Target) -> PathBuf {
        self.dir.join(&target.pod).join(&target.volume)
    }

    /// Whether `target` has a record.
    pub fn has(&self, target: &Target) -> io::Result<bool> {
        match std::fs::symlink_metadata(self.record(target)) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Records `target` if the bounds allow it. Records of Pods whose directory the kubelet removed are dropped
    /// first (their volumes went with it), so that they do not count.
    pub fn add(&self, target: &Target, volume_id: &str) -> Result<(), Refused> {
        let _one = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut total = 0;
        for pod in entries(&self.dir).map_err(io_at(&self.dir))? {
            let name = pod.file_name();
            if !self.pods_dir.join(&name).exists() {
                let _ = std::fs::remove_dir_all(pod.path());
                continue;
            }
            let count = entries(&pod.path()).map_err(io_at(&pod.path()))?.len();
            if name.as_os_str() == target.pod.as_str() && count >= self.per_pod {
                return Err(Refused::PerPod {
                    pod: target.pod.clone(),
                    bound: self.per_pod,
                });
            }
            total += count;
        }
        if total >= self.per_node {
            return Err(Refused::PerNode {
                bound: self.per_node,
            });
        }
        let pod_dir = self.dir.join(&target.pod);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&pod_dir)
            .map_err(io_at(&pod_dir))?;
        let path = self.record(target);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(io_at(&path))?;
        writeln!(file, "{volume_id}\n{}", target.path.display()).map_err(io_at(&path))
    }

    /// Drops the record of `target` (none is no error).
    pub fn remove(&self, target: &Target) -> io::Result<()> {
        let _one = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        match std::fs::remove_file(self.record(target)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        // The Pod's directory goes with its last record.
        let _ = std::fs::remove_dir(self.dir.join(&target.pod));
        Ok(())
    }
}
