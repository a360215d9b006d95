//! What a Secret's certificates say, without I/O: its PEM bundles and CAs, the ledger of retired and dropped
//! CAs, and whether the Secret can be used as it is.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use sha2::Digest;

use pdp_tls::{self as tls, TlsMaterial};

use super::{Assessment, Settings};

pub(super) fn field(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
}

pub(super) fn first_cert_expiry(pem: &str) -> Option<i64> {
    tls::not_after(pem.as_bytes()).ok()
}

pub(super) fn has_san(cert_pem: &str, san: &str) -> bool {
    let Ok(der) = CertificateDer::from_pem_slice(cert_pem.as_bytes()) else {
        return false;
    };
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(&der) else {
        return false;
    };
    let Ok(Some(ext)) = cert.subject_alternative_name() else {
        return false;
    };
    ext.value
        .general_names
        .iter()
        .any(|n| matches!(n, x509_parser::extensions::GeneralName::DNSName(d) if *d == san))
}

const RETIRED_CAS: &str = "pdp-injector.io/retired-cas";
const DROPPED_CAS: &str = "pdp-injector.io/dropped-cas";
/// How many dropped CAs the Secret remembers (a stale replica can re-add only a CA it still knows).
const DROPPED_KEPT: usize = 32;

/// The certificates of a PEM bundle, one block each, in order; anything else in the text is left out.
pub fn split_pem(bundle: &str) -> Vec<String> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let mut out = Vec::new();
    let mut rest = bundle;
    while let Some(start) = rest.find(BEGIN) {
        let Some(len) = rest[start..].find(END) else {
            break;
        };
        let end = start + len + END.len();
        out.push(format!("{}\n", &rest[start..end]));
        rest = &rest[end..];
    }
    out
}

/// A short SHA-256 of a certificate's DER, to name a CA in the Secret's ledger.
pub fn fingerprint(cert_pem: &str) -> Option<String> {
    let der = CertificateDer::from_pem_slice(cert_pem.as_bytes()).ok()?;
    let digest = sha2::Sha256::digest(der.as_ref());
    Some(digest[..16].iter().map(|b| format!("{b:02x}")).collect())
}

/// The CAs of `bundles`, in order, each once, without expired, unreadable or `dropped` ones.
pub fn ca_union<'a>(
    bundles: impl IntoIterator<Item = &'a str>,
    dropped: &BTreeSet<String>,
    now: i64,
) -> String {
    let mut seen = BTreeSet::new();
    let mut out = String::new();
    for cert in bundles.into_iter().flat_map(split_pem) {
        let Some(fp) = fingerprint(&cert) else {
            continue;
        };
        let live = first_cert_expiry(&cert).is_some_and(|e| e > now);
        if live && !dropped.contains(&fp) && seen.insert(fp) {
            out.push_str(&cert);
        }
    }
    out
}

/// What the Secret remembers of CAs that are no longer current: when each was retired, and which were dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ledger {
    /// Fingerprint -> when it was retired (seconds since the epoch); still trusted.
    pub retired: BTreeMap<String, i64>,
    /// Fingerprints no longer trusted, newest last.
    pub dropped: Vec<String>,
}

impl Ledger {
    /// Reads the Secret's annotations; an unreadable ledger is an empty one (nothing is dropped early).
    pub fn of(secret: &Secret) -> Ledger {
        let notes = secret.metadata.annotations.as_ref();
        let read = |key: &str| notes.and_then(|a| a.get(key)).map(String::as_str);
        Ledger {
            retired: read(RETIRED_CAS)
                .and_then(|t| serde_json::from_str(t).ok())
                .unwrap_or_default(),
            dropped: read(DROPPED_CAS)
                .and_then(|t| serde_json::from_str(t).ok())
                .unwrap_or_default(),
        }
    }

    pub(super) fn annotations(&self) -> BTreeMap<String, String> {
        let mut a = BTreeMap::new();
        if !self.retired.is_empty() {
            a.insert(
                RETIRED_CAS.into(),
                serde_json::json!(self.retired).to_string(),
            );
        }
        if !self.dropped.is_empty() {
            a.insert(
                DROPPED_CAS.into(),
                serde_json::json!(self.dropped).to_string(),
            );
        }
        a
    }

    /// The dropped fingerprints as a set.
    pub fn dropped_set(&self) -> BTreeSet<String> {
        self.dropped.iter().cloned().collect()
    }

    /// Records every CA of `bundle` but the current one as retired at `now` (keeping earlier dates).
    pub(super) fn retire_all_but(&mut self, bundle: &str, current: &str, now: i64) {
        let current = fingerprint(current);
        for cert in split_pem(bundle) {
            if let Some(fp) = fingerprint(&cert)
                && Some(&fp) != current.as_ref()
            {
                self.retired.entry(fp).or_insert(now);
            }
        }
    }

    /// Moves the CAs retired at least `after` ago to `dropped`; returns whether any moved.
    pub(super) fn drop_due(&mut self, now: i64, after: Duration) -> bool {
        let after = i64::try_from(after.as_secs()).unwrap_or(i64::MAX);
        let due: Vec<String> = self
            .retired
            .iter()
            .filter(|(_, at)| now.saturating_sub(**at) >= after)
            .map(|(fp, _)| fp.clone())
            .collect();
        for fp in &due {
            self.retired.remove(fp);
            self.dropped.push(fp.clone());
        }
        let excess = self.dropped.len().saturating_sub(DROPPED_KEPT);
        self.dropped.drain(..excess);
        !due.is_empty()
    }
}

/// Decides, without I/O, whether a Secret's certificates can be used at `now` (seconds since the epoch).
pub fn assess(secret: &Secret, settings: &Settings, now: i64) -> Assessment {
    let renew_at = |expiry: i64| expiry - settings.renew_before() * 86_400 <= now;
    let (Some(ca_cert), Some(ca_key)) = (field(secret, "ca.crt"), field(secret, "ca.key")) else {
        return Assessment::Regenerate;
    };
    let ca_usable = first_cert_expiry(&ca_cert).is_some_and(|e| !renew_at(e))
        && rcgen::KeyPair::from_pem(&ca_key).is_ok();
    if !ca_usable {
        return Assessment::Regenerate;
    }
    let (Some(cert), Some(key)) = (field(secret, "tls.crt"), field(secret, "tls.key")) else {
        return Assessment::RenewWithCa(ca_cert, ca_key);
    };
    let material = TlsMaterial {
        cert_pem: cert.clone().into_bytes(),
        key_pem: key.into_bytes(),
        client_ca_pem: None,
    };
    let sound = tls::build(&material).is_ok()
        && first_cert_expiry(&cert).is_some_and(|e| !renew_at(e))
        && settings.sans().iter().all(|s| has_san(&cert, s));
    if sound {
        Assessment::Valid(material, ca_cert)
    } else {
        Assessment::RenewWithCa(ca_cert, ca_key)
    }
}
