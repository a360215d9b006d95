//! The Install section: the webhook configuration and its entries, the certificates the apiserver verifies, the
//! webhook Deployment, and the config the webhook uses.

use k8s_openapi::api::admissionregistration::v1::MutatingWebhook;
use k8s_openapi::api::core::v1::Namespace;

use crate::check::analyse::{
    ConfigSource, ENTRIES, EXPIRY_ERROR, EXPIRY_WARNING, LiveProbe, days, labels_of,
};
use crate::check::codes::FindingCode as Code;
use crate::check::report::{Finding, Section, Severity};
use crate::check::{ClusterView, certs, selectors};
use crate::config::Config;

pub(super) fn expiry_finding(
    what: &str,
    (not_before, not_after): certs::Validity,
    now: i64,
) -> Finding {
    let left = not_after - now;
    let life = (not_after - not_before).max(1);
    let late = |(part, cap): (i64, i64)| left < (life / part).min(cap);
    let date = time::OffsetDateTime::from_unix_timestamp(not_after)
        .map(|t| t.date().to_string())
        .unwrap_or_default();
    let message = format!("{} ({date})", days(left));
    let severity = if left < 0 || now < not_before || late(EXPIRY_ERROR) {
        Severity::Error
    } else if late(EXPIRY_WARNING) {
        Severity::Warning
    } else {
        Severity::Ok
    };
    let f = Finding::new(severity, Code::CertificateExpiry, what, message);
    if severity == Severity::Ok {
        f
    } else {
        f.fix(
            "the certificate was not renewed: see the webhook's log (self-managed) or the Certificate's events \
             (cert-manager)",
        )
    }
}

/// The config the webhook uses in this cluster, and the Install findings about it.
pub(super) fn config(view: &ClusterView, install: &mut Section) -> Option<Config> {
    let names = &view.names;
    let where_ = format!("ConfigMap {}/{}", names.namespace, names.config_map);
    let (source, loaded) = match &view.config {
        None => return None,
        Some(ConfigSource::File(path, config)) => (path.clone(), (**config).clone()),
        Some(ConfigSource::Installed(Err(e))) => {
            install.push(Finding::new(
                Severity::Error,
                Code::ConfigUnreadable,
                "config",
                format!("cannot read {where_}: {e}; Pods are not compared (or pass --config FILE)"),
            ));
            return None;
        }
        Some(ConfigSource::Installed(Ok(None))) => {
            install.push(Finding::new(
                Severity::Warning,
                Code::ConfigMissing,
                "config",
                format!("{where_} (key config.yaml) not found: judging by the built-in config"),
            ));
            ("the built-in config".to_string(), Config::builtin())
        }
        Some(ConfigSource::Installed(Ok(Some(text)))) => match Config::from_yaml(text) {
            Ok(c) => (where_, c),
            Err(e) => {
                install.push(
                    Finding::new(
                        Severity::Error,
                        Code::ConfigInvalid,
                        "config",
                        format!(
                            "{where_} does not load ({e}): the webhook keeps its last good config, which \
                             check cannot see; Pods are not compared"
                        ),
                    )
                    .fix(format!(
                        "fix the file and check it offline: pdp-injector inject --config config.yaml -f pod.yaml; \
                         then kubectl apply it to {where_}"
                    )),
                );
                return None;
            }
        },
    };
    // The same adaptation as the webhook's, so the hash is the one it writes into the status annotation.
    let fit = crate::config::ClusterFit {
        native_sidecars: view.native_sidecars,
        own_namespace: Some(names.namespace.clone()),
        csi_driver: view.csi_driver.as_ref().is_ok_and(|d| *d),
    };
    let config = fit.apply(loaded);
    install.push(Finding::new(
        Severity::Ok,
        Code::ConfigLoaded,
        "config",
        format!(
            "{source} loads: hash {}{}",
            config.hash,
            if view.native_sidecars {
                ""
            } else {
                " (classic sidecars: the apiserver is older than 1.29)"
            }
        ),
    ));
    Some(config)
}

pub(super) fn selects_pods_on_create(w: &MutatingWebhook) -> bool {
    w.rules.iter().flatten().any(|r| {
        let has = |list: &Option<Vec<String>>, want: &[&str]| {
            list.iter().flatten().any(|v| want.contains(&v.as_str()))
        };
        has(&r.operations, &["CREATE", "*"])
            && has(&r.api_groups, &["", "*"])
            && has(&r.resources, &["pods", "*"])
    })
}

/// The name the apiserver verifies the serving certificate for, and the endpoint it dials.
pub fn endpoint(w: &MutatingWebhook) -> Option<(String, String)> {
    let cc = &w.client_config;
    if let Some(url) = &cc.url {
        let authority = url.strip_prefix("https://")?.split('/').next()?;
        let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
            let (h, after) = rest.split_once(']')?;
            (h, after.strip_prefix(':').unwrap_or("443"))
        } else {
            authority.split_once(':').unwrap_or((authority, "443"))
        };
        let dial = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        return Some((host.to_string(), dial));
    }
    let svc = cc.service.as_ref()?;
    let host = format!("{}.{}.svc", svc.name, svc.namespace);
    let port = svc.port.unwrap_or(443);
    Some((host.clone(), format!("{host}:{port}")))
}

/// The webhook configuration, its certificates and the Deployment.
pub(super) fn install(view: &ClusterView, install: &mut Section, namespaces: &[Namespace]) {
    let names = &view.names;
    let subject = format!("MutatingWebhookConfiguration {}", names.webhook_config);
    let mwc = match &view.webhook {
        Err(e) => {
            install.push(Finding::new(
                Severity::Error,
                Code::WebhookUnreadable,
                &subject,
                format!("cannot read it: {e}"),
            ));
            None
        }
        Ok(None) => {
            install.push(
                Finding::new(
                    Severity::Error,
                    Code::WebhookMissing,
                    &subject,
                    "not found: no Pod is sent to the webhook",
                )
                .fix(
                    "kubectl apply -k manifests/overlays/daemonset (or the overlay you installed)",
                ),
            );
            None
        }
        Ok(Some(m)) => Some(m),
    };
    let mut ca_bundle: Option<Vec<u8>> = None;
    let mut server_name: Option<String> = None;
    if let Some(mwc) = mwc {
        let webhooks = mwc.webhooks.as_deref().unwrap_or_default();
        let mut good = true;
        for (entry, policy) in ENTRIES {
            let Some(w) = webhooks.iter().find(|w| w.name == entry) else {
                good = false;
                install.push(
                    Finding::new(Severity::Error, Code::WebhookEntryMissing, &subject, format!("has no entry {entry}"))
                        .fix("kubectl apply -k manifests/overlays/daemonset (or the overlay you installed)"),
                );
                continue;
            };
            let mut wrong = Vec::new();
            let actual = w.failure_policy.as_deref().unwrap_or("Fail");
            if actual != policy {
                wrong.push(format!("failurePolicy {actual} (manifests: {policy})"));
            }
            if !selects_pods_on_create(w) {
                wrong.push("its rules do not send Pod CREATE".to_string());
            }
            // Never-injected namespaces must not reach the webhook: its own Pods would wait on themselves.
            for ns in namespaces {
                let name = ns.metadata.name.as_deref().unwrap_or("");
                let protected = name == names.namespace
                    || crate::names::ALWAYS_EXCLUDED_NAMESPACES.contains(&name);
                if protected && selectors::matches(w.namespace_selector.as_ref(), &labels_of(ns)) {
                    wrong.push(format!("its namespaceSelector selects namespace {name}"));
                }
            }
            if !wrong.is_empty() {
                good = false;
                install.push(
                    Finding::new(Severity::Error, Code::WebhookEntryDiffers, format!("{subject} entry {entry}"), wrong.join("; "))
                        .fix("kubectl apply -k manifests/overlays/daemonset (or the overlay you installed)"),
                );
            }
            if let Some((name, _)) = endpoint(w) {
                server_name.get_or_insert(name);
            }
            if ca_bundle.is_none() {
                ca_bundle = w.client_config.ca_bundle.as_ref().map(|b| b.0.clone());
            }
        }
        if good {
            install.push(Finding::new(
                Severity::Ok,
                Code::WebhookRegistered,
                &subject,
                format!(
                    "entries {} and {} select Pod CREATE as the manifests say",
                    ENTRIES[0].0, ENTRIES[1].0
                ),
            ));
        }
    }
    certificates(view, install, ca_bundle.as_deref(), server_name.as_deref());
    deployment(view, install);
}

pub(super) fn certificates(
    view: &ClusterView,
    install: &mut Section,
    ca_bundle: Option<&[u8]>,
    server_name: Option<&str>,
) {
    let names = &view.names;
    let secret = format!("Secret {}/{}", names.namespace, names.secret);
    let roots = match ca_bundle.filter(|b| !b.is_empty()) {
        None => {
            if view.webhook.as_ref().is_ok_and(Option::is_some) {
                install.push(
                    Finding::new(Severity::Error, Code::CaBundleMissing, "caBundle", "empty: the apiserver cannot trust the webhook")
                        .fix("self-managed: check the webhook's log; cert-manager: check the cainjector and the annotation cert-manager.io/inject-ca-from"),
                );
            }
            None
        }
        Some(pem) => match certs::roots(pem) {
            Ok(r) => Some(r),
            Err(e) => {
                install.push(Finding::new(
                    Severity::Error,
                    Code::CaBundleInvalid,
                    "caBundle",
                    e,
                ));
                None
            }
        },
    };
    let live_verified = matches!(view.live, Some(LiveProbe::Verified { .. }));
    match &view.serving_cert {
        Err(e) => install.push(Finding::new(
            Severity::Info,
            Code::ServingSecretUnreadable,
            &secret,
            format!(
                "cannot read it ({e}): the serving certificate is judged at the live endpoint only"
            ),
        )),
        Ok(None) => install.push(Finding::new(
            if live_verified {
                Severity::Info
            } else {
                Severity::Warning
            },
            Code::ServingSecretMissing,
            &secret,
            "not found (certificates from files, or another Secret: --secret NAME)",
        )),
        Ok(Some(pem)) => {
            if let (Some(roots), Some(name)) = (&roots, server_name) {
                match certs::verify(roots.clone(), pem, name, view.now) {
                    Ok(()) => install.push(Finding::new(
                        Severity::Ok,
                        Code::ServingCertTrusted,
                        &secret,
                        format!("its certificate is trusted by the caBundle for {name}"),
                    )),
                    Err(e) => install.push(
                        Finding::new(
                            Severity::Error,
                            Code::ServingCertUntrusted,
                            &secret,
                            format!("its certificate is not trusted by the caBundle for {name}: {e}"),
                        )
                        .fix("self-managed: the webhook patches caBundle on its next pass (see its log); cert-manager: check the cainjector"),
                    ),
                }
            }
            match certs::validity(pem) {
                Ok(v) => install.push(expiry_finding(
                    &format!("{secret} certificate"),
                    v,
                    view.now,
                )),
                Err(e) => install.push(Finding::new(
                    Severity::Error,
                    Code::ServingCertInvalid,
                    &secret,
                    e,
                )),
            }
        }
    }
    match &view.live {
        None => {}
        Some(LiveProbe::Verified { endpoint, validity }) => {
            install.push(Finding::new(
                Severity::Ok,
                Code::EndpointTrusted,
                format!("endpoint {endpoint}"),
                "presents a certificate the caBundle verifies",
            ));
            if let Some(v) = validity {
                install.push(expiry_finding(&format!("endpoint {endpoint} certificate"), *v, view.now));
            }
        }
        Some(LiveProbe::Untrusted { endpoint, error }) => install.push(
            Finding::new(
                Severity::Error,
                Code::EndpointUntrusted,
                format!("endpoint {endpoint}"),
                format!("the certificate it presents is not trusted by the caBundle: {error}; the apiserver refuses it too"),
            )
            .fix("compare the Secret's certificate with caBundle; restart the webhook if it serves an old certificate"),
        ),
        Some(LiveProbe::Unreachable { endpoint, error }) => install.push(Finding::new(
            Severity::Info,
            Code::EndpointUnreachable,
            format!("endpoint {endpoint}"),
            format!("not reachable from here ({error}); run check inside the cluster to test it"),
        )),
    }
}

pub(super) fn deployment(view: &ClusterView, install: &mut Section) {
    let names = &view.names;
    let subject = format!("Deployment {}/{}", names.namespace, names.deployment);
    let d = match &view.deployment {
        Err(e) => {
            install.push(Finding::new(
                Severity::Error,
                Code::DeploymentUnreadable,
                &subject,
                format!("cannot read it: {e}"),
            ));
            return;
        }
        Ok(None) => {
            install.push(Finding::new(
                Severity::Error,
                Code::DeploymentMissing,
                &subject,
                "not found",
            ));
            return;
        }
        Ok(Some(d)) => d,
    };
    let desired = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let ready = d
        .status
        .as_ref()
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0);
    let fix = format!(
        "kubectl -n {} describe deployment {}; kubectl -n {} logs deployment/{}",
        names.namespace, names.deployment, names.namespace, names.deployment
    );
    let message = format!("{ready} of {desired} replicas ready");
    if ready == 0 {
        install.push(
            Finding::new(
                Severity::Error,
                Code::WebhookNotReady,
                &subject,
                format!("{message}: Pods in opted-in namespaces are refused, annotated Pods elsewhere start without a PDP"),
            )
            .fix(fix),
        );
    } else if ready < desired {
        install.push(
            Finding::new(Severity::Warning, Code::WebhookDegraded, &subject, message).fix(fix),
        );
    } else {
        install.push(Finding::new(
            Severity::Ok,
            Code::WebhookReady,
            &subject,
            message,
        ));
    }
}

pub(super) fn fail_entry(view: &ClusterView) -> Option<&MutatingWebhook> {
    let mwc = view.webhook.as_ref().ok()?.as_ref()?;
    mwc.webhooks
        .iter()
        .flatten()
        .find(|w| w.name == ENTRIES[0].0)
}
