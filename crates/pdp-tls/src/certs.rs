//! Certificates on disk: the generation is pure (`pdp_core::pki`); this writes a bundle as a Kubernetes TLS
//! Secret's files, atomically, and names the webhook's Service for `serve` and `certs`.

use std::path::Path;

use pdp_core::names::{DEFAULT_NAME, DEFAULT_NAMESPACE};

pub use pdp_core::pki::{Bundle, GenerateError, generate, generate_with_issuer, service_sans};

/// The webhook's Service, whose DNS names the serving certificate carries: flags of `serve`, `certs` and `check`
/// (inside `pdp_cluster::InstallNames` for the first and the last).
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct ServiceName {
    /// Service name the apiserver dials (the certificate's SANs).
    #[arg(long, env = "PDP_INJECTOR_SERVICE", default_value = DEFAULT_NAME)]
    pub service: String,
    /// Namespace of the webhook (its Service, Secret, Deployment and ConfigMap), also spelt `--namespace` by
    /// `serve` and `certs`.
    #[arg(long = "webhook-namespace", env = "POD_NAMESPACE", default_value = DEFAULT_NAMESPACE)]
    pub namespace: String,
}

impl ServiceName {
    /// The DNS names the apiserver dials: `<service>.<namespace>.svc` and the cluster-local form.
    pub fn sans(&self) -> Vec<String> {
        service_sans(&self.service, &self.namespace)
    }
}

/// Why certificates could not be made or written.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// rcgen refused the parameters (for example an invalid DNS name).
    #[error("cannot generate certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// A file could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// Writes `ca.crt`, `ca.key`, `tls.crt` and `tls.key` (the names of a Kubernetes TLS Secret) into `dir`; keys
/// are readable by the owner only.
pub fn write_bundle(bundle: &Bundle, dir: &Path) -> Result<(), CertError> {
    std::fs::create_dir_all(dir).map_err(|source| CertError::Write {
        path: dir.display().to_string(),
        source,
    })?;
    for (name, pem, private) in [
        ("ca.crt", &bundle.ca_cert_pem, false),
        ("ca.key", &bundle.ca_key_pem, true),
        ("tls.crt", &bundle.cert_pem, false),
        ("tls.key", &bundle.key_pem, true),
    ] {
        let path = dir.join(name);
        write_file(&path, pem.as_bytes(), private).map_err(|source| CertError::Write {
            path: path.display().to_string(),
            source,
        })?;
    }
    Ok(())
}

/// Writes a file atomically, so a watcher never reads half a certificate: the bytes go to a new file in the
/// target's directory (created exclusively and never through a symlink, so nothing planted under a temporary
/// name is followed or reused), which is then renamed over the target (a symlink at the target is replaced,
/// not followed). A file left behind by a failed write is removed.
pub fn write_file(path: &Path, bytes: &[u8], private: bool) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "no file name"))?;
    let mut attempt = 0;
    let (tmp, mut file) = loop {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let tmp = dir.join(format!(
            ".{}.{}.{nanos:x}.{}.tmp",
            name.to_string_lossy(),
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .mode(if private { 0o600 } else { 0o644 })
            .open(&tmp)
        {
            Ok(f) => break (tmp, f),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 16 => attempt += 1,
            Err(e) => return Err(e),
        }
    };
    let written = file
        .write_all(bytes)
        .and_then(|()| file.sync_all())
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundle_writes_private_keys_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let scratch = pdp_testkit::dir::TempDir::new("certs");
        let dir = scratch.join("bundle");
        let b = generate(&["localhost".into()], 1, 1).unwrap();
        write_bundle(&b, &dir).unwrap();
        let mode = std::fs::metadata(dir.join("tls.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(
            std::fs::read_to_string(dir.join("ca.crt"))
                .unwrap()
                .starts_with("-----BEGIN CERTIFICATE-----")
        );
    }

    /// A symlink planted where a predictable temporary file would go, or at the target itself, is never
    /// followed: the file it points at stays as it was, and no temporary file is left.
    #[test]
    fn writes_never_follow_a_planted_symlink() {
        let scratch = pdp_testkit::dir::TempDir::new("certs-link");
        let dir = scratch.path();
        let victim = dir.join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let target = dir.join("tls.key");
        // What the old code wrote through: tls.tmp, and the target as a link.
        std::os::unix::fs::symlink(&victim, dir.join("tls.tmp")).unwrap();
        write_file(&target, b"first", true).unwrap();
        std::fs::remove_file(&target).unwrap();
        std::os::unix::fs::symlink(&victim, &target).unwrap();
        write_file(&target, b"second", true).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        let meta = std::fs::symlink_metadata(&target).unwrap();
        assert!(meta.file_type().is_file(), "the target is still a link");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "second");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let mut left: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["tls.key", "tls.tmp", "victim"]);
        // A directory that does not exist is an error, not a write elsewhere.
        assert!(write_file(&dir.join("missing/tls.key"), b"x", false).is_err());
    }
}
