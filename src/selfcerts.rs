//! Self-managed certificates (no cert-manager): the CA and serving certificate live in a Secret that every
//! replica shares. On start and then periodically, each replica loads the Secret, creates it if absent or
//! renews it before expiry (create-if-absent and resourceVersion-checked replace, so replicas racing each other
//! converge on one winner), patches `caBundle` into the MutatingWebhookConfiguration, and hands new material to
//! the TLS reloader: every replica serves the new certificate without a restart.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::PostParams;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::certs::{self, Bundle};
use crate::tls::{self, TlsMaterial};

/// Settings of self-managed mode (flags of `serve`).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Namespace of the webhook and its Secret.
    pub namespace: String,
    /// Secret holding `ca.crt`, `ca.key`, `tls.crt`, `tls.key`.
    pub secret_name: String,
    /// Service the apiserver dials.
    pub service: String,
    /// MutatingWebhookConfiguration whose `caBundle` is kept in step.
    pub webhook_config: String,
    /// Validity of a serving certificate, in days.
    pub cert_days: i64,
    /// Validity of a CA, in days.
    pub ca_days: i64,
    /// Renew when less than this is left, in days.
    pub renew_before_days: i64,
    /// How often the Secret is checked.
    pub check_interval: Duration,
    /// Client CA for mTLS, added to the serving material.
    pub client_ca_pem: Option<Vec<u8>>,
}

impl Settings {
    /// Defaults for a namespace.
    pub fn new(namespace: impl Into<String>) -> Self {
        Settings {
            namespace: namespace.into(),
            secret_name: "pdp-injector-tls".into(),
            service: "pdp-injector".into(),
            webhook_config: "pdp-injector".into(),
            cert_days: 90,
            ca_days: 3650,
            renew_before_days: 30,
            check_interval: Duration::from_secs(60),
            client_ca_pem: None,
        }
    }

    fn sans(&self) -> Vec<String> {
        certs::service_sans(&self.service, &self.namespace)
    }
}

/// Why the certificates could not be ensured. The caller retries; a running server keeps its certificate.
#[derive(Debug, thiserror::Error)]
pub enum SelfCertError {
    /// An API call failed.
    #[error("kubernetes API: {0}")]
    Api(#[from] kube::Error),
    /// Generation failed.
    #[error(transparent)]
    Generate(#[from] certs::CertError),
    /// Other replicas kept winning the race for too long.
    #[error("gave up after {0} conflicting updates of {1}")]
    Contention(usize, String),
}

/// What the Secret's content means for this replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Assessment {
    /// Usable as it is.
    Valid(TlsMaterial, String),
    /// Needs a new serving certificate; the CA (cert PEM, key PEM) is still good for signing it.
    RenewWithCa(String, String),
    /// Needs a new CA and certificate (absent, unreadable, or the CA itself is expiring).
    Regenerate,
}

fn field(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
}

fn first_cert_expiry(pem: &str) -> Option<i64> {
    tls::not_after(pem.as_bytes()).ok()
}

fn has_san(cert_pem: &str, san: &str) -> bool {
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

/// Decides, without I/O, whether a Secret's certificates can be used at `now` (seconds since the epoch).
pub fn assess(secret: &Secret, settings: &Settings, now: i64) -> Assessment {
    let renew_at = |expiry: i64| expiry - settings.renew_before_days * 86_400 <= now;
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

/// A serving certificate signed by an existing CA.
fn sign_with(ca_cert: &str, ca_key: &str, settings: &Settings) -> Result<Bundle, SelfCertError> {
    let key = rcgen::KeyPair::from_pem(ca_key).map_err(certs::CertError::Generate)?;
    let issuer =
        rcgen::Issuer::from_ca_cert_pem(ca_cert, key).map_err(certs::CertError::Generate)?;
    let fresh = certs::generate_with_issuer(&settings.sans(), settings.cert_days, &issuer)?;
    Ok(Bundle {
        ca_cert_pem: ca_cert.to_string(),
        ca_key_pem: ca_key.to_string(),
        cert_pem: fresh.0,
        key_pem: fresh.1,
    })
}

fn secret_of(bundle: &Bundle, settings: &Settings, resource_version: Option<String>) -> Secret {
    let data = BTreeMap::from([
        (
            "ca.crt".to_string(),
            ByteString(bundle.ca_cert_pem.clone().into_bytes()),
        ),
        (
            "ca.key".to_string(),
            ByteString(bundle.ca_key_pem.clone().into_bytes()),
        ),
        (
            "tls.crt".to_string(),
            ByteString(bundle.cert_pem.clone().into_bytes()),
        ),
        (
            "tls.key".to_string(),
            ByteString(bundle.key_pem.clone().into_bytes()),
        ),
    ]);
    Secret {
        metadata: ObjectMeta {
            name: Some(settings.secret_name.clone()),
            namespace: Some(settings.namespace.clone()),
            resource_version,
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_string(),
                "pdp-injector".to_string(),
            )])),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(data),
        ..Default::default()
    }
}

fn is_status(e: &kube::Error, check: fn(&kube::core::Status) -> bool) -> bool {
    matches!(e, kube::Error::Api(s) if check(s))
}

/// Loads the Secret, creating or renewing it as needed; returns the serving material and the CA bundle.
pub async fn ensure_secret(
    api: &Api<Secret>,
    settings: &Settings,
) -> Result<(TlsMaterial, String), SelfCertError> {
    const ATTEMPTS: usize = 8;
    for _ in 0..ATTEMPTS {
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let current = api.get_opt(&settings.secret_name).await?;
        let (bundle, rv) = match &current {
            None => {
                let b = certs::generate(&settings.sans(), settings.ca_days, settings.cert_days)?;
                (b, None)
            }
            Some(secret) => {
                let rv = secret.metadata.resource_version.clone();
                match assess(secret, settings, now) {
                    Assessment::Valid(material, ca) => return Ok((material, ca)),
                    Assessment::RenewWithCa(ca_cert, ca_key) => {
                        info!(secret = %settings.secret_name, "renewing the serving certificate");
                        (sign_with(&ca_cert, &ca_key, settings)?, rv)
                    }
                    Assessment::Regenerate => {
                        info!(secret = %settings.secret_name, "creating a new CA and serving certificate");
                        let mut b = certs::generate(
                            &settings.sans(),
                            settings.ca_days,
                            settings.cert_days,
                        )?;
                        // Keep trusting the old CA while replicas still serve certificates it signed.
                        if let Some(old) = field(secret, "ca.crt")
                            .filter(|old| first_cert_expiry(old).is_some_and(|e| e > now))
                        {
                            b.ca_cert_pem.push_str(&old);
                        }
                        (b, rv)
                    }
                }
            }
        };
        let result = match rv {
            None => {
                api.create(&PostParams::default(), &secret_of(&bundle, settings, None))
                    .await
            }
            Some(rv) => {
                api.replace(
                    &settings.secret_name,
                    &PostParams::default(),
                    &secret_of(&bundle, settings, Some(rv)),
                )
                .await
            }
        };
        match result {
            Ok(_) => {
                let material = TlsMaterial {
                    cert_pem: bundle.cert_pem.into_bytes(),
                    key_pem: bundle.key_pem.into_bytes(),
                    client_ca_pem: None,
                };
                return Ok((material, bundle.ca_cert_pem));
            }
            // Another replica created or renewed it first: use theirs.
            Err(e)
                if is_status(&e, kube::core::Status::is_already_exists)
                    || is_status(&e, kube::core::Status::is_conflict) =>
            {
                info!(secret = %settings.secret_name, "another replica updated the certificate first; reloading it");
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(SelfCertError::Contention(
        ATTEMPTS,
        settings.secret_name.clone(),
    ))
}

/// Writes `ca_bundle` into every webhook of the configuration; returns whether anything changed.
pub async fn ensure_ca_bundle(
    api: &Api<MutatingWebhookConfiguration>,
    name: &str,
    ca_bundle: &str,
) -> Result<bool, SelfCertError> {
    const ATTEMPTS: usize = 8;
    for _ in 0..ATTEMPTS {
        let mut config = api.get(name).await?;
        let mut changed = false;
        for webhook in config.webhooks.iter_mut().flatten() {
            let want = Some(ByteString(ca_bundle.as_bytes().to_vec()));
            if webhook.client_config.ca_bundle != want {
                webhook.client_config.ca_bundle = want;
                changed = true;
            }
        }
        if !changed {
            return Ok(false);
        }
        match api.replace(name, &PostParams::default(), &config).await {
            Ok(_) => {
                info!(webhook_config = name, "caBundle updated");
                return Ok(true);
            }
            Err(e) if is_status(&e, kube::core::Status::is_conflict) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(SelfCertError::Contention(ATTEMPTS, name.to_string()))
}

/// One pass: the Secret, then the caBundle.
pub async fn reconcile(
    client: &kube::Client,
    settings: &Settings,
) -> Result<TlsMaterial, SelfCertError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &settings.namespace);
    let (material, ca) = ensure_secret(&secrets, settings).await?;
    let webhooks: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    ensure_ca_bundle(&webhooks, &settings.webhook_config, &ca).await?;
    Ok(TlsMaterial {
        client_ca_pem: settings.client_ca_pem.clone(),
        ..material
    })
}

/// Runs [`reconcile`] every `check_interval`, publishing new material; errors are logged and retried, never
/// fatal (the server keeps its current certificate).
pub async fn keep_reconciling(
    client: kube::Client,
    settings: Settings,
    tx: watch::Sender<TlsMaterial>,
) {
    loop {
        tokio::time::sleep(settings.check_interval).await;
        match reconcile(&client, &settings).await {
            Ok(material) => {
                tx.send_if_modified(|current| {
                    if *current == material {
                        false
                    } else {
                        *current = material;
                        true
                    }
                });
            }
            Err(e) => warn!(error = %e, "self-managed certificates: reconcile failed; will retry"),
        }
    }
}
