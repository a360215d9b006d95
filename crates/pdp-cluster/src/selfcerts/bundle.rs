//! The webhook configuration's `caBundle`: read, derived from the Secret, and kept exactly in step with it.

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::PostParams;
use tracing::info;

use super::cas::{Ledger, ca_union, field, split_pem};
use super::{SelfCertError, is_status};

fn bundle_of(webhook: &k8s_openapi::api::admissionregistration::v1::MutatingWebhook) -> String {
    webhook
        .client_config
        .ca_bundle
        .as_ref()
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .unwrap_or_default()
}

/// The CAs of every webhook's `caBundle` (empty when the configuration does not exist yet).
pub async fn current_ca_bundle(
    api: &Api<MutatingWebhookConfiguration>,
    name: &str,
) -> Result<String, SelfCertError> {
    Ok(api
        .get_opt(name)
        .await?
        .and_then(|c| c.webhooks)
        .into_iter()
        .flatten()
        .map(|w| bundle_of(&w))
        .collect())
}

/// The `caBundle` a Secret stands for: its CAs (current first, then the retired ones still trusted), less
/// expired, unreadable and dropped ones.
pub fn bundle_from_secret(secret: &Secret, now: i64) -> String {
    let cas = field(secret, "ca.crt").unwrap_or_default();
    ca_union([cas.as_str()], &Ledger::of(secret).dropped_set(), now)
}

/// Makes every webhook's `caBundle` exactly [`bundle_from_secret`] of the Secret `secret_name`, read after the
/// configuration and written with the configuration's resourceVersion (a conflict re-reads both). Whatever else
/// `caBundle` held (a CA someone injected, garbage) is not kept. Returns whether anything changed.
pub async fn ensure_ca_bundle(
    api: &Api<MutatingWebhookConfiguration>,
    name: &str,
    secrets: &Api<Secret>,
    secret_name: &str,
) -> Result<bool, SelfCertError> {
    const ATTEMPTS: usize = 8;
    for _ in 0..ATTEMPTS {
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let mut config = api.get(name).await?;
        let want = match secrets.get_opt(secret_name).await? {
            Some(secret) => bundle_from_secret(&secret, now),
            None => String::new(),
        };
        if want.is_empty() {
            return Err(SelfCertError::NoCa(secret_name.to_string()));
        }
        let mut changed = false;
        for webhook in config.webhooks.iter_mut().flatten() {
            let want = Some(ByteString(want.as_bytes().to_vec()));
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
                info!(
                    webhook_config = name,
                    cas = split_pem(&want).len(),
                    "caBundle updated"
                );
                return Ok(true);
            }
            Err(e) if is_status(&e, kube::core::Status::is_conflict) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(SelfCertError::Contention(ATTEMPTS, name.to_string()))
}
