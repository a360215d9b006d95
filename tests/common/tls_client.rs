// Shared by the test binaries that speak TLS to the webhook or the node-local front: one rustls client
// configuration, trusting the given CAs (PEM), presenting a client certificate when given, with the given
// protocol versions and ALPN.

/// A client configuration trusting every certificate in `ca_pems`.
pub fn tls_client_config(
    ca_pems: &[&str],
    identity: Option<(&str, &str)>,
    versions: &[&'static rustls::SupportedProtocolVersion],
    alpn: &[&[u8]],
) -> std::sync::Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    for pem in ca_pems {
        for c in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
    }
    let builder = rustls::ClientConfig::builder_with_provider(pdp_injector::tls::provider())
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(cert.as_bytes())
                    .map(|c| c.unwrap())
                    .collect(),
                PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
            )
            .unwrap(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    std::sync::Arc::new(config)
}
