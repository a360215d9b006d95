//! One rustls client configuration for tests that speak TLS to the webhook or the node-local front.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A client trusting every certificate in `ca_pems`, presenting `identity` (certificate, key PEM) when given,
/// with the given protocol versions and ALPN.
pub fn tls_client_config(
    ca_pems: &[&str],
    identity: Option<(&str, &str)>,
    versions: &[&'static rustls::SupportedProtocolVersion],
    alpn: &[&[u8]],
) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for pem in ca_pems {
        for c in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            roots
                .add(c.expect("a CA certificate in PEM"))
                .expect("a valid CA certificate");
        }
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(versions)
    .expect("protocol versions the provider supports")
    .with_root_certificates(roots);
    let mut config = match identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(cert.as_bytes())
                    .map(|c| c.expect("a client certificate in PEM"))
                    .collect(),
                PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("a client key in PEM"),
            )
            .expect("a client certificate matching its key"),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}
