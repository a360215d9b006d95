//! Self-managed certificates against a fake kube-apiserver (a tower service with resourceVersion semantics):
//! create-if-absent, renewal, the two-replica race, and the caBundle patch.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use pdp_cluster::selfcerts::{self, Assessment, Settings, assess};
use serde_json::{Value, json};

const SECRET: &str = "/api/v1/namespaces/pdp-system/secrets/pdp-injector-tls";
const SECRETS: &str = "/api/v1/namespaces/pdp-system/secrets";
const MWC: &str =
    "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/pdp-injector";

/// The objects of the fake apiserver, by path, and what happened to them.
#[derive(Default)]
struct World {
    objects: HashMap<String, Value>,
    next_rv: u64,
    creates: usize,
    replaces: usize,
    conflicts: usize,
    /// The first GETs of the Secret wait here for each other (forces replicas to interleave).
    gate: Option<Arc<tokio::sync::Barrier>>,
    /// How many GETs still pass through the gate.
    gated: usize,
}

fn status(code: StatusCode, reason: &str, message: &str) -> Response<Full<Bytes>> {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16()});
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

fn ok(v: &Value, code: StatusCode) -> Response<Full<Bytes>> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(v.to_string())))
        .unwrap()
}

async fn handle(
    world: Arc<Mutex<World>>,
    req: Request<kube::client::Body>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let body = req.into_body().collect().await.unwrap().to_bytes();
    if method == "GET" && path == SECRET {
        let gate = {
            let mut w = world.lock().unwrap();
            if w.gated > 0 {
                w.gated -= 1;
                w.gate.clone()
            } else {
                None
            }
        };
        if let Some(gate) = gate {
            gate.wait().await;
        }
    }
    let mut w = world.lock().unwrap();
    let resp = match (method.as_str(), path.as_str()) {
        ("GET", p) => match w.objects.get(p) {
            Some(v) => ok(v, StatusCode::OK),
            None => status(StatusCode::NOT_FOUND, "NotFound", "not found"),
        },
        ("POST", SECRETS) => {
            if w.objects.contains_key(SECRET) {
                status(
                    StatusCode::CONFLICT,
                    "AlreadyExists",
                    "secrets \"pdp-injector-tls\" already exists",
                )
            } else {
                let mut v: Value = serde_json::from_slice(&body).unwrap();
                w.next_rv += 1;
                v["metadata"]["resourceVersion"] = json!(w.next_rv.to_string());
                w.creates += 1;
                w.objects.insert(SECRET.into(), v.clone());
                ok(&v, StatusCode::CREATED)
            }
        }
        ("PUT", p) => {
            let mut v: Value = serde_json::from_slice(&body).unwrap();
            let current = w
                .objects
                .get(p)
                .map(|o| o["metadata"]["resourceVersion"].clone());
            if current.as_ref() != Some(&v["metadata"]["resourceVersion"]) {
                w.conflicts += 1;
                status(
                    StatusCode::CONFLICT,
                    "Conflict",
                    "the object has been modified",
                )
            } else {
                w.next_rv += 1;
                v["metadata"]["resourceVersion"] = json!(w.next_rv.to_string());
                w.replaces += 1;
                w.objects.insert(p.to_string(), v.clone());
                ok(&v, StatusCode::OK)
            }
        }
        _ => status(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("{method} {path}"),
        ),
    };
    Ok(resp)
}

fn fake() -> (kube::Client, Arc<Mutex<World>>) {
    pdp_tls::install_default_provider();
    let world = Arc::new(Mutex::new(World::default()));
    let w = world.clone();
    let service = tower::service_fn(move |req| handle(w.clone(), req));
    let mut webhook = json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "pdp-injector", "resourceVersion": "1"},
        "webhooks": [
            {"name": "namespaces.pdp-injector.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
             "clientConfig": {"service": {"name": "pdp-injector", "namespace": "pdp-system", "path": "/mutate"}}},
            {"name": "pods.pdp-injector.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
             "clientConfig": {"service": {"name": "pdp-injector", "namespace": "pdp-system", "path": "/mutate"}}}
        ]
    });
    webhook["metadata"]["resourceVersion"] = json!("1");
    {
        let mut w = world.lock().unwrap();
        w.next_rv = 1;
        w.objects.insert(MWC.into(), webhook);
    }
    (kube::Client::new(service, "pdp-system"), world)
}

fn settings() -> Settings {
    Settings::new("pdp-system")
}

fn stored_secret(world: &Mutex<World>) -> Secret {
    serde_json::from_value(world.lock().unwrap().objects[SECRET].clone()).unwrap()
}

#[tokio::test]
async fn creates_the_secret_when_absent_and_patches_the_ca_bundle() {
    let (client, world) = fake();
    let material = selfcerts::reconcile(&client, &settings()).await.unwrap();
    let secret = stored_secret(&world);
    assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
    let data = secret.data.unwrap();
    assert_eq!(data["tls.crt"].0, material.cert_pem);
    assert!(pdp_tls::build(&material).is_ok());

    let mwc: MutatingWebhookConfiguration =
        serde_json::from_value(world.lock().unwrap().objects[MWC].clone()).unwrap();
    for webhook in mwc.webhooks.unwrap() {
        assert_eq!(
            webhook.client_config.ca_bundle.unwrap().0,
            data["ca.crt"].0,
            "{}",
            webhook.name
        );
    }
    // A second pass changes nothing: same material, no writes.
    let counts = |w: &Mutex<World>| {
        let w = w.lock().unwrap();
        (w.creates, w.replaces)
    };
    let before = counts(&world);
    let again = selfcerts::reconcile(&client, &settings()).await.unwrap();
    assert_eq!(again, material);
    assert_eq!(counts(&world), before);
}

#[tokio::test]
async fn two_replicas_starting_at_once_converge_on_one_certificate() {
    let (client, world) = fake();
    {
        let mut w = world.lock().unwrap();
        w.gate = Some(Arc::new(tokio::sync::Barrier::new(2)));
        w.gated = 2;
    }
    let a = {
        let client = client.clone();
        tokio::spawn(async move { selfcerts::reconcile(&client, &settings()).await })
    };
    let b = {
        let client = client.clone();
        tokio::spawn(async move { selfcerts::reconcile(&client, &settings()).await })
    };
    // Both saw "absent"; release the gate for the re-reads.
    let (a, b) = (a.await.unwrap().unwrap(), b.await.unwrap().unwrap());
    assert_eq!(a, b, "replicas serve different certificates");
    let w = world.lock().unwrap();
    assert_eq!(w.creates, 1, "exactly one create wins");
    assert_eq!(
        stored_secret_value(&w)["data"]["tls.crt"],
        json!(base64(&a.cert_pem))
    );
}

fn stored_secret_value(w: &World) -> Value {
    w.objects[SECRET].clone()
}

fn base64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[tokio::test]
async fn renews_before_expiry_with_the_same_ca_and_a_resource_version() {
    let (client, world) = fake();
    let first = selfcerts::reconcile(&client, &settings()).await.unwrap();
    let ca_before = stored_secret(&world).data.unwrap()["ca.crt"].clone();

    // With a renewal window wider than the certificate's life, the certificate counts as expiring.
    let mut eager = settings();
    eager.renew_before_days = Some(365);
    let renewed = selfcerts::reconcile(&client, &eager).await.unwrap();
    assert_ne!(renewed.cert_pem, first.cert_pem);
    let secret = stored_secret(&world);
    assert_eq!(
        secret.data.as_ref().unwrap()["ca.crt"],
        ca_before,
        "the CA is kept"
    );
    assert_eq!(
        world.lock().unwrap().replaces,
        2,
        "Secret replaced once, MWC once (initial caBundle)"
    );
    assert_eq!(world.lock().unwrap().conflicts, 0);

    // The renewed certificate chains to the unchanged CA (what the apiserver trusts through caBundle).
    let ca_pem = String::from_utf8(ca_before.0).unwrap();
    assert!(chains_to(&renewed.cert_pem, &ca_pem));
}

fn chains_to(cert_pem: &[u8], ca_pem: &str) -> bool {
    use rustls::pki_types::pem::PemObject;
    let der = rustls::pki_types::CertificateDer::from_pem_slice(cert_pem).unwrap();
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    let ca_der = rustls::pki_types::CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap();
    let (_, ca) = x509_parser::parse_x509_certificate(&ca_der).unwrap();
    cert.issuer() == ca.subject() && cert.verify_signature(Some(ca.public_key())).is_ok()
}

#[tokio::test]
async fn a_stale_resource_version_is_a_conflict_and_the_winner_is_used() {
    let (client, world) = fake();
    selfcerts::reconcile(&client, &settings()).await.unwrap();
    let api: Api<Secret> = Api::namespaced(client.clone(), "pdp-system");
    // Someone else renews between our read and our write: simulate by bumping the stored resourceVersion.
    let mut stale = api.get("pdp-injector-tls").await.unwrap();
    {
        let mut w = world.lock().unwrap();
        w.objects.get_mut(SECRET).unwrap()["metadata"]["resourceVersion"] = json!("999");
    }
    stale.metadata.labels = None;
    let err = api
        .replace("pdp-injector-tls", &Default::default(), &stale)
        .await
        .unwrap_err();
    assert!(matches!(err, kube::Error::Api(s) if s.is_conflict()));
    // ensure_secret itself re-reads after a conflict and returns what is stored.
    let settled = selfcerts::ensure_secret(&api, &settings(), "")
        .await
        .unwrap();
    assert_eq!(
        settled.material.cert_pem,
        stored_secret(&world).data.unwrap()["tls.crt"].0
    );
}

#[test]
fn assessment_of_broken_secrets() {
    let s = settings();
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    assert_eq!(assess(&Secret::default(), &s, now), Assessment::Regenerate);
    let bundle = pdp_tls::certs::generate(
        &pdp_tls::certs::service_sans("pdp-injector", "pdp-system"),
        3650,
        90,
    )
    .unwrap();
    let secret = |cert: &str, key: &str| -> Secret {
        serde_json::from_value(json!({"data": {
            "ca.crt": base64(bundle.ca_cert_pem.as_bytes()), "ca.key": base64(bundle.ca_key_pem.as_bytes()),
            "tls.crt": base64(cert.as_bytes()), "tls.key": base64(key.as_bytes())}}))
        .unwrap()
    };
    assert!(matches!(
        assess(&secret(&bundle.cert_pem, &bundle.key_pem), &s, now),
        Assessment::Valid(..)
    ));
    // garbage serving cert: renew with the CA
    assert!(matches!(
        assess(&secret("junk", &bundle.key_pem), &s, now),
        Assessment::RenewWithCa(..)
    ));
    // a certificate for another Service: renew
    let other = pdp_tls::certs::generate(&["elsewhere.svc".into()], 1, 90).unwrap();
    assert!(matches!(
        assess(&secret(&other.cert_pem, &other.key_pem), &s, now),
        Assessment::RenewWithCa(..)
    ));
    // 100 days from now the 90-day certificate has expired; the 10-year CA has not
    assert!(matches!(
        assess(
            &secret(&bundle.cert_pem, &bundle.key_pem),
            &s,
            now + 100 * 86_400
        ),
        Assessment::RenewWithCa(..)
    ));
    // 3,650 days from now the CA too: regenerate
    assert_eq!(
        assess(
            &secret(&bundle.cert_pem, &bundle.key_pem),
            &s,
            now + 3650 * 86_400
        ),
        Assessment::Regenerate
    );
}

fn stored_bundle(world: &Mutex<World>) -> String {
    let mwc: MutatingWebhookConfiguration =
        serde_json::from_value(world.lock().unwrap().objects[MWC].clone()).unwrap();
    let bundles: Vec<Vec<u8>> = mwc
        .webhooks
        .unwrap()
        .into_iter()
        .map(|w| w.client_config.ca_bundle.unwrap().0)
        .collect();
    assert!(
        bundles.windows(2).all(|w| w[0] == w[1]),
        "webhooks with different caBundles"
    );
    String::from_utf8(bundles[0].clone()).unwrap()
}

/// Whether some CA of `bundle` signed `cert_pem`: what the apiserver checks when it dials the webhook.
fn trusted_by(cert_pem: &[u8], bundle: &str) -> bool {
    selfcerts::split_pem(bundle)
        .iter()
        .any(|ca| chains_to(cert_pem, ca))
}

fn secret_cas(world: &Mutex<World>) -> String {
    String::from_utf8(stored_secret(world).data.unwrap()["ca.crt"].0.clone()).unwrap()
}

/// Someone deletes the Secret: the next pass creates a new CA, and the old CA stays in caBundle (and in the
/// Secret, retired) so that replicas still serving the old certificate keep passing the apiserver's TLS check.
#[tokio::test]
async fn a_deleted_secret_is_recreated_and_the_old_ca_stays_trusted() {
    let (client, world) = fake();
    let old = selfcerts::reconcile(&client, &settings()).await.unwrap();
    let old_ca = secret_cas(&world);
    world.lock().unwrap().objects.remove(SECRET);

    let new = selfcerts::reconcile(&client, &settings()).await.unwrap();
    assert_ne!(new.cert_pem, old.cert_pem);
    let bundle = stored_bundle(&world);
    assert_eq!(selfcerts::split_pem(&bundle).len(), 2, "{bundle}");
    assert!(
        trusted_by(&old.cert_pem, &bundle),
        "the old certificate is no longer trusted"
    );
    assert!(trusted_by(&new.cert_pem, &bundle));
    // The Secret lists the new CA first (it signs), the old one retired.
    let cas = selfcerts::split_pem(&secret_cas(&world));
    assert_eq!(cas.len(), 2);
    assert!(chains_to(&new.cert_pem, &cas[0]));
    assert_eq!(cas[1], old_ca);
    let ledger = selfcerts::Ledger::of(&stored_secret(&world));
    assert_eq!(
        ledger.retired.keys().cloned().collect::<Vec<_>>(),
        vec![selfcerts::fingerprint(&old_ca).unwrap()]
    );
}

/// Two replicas find the CA expiring at the same moment and both generate a new one: one write wins, the other
/// replica takes the winner's material, and caBundle ends up trusting the old CA and the winner's.
#[tokio::test]
async fn two_replicas_rotating_the_ca_at_once_keep_every_served_certificate_trusted() {
    let (client, world) = fake();
    let mut short = settings();
    short.ca_days = 100;
    let old = selfcerts::reconcile(&client, &short).await.unwrap();
    // A CA with 100 days left is within a 365-day renewal window: both replicas regenerate.
    let mut rotating = settings();
    rotating.ca_days = 3650;
    rotating.cert_days = 3000;
    rotating.renew_before_days = Some(365);
    {
        let mut w = world.lock().unwrap();
        w.gate = Some(Arc::new(tokio::sync::Barrier::new(2)));
        w.gated = 2;
    }
    let spawn = |settings: Settings| {
        let client = client.clone();
        tokio::spawn(async move { selfcerts::reconcile(&client, &settings).await })
    };
    let (a, b) = (spawn(rotating.clone()), spawn(rotating.clone()));
    let (a, b) = (a.await.unwrap().unwrap(), b.await.unwrap().unwrap());
    assert_eq!(a, b, "replicas serve different certificates");
    assert!(
        world.lock().unwrap().conflicts >= 1,
        "the race did not happen"
    );
    let bundle = stored_bundle(&world);
    assert!(trusted_by(&old.cert_pem, &bundle), "the old CA was dropped");
    assert!(trusted_by(&a.cert_pem, &bundle));
    assert_eq!(selfcerts::split_pem(&bundle).len(), 2, "{bundle}");

    // A replica writing caBundle again reads the Secret afresh (after the configuration): it writes the
    // rotated set, never the one it read before the rotation.
    let (api, secrets) = apis(&client);
    let changed = selfcerts::ensure_ca_bundle(&api, "pdp-injector", &secrets, "pdp-injector-tls")
        .await
        .unwrap();
    assert!(!changed);
    assert!(trusted_by(&a.cert_pem, &stored_bundle(&world)));
    assert!(trusted_by(&old.cert_pem, &stored_bundle(&world)));
}

fn apis(client: &kube::Client) -> (Api<MutatingWebhookConfiguration>, Api<Secret>) {
    (
        Api::all(client.clone()),
        Api::namespaced(client.clone(), "pdp-system"),
    )
}

/// With the webhook's token one can write any caBundle (the guard must allow caBundle changes): a foreign CA or
/// garbage written there is not kept, the next pass writes exactly the Secret's CAs.
#[tokio::test]
async fn ca_bundle_is_written_exactly_from_the_secret() {
    let (client, world) = fake();
    let served = selfcerts::reconcile(&client, &settings()).await.unwrap();
    let ours = stored_bundle(&world);
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    assert_eq!(
        ours,
        selfcerts::bundle_from_secret(&stored_secret(&world), now)
    );
    let sans = pdp_tls::certs::service_sans("pdp-injector", "pdp-system");
    let foreign = pdp_tls::certs::generate(&sans, 30, 10).unwrap();
    for injected in [
        format!("{ours}{}", foreign.ca_cert_pem),
        foreign.ca_cert_pem.clone(),
        "garbage".to_string(),
        String::new(),
    ] {
        {
            let mut w = world.lock().unwrap();
            for wh in w.objects.get_mut(MWC).unwrap()["webhooks"]
                .as_array_mut()
                .unwrap()
            {
                wh["clientConfig"]["caBundle"] = json!(base64(injected.as_bytes()));
            }
        }
        let again = selfcerts::reconcile(&client, &settings()).await.unwrap();
        assert_eq!(again, served);
        let bundle = stored_bundle(&world);
        assert_eq!(bundle, ours, "after {injected:?}");
        assert!(!bundle.contains(foreign.ca_cert_pem.trim()));
    }
    // A Secret without a usable CA never empties caBundle.
    {
        let mut w = world.lock().unwrap();
        let secret = w.objects.get_mut(SECRET).unwrap();
        secret["data"]["ca.crt"] = json!(base64(b"garbage"));
    }
    let (api, secrets) = apis(&client);
    let e = selfcerts::ensure_ca_bundle(&api, "pdp-injector", &secrets, "pdp-injector-tls")
        .await
        .unwrap_err();
    assert!(e.to_string().contains("no usable CA"), "{e}");
    assert_eq!(stored_bundle(&world), ours);
}

/// A retired CA leaves caBundle `retire_after` later, and a replica still acting on an older read cannot bring
/// it back for longer than one pass.
#[tokio::test]
async fn retired_cas_are_dropped_in_time_and_stay_dropped() {
    let (client, world) = fake();
    let old = selfcerts::reconcile(&client, &settings()).await.unwrap();
    let old_ca = secret_cas(&world);
    world.lock().unwrap().objects.remove(SECRET);
    let mut quick = settings();
    quick.retire_after = std::time::Duration::ZERO;
    let new = selfcerts::reconcile(&client, &quick).await.unwrap();
    assert!(trusted_by(&old.cert_pem, &stored_bundle(&world)));

    // The next pass finds the retirement due: out of the Secret and of caBundle, remembered as dropped.
    let again = selfcerts::reconcile(&client, &quick).await.unwrap();
    assert_eq!(again, new);
    let bundle = stored_bundle(&world);
    assert!(!trusted_by(&old.cert_pem, &bundle), "{bundle}");
    assert!(trusted_by(&new.cert_pem, &bundle));
    assert_eq!(selfcerts::split_pem(&secret_cas(&world)).len(), 1);
    let ledger = selfcerts::Ledger::of(&stored_secret(&world));
    assert!(ledger.retired.is_empty());
    assert_eq!(
        ledger.dropped,
        vec![selfcerts::fingerprint(&old_ca).unwrap()]
    );

    // A replica writing caBundle reads the Secret afresh: the dropped CA cannot come back.
    let (api, secrets) = apis(&client);
    let changed = selfcerts::ensure_ca_bundle(&api, "pdp-injector", &secrets, "pdp-injector-tls")
        .await
        .unwrap();
    assert!(!changed);
    assert!(!trusted_by(&old.cert_pem, &stored_bundle(&world)));
}

#[test]
fn ca_union_dedups_orders_and_drops_expired() {
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let sans = pdp_tls::certs::service_sans("pdp-injector", "pdp-system");
    let a = pdp_tls::certs::generate(&sans, 3650, 90)
        .unwrap()
        .ca_cert_pem;
    let b = pdp_tls::certs::generate(&sans, 10, 5).unwrap().ca_cert_pem;
    let joined = format!("{a}{b}");
    let union = selfcerts::ca_union(
        [b.as_str(), joined.as_str(), "junk"],
        &Default::default(),
        now,
    );
    assert_eq!(selfcerts::split_pem(&union), vec![b.clone(), a.clone()]);
    // 20 days on, b has expired.
    let later = selfcerts::ca_union([union.as_str()], &Default::default(), now + 20 * 86_400);
    assert_eq!(selfcerts::split_pem(&later), vec![a.clone()]);
    let dropped = [selfcerts::fingerprint(&a).unwrap()].into_iter().collect();
    assert_eq!(selfcerts::ca_union([union.as_str()], &dropped, now), b);
}

#[test]
fn settings_default_to_the_flags_defaults_and_renew_at_a_third() {
    let mut s = Settings::new("team");
    assert_eq!(s.names.webhook.namespace, "team");
    assert_eq!(s.names.webhook.service, "pdp-injector");
    assert_eq!(s.names.secret, "pdp-injector-tls");
    assert_eq!(s.cert_days, 90);
    assert_eq!(s.renew_before(), 30);
    s.cert_days = 12;
    assert_eq!(s.renew_before(), 4);
    s.renew_before_days = Some(365);
    assert_eq!(s.renew_before(), 365);
    assert!(s.sans().contains(&"pdp-injector.team.svc".to_string()));
}
