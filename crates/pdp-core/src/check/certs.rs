//! Does the webhook configuration's `caBundle` verify the serving certificate, for the name the apiserver dials?
//! The same rustls/webpki verification a TLS client does, on PEM bytes (no I/O), so the Secret's certificate
//! and the one the live endpoint presents are judged alike.

use std::sync::Arc;

use rustls::RootCertStore;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

/// The trust anchors of a `caBundle` (PEM), or why it cannot verify anything.
pub fn roots(ca_bundle_pem: &[u8]) -> Result<Arc<RootCertStore>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(ca_bundle_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("caBundle is not PEM: {e}"))?;
    if certs.is_empty() {
        return Err("caBundle holds no certificate".into());
    }
    let mut store = RootCertStore::empty();
    let (_, bad) = store.add_parsable_certificates(certs);
    if store.is_empty() {
        return Err(format!(
            "caBundle holds {bad} certificate(s), none usable as a CA"
        ));
    }
    Ok(Arc::new(store))
}

/// Verifies a certificate chain (PEM, leaf first) against `roots` for `server_name` (a DNS name or an IP) at
/// time `now` (Unix seconds). `Err` says why a TLS client would refuse it.
pub fn verify(
    roots: Arc<RootCertStore>,
    chain_pem: &[u8],
    server_name: &str,
    now: i64,
) -> Result<(), String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(chain_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("certificate is not PEM: {e}"))?;
    verify_der(roots, &chain, server_name, now)
}

/// [`verify`] on DER certificates (what a TLS handshake hands over).
pub fn verify_der(
    roots: Arc<RootCertStore>,
    chain: &[CertificateDer<'_>],
    server_name: &str,
    now: i64,
) -> Result<(), String> {
    let Some((leaf, intermediates)) = chain.split_first() else {
        return Err("no certificate".into());
    };
    let name = ServerName::try_from(server_name.to_string())
        .map_err(|e| format!("{server_name:?} is not a DNS name or IP address: {e}"))?;
    let verifier = WebPkiServerVerifier::builder_with_provider(roots, crate::pki::provider())
        .build()
        .map_err(|e| e.to_string())?;
    let now = UnixTime::since_unix_epoch(std::time::Duration::from_secs(now.max(0) as u64));
    verifier
        .verify_server_cert(leaf, intermediates, &name, &[], now)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Validity of a certificate: (not before, not after), Unix seconds.
pub type Validity = (i64, i64);

/// Validity of a DER certificate.
pub fn validity_der(der: &CertificateDer<'_>) -> Result<Validity, String> {
    x509_parser::parse_x509_certificate(der)
        .map(|(_, c)| {
            (
                c.validity().not_before.timestamp(),
                c.validity().not_after.timestamp(),
            )
        })
        .map_err(|e| e.to_string())
}

/// Validity of the first certificate of a PEM chain.
pub fn validity(pem: &[u8]) -> Result<Validity, String> {
    let der = CertificateDer::from_pem_slice(pem).map_err(|_| "no PEM certificate".to_string())?;
    validity_der(&der)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki as certs;

    fn now() -> i64 {
        time::OffsetDateTime::now_utc().unix_timestamp()
    }

    #[test]
    fn bundle_verifies_its_own_serving_cert_only() {
        let sans = certs::service_sans("pdp-injector", "pdp-system");
        let a = certs::generate(&sans, 30, 10).unwrap();
        let b = certs::generate(&sans, 30, 10).unwrap();
        let ra = roots(a.ca_cert_pem.as_bytes()).unwrap();
        verify(
            ra.clone(),
            a.cert_pem.as_bytes(),
            "pdp-injector.pdp-system.svc",
            now(),
        )
        .unwrap();
        // Another CA's certificate, or the right one for another name, is refused.
        assert!(
            verify(
                ra.clone(),
                b.cert_pem.as_bytes(),
                "pdp-injector.pdp-system.svc",
                now()
            )
            .is_err()
        );
        let e = verify(
            ra.clone(),
            a.cert_pem.as_bytes(),
            "other.pdp-system.svc",
            now(),
        )
        .unwrap_err();
        assert!(e.to_lowercase().contains("name"), "{e}");
        // Expired by then.
        assert!(
            verify(
                ra,
                a.cert_pem.as_bytes(),
                "pdp-injector.pdp-system.svc",
                now() + 20 * 86400
            )
            .is_err()
        );
        let (from, to) = validity(a.cert_pem.as_bytes()).unwrap();
        assert!((from - now()).abs() < 3600, "{from}");
        let left = to - now();
        assert!((9 * 86400..=11 * 86400).contains(&left), "{left}");
    }

    #[test]
    fn bad_bundles_say_why() {
        assert!(roots(b"").unwrap_err().contains("no certificate"));
        assert!(roots(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n").is_err());
    }
}
