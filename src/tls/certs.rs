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

/// Writes a file atomically (temp file + rename), so a watcher never reads half a certificate.
pub fn write_file(path: &Path, bytes: &[u8], private: bool) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(if private { 0o600 } else { 0o644 })
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)
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

    #[test]
    fn invalid_names_are_errors() {
        assert!(generate(&["bücher.example".into()], 1, 1).is_err());
    }
}
