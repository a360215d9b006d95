//! The directory source: `DIR/NAMESPACE/NAME.flagd.json`, one flag set per file, read again when a file's size
//! or modification time changes. For running without a cluster, and for a mounted volume of flag files.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::metrics::Metrics;
use crate::set::{FlagSet, Origin, SetId};
use crate::store::Store;

/// The file name ending that marks a flag set.
pub const SUFFIX: &str = ".flagd.json";
/// The largest flag file read (a Kubernetes object's own limit).
pub const MAX_FILE: u64 = 1 << 20;

/// A file as last read: its stamp, and what it held (the last good set when it became unreadable).
struct Seen {
    stamp: (SystemTime, u64),
    set: Option<FlagSet>,
}

/// Scans `dir` every `interval` and replaces the store's file sets with what it finds, until the store is
/// dropped by every other holder.
pub async fn run(dir: PathBuf, interval: Duration, store: Arc<Store>, metrics: Arc<Metrics>) {
    let mut seen: HashMap<PathBuf, Seen> = HashMap::new();
    loop {
        let sets = scan(&dir, &mut seen, &metrics).await;
        store.replace_origin(Origin::File, sets);
        if Arc::strong_count(&store) == 1 {
            return;
        }
        tokio::time::sleep(interval).await;
    }
}

async fn scan(
    dir: &Path,
    seen: &mut HashMap<PathBuf, Seen>,
    metrics: &Metrics,
) -> BTreeMap<SetId, FlagSet> {
    let mut sets = BTreeMap::new();
    let mut present = Vec::new();
    let Ok(mut namespaces) = tokio::fs::read_dir(dir).await else {
        tracing::warn!(dir = %dir.display(), "flag directory unreadable; serving no file flag sets");
        seen.clear();
        return sets;
    };
    while let Ok(Some(ns)) = namespaces.next_entry().await {
        let namespace = ns.file_name().to_string_lossy().into_owned();
        let Ok(mut files) = tokio::fs::read_dir(ns.path()).await else {
            continue;
        };
        while let Ok(Some(file)) = files.next_entry().await {
            let file_name = file.file_name().to_string_lossy().into_owned();
            let Some(name) = file_name.strip_suffix(SUFFIX) else {
                continue;
            };
            let path = file.path();
            let Ok(meta) = tokio::fs::metadata(&path).await else {
                continue;
            };
            let stamp = (
                meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                meta.len(),
            );
            present.push(path.clone());
            let fresh = seen.get(&path).is_some_and(|s| s.stamp == stamp);
            if !fresh {
                let read = read_set(&path, meta.len()).await;
                let set = match read {
                    Ok(set) => Some(set),
                    Err(e) => {
                        metrics.rejected_sets.inc();
                        tracing::warn!(file = %path.display(), error = %e, "flag file not taken; keeping its last good version");
                        seen.get(&path).and_then(|s| s.set.clone())
                    }
                };
                seen.insert(path.clone(), Seen { stamp, set });
            }
            if let Some(set) = seen.get(&path).and_then(|s| s.set.clone()) {
                let id = SetId {
                    origin: Origin::File,
                    namespace: namespace.clone(),
                    name: name.to_string(),
                };
                sets.insert(id, set);
            }
        }
    }
    seen.retain(|path, _| present.contains(path));
    sets
}

async fn read_set(path: &Path, len: u64) -> Result<FlagSet, String> {
    if len > MAX_FILE {
        return Err(format!("{len} bytes; at most {MAX_FILE} are read"));
    }
    let text = tokio::fs::read_to_string(path)
        .await
        .map_err(|e| e.to_string())?;
    FlagSet::from_json(&text).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str =
        r#"{"flags":{"f":{"state":"ENABLED","variants":{"on":true},"defaultVariant":"on"}}}"#;

    #[tokio::test]
    async fn files_become_sets_and_a_broken_file_keeps_its_last_good_version() {
        let scratch = pdp_testkit::dir::TempDir::new("flagsync-dir");
        let dir = scratch.path();
        std::fs::create_dir_all(dir.join("team-a")).unwrap();
        std::fs::write(dir.join("team-a/app.flagd.json"), GOOD).unwrap();
        std::fs::write(dir.join("team-a/notes.txt"), "not a flag file").unwrap();
        let metrics = Metrics::default();
        let mut seen = HashMap::new();
        let sets = scan(dir, &mut seen, &metrics).await;
        let names: Vec<String> = sets.keys().map(|i| i.to_string()).collect();
        assert_eq!(names, ["file/team-a/app"]);

        std::fs::write(
            dir.join("team-a/app.flagd.json"),
            "{ broken, and of another length",
        )
        .unwrap();
        let sets = scan(dir, &mut seen, &metrics).await;
        assert_eq!(sets.len(), 1, "the last good version stays");
        assert_eq!(metrics.rejected_sets.get(), 1);

        std::fs::remove_file(dir.join("team-a/app.flagd.json")).unwrap();
        assert!(
            scan(dir, &mut seen, &metrics).await.is_empty(),
            "a removed file is a removed set"
        );
    }
}
