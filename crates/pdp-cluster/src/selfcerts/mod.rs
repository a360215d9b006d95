//! Self-managed certificates (no cert-manager): the CA and serving certificate live in a Secret that every
//! replica shares. Each replica watches the Secret and reconciles on every change (and at least every
//! `check_interval`): it creates the Secret if absent or renews it before expiry (create-if-absent and
//! resourceVersion-checked replace, so replicas racing each other converge on one winner), keeps `caBundle` of
//! the MutatingWebhookConfiguration in step, and hands new material to the TLS reloader: every replica serves
//! the new certificate without a restart.
//!
//! A CA change never breaks TLS for a replica that has not reloaded yet: `caBundle` holds the unexpired CAs any
//! replica may still serve with. The Secret's `ca.crt` lists the current CA first and the retired ones after
//! it, with when each was retired (annotation `pdp-injector.io/retired-cas`); a retired CA is dropped
//! `retire_after` later (annotation `pdp-injector.io/dropped-cas`), long after every replica has reloaded.
//! `caBundle` is written exactly from the Secret's CAs (nothing it held before is kept, so a foreign or garbage
//! bundle is gone by the next pass), with optimistic concurrency: the Secret is read after the configuration,
//! and the Secret only moves forward, so a replica never writes a set older than one another replica wrote
//! before it. A deleted Secret is recreated with the CAs of the current `caBundle` retired into it, trusted for
//! `retire_after` only.

mod bundle;
mod cas;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::PostParams;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::InstallNames;
use pdp_tls::TlsMaterial;
use pdp_tls::certs::{self, Bundle};

pub use bundle::{bundle_from_secret, current_ca_bundle, ensure_ca_bundle};
use cas::field;
pub use cas::{Ledger, assess, ca_union, fingerprint, split_pem};

/// Settings of self-managed mode: the flags of `serve` that name the webhook's objects, with their defaults and
/// environment variables (the binary flattens this; [`Settings::new`] parses no arguments), and tuning that is
/// not a flag.
#[derive(Debug, Clone, clap::Args)]
pub struct Settings {
    /// Where the webhook, its Secret and its configuration are.
    #[command(flatten)]
    pub names: InstallNames,
    /// Validity of self-managed serving certificates, in days (renewed when 30 days or a third are left).
    #[arg(long, env = "PDP_INJECTOR_CERT_DAYS", default_value_t = 90, value_parser = clap::value_parser!(i64).range(1..))]
    pub cert_days: i64,
    /// Validity of a CA, in days.
    #[arg(skip = 3650)]
    pub ca_days: i64,
    /// Renew when less than this is left, in days (by default a third of `cert_days`, at most 30).
    #[arg(skip)]
    pub renew_before_days: Option<i64>,
    /// How often the Secret is checked even when the watch reports nothing (renewal is time-driven).
    #[arg(skip = Duration::from_secs(60))]
    pub check_interval: Duration,
    /// How long a retired CA stays trusted in `caBundle`: far longer than any replica takes to reload.
    #[arg(skip = Duration::from_secs(600))]
    pub retire_after: Duration,
    /// Client CA for mTLS, added to the serving material.
    #[arg(skip)]
    pub client_ca_pem: Option<Vec<u8>>,
}

impl Settings {
    /// Defaults for a namespace.
    pub fn new(namespace: impl Into<String>) -> Self {
        #[derive(clap::Parser)]
        struct Only {
            #[command(flatten)]
            settings: Settings,
        }
        let mut settings = <Only as clap::Parser>::try_parse_from(["serve"])
            .expect("the defaults of the certificate flags parse")
            .settings;
        settings.names.webhook.namespace = namespace.into();
        settings
    }

    /// Renew when less than this is left, in days.
    pub fn renew_before(&self) -> i64 {
        self.renew_before_days
            .unwrap_or((self.cert_days / 3).clamp(0, 30))
    }

    /// The DNS names the apiserver dials.
    pub fn sans(&self) -> Vec<String> {
        self.names.webhook.sans()
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
    Generate(#[from] certs::GenerateError),
    /// Other replicas kept winning the race for too long.
    #[error("gave up after {0} conflicting updates of {1}")]
    Contention(usize, String),
    /// The Secret holds no usable CA to write into `caBundle` (absent, or every CA unreadable or expired):
    /// `caBundle` is left as it is rather than emptied.
    #[error("Secret {0} holds no usable CA; caBundle left as it is")]
    NoCa(String),
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

/// A serving certificate signed by an existing CA.
fn sign_with(ca_cert: &str, ca_key: &str, settings: &Settings) -> Result<Bundle, SelfCertError> {
    let key = rcgen::KeyPair::from_pem(ca_key)?;
    // ca.crt lists the current CA first, then retired ones: sign with the current one.
    let current = split_pem(ca_cert).into_iter().next().unwrap_or_default();
    let issuer = rcgen::Issuer::from_ca_cert_pem(&current, key)?;
    let fresh = certs::generate_with_issuer(&settings.sans(), settings.cert_days, &issuer)?;
    Ok(Bundle {
        ca_cert_pem: ca_cert.to_string(),
        ca_key_pem: ca_key.to_string(),
        cert_pem: fresh.0,
        key_pem: fresh.1,
    })
}

fn secret_of(
    bundle: &Bundle,
    settings: &Settings,
    resource_version: Option<String>,
    ledger: &Ledger,
) -> Secret {
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
            name: Some(settings.names.secret.clone()),
            namespace: Some(settings.names.webhook.namespace.clone()),
            resource_version,
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_string(),
                "pdp-injector".to_string(),
            )])),
            annotations: Some(ledger.annotations()).filter(|a| !a.is_empty()),
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

/// What [`ensure_secret`] settled on.
#[derive(Debug, Clone)]
pub struct Settled {
    /// This replica's serving certificate and key.
    pub material: TlsMaterial,
    /// The Secret's `ca.crt`: the current CA, then the retired ones still trusted.
    pub cas: String,
    /// CAs no longer trusted.
    pub ledger: Ledger,
}

/// Loads the Secret, creating or renewing it as needed, and drops retired CAs whose time is up.
/// `previous_bundle` is the `caBundle` in force: when the Secret has to be created (first install, or deleted),
/// its CAs stay trusted, retired, since replicas may still serve certificates they signed.
pub async fn ensure_secret(
    api: &Api<Secret>,
    settings: &Settings,
    previous_bundle: &str,
) -> Result<Settled, SelfCertError> {
    const ATTEMPTS: usize = 8;
    for _ in 0..ATTEMPTS {
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let current = api.get_opt(&settings.names.secret).await?;
        let (bundle, rv, ledger) = match &current {
            None => {
                let mut b =
                    certs::generate(&settings.sans(), settings.ca_days, settings.cert_days)?;
                let mut ledger = Ledger::default();
                let kept = ca_union([previous_bundle], &BTreeSet::new(), now);
                if !kept.is_empty() {
                    info!(secret = %settings.names.secret, "creating the Secret; the CAs of the current caBundle stay trusted until every replica has reloaded");
                }
                ledger.retire_all_but(&kept, &b.ca_cert_pem, now);
                b.ca_cert_pem = ca_union([b.ca_cert_pem.as_str(), &kept], &BTreeSet::new(), now);
                (b, None, ledger)
            }
            Some(secret) => {
                let rv = secret.metadata.resource_version.clone();
                let mut ledger = Ledger::of(secret);
                match assess(secret, settings, now) {
                    Assessment::Valid(material, cas) => {
                        if !ledger.drop_due(now, settings.retire_after) {
                            return Ok(Settled {
                                material,
                                cas,
                                ledger,
                            });
                        }
                        info!(secret = %settings.names.secret, "dropping retired CAs");
                        let b = Bundle {
                            ca_cert_pem: ca_union([cas.as_str()], &ledger.dropped_set(), now),
                            ca_key_pem: field(secret, "ca.key").unwrap_or_default(),
                            cert_pem: String::from_utf8_lossy(&material.cert_pem).into_owned(),
                            key_pem: String::from_utf8_lossy(&material.key_pem).into_owned(),
                        };
                        (b, rv, ledger)
                    }
                    Assessment::RenewWithCa(ca_cert, ca_key) => {
                        info!(secret = %settings.names.secret, "renewing the serving certificate");
                        (sign_with(&ca_cert, &ca_key, settings)?, rv, ledger)
                    }
                    Assessment::Regenerate => {
                        info!(secret = %settings.names.secret, "creating a new CA and serving certificate");
                        let mut b = certs::generate(
                            &settings.sans(),
                            settings.ca_days,
                            settings.cert_days,
                        )?;
                        // Keep trusting the old CAs while replicas still serve certificates they signed.
                        let old = field(secret, "ca.crt").unwrap_or_default();
                        let dropped = ledger.dropped_set();
                        let kept = ca_union([old.as_str(), previous_bundle], &dropped, now);
                        ledger.retire_all_but(&kept, &b.ca_cert_pem, now);
                        b.ca_cert_pem = ca_union([b.ca_cert_pem.as_str(), &kept], &dropped, now);
                        (b, rv, ledger)
                    }
                }
            }
        };
        let secret = secret_of(&bundle, settings, rv.clone(), &ledger);
        let result = match rv {
            None => api.create(&PostParams::default(), &secret).await,
            Some(_) => {
                api.replace(&settings.names.secret, &PostParams::default(), &secret)
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
                return Ok(Settled {
                    material,
                    cas: bundle.ca_cert_pem,
                    ledger,
                });
            }
            // Another replica created or renewed it first: use theirs.
            Err(e)
                if is_status(&e, kube::core::Status::is_already_exists)
                    || is_status(&e, kube::core::Status::is_conflict) =>
            {
                info!(secret = %settings.names.secret, "another replica updated the certificate first; reloading it");
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(SelfCertError::Contention(
        ATTEMPTS,
        settings.names.secret.clone(),
    ))
}

/// One pass: the Secret, then the caBundle.
pub async fn reconcile(
    client: &kube::Client,
    settings: &Settings,
) -> Result<TlsMaterial, SelfCertError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &settings.names.webhook.namespace);
    let webhooks: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let previous = current_ca_bundle(&webhooks, &settings.names.webhook_config).await?;
    let settled = ensure_secret(&secrets, settings, &previous).await?;
    ensure_ca_bundle(
        &webhooks,
        &settings.names.webhook_config,
        &secrets,
        &settings.names.secret,
    )
    .await?;
    Ok(TlsMaterial {
        client_ca_pem: settings.client_ca_pem.clone(),
        ..settled.material
    })
}

/// Watches the Secret and runs [`reconcile`] on every change to it (another replica renewed it, someone deleted
/// it) and at least every `check_interval`, publishing new material; errors are counted, logged and retried,
/// never fatal (the server keeps its current certificate).
pub async fn keep_reconciling(
    client: kube::Client,
    settings: Settings,
    tx: watch::Sender<TlsMaterial>,
    counters: crate::ClusterCounters,
) {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &settings.names.webhook.namespace);
    let config =
        watcher::Config::default().fields(&format!("metadata.name={}", settings.names.secret));
    let (changed_tx, changed_rx) = tokio::sync::mpsc::channel::<()>(1);
    {
        let counters = counters.clone();
        tokio::spawn(async move {
            let stream = watcher::watcher(secrets, config).default_backoff();
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                match event {
                    // A full channel already holds a wake-up: nothing is lost.
                    Ok(_) => {
                        let _ = changed_tx.try_send(());
                    }
                    Err(e) => {
                        counters.watch_error();
                        warn!(error = %e, "certificate Secret watch error; retrying with backoff");
                    }
                }
            }
        });
    }
    let mut changed_rx = Some(changed_rx);
    loop {
        match &mut changed_rx {
            Some(rx) => {
                tokio::select! {
                    woke = rx.recv() => if woke.is_none() { changed_rx = None },
                    _ = tokio::time::sleep(settings.check_interval) => {}
                }
            }
            None => tokio::time::sleep(settings.check_interval).await,
        }
        match reconcile(&client, &settings).await {
            Ok(material) => {
                counters.cert_reconcile(true);
                tx.send_if_modified(|current| {
                    if *current == material {
                        false
                    } else {
                        *current = material;
                        true
                    }
                });
            }
            Err(e) => {
                counters.cert_reconcile(false);
                warn!(error = %e, "self-managed certificates: reconcile failed; will retry");
            }
        }
    }
}
