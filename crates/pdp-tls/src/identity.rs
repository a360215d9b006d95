//! Client identities on a TLS port: "a certificate of the client CA" is not enough where one CA signs for many
//! namespaces, so a server can also require the client certificate to name an allowed SPIFFE ID
//! (`spiffe://<trust domain>/<path>`, a URI SAN, the form Istio, Linkerd, SPIRE and cert-manager's
//! csi-driver-spiffe write: `spiffe://cluster.local/ns/<namespace>/sa/<service account>`).
//!
//! A pattern is a SPIFFE ID in which a path segment may be `*`, matching exactly one segment:
//! `spiffe://cluster.local/ns/shop/sa/*` is every ServiceAccount of namespace `shop`. The check runs inside the
//! handshake, after the chain is verified, so a refused client gets a TLS alert and nothing reaches the PDP.
use std::fmt;
use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, OtherError, SignatureScheme,
};

const SCHEME: &str = "spiffe://";

/// One allowed client identity, `*` standing for one whole path segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpiffeIdPattern {
    text: String,
    trust_domain: String,
    segments: Vec<Option<String>>,
}

/// A SPIFFE ID split into its trust domain and path segments, or why it is not one.
fn split(id: &str, wildcards: bool) -> Result<(&str, Vec<Option<&str>>), String> {
    let rest = id
        .strip_prefix(SCHEME)
        .ok_or_else(|| format!("{id:?} is not a SPIFFE ID: it must start with {SCHEME}"))?;
    let (domain, path) = rest.split_once('/').ok_or_else(|| {
        format!("{id:?} has no path: a workload's ID looks like spiffe://cluster.local/ns/<namespace>/sa/<name>")
    })?;
    if domain.is_empty()
        || !domain
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-._".contains(&b))
    {
        return Err(format!(
            "{id:?}: the trust domain {domain:?} must be lowercase letters, digits, '-', '.' or '_'"
        ));
    }
    let mut segments = Vec::new();
    for segment in path.split('/') {
        if wildcards && segment == "*" {
            segments.push(None);
            continue;
        }
        if segment.is_empty() || segment == "." || segment == ".." {
            return Err(format!(
                "{id:?}: empty, '.' and '..' path segments are not allowed"
            ));
        }
        if !segment
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
        {
            return Err(format!(
                "{id:?}: the segment {segment:?} may hold only letters, digits, '-', '.' and '_'{}",
                if wildcards {
                    " (or be * alone, for any one segment)"
                } else {
                    ""
                }
            ));
        }
        segments.push(Some(segment));
    }
    Ok((domain, segments))
}

impl SpiffeIdPattern {
    /// Parses a pattern (a command-line value).
    pub fn parse(text: &str) -> Result<Self, String> {
        let (trust_domain, segments) = split(text, true)?;
        Ok(Self {
            text: text.to_owned(),
            trust_domain: trust_domain.to_owned(),
            segments: segments.into_iter().map(|s| s.map(str::to_owned)).collect(),
        })
    }

    /// Whether a URI of a certificate is an ID this pattern allows. Anything that is not a valid SPIFFE ID
    /// (another scheme, a `*` segment, a query) matches nothing.
    pub fn matches(&self, uri: &str) -> bool {
        let Ok((domain, segments)) = split(uri, false) else {
            return false;
        };
        domain == self.trust_domain
            && segments.len() == self.segments.len()
            && segments
                .iter()
                .zip(&self.segments)
                .all(|(seg, want)| want.as_deref().is_none_or(|w| Some(w) == *seg))
    }
}

impl fmt::Display for SpiffeIdPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// The URI SANs of a DER certificate (none when it cannot be parsed: the chain check before has parsed it).
pub fn uri_sans(der: &[u8]) -> Vec<String> {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return Vec::new();
    };
    let Ok(Some(sans)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    sans.value
        .general_names
        .iter()
        .filter_map(|name| match name {
            x509_parser::extensions::GeneralName::URI(uri) => Some((*uri).to_owned()),
            _ => None,
        })
        .collect()
}

/// The handshake error of a verified certificate that names no allowed identity; its text is what the server
/// logs (the client sees a certificate alert).
#[derive(Debug)]
pub struct IdentityRefused {
    /// The certificate's URI SANs.
    pub found: Vec<String>,
}

impl fmt::Display for IdentityRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.found.is_empty() {
            write!(
                f,
                "the client's certificate names no SPIFFE ID (URI SAN), and --tls-client-id requires an allowed one"
            )
        } else {
            write!(
                f,
                "the client's certificate names {}, which no --tls-client-id allows",
                self.found.join(", ")
            )
        }
    }
}

impl std::error::Error for IdentityRefused {}

/// A client verifier that, after the CA's chain check, requires one of `allowed` among the leaf's URI SANs.
#[derive(Debug)]
pub struct IdentityVerifier {
    pub(crate) inner: Arc<dyn ClientCertVerifier>,
    pub(crate) allowed: Arc<[SpiffeIdPattern]>,
}

impl ClientCertVerifier for IdentityVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.inner
            .verify_client_cert(end_entity, intermediates, now)?;
        let found = uri_sans(end_entity);
        if found
            .iter()
            .any(|id| self.allowed.iter().any(|p| p.matches(id)))
        {
            return Ok(ClientCertVerified::assertion());
        }
        Err(rustls::Error::InvalidCertificate(CertificateError::Other(
            OtherError(Arc::new(IdentityRefused { found })),
        )))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pattern_matches_whole_segments_of_its_trust_domain_only() {
        let p = SpiffeIdPattern::parse("spiffe://cluster.local/ns/shop/sa/*").unwrap();
        assert!(p.matches("spiffe://cluster.local/ns/shop/sa/checkout"));
        assert!(p.matches("spiffe://cluster.local/ns/shop/sa/default"));
        for other in [
            "spiffe://cluster.local/ns/shop2/sa/checkout",
            "spiffe://cluster.local/ns/shop/sa/checkout/extra",
            "spiffe://cluster.local/ns/shop/sa",
            "spiffe://cluster.local/ns/shop/sa/",
            "spiffe://other.domain/ns/shop/sa/checkout",
            "spiffe://cluster.local/ns/shop/sa/*",
            "spiffe://cluster.local/ns/shop/sa/..",
            "https://cluster.local/ns/shop/sa/checkout",
            "spiffe://CLUSTER.local/ns/shop/sa/checkout",
            "spiffe://cluster.local/ns/shop/sa/a?b",
            "",
        ] {
            assert!(!p.matches(other), "{other}");
        }
        let any_ns = SpiffeIdPattern::parse("spiffe://cluster.local/ns/*/sa/checkout").unwrap();
        assert!(any_ns.matches("spiffe://cluster.local/ns/a/sa/checkout"));
        assert!(!any_ns.matches("spiffe://cluster.local/ns/a/sa/other"));
        let exact = SpiffeIdPattern::parse("spiffe://td/ns/a/sa/b").unwrap();
        assert!(exact.matches("spiffe://td/ns/a/sa/b"));
        assert!(!exact.matches("spiffe://td/ns/a/sa/bb"));
        assert_eq!(exact.to_string(), "spiffe://td/ns/a/sa/b");
    }

    #[test]
    fn bad_patterns_say_what_is_wrong() {
        for (text, says) in [
            ("cluster.local/ns/a", "must start with spiffe://"),
            ("spiffe://cluster.local", "has no path"),
            ("spiffe:///ns/a", "trust domain"),
            ("spiffe://Cluster/ns/a", "trust domain"),
            ("spiffe://td/ns//a", "empty"),
            ("spiffe://td/ns/../a", "'..'"),
            ("spiffe://td/ns/a*", "or be * alone"),
            ("spiffe://td/ns/a/", "empty"),
        ] {
            let e = SpiffeIdPattern::parse(text).unwrap_err();
            assert!(e.contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn uri_sans_are_read_from_the_certificate() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["client".to_owned()]).unwrap();
        params.subject_alt_names.push(rcgen::SanType::URI(
            "spiffe://cluster.local/ns/a/sa/b".try_into().unwrap(),
        ));
        let cert = params.self_signed(&key).unwrap();
        assert_eq!(uri_sans(cert.der()), ["spiffe://cluster.local/ns/a/sa/b"]);
        assert!(uri_sans(b"not a certificate").is_empty());
        let refused = IdentityRefused {
            found: uri_sans(cert.der()),
        };
        assert!(
            refused.to_string().contains(
                "names spiffe://cluster.local/ns/a/sa/b, which no --tls-client-id allows"
            )
        );
    }
}
