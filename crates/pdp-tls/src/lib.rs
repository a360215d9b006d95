//! TLS for the webhook and the node-local front: rustls with the ring provider, TLS 1.2 and 1.3 only, optional
//! client-certificate verification (mTLS), built from PEM bytes so that files, Secrets and tests share one path;
//! [`Reloader`] turns each new generation of the inputs into a new configuration, or keeps the last good one.

pub mod certs;
pub mod identity;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use sha2::{Digest, Sha256};

use identity::{IdentityVerifier, SpiffeIdPattern};

/// Why a certificate, key or client CA was refused. The server keeps the last good configuration.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// No PEM certificate in the input.
    #[error("{0}: no PEM certificate found")]
    NoCertificate(String),
    /// The private key is missing or unreadable.
    #[error("{0}: no usable PEM private key found")]
    NoKey(String),
    /// The leaf certificate cannot be parsed.
    #[error("{what}: invalid certificate: {message}")]
    BadCertificate {
        /// Which input.
        what: String,
        /// What is wrong.
        message: String,
    },
    /// rustls refused the pair (for example a key that does not match the certificate).
    #[error("certificate and key rejected: {0}")]
    Rustls(#[from] rustls::Error),
    /// The client CA cannot verify clients.
    #[error("client CA rejected: {0}")]
    ClientCa(String),
}

/// The one crypto provider of the process. Installing it explicitly keeps rustls from guessing when two are
/// compiled in (kube's client and the server share this one).
pub fn provider() -> Arc<CryptoProvider> {
    pdp_core::pki::provider()
}

/// Installs [`provider`] as the process default; harmless when already installed (tests call it repeatedly).
pub fn install_default_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// PEM inputs of a server configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsMaterial {
    /// Certificate chain, leaf first.
    pub cert_pem: Vec<u8>,
    /// Private key of the leaf.
    pub key_pem: Vec<u8>,
    /// CA that client certificates must chain to, when mTLS is on.
    pub client_ca_pem: Option<Vec<u8>>,
}

impl TlsMaterial {
    /// Hash of all inputs: a change of any byte means a reload.
    pub fn fingerprint(&self) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(&self.cert_pem);
        h.update([0]);
        h.update(&self.key_pem);
        h.update([0]);
        if let Some(ca) = &self.client_ca_pem {
            h.update(ca);
        }
        h.finalize().into()
    }
}

/// Where the serving certificate comes from on disk.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// Certificate chain (PEM).
    pub cert: PathBuf,
    /// Private key (PEM).
    pub key: PathBuf,
    /// Optional client CA (PEM) for mTLS.
    pub client_ca: Option<PathBuf>,
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.display().to_string(),
        source,
    })
}

impl TlsFiles {
    /// Reads the files. Kubernetes swaps a Secret volume's `..data` symlink atomically, so reading the three
    /// paths through it sees one consistent generation or the next.
    pub fn read(&self) -> Result<TlsMaterial, TlsError> {
        Ok(TlsMaterial {
            cert_pem: read(&self.cert)?,
            key_pem: read(&self.key)?,
            client_ca_pem: self.client_ca.as_deref().map(read).transpose()?,
        })
    }
}

/// A usable server configuration and facts about it.
#[derive(Debug, Clone)]
pub struct LoadedTls {
    /// For the acceptor.
    pub config: Arc<ServerConfig>,
    /// Expiry of the leaf certificate, in seconds since the epoch.
    pub not_after: i64,
}

/// Unix time at which a PEM certificate expires.
pub fn not_after(cert_pem: &[u8]) -> Result<i64, TlsError> {
    let der = CertificateDer::from_pem_slice(cert_pem)
        .map_err(|_| TlsError::NoCertificate("certificate".into()))?;
    let (_, cert) =
        x509_parser::parse_x509_certificate(&der).map_err(|e| TlsError::BadCertificate {
            what: "certificate".into(),
            message: e.to_string(),
        })?;
    Ok(cert.validity().not_after.timestamp())
}

/// ALPN of the webhook: the apiserver speaks HTTP/2, other clients (curl, probes) may speak HTTP/1.1.
pub const ALPN_HTTP: &[&[u8]] = &[b"h2", b"http/1.1"];

/// ALPN of a gRPC-only endpoint (the node-local front): a client that offers only HTTP/1.1 fails the handshake
/// instead of failing later on bytes the backend cannot parse.
pub const ALPN_H2: &[&[u8]] = &[b"h2"];

/// Builds the rustls configuration: TLS 1.2 and 1.3, ALPN h2 and http/1.1, client certificates required when
/// a client CA is given.
pub fn build(material: &TlsMaterial) -> Result<LoadedTls, TlsError> {
    build_with_alpn(material, ALPN_HTTP)
}

/// [`build`] with the given ALPN protocols, in order of preference. A client that offers ALPN and none of
/// these fails the handshake (rustls answers `no_application_protocol`); one that offers no ALPN is served.
pub fn build_with_alpn(material: &TlsMaterial, alpn: &[&[u8]]) -> Result<LoadedTls, TlsError> {
    build_for(material, alpn, &[])
}

/// [`build_with_alpn`] where a client certificate must also name one of `client_ids` (a URI SAN; see
/// [`identity`]). Non-empty `client_ids` need a client CA: an identity means nothing without the chain check.
pub fn build_for(
    material: &TlsMaterial,
    alpn: &[&[u8]],
    client_ids: &[SpiffeIdPattern],
) -> Result<LoadedTls, TlsError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&material.cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|_| TlsError::NoCertificate("certificate".into()))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate("certificate".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(&material.key_pem)
        .map_err(|_| TlsError::NoKey("key".into()))?;
    let not_after = not_after(&material.cert_pem)?;
    let provider = provider();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?;
    let builder = match &material.client_ca_pem {
        None if !client_ids.is_empty() => {
            return Err(TlsError::ClientCa(
                "client identities are checked only on certificates of a client CA, and none is given".into(),
            ));
        }
        None => builder.with_no_client_auth(),
        Some(ca_pem) => {
            let mut roots = rustls::RootCertStore::empty();
            let mut count = 0;
            for cert in CertificateDer::pem_slice_iter(ca_pem) {
                let cert = cert.map_err(|e| TlsError::ClientCa(e.to_string()))?;
                roots
                    .add(cert)
                    .map_err(|e| TlsError::ClientCa(e.to_string()))?;
                count += 1;
            }
            if count == 0 {
                return Err(TlsError::ClientCa("no PEM certificate found".into()));
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| TlsError::ClientCa(e.to_string()))?;
            if client_ids.is_empty() {
                builder.with_client_cert_verifier(verifier)
            } else {
                builder.with_client_cert_verifier(Arc::new(IdentityVerifier {
                    inner: verifier,
                    allowed: client_ids.into(),
                }))
            }
        }
    };
    let mut config = builder.with_single_cert(certs, key)?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(LoadedTls {
        config: Arc::new(config),
        not_after,
    })
}

/// What one look at the inputs found.
#[derive(Debug)]
pub enum Reload {
    /// The same inputs as last time (or the same error as last time, already reported).
    Unchanged,
    /// New inputs that build: serve this from now on.
    Loaded(LoadedTls),
    /// New inputs that cannot be read or built, reported once per distinct error: keep serving the last good
    /// configuration.
    Failed(TlsError),
}

/// Turns successive readings of the TLS inputs into configurations to swap in: only a change of any input
/// byte (its [`TlsMaterial::fingerprint`]) builds a new one, and a broken input is reported once, not at
/// every look, so a server that polls its files every few seconds logs a bad Secret once and keeps serving.
/// Shared by the webhook and the node-local front.
#[derive(Debug)]
pub struct Reloader {
    seen: [u8; 32],
    alpn: &'static [&'static [u8]],
    client_ids: Vec<SpiffeIdPattern>,
}

impl Reloader {
    /// Builds the first configuration; an error here means the server cannot start.
    pub fn start(
        material: &TlsMaterial,
        alpn: &'static [&'static [u8]],
    ) -> Result<(Reloader, LoadedTls), TlsError> {
        Self::start_for(material, alpn, Vec::new())
    }

    /// [`Reloader::start`] for a server that requires one of `client_ids` in client certificates
    /// ([`build_for`]); every configuration it builds keeps that requirement.
    pub fn start_for(
        material: &TlsMaterial,
        alpn: &'static [&'static [u8]],
        client_ids: Vec<SpiffeIdPattern>,
    ) -> Result<(Reloader, LoadedTls), TlsError> {
        let loaded = build_for(material, alpn, &client_ids)?;
        Ok((
            Reloader {
                seen: material.fingerprint(),
                alpn,
                client_ids,
            },
            loaded,
        ))
    }

    /// Judges a new reading of the inputs (a read error counts as a reading: it is reported once too).
    pub fn offer(&mut self, reading: Result<TlsMaterial, TlsError>) -> Reload {
        let fingerprint = match &reading {
            Ok(material) => material.fingerprint(),
            Err(e) => Sha256::digest(e.to_string().as_bytes()).into(),
        };
        if fingerprint == self.seen {
            return Reload::Unchanged;
        }
        self.seen = fingerprint;
        match reading.and_then(|material| build_for(&material, self.alpn, &self.client_ids)) {
            Ok(loaded) => Reload::Loaded(loaded),
            Err(e) => Reload::Failed(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certs::generate;

    fn material() -> TlsMaterial {
        let b = generate(&["localhost".into()], 2, 1).unwrap();
        TlsMaterial {
            cert_pem: b.cert_pem.into_bytes(),
            key_pem: b.key_pem.into_bytes(),
            client_ca_pem: None,
        }
    }

    #[test]
    fn builds_from_generated_material() {
        let m = material();
        let loaded = build(&m).unwrap();
        assert_eq!(loaded.config.alpn_protocols.len(), 2);
        assert!(loaded.not_after > time::OffsetDateTime::now_utc().unix_timestamp());
    }

    #[test]
    fn mismatched_key_is_refused() {
        let a = material();
        let b = material();
        let mixed = TlsMaterial {
            cert_pem: a.cert_pem,
            key_pem: b.key_pem,
            client_ca_pem: None,
        };
        assert!(matches!(build(&mixed), Err(TlsError::Rustls(_))));
    }

    #[test]
    fn garbage_is_refused_with_a_reason() {
        let m = TlsMaterial {
            cert_pem: b"nope".to_vec(),
            key_pem: b"nope".to_vec(),
            client_ca_pem: None,
        };
        assert!(matches!(build(&m), Err(TlsError::NoCertificate(_))));
        let mut m = material();
        m.client_ca_pem = Some(b"nope".to_vec());
        assert!(matches!(build(&m), Err(TlsError::ClientCa(_))));
    }

    #[test]
    fn the_reloader_builds_each_new_generation_once_and_reports_each_error_once() {
        let first = material();
        let (mut reloader, loaded) = Reloader::start(&first, ALPN_H2).unwrap();
        assert_eq!(loaded.config.alpn_protocols, [b"h2".to_vec()]);
        assert!(matches!(
            reloader.offer(Ok(first.clone())),
            Reload::Unchanged
        ));
        let broken = TlsMaterial {
            cert_pem: b"half a file".to_vec(),
            ..first.clone()
        };
        assert!(matches!(
            reloader.offer(Ok(broken.clone())),
            Reload::Failed(TlsError::NoCertificate(_))
        ));
        assert!(matches!(reloader.offer(Ok(broken)), Reload::Unchanged));
        let missing = || {
            TlsFiles {
                cert: "/nonexistent/tls.crt".into(),
                key: "/nonexistent/tls.key".into(),
                client_ca: None,
            }
            .read()
        };
        assert!(matches!(
            reloader.offer(missing()),
            Reload::Failed(TlsError::Read { .. })
        ));
        assert!(matches!(reloader.offer(missing()), Reload::Unchanged));
        let second = material();
        match reloader.offer(Ok(second)) {
            Reload::Loaded(loaded) => assert_eq!(loaded.config.alpn_protocols, [b"h2".to_vec()]),
            other => panic!("{other:?}"),
        }
        // Back to the first generation after a failure: that is a change too.
        assert!(matches!(reloader.offer(Ok(first)), Reload::Loaded(_)));
    }

    #[test]
    fn fingerprint_changes_with_any_input() {
        let m = material();
        let mut n = m.clone();
        n.client_ca_pem = Some(b"x".to_vec());
        assert_ne!(m.fingerprint(), n.fingerprint());
        assert_eq!(m.fingerprint(), m.clone().fingerprint());
    }
}
