//! Scratch directories under the system's temporary directory, removed when dropped (also when a test panics).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// A fresh, empty directory named after its label, this process and a counter, so tests running at once never
/// share one.
pub struct TempDir(PathBuf);

impl TempDir {
    /// `$TMPDIR/pdp-<label>-<pid>-<n>`, created empty.
    pub fn new(label: &str) -> TempDir {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("pdp-{label}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        TempDir(dir)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// A path below the directory (not created).
    pub fn join(&self, relative: impl AsRef<Path>) -> PathBuf {
        self.0.join(relative)
    }

    /// Creates `relative` (and its parents) with `mode`, whatever the umask, and returns it.
    pub fn mkdir(&self, relative: impl AsRef<Path>, mode: u32) -> PathBuf {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = self.0.join(relative);
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode))
            .unwrap_or_else(|e| panic!("cannot chmod {}: {e}", dir.display()));
        dir
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_directory_is_its_own_and_gone_when_dropped() {
        let a = TempDir::new("testkit");
        let b = TempDir::new("testkit");
        assert_ne!(a.path(), b.path());
        let sub = a.mkdir("x/y", 0o700);
        std::fs::write(sub.join("f"), "1").unwrap();
        let kept = a.path().to_path_buf();
        drop(a);
        assert!(!kept.exists());
        assert!(b.path().is_dir());
    }
}
