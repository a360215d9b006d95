//! Certificate generation: a CA and a serving certificate with the SANs the apiserver dials
//! (`<svc>.<ns>.svc`, `<svc>.<ns>.svc.cluster.local`), for `pdp-injector certs`, the local self-signed mode of
//! `serve`, and the tests.

use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use time::{Duration, OffsetDateTime};

/// The webhook's Service, whose DNS names the serving certificate carries: flags of `serve` and `certs`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct ServiceName {
    /// Service name the apiserver dials (the certificate's SANs).
    #[arg(long, env = "PDP_INJECTOR_SERVICE", default_value = "pdp-injector")]
    pub service: String,
    /// Namespace of the webhook (its Service and Secret).
    #[arg(long, env = "POD_NAMESPACE", default_value = "pdp-system")]
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

/// A CA and a serving certificate signed by it, in PEM.
#[derive(Debug, Clone)]
pub struct Bundle {
    /// CA certificate: the `caBundle` of the MutatingWebhookConfiguration.
    pub ca_cert_pem: String,
    /// CA private key (needed only to renew).
    pub ca_key_pem: String,
    /// Serving certificate.
    pub cert_pem: String,
    /// Serving private key.
    pub key_pem: String,
}

/// The DNS names the apiserver uses for a webhook Service.
pub fn service_sans(service: &str, namespace: &str) -> Vec<String> {
    vec![
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ]
}

/// Generates a CA valid for `ca_days` and a serving certificate for `sans` valid for `days`.
pub fn generate(sans: &[String], ca_days: i64, days: i64) -> Result<Bundle, CertError> {
    let now = OffsetDateTime::now_utc();
    // Backdate a little: clocks of the apiserver and the nodes are never exactly in step.
    let not_before = now - Duration::minutes(5);

    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "pdp-injector CA");
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca_params.not_before = not_before;
    ca_params.not_after = now + Duration::days(ca_days);
    let ca_key = KeyPair::generate()?;
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let ca_cert_pem = ca_cert.pem();
    let ca_key_pem = ca_key.serialize_pem();
    let issuer = Issuer::new(ca_params, ca_key);
    let (cert_pem, key_pem) = generate_with_issuer(sans, days, &issuer)?;
    Ok(Bundle {
        ca_cert_pem,
        ca_key_pem,
        cert_pem,
        key_pem,
    })
}

/// A serving certificate for `sans`, valid for `days`, signed by `issuer`; returns (certificate, key) in PEM.
pub fn generate_with_issuer(
    sans: &[String],
    days: i64,
    issuer: &Issuer<'_, KeyPair>,
) -> Result<(String, String), CertError> {
    let now = OffsetDateTime::now_utc();
    let mut params = CertificateParams::new(sans.to_vec())?;
    params.distinguished_name.push(
        DnType::CommonName,
        sans.first().map(String::as_str).unwrap_or("pdp-injector"),
    );
    params.is_ca = IsCa::ExplicitNoCa;
    params.use_authority_key_identifier_extension = true;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.not_before = now - Duration::minutes(5);
    params.not_after = now + Duration::days(days);
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

impl Bundle {
    /// Writes `ca.crt`, `ca.key`, `tls.crt` and `tls.key` (the names of a Kubernetes TLS Secret) into `dir`;
    /// keys are readable by the owner only.
    pub fn write(&self, dir: &Path) -> Result<(), CertError> {
        std::fs::create_dir_all(dir).map_err(|source| CertError::Write {
            path: dir.display().to_string(),
            source,
        })?;
        for (name, pem, private) in [
            ("ca.crt", &self.ca_cert_pem, false),
            ("ca.key", &self.ca_key_pem, true),
            ("tls.crt", &self.cert_pem, false),
            ("tls.key", &self.key_pem, true),
        ] {
            let path = dir.join(name);
            write_file(&path, pem.as_bytes(), private).map_err(|source| CertError::Write {
                path: path.display().to_string(),
                source,
            })?;
        }
        Ok(())
    }

    /// The CA in base64, ready for `caBundle`.
    pub fn ca_bundle(&self) -> String {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(self.ca_cert_pem.as_bytes())
    }
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
    use rustls_pki_types::pem::PemObject as _;

    #[test]
    fn serving_cert_has_the_service_sans_and_expiry() {
        let sans = service_sans("pdp-injector", "pdp-system");
        let b = generate(&sans, 3650, 90).unwrap();
        let der = rustls_pki_types::CertificateDer::from_pem_slice(b.cert_pem.as_bytes()).unwrap();
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        let names: Vec<String> = cert
            .subject_alternative_name()
            .unwrap()
            .unwrap()
            .value
            .general_names
            .iter()
            .map(|n| n.to_string())
            .collect();
        assert_eq!(
            names,
            vec![
                "DNSName(pdp-injector.pdp-system.svc)",
                "DNSName(pdp-injector.pdp-system.svc.cluster.local)"
            ]
        );
        let days = (cert.validity().not_after.timestamp()
            - OffsetDateTime::now_utc().unix_timestamp())
            / 86_400;
        assert!((89..=90).contains(&days), "{days}");
        assert!(!cert.is_ca());
        let ca_der =
            rustls_pki_types::CertificateDer::from_pem_slice(b.ca_cert_pem.as_bytes()).unwrap();
        let (_, ca) = x509_parser::parse_x509_certificate(&ca_der).unwrap();
        assert!(ca.is_ca());
        assert_eq!(cert.issuer(), ca.subject());
    }

    #[test]
    fn bundle_writes_private_keys_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("pdp-certs-{}", std::process::id()));
        let b = generate(&["localhost".into()], 1, 1).unwrap();
        b.write(&dir).unwrap();
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
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A symlink planted where a predictable temporary file would go, or at the target itself, is never
    /// followed: the file it points at stays as it was, and no temporary file is left.
    #[test]
    fn writes_never_follow_a_planted_symlink() {
        let dir = std::env::temp_dir().join(format!("pdp-certs-link-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
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
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["tls.key", "tls.tmp", "victim"]);
        // A directory that does not exist is an error, not a write elsewhere.
        assert!(write_file(&dir.join("missing/tls.key"), b"x", false).is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn invalid_names_are_errors() {
        assert!(generate(&["bücher.example".into()], 1, 1).is_err());
    }
}
