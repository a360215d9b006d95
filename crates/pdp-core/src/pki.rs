//! Certificate generation: a CA and a serving certificate with the SANs the apiserver dials
//! (`<svc>.<ns>.svc`, `<svc>.<ns>.svc.cluster.local`), for `pdp-injector certs`, the local self-signed mode of
//! `serve`, `check`'s judging and the tests. Pure: the binary's `tls::certs` writes the files.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use time::{Duration, OffsetDateTime};

/// The one crypto provider of the process (ring). Installing it explicitly keeps rustls from guessing when two
/// are compiled in (kube's client and the server share this one).
pub fn provider() -> std::sync::Arc<rustls::crypto::CryptoProvider> {
    std::sync::Arc::new(rustls::crypto::ring::default_provider())
}

/// Why a certificate could not be made: rcgen refused the parameters (for example an invalid DNS name).
pub type GenerateError = rcgen::Error;

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
pub fn generate(sans: &[String], ca_days: i64, days: i64) -> Result<Bundle, GenerateError> {
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
) -> Result<(String, String), GenerateError> {
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
    /// The CA in base64, ready for `caBundle`.
    pub fn ca_bundle(&self) -> String {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(self.ca_cert_pem.as_bytes())
    }
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
    fn invalid_names_are_errors() {
        assert!(generate(&["bücher.example".into()], 1, 1).is_err());
    }
}
