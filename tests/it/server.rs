//! Real HTTPS round trips against `serve` on 127.0.0.1 with certificates generated in the test.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use pdp_cluster::{NamespaceSource, NoCluster, Static};
use pdp_core::core::NamespaceInfo;
use pdp_tls::certs;
use pdp_tls::{TlsFiles, TlsMaterial};
use pdp_webhook::server::{self, Running, ServeOptions, TlsSource};
use rustls::pki_types::ServerName;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::process::{connect, send};
use pdp_testkit::tls::tls_client_config;

const FIXTURE: &str = include_str!("../fixtures/admissionreview-v1-pod-create.json");

fn fixture() -> Value {
    serde_json::from_str(FIXTURE).unwrap()
}

fn annotated(value: &str) -> Vec<u8> {
    let mut r = fixture();
    r["request"]["object"]["metadata"]["annotations"] = json!({"pdp-injector.io/inject": value});
    r.to_string().into_bytes()
}

fn bundle() -> certs::Bundle {
    certs::generate(&["localhost".into(), "127.0.0.1".into()], 2, 1).unwrap()
}

fn material(b: &certs::Bundle) -> TlsMaterial {
    TlsMaterial {
        cert_pem: b.cert_pem.clone().into_bytes(),
        key_pem: b.key_pem.clone().into_bytes(),
        client_ca_pem: None,
    }
}

fn local() -> std::net::SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

async fn start_with(options: ServeOptions, ns: Arc<dyn NamespaceSource>) -> Running {
    pdp_tls::install_default_provider();
    server::start(options, ns).await.expect("server starts")
}

/// The default options on the bundle's certificate, with a namespace source of the test's choosing.
async fn start_on(b: &certs::Bundle, ns: Arc<dyn NamespaceSource>) -> Running {
    start_with(
        ServeOptions::new(local(), TlsSource::Fixed(material(b))),
        ns,
    )
    .await
}

async fn start(b: &certs::Bundle) -> Running {
    start_with(
        ServeOptions::new(local(), TlsSource::Fixed(material(b))),
        Arc::new(NoCluster),
    )
    .await
}

/// A TLS client trusting `ca_pem`, optionally presenting a client certificate, limited to some versions.
fn client_config(
    ca_pem: &str,
    client: Option<(&str, &str)>,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Arc<rustls::ClientConfig> {
    tls_client_config(&[ca_pem], client, versions, &[])
}

fn default_client(ca_pem: &str) -> Arc<rustls::ClientConfig> {
    client_config(ca_pem, None, rustls::DEFAULT_VERSIONS)
}

/// One request on a fresh connection.
async fn call(
    addr: std::net::SocketAddr,
    config: Arc<rustls::ClientConfig>,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: Vec<u8>,
) -> Result<(StatusCode, Vec<u8>), String> {
    let mut sender = connect(addr, &config).await?;
    send(&mut sender, method, path, content_type, body).await
}

async fn post(r: &Running, ca: &str, body: Vec<u8>) -> (StatusCode, Value) {
    let (status, bytes) = call(
        r.addr,
        default_client(ca),
        "POST",
        "/mutate",
        Some("application/json"),
        body,
    )
    .await
    .unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

async fn get_text(r: &Running, ca: &str, path: &str) -> (StatusCode, String) {
    let (s, b) = call(r.addr, default_client(ca), "GET", path, None, vec![])
        .await
        .unwrap();
    (s, String::from_utf8(b).unwrap())
}

fn decode_patch(resp: &Value) -> json_patch::Patch {
    let raw = base64::engine::general_purpose::STANDARD
        .decode(resp["patch"].as_str().expect("patch present"))
        .unwrap();
    serde_json::from_slice(&raw).unwrap()
}

#[tokio::test]
async fn reviews_over_https() {
    let b = bundle();
    let ns = Static(HashMap::from([(
        "labelled".to_string(),
        NamespaceInfo {
            name: "labelled".into(),
            injection: Some("sidecar".into()),
            pss_enforce: None,
            required: false,
        },
    )]));
    let r = start_with(
        ServeOptions::new(local(), TlsSource::Fixed(material(&b))),
        Arc::new(ns),
    )
    .await;
    let ca = &b.ca_cert_pem;

    // injected (annotation), with a patch that applies to the real object
    let (s, out) = post(&r, ca, annotated("daemonset")).await;
    assert_eq!(s, StatusCode::OK);
    let resp = &out["response"];
    assert_eq!(resp["uid"], "2c11f9f4-347e-4028-9bdb-2d01a3c0650c");
    assert_eq!(resp["allowed"], true);
    assert_eq!(resp["patchType"], "JSONPatch");
    let mut pod =
        serde_json::from_slice::<Value>(&annotated("daemonset")).unwrap()["request"]["object"]
            .clone();
    json_patch::patch(&mut pod, &decode_patch(resp)).unwrap();
    assert_eq!(
        pod["spec"]["containers"][0]["env"][1]["name"],
        "CERBOS_PDP_ADDR"
    );

    // the real fixture, unlabelled namespace: skipped, no patch
    let (s, out) = post(&r, ca, FIXTURE.as_bytes().to_vec()).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(out["response"]["allowed"], true);
    assert!(out["response"].get("patch").is_none());
    assert_eq!(
        out["response"]["auditAnnotations"]["reason"],
        "not_opted_in"
    );

    // namespace from the namespace source: the same fixture in a labelled namespace gets a native sidecar
    let mut labelled = fixture();
    labelled["request"]["namespace"] = json!("labelled");
    let (_, out) = post(&r, ca, labelled.to_string().into_bytes()).await;
    assert_eq!(
        out["response"]["auditAnnotations"]["reason"],
        "injected_sidecar"
    );
    let patch = serde_json::to_value(decode_patch(&out["response"])).unwrap();
    assert!(patch.to_string().contains("\"restartPolicy\":\"Always\""));

    // denied with the message, HTTP 200
    let (s, out) = post(&r, ca, annotated("sidecars")).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(out["response"]["allowed"], false);
    assert!(
        out["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .contains("valid values are sidecar, daemonset, central, enabled, disabled")
    );

    // dry run: identical answer
    let mut dry: Value = serde_json::from_slice(&annotated("daemonset")).unwrap();
    dry["request"]["dryRun"] = json!(true);
    let (_, a) = post(&r, ca, annotated("daemonset")).await;
    let (_, d) = post(&r, ca, dry.to_string().into_bytes()).await;
    assert_eq!(a, d);

    // UPDATE and other kinds: allowed untouched
    let mut update: Value = serde_json::from_slice(&annotated("sidecar")).unwrap();
    update["request"]["operation"] = json!("UPDATE");
    let (s, out) = post(&r, ca, update.to_string().into_bytes()).await;
    assert_eq!(
        (s, out["response"]["allowed"].clone()),
        (StatusCode::OK, json!(true))
    );
    assert_eq!(
        out["response"]["auditAnnotations"]["reason"],
        "not_a_pod_create"
    );
    let mut other = fixture();
    other["request"]["kind"] = json!({"group": "", "version": "v1", "kind": "ConfigMap"});
    other["request"]["resource"] = json!({"group": "", "version": "v1", "resource": "configmaps"});
    other["request"]["object"] = json!({"kind": "ConfigMap", "data": {"a": "b"}});
    let (_, out) = post(&r, ca, other.to_string().into_bytes()).await;
    assert_eq!(
        out["response"]["auditAnnotations"]["reason"],
        "not_a_pod_create"
    );
    assert!(out["response"].get("patch").is_none());

    // metrics moved
    let (_, text) = get_text(&r, ca, "/metrics").await;
    assert!(text.contains("pdp_injector_admission_reviews_total{decision=\"inject\",reason=\"injected_daemonset\"} 3\n"), "{text}");
    assert!(
        text.contains("pdp_injector_denials_total{reason=\"invalid_annotation\"} 1\n"),
        "{text}"
    );
    assert!(
        text.contains("pdp_injector_request_duration_seconds_count{result=\"review\"} 8\n"),
        "{text}"
    );
    assert!(text.contains("pdp_injector_ready 1\n"));
    let (s, body) = get_text(&r, ca, "/healthz").await;
    assert_eq!((s, body.as_str()), (StatusCode::OK, "ok\n"));
    let (s, _) = get_text(&r, ca, "/readyz").await;
    assert_eq!(s, StatusCode::OK);
    r.shutdown().await.unwrap();
}

#[tokio::test]
async fn bad_inputs_get_clear_4xx() {
    let b = bundle();
    let r = start(&b).await;
    let client = default_client(&b.ca_cert_pem);
    let json = Some("application/json");
    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000)).into_bytes();
    /// name, content type, body, expected status, expected text in the error
    type Case<'a> = (&'a str, Option<&'a str>, Vec<u8>, StatusCode, &'a str);
    let cases: Vec<Case> = vec![
        (
            "empty body",
            json,
            vec![],
            StatusCode::BAD_REQUEST,
            "empty body",
        ),
        (
            "not JSON",
            json,
            b"hello".to_vec(),
            StatusCode::BAD_REQUEST,
            "not a JSON AdmissionReview",
        ),
        (
            "wrong content type",
            Some("text/plain"),
            FIXTURE.as_bytes().to_vec(),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "application/json",
        ),
        (
            "no content type",
            None,
            FIXTURE.as_bytes().to_vec(),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "application/json",
        ),
        (
            "missing request",
            json,
            br#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1"}"#.to_vec(),
            StatusCode::BAD_REQUEST,
            "no request",
        ),
        (
            "other version",
            json,
            FIXTURE
                .replace("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
                .into_bytes(),
            StatusCode::BAD_REQUEST,
            "v1beta1",
        ),
        (
            "10,000 deep",
            json,
            deep,
            StatusCode::BAD_REQUEST,
            "not a JSON AdmissionReview",
        ),
    ];
    for (name, ct, body, want, needle) in cases {
        let (status, bytes) = call(r.addr, client.clone(), "POST", "/mutate", ct, body)
            .await
            .unwrap();
        let v: Value =
            serde_json::from_slice(&bytes).unwrap_or_else(|_| panic!("{name}: body is not JSON"));
        assert_eq!(status, want, "{name}: {v}");
        assert_eq!(v["code"], want.as_u16(), "{name}");
        assert!(v["error"].as_str().unwrap().contains(needle), "{name}: {v}");
    }
    // wrong method and unknown path
    let (s, _) = call(r.addr, client.clone(), "GET", "/mutate", None, vec![])
        .await
        .unwrap();
    assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED);
    let (s, _) = call(r.addr, client.clone(), "GET", "/nope", None, vec![])
        .await
        .unwrap();
    assert_eq!(s, StatusCode::NOT_FOUND);

    // a 2.5 MiB Pod passes; an 8 MiB body gets 413
    let mut big = serde_json::from_slice::<Value>(&annotated("daemonset")).unwrap();
    big["request"]["object"]["metadata"]["annotations"]["example.com/blob"] =
        json!("x".repeat(2_500 * 1024));
    let (s, out) = post(&r, &b.ca_cert_pem, big.to_string().into_bytes()).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        out["response"]["auditAnnotations"]["reason"],
        "injected_daemonset"
    );
    let huge = vec![b' '; 8 * 1024 * 1024];
    let (s, _) = call(r.addr, client.clone(), "POST", "/mutate", json, huge)
        .await
        .unwrap();
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);

    let (_, text) = get_text(&r, &b.ca_cert_pem, "/metrics").await;
    assert!(
        text.contains("pdp_injector_request_errors_total{kind=\"bad_request\"} 5\n"),
        "{text}"
    );
    assert!(
        text.contains("pdp_injector_request_errors_total{kind=\"unsupported_media_type\"} 2\n"),
        "{text}"
    );
    assert!(
        text.contains("pdp_injector_request_errors_total{kind=\"payload_too_large\"} 1\n"),
        "{text}"
    );
    r.shutdown().await.unwrap();
}

/// Opens a connection and sends a review's headers and the first byte of its body, never the rest; `query`
/// goes after `/mutate`.
async fn slow_body(
    addr: std::net::SocketAddr,
    ca: &str,
    query: &str,
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(default_client(ca))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let head = format!(
        "POST /mutate{query} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{"
    );
    tls.write_all(head.as_bytes()).await.unwrap();
    tls
}

/// Reads until the server closes the connection; fails if that takes longer than `limit`. Returns what was
/// read, so a test can check that nothing meaningful was answered.
async fn closed_within<S: tokio::io::AsyncRead + Unpin>(
    stream: &mut S,
    started: Instant,
    limit: Duration,
) -> Vec<u8> {
    let mut all = Vec::new();
    let _ = tokio::time::timeout(limit + Duration::from_secs(2), stream.read_to_end(&mut all))
        .await
        .expect("connection not closed");
    assert!(
        started.elapsed() < limit,
        "closed only after {:?}",
        started.elapsed()
    );
    all
}

/// An answer is sent with its length, in one piece: not chunked, which costs the server a chunk header, a
/// terminator and, when the end comes in a later poll, another TLS record and write.
#[tokio::test]
async fn answers_carry_their_length_not_chunks() {
    let b = bundle();
    let r = start(&b).await;
    let mut tls = crate::common::process::tls_connect(r.addr, &default_client(&b.ca_cert_pem))
        .await
        .unwrap();
    let body = annotated("sidecar");
    let head = format!(
        "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).await.unwrap();
    tls.write_all(&body).await.unwrap();
    tls.flush().await.unwrap();
    let all = closed_within(&mut tls, Instant::now(), Duration::from_secs(10)).await;
    let text = String::from_utf8_lossy(&all).to_string();
    let (head, payload) = text.split_once("\r\n\r\n").expect("a complete answer");
    let head = head.to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(
        !head.contains("transfer-encoding"),
        "a chunked answer: {head}"
    );
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .unwrap_or_else(|| panic!("no content-length: {head}"))
        .trim()
        .parse()
        .unwrap();
    assert_eq!(length, payload.len(), "{head}");
    let answer: Value = serde_json::from_str(payload).unwrap();
    assert_eq!(answer["response"]["allowed"], true);
    r.shutdown().await.unwrap();
}

/// A TLS 1.1 ClientHello (legacy_version 0x0302, no supported_versions extension).
fn tls11_client_hello() -> Vec<u8> {
    let mut hello = vec![0x03, 0x02];
    hello.extend([7u8; 32]); // random
    hello.push(0); // session id
    hello.extend([0x00, 0x04, 0xc0, 0x13, 0x00, 0x2f]); // ECDHE-RSA-AES128-SHA, RSA-AES128-SHA
    hello.extend([0x01, 0x00]); // null compression
    let mut handshake = vec![0x01, 0x00, 0x00, hello.len() as u8];
    handshake.extend(hello);
    let mut record = vec![0x16, 0x03, 0x01, 0x00, handshake.len() as u8];
    record.extend(handshake);
    record
}

#[tokio::test]
async fn tls_versions_and_plain_http() {
    let b = bundle();
    let r = start(&b).await;
    let ca = &b.ca_cert_pem;
    for version in [&rustls::version::TLS12, &rustls::version::TLS13] {
        let (s, _) = call(
            r.addr,
            client_config(ca, None, &[version]),
            "GET",
            "/healthz",
            None,
            vec![],
        )
        .await
        .unwrap();
        assert_eq!(s, StatusCode::OK);
    }

    // TLS 1.1: refused with an alert (0x15), never a ServerHello (0x16)
    let mut tcp = TcpStream::connect(r.addr).await.unwrap();
    tcp.write_all(&tls11_client_hello()).await.unwrap();
    let mut buf = vec![0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(2), tcp.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(n >= 7, "no answer to a TLS 1.1 hello");
    assert_eq!(buf[0], 0x15, "expected a TLS alert, got {:?}", &buf[..n]);
    // protocol_version (70) or handshake_failure (40): either way no TLS 1.1 session
    assert!(
        matches!(buf[6], 40 | 70),
        "expected a fatal handshake alert, got {:?}",
        &buf[..n]
    );

    // plain HTTP on the TLS port: closed promptly, no HTTP answer
    let started = Instant::now();
    let mut tcp = TcpStream::connect(r.addr).await.unwrap();
    tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let all = closed_within(&mut tcp, started, Duration::from_secs(1)).await;
    assert!(!all.starts_with(b"HTTP/"), "plain HTTP was answered");

    // a client that trusts another CA refuses the server
    let other = bundle();
    assert!(
        call(
            r.addr,
            default_client(&other.ca_cert_pem),
            "GET",
            "/healthz",
            None,
            vec![]
        )
        .await
        .is_err()
    );
    r.shutdown().await.unwrap();
}

fn client_cert(ca: &certs::Bundle) -> (String, String) {
    use rcgen::{CertificateParams, ExtendedKeyUsagePurpose, Issuer, KeyPair};
    let issuer =
        Issuer::from_ca_cert_pem(&ca.ca_cert_pem, KeyPair::from_pem(&ca.ca_key_pem).unwrap())
            .unwrap();
    let mut params = CertificateParams::new(vec!["kube-apiserver".to_string()]).unwrap();
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

#[tokio::test]
async fn mutual_tls_accepts_and_refuses() {
    let b = bundle();
    let client_ca = bundle();
    let mut m = material(&b);
    m.client_ca_pem = Some(client_ca.ca_cert_pem.clone().into_bytes());
    let r = start_with(
        ServeOptions::new(local(), TlsSource::Fixed(m)),
        Arc::new(NoCluster),
    )
    .await;
    let ca = &b.ca_cert_pem;

    let (cert, key) = client_cert(&client_ca);
    let good = client_config(ca, Some((&cert, &key)), rustls::DEFAULT_VERSIONS);
    let (s, _) = call(
        r.addr,
        good,
        "POST",
        "/mutate",
        Some("application/json"),
        FIXTURE.as_bytes().to_vec(),
    )
    .await
    .unwrap();
    assert_eq!(s, StatusCode::OK);

    // no client certificate: refused
    assert!(
        call(r.addr, default_client(ca), "GET", "/healthz", None, vec![])
            .await
            .is_err()
    );
    // a certificate from another CA: refused
    let stranger = bundle();
    let (cert, key) = client_cert(&stranger);
    let bad = client_config(ca, Some((&cert, &key)), rustls::DEFAULT_VERSIONS);
    assert!(
        call(r.addr, bad, "GET", "/healthz", None, vec![])
            .await
            .is_err()
    );
    r.shutdown().await.unwrap();
}

/// Lays out a directory the way the kubelet mounts a Secret: files are symlinks through `..data`, which is
/// swapped atomically to a new timestamped directory on every update.
struct SecretDir {
    root: pdp_testkit::dir::TempDir,
    generation: u32,
}

impl SecretDir {
    fn new(name: &str) -> Self {
        SecretDir {
            root: pdp_testkit::dir::TempDir::new(&format!("secret-{name}")),
            generation: 0,
        }
    }

    fn write(&mut self, files: &[(&str, &str)]) {
        self.generation += 1;
        let dir_name = format!("..2026_11_29_{:04}", self.generation);
        let dir = self.root.join(&dir_name);
        std::fs::create_dir_all(&dir).unwrap();
        for (name, content) in files {
            std::fs::write(dir.join(name), content).unwrap();
            let link = self.root.join(name);
            if !link.exists() {
                std::os::unix::fs::symlink(Path::new("..data").join(name), &link).unwrap();
            }
        }
        let tmp = self.root.join("..data_tmp");
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&dir_name, &tmp).unwrap();
        std::fs::rename(&tmp, self.root.join("..data")).unwrap();
    }

    fn path(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }
}

async fn wait_for<F: AsyncFnMut() -> bool>(mut check: F) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test]
async fn certificate_rotation_without_restart() {
    let first = bundle();
    let mut secret = SecretDir::new("rotation");
    secret.write(&[("tls.crt", &first.cert_pem), ("tls.key", &first.key_pem)]);
    let mut options = ServeOptions::new(
        local(),
        TlsSource::Files(TlsFiles {
            cert: secret.path("tls.crt"),
            key: secret.path("tls.key"),
            client_ca: None,
        }),
    );
    options.flags.reload_interval = Duration::from_millis(50);
    let r = start_with(options, Arc::new(NoCluster)).await;
    assert!(
        call(
            r.addr,
            default_client(&first.ca_cert_pem),
            "GET",
            "/healthz",
            None,
            vec![]
        )
        .await
        .is_ok()
    );

    // an open keep-alive connection from before the rotation keeps working
    let mut old_conn = connect(r.addr, &default_client(&first.ca_cert_pem))
        .await
        .unwrap();

    // rotate to a pair from a new CA: new handshakes see the new certificate
    let second = bundle();
    secret.write(&[("tls.crt", &second.cert_pem), ("tls.key", &second.key_pem)]);
    let addr = r.addr;
    let ca2 = second.ca_cert_pem.clone();
    assert!(
        wait_for(
            async || call(addr, default_client(&ca2), "GET", "/healthz", None, vec![])
                .await
                .is_ok()
        )
        .await,
        "new certificate not served"
    );
    assert!(
        call(
            r.addr,
            default_client(&first.ca_cert_pem),
            "GET",
            "/healthz",
            None,
            vec![]
        )
        .await
        .is_err()
    );
    let (s, _) = send(&mut old_conn, "GET", "/healthz", None, vec![])
        .await
        .unwrap();
    assert_eq!(s, StatusCode::OK);

    // a cert-only change (new certificate, old key) is refused: the old pair keeps serving
    let third = bundle();
    secret.write(&[("tls.crt", &third.cert_pem), ("tls.key", &second.key_pem)]);
    let ca = second.ca_cert_pem.clone();
    assert!(
        wait_for(async || {
            let (_, text) = get_text(&r, &ca, "/metrics").await;
            text.contains("pdp_injector_certificate_reloads_total{result=\"failure\"} 1\n")
        })
        .await,
        "failed reload not counted"
    );
    assert!(
        call(
            r.addr,
            default_client(&second.ca_cert_pem),
            "GET",
            "/healthz",
            None,
            vec![]
        )
        .await
        .is_ok()
    );
    assert!(
        call(
            r.addr,
            default_client(&third.ca_cert_pem),
            "GET",
            "/healthz",
            None,
            vec![]
        )
        .await
        .is_err()
    );
    let (_, text) = get_text(&r, &second.ca_cert_pem, "/metrics").await;
    assert!(
        text.contains("pdp_injector_certificate_reloads_total{result=\"success\"} 1\n"),
        "{text}"
    );
    r.shutdown().await.unwrap();
}

#[tokio::test]
async fn config_reload_good_and_bad() {
    let b = bundle();
    let mut dir = SecretDir::new("config");
    dir.write(&[("config.yaml", "defaultMode: daemonset\n")]);
    let mut options = ServeOptions::new(local(), TlsSource::Fixed(material(&b)));
    options.flags.config_path = Some(dir.path("config.yaml"));
    options.flags.reload_interval = Duration::from_millis(50);
    let r = start_with(options, Arc::new(NoCluster)).await;
    let ca = b.ca_cert_pem.clone();
    let (_, out) = post(&r, &ca, annotated("enabled")).await;
    assert_eq!(
        out["response"]["auditAnnotations"]["reason"],
        "injected_daemonset"
    );

    dir.write(&[("config.yaml", "defaultMode: sidecar\n")]);
    assert!(
        wait_for(async || post(&r, &ca, annotated("enabled")).await.1["response"]["auditAnnotations"]["reason"] == "injected_sidecar").await,
        "good config not picked up"
    );

    // Refused for its unknown key alone, and with another mode than the last good config's: the answer below
    // tells which of the two is in force.
    dir.write(&[("config.yaml", "defaultMode: daemonset\nbogus: 1\n")]);
    assert!(
        wait_for(async || get_text(&r, &ca, "/metrics")
            .await
            .1
            .contains("pdp_injector_config_reloads_total{result=\"failure\"} 1\n"))
        .await,
        "bad config not counted"
    );
    let (_, out) = post(&r, &ca, annotated("enabled")).await;
    assert_eq!(
        out["response"]["auditAnnotations"]["reason"], "injected_sidecar",
        "the last good config stays"
    );
    let (_, text) = get_text(&r, &ca, "/metrics").await;
    assert!(
        text.contains("pdp_injector_config_reloads_total{result=\"success\"} 1\n"),
        "{text}"
    );
    r.shutdown().await.unwrap();
}

/// A sidecar review on a fresh connection: its status.
async fn review_on_a_new_connection(
    addr: std::net::SocketAddr,
    ca: &str,
) -> Result<StatusCode, String> {
    let body = annotated("sidecar");
    let (s, _) = call(
        addr,
        default_client(ca),
        "POST",
        "/mutate",
        Some("application/json"),
        body,
    )
    .await?;
    Ok(s)
}

#[tokio::test]
async fn readiness_fails_at_once_on_shutdown_while_requests_are_still_answered() {
    let b = bundle();
    let mut options = ServeOptions::new(local(), TlsSource::Fixed(material(&b)));
    options.flags.drain_delay = Duration::from_millis(800);
    let r = start_with(options, Arc::new(NoCluster)).await;
    let addr = r.addr;
    let ca = b.ca_cert_pem.clone();
    let mut keep_alive = connect(addr, &default_client(&ca)).await.unwrap();
    let stopping = tokio::spawn(r.shutdown());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (s, body) = call(addr, default_client(&ca), "GET", "/readyz", None, vec![])
        .await
        .unwrap();
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    assert!(String::from_utf8(body).unwrap().contains("shutting down"));
    // during the drain delay, reviews are still answered, on new and on open connections
    let s = review_on_a_new_connection(addr, &ca).await.unwrap();
    assert_eq!(s, StatusCode::OK);
    let (s, _) = send(
        &mut keep_alive,
        "POST",
        "/mutate",
        Some("application/json"),
        annotated("sidecar"),
    )
    .await
    .unwrap();
    assert_eq!(s, StatusCode::OK);
    // ...and the answer on the open HTTP/1.1 connection told the client to close it, so that its next POST
    // never races the server's close of an idle connection.
    let closed = tokio::time::timeout(Duration::from_secs(10), keep_alive.ready()).await;
    assert!(
        matches!(closed, Ok(Err(_))),
        "the keep-alive connection stayed open for reuse during the drain: {closed:?}"
    );
    stopping.await.unwrap().unwrap();
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "still accepting after shutdown"
    );
}

/// After the drain delay the server keeps accepting while new connections still arrive (a Service's routing
/// lags its endpoints), stops once they have stopped for `--drain-quiet`, and never waits past half the grace.
#[tokio::test]
async fn shutdown_waits_for_new_connections_to_stop_arriving() {
    let b = bundle();
    let ca = b.ca_cert_pem.clone();
    let mut options = ServeOptions::new(local(), TlsSource::Fixed(material(&b)));
    options.flags.drain_delay = Duration::from_millis(200);
    options.flags.drain_quiet = Duration::from_millis(700);
    options.flags.shutdown_grace = Duration::from_secs(20);
    let r = start_with(options, Arc::new(NoCluster)).await;
    let addr = r.addr;
    let sigterm = Instant::now();
    let stopping = tokio::spawn(r.shutdown());
    // New connections every 150 ms for 2 s, ten times the drain delay: every one is answered.
    while sigterm.elapsed() < Duration::from_secs(2) {
        let s = review_on_a_new_connection(addr, &ca)
            .await
            .unwrap_or_else(|e| panic!("refused at +{:?} of the drain: {e}", sigterm.elapsed()));
        assert_eq!(s, StatusCode::OK);
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let last = Instant::now();
    tokio::time::timeout(Duration::from_secs(15), stopping)
        .await
        .expect("shutdown did not finish after connections stopped")
        .unwrap()
        .unwrap();
    assert!(
        last.elapsed() >= Duration::from_millis(500),
        "stopped {:?} after the last connection, before the quiet period",
        last.elapsed()
    );

    // A client that never stops connecting holds the shutdown for half the grace at most.
    let mut options = ServeOptions::new(local(), TlsSource::Fixed(material(&b)));
    options.flags.drain_delay = Duration::ZERO;
    options.flags.drain_quiet = Duration::from_secs(1);
    options.flags.shutdown_grace = Duration::from_secs(2);
    let r = start_with(options, Arc::new(NoCluster)).await;
    let addr = r.addr;
    let sigterm = Instant::now();
    let stopping = tokio::spawn(r.shutdown());
    let hammer = tokio::spawn(async move {
        while TcpStream::connect(addr).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    tokio::time::timeout(Duration::from_secs(15), stopping)
        .await
        .expect("a client that keeps connecting held the shutdown")
        .unwrap()
        .unwrap();
    let took = sigterm.elapsed();
    assert!(
        took >= Duration::from_millis(900),
        "stopped after {took:?}, before half the grace, while connections still arrived"
    );
    tokio::time::timeout(Duration::from_secs(10), hammer)
        .await
        .expect("still accepting after shutdown")
        .unwrap();
}

/// The server's count of admission requests being received or answered (`/metrics`).
async fn in_flight(r: &Running, ca: &str) -> i64 {
    let (_, text) = get_text(r, ca, "/metrics").await;
    text.lines()
        .find_map(|l| l.strip_prefix("pdp_injector_in_flight_requests "))
        .unwrap_or_else(|| panic!("no in-flight gauge: {text}"))
        .parse()
        .unwrap()
}

/// A request counter of `/metrics` by its kind (0 before the first).
fn request_errors(text: &str, kind: &str) -> u64 {
    let prefix = format!("pdp_injector_request_errors_total{{kind=\"{kind}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .map_or(0, |v| v.parse().unwrap())
}

#[tokio::test]
async fn overload_and_deadlines_answer_fast() {
    let b = bundle();
    let mut options = ServeOptions::new(local(), TlsSource::Fixed(material(&b)));
    options.flags.max_in_flight = 1;
    // Far beyond the test: the held bodies stay held however slow the machine, until they are dropped.
    options.flags.request_timeout = Duration::from_secs(120);
    let r = start_with(options, Arc::new(NoCluster)).await;
    let ca = b.ca_cert_pem.clone();
    let review = || {
        call(
            r.addr,
            default_client(&ca),
            "POST",
            "/mutate",
            Some("application/json"),
            FIXTURE.as_bytes().to_vec(),
        )
    };

    // Requests whose body never completes do not take the review permit: a normal review still passes...
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(slow_body(r.addr, &ca, "").await);
    }
    assert!(
        wait_for(async || in_flight(&r, &ca).await == 3).await,
        "three slow bodies not being received"
    );
    let (s, _) = review().await.unwrap();
    assert_eq!(s, StatusCode::OK, "slow bodies starved a complete request");
    // ...until four times --max-in-flight requests are being received: then a fast 503.
    held.push(slow_body(r.addr, &ca, "").await);
    assert!(
        wait_for(async || in_flight(&r, &ca).await == 4).await,
        "four slow bodies not being received"
    );
    let started = Instant::now();
    let (s, body) = review().await.unwrap();
    assert_eq!(
        s,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        String::from_utf8_lossy(&body)
    );
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "503 took {:?}",
        started.elapsed()
    );

    // Once they are gone, a held request with ?timeout=1s runs into that deadline and gets 504.
    drop(held);
    assert!(
        wait_for(async || in_flight(&r, &ca).await == 0).await,
        "dropped slow bodies still counted"
    );
    let mut tls = slow_body(r.addr, &ca, "?timeout=1s").await;
    let started = Instant::now();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        let mut buf = [0u8; 1024];
        while let Ok(n) = tls.read(&mut buf).await {
            if n == 0 {
                break;
            }
            answer.extend_from_slice(&buf[..n]);
            if answer.windows(4).any(|w| w == b"\r\n\r\n") && answer.ends_with(b"}") {
                break;
            }
        }
    })
    .await;
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 504"), "{text}");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "504 after {:?}, before its deadline",
        started.elapsed()
    );

    // and the permit is free again
    let (s, _) = review().await.unwrap();
    assert_eq!(s, StatusCode::OK);
    let (_, text) = get_text(&r, &ca, "/metrics").await;
    assert_eq!(request_errors(&text, "overloaded"), 1, "{text}");
    assert_eq!(request_errors(&text, "timeout"), 1, "{text}");
    r.shutdown().await.unwrap();
}

#[tokio::test]
async fn slow_headers_are_cut_off() {
    let b = bundle();
    let mut options = ServeOptions::new(local(), TlsSource::Fixed(material(&b)));
    options.header_timeout = Duration::from_millis(500);
    options.flags.handshake_timeout = Duration::from_millis(500);
    let r = start_with(options, Arc::new(NoCluster)).await;

    // a partial TLS ClientHello is dropped after the handshake timeout
    let started = Instant::now();
    let mut tcp = TcpStream::connect(r.addr).await.unwrap();
    tcp.write_all(&tls11_client_hello()[..10]).await.unwrap();
    closed_within(&mut tcp, started, Duration::from_secs(2)).await;

    // partial headers after a complete handshake are dropped after the header timeout
    let tcp = TcpStream::connect(r.addr).await.unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(default_client(&b.ca_cert_pem))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let started = Instant::now();
    tls.write_all(b"POST /mutate HTTP/1.1\r\nHost: loc")
        .await
        .unwrap();
    closed_within(&mut tls, started, Duration::from_secs(2)).await;
    r.shutdown().await.unwrap();
}

/// A namespace cache that has not seen the namespace (or its newest labels) yet, and an apiserver (fetch) that
/// has it labelled, or cannot be reached.
struct LaggingCache {
    cached: Option<NamespaceInfo>,
    apiserver: Result<Option<&'static str>, &'static str>,
    fetches: std::sync::atomic::AtomicUsize,
}

impl LaggingCache {
    fn new(
        cached: Option<NamespaceInfo>,
        apiserver: Result<Option<&'static str>, &'static str>,
    ) -> Arc<Self> {
        Arc::new(LaggingCache {
            cached,
            apiserver,
            fetches: Default::default(),
        })
    }

    fn fetches(&self) -> usize {
        self.fetches.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl NamespaceSource for LaggingCache {
    fn lookup(&self, _name: &str) -> Option<NamespaceInfo> {
        self.cached.clone()
    }
    fn synced(&self) -> bool {
        true
    }
    fn fetch<'a>(&'a self, name: &'a str) -> pdp_cluster::FetchFuture<'a> {
        self.fetches
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let answer = self
            .apiserver
            .map(|label| {
                label.map(|l| NamespaceInfo {
                    name: name.into(),
                    injection: Some(l.into()),
                    pss_enforce: Some("baseline".into()),
                    required: false,
                })
            })
            .map_err(str::to_string);
        Box::pin(std::future::ready(answer))
    }
}

async fn post_path(r: &Running, ca: &str, path: &str, body: &[u8]) -> Value {
    let (status, bytes) = call(
        r.addr,
        default_client(ca),
        "POST",
        path,
        Some("application/json"),
        body.to_vec(),
    )
    .await
    .unwrap();
    assert_eq!(
        status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&bytes)
    );
    serde_json::from_slice(&bytes).unwrap()
}

/// The entry for opted-in namespaces (failurePolicy Fail) never answers "not opted in" from doubt: a cache that
/// does not show the label is checked against the apiserver, and when that fails the Pod is refused.
#[tokio::test]
async fn opted_in_entry_never_skips_from_doubt() {
    let b = bundle();
    let unlabelled = Some(NamespaceInfo::named("webhook-demo"));
    let opted_in = server::OPTED_IN_PATH;

    // Stale cache, apiserver has the label: injected, after one fetch. The other entry trusts the cache.
    let cache = LaggingCache::new(unlabelled.clone(), Ok(Some("daemonset")));
    let r = start_on(&b, cache.clone()).await;
    let out = post_path(&r, &b.ca_cert_pem, opted_in, FIXTURE.as_bytes()).await;
    assert_eq!(
        out["response"]["auditAnnotations"]["reason"],
        "injected_daemonset"
    );
    assert_eq!(cache.fetches(), 1);
    let out = post_path(&r, &b.ca_cert_pem, "/mutate", FIXTURE.as_bytes()).await;
    assert_eq!(
        out["response"]["auditAnnotations"]["reason"],
        "not_opted_in"
    );
    assert_eq!(cache.fetches(), 1);
    r.shutdown().await.unwrap();

    // Apiserver unreachable (or the namespace gone): refused with 503 on the opted-in entry, with a message
    // that says why. The generic entry trusts a cache that has the namespace; without it, it answers an HTTP
    // 503 (never a guessed not_opted_in), so that its failure policy decides: Ignore admits, Fail refuses.
    for apiserver in [Err("connection refused"), Ok(None)] {
        for cached in [unlabelled.clone(), None] {
            let cache = LaggingCache::new(cached.clone(), apiserver);
            let r = start_on(&b, cache.clone()).await;
            let out = post_path(&r, &b.ca_cert_pem, opted_in, FIXTURE.as_bytes()).await;
            let resp = &out["response"];
            assert_eq!(resp["uid"], fixture()["request"]["uid"]);
            assert_eq!(resp["allowed"], false, "{cached:?} {apiserver:?}: {resp}");
            assert_eq!(resp["status"]["code"], 503);
            assert_eq!(resp["auditAnnotations"]["reason"], "namespace_unreadable");
            let message = resp["status"]["message"].as_str().unwrap();
            assert!(
                message.contains("\"webhook-demo\"")
                    && message.contains(apiserver.err().unwrap_or("does not exist")),
                "{message}"
            );
            let (status, out) = post(&r, &b.ca_cert_pem, FIXTURE.as_bytes().to_vec()).await;
            if cached.is_some() {
                assert_eq!(status, StatusCode::OK);
                assert_eq!(out["response"]["allowed"], true);
                assert_eq!(
                    out["response"]["auditAnnotations"]["reason"],
                    "not_opted_in"
                );
            } else {
                assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{out}");
                let message = out["error"].as_str().unwrap();
                assert!(
                    message.starts_with("pdp-injector namespace_unreadable: ")
                        && message.contains("\"webhook-demo\"")
                        && message.contains(apiserver.err().unwrap_or("does not exist")),
                    "{message}"
                );
                // A request whose answer does not depend on the namespace is answered as usual.
                let mut update = fixture();
                update["request"]["operation"] = "UPDATE".into();
                update["request"]["oldObject"] = update["request"]["object"].clone();
                let (status, out) = post(&r, &b.ca_cert_pem, update.to_string().into_bytes()).await;
                assert_eq!(status, StatusCode::OK, "{out}");
                assert_eq!(
                    out["response"]["auditAnnotations"]["reason"],
                    "not_a_pod_create"
                );
            }
            r.shutdown().await.unwrap();
        }
    }

    // A cache that shows the opt-in is trusted on both entries: no fetch.
    let labelled = NamespaceInfo {
        name: "webhook-demo".into(),
        injection: Some("enabled".into()),
        pss_enforce: None,
        required: false,
    };
    let cache = LaggingCache::new(Some(labelled), Err("must not be asked"));
    let r = start_on(&b, cache.clone()).await;
    let out = post_path(&r, &b.ca_cert_pem, opted_in, FIXTURE.as_bytes()).await;
    assert_eq!(
        out["response"]["auditAnnotations"]["reason"],
        "injected_daemonset"
    );
    assert_eq!(cache.fetches(), 0);
    r.shutdown().await.unwrap();
}

#[tokio::test]
async fn namespace_missing_from_the_cache_is_fetched_not_guessed() {
    let b = bundle();
    let cache = LaggingCache::new(None, Ok(Some("daemonset")));
    let r = start_on(&b, cache.clone()).await;
    let (_, out) = post(&r, &b.ca_cert_pem, FIXTURE.as_bytes().to_vec()).await;
    assert_eq!(
        out["response"]["auditAnnotations"]["reason"],
        "injected_daemonset"
    );
    let warnings = out["response"]["warnings"].as_array().unwrap();
    assert!(
        warnings[0].as_str().unwrap().contains("downgraded_pss"),
        "{warnings:?}"
    );
    assert_eq!(cache.fetches(), 1);
    r.shutdown().await.unwrap();
}

#[tokio::test]
async fn classic_sidecars_for_old_apiservers() {
    let b = bundle();
    let mut options = ServeOptions::new(local(), TlsSource::Fixed(material(&b)));
    options.fit.native_sidecars = false;
    let r = start_with(options, Arc::new(NoCluster)).await;
    let (_, out) = post(&r, &b.ca_cert_pem, annotated("sidecar")).await;
    let mut pod =
        serde_json::from_slice::<Value>(&annotated("sidecar")).unwrap()["request"]["object"]
            .clone();
    json_patch::patch(&mut pod, &decode_patch(&out["response"])).unwrap();
    // A classic container, first among the containers, held there by its postStart hook until it answers;
    // its helper comes from the init container pdp-injector-tools.
    let pdp = &pod["spec"]["containers"][0];
    assert_eq!(pdp["name"], "cerbos-pdp", "{pod}");
    assert!(pdp.get("restartPolicy").is_none());
    assert_eq!(
        pdp["lifecycle"]["postStart"]["exec"]["command"],
        json!([
            "/var/run/pdp-injector/tools/pdp-await",
            "wait",
            "--http",
            "127.0.0.1:3592/_cerbos/health",
            "--timeout=120s"
        ])
    );
    let app = pod["spec"]["containers"][1]["name"].as_str().unwrap();
    assert_ne!(app, "cerbos-pdp");
    let inits = pod["spec"]["initContainers"].as_array().unwrap();
    assert_eq!(inits.len(), 1);
    assert_eq!(inits[0]["name"], "pdp-injector-tools");
    assert_eq!(
        pod["metadata"]["annotations"]["kubectl.kubernetes.io/default-container"],
        app
    );
    // Not a Pod that runs to completion: no liveness probe, no watch container, no shared process namespace.
    assert!(pdp.get("livenessProbe").is_none());
    assert!(pod["spec"].get("shareProcessNamespace").is_none());
    assert!(
        !pod["spec"]["containers"]
            .to_string()
            .contains("pdp-injector-watch-")
    );
    r.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_webhooks_own_namespace_is_never_injected() {
    let b = bundle();
    let mut options = ServeOptions::new(local(), TlsSource::Fixed(material(&b)));
    options.fit.own_namespace = Some("webhook-demo".into());
    let r = start_with(options, Arc::new(NoCluster)).await;
    let (_, out) = post(&r, &b.ca_cert_pem, annotated("sidecar")).await;
    assert_eq!(
        out["response"]["auditAnnotations"]["reason"],
        "excluded_namespace"
    );
    assert!(out["response"].get("patch").is_none());
    r.shutdown().await.unwrap();
}

/// An HTTP/2 connection (what the apiserver uses for webhooks), negotiated with ALPN.
async fn connect_h2(
    addr: std::net::SocketAddr,
    ca_pem: &str,
) -> hyper::client::conn::http2::SendRequest<Full<Bytes>> {
    let mut config = (*default_client(ca_pem)).clone();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = TcpStream::connect(addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        TokioIo::new(tls),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    sender
}

/// A review whose Pod carries an annotation of `padding` bytes (a large but legal object).
fn padded_review(uid: &str, padding: usize) -> Vec<u8> {
    let mut r: Value = serde_json::from_slice(&annotated("daemonset")).unwrap();
    r["request"]["uid"] = uid.into();
    r["request"]["object"]["metadata"]["annotations"]["example.com/padding"] =
        "x".repeat(padding).into();
    serde_json::to_vec(&r).unwrap()
}

/// Over HTTP/2 a body over the limit gets a 413 while the client is still sending, and the stream is not reset
/// under it: the client finishes its body and sees the answer whole (curl and Go report a reset as a stream
/// error and drop the answer).
#[tokio::test]
async fn early_413_over_http2_does_not_reset_the_stream() {
    let b = bundle();
    let r = start(&b).await;
    let mut config = (*default_client(&b.ca_cert_pem)).clone();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = TcpStream::connect(r.addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let (client, conn) = h2::client::handshake(tls).await.unwrap();
    tokio::spawn(conn);
    let mut client = client.ready().await.unwrap();
    let body = padded_review("big", 8 * 1024 * 1024);
    let req = http::Request::post(format!("https://localhost:{}/mutate", r.addr.port()))
        .header("content-type", "application/json")
        .header("content-length", body.len())
        .body(())
        .unwrap();
    let (response, mut stream) = client.send_request(req, false).unwrap();
    let mut chunks = body.chunks(16 * 1024);
    let first = chunks.next().unwrap();
    stream
        .send_data(Bytes::copy_from_slice(first), false)
        .unwrap();
    let response = response.await.unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    // The rest of the body, as flow control allows: no reset from the server on the way.
    let mut chunks = chunks.peekable();
    while let Some(chunk) = chunks.next() {
        stream.reserve_capacity(chunk.len());
        let mut granted = 0;
        while granted < chunk.len() {
            granted = std::future::poll_fn(|cx| stream.poll_capacity(cx))
                .await
                .expect("stream still open")
                .unwrap_or_else(|e| panic!("the server reset the stream: {e}"));
        }
        stream
            .send_data(Bytes::copy_from_slice(chunk), chunks.peek().is_none())
            .unwrap_or_else(|e| panic!("the server reset the stream: {e}"));
    }
    let mut body = response.into_body();
    let mut answer = Vec::new();
    while let Some(data) = body.data().await {
        answer.extend_from_slice(&data.unwrap());
    }
    let v: Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(v["code"], 413);
    r.shutdown().await.unwrap();
}

/// Over HTTP/2 a body over the limit gets a 413 with its JSON error, as over HTTP/1.1, with or without a declared
/// length; a normal review on the same connection is answered afterwards.
#[tokio::test]
async fn body_over_the_limit_gets_413_over_http2() {
    let b = bundle();
    let r = start(&b).await;
    let mut h2 = connect_h2(r.addr, &b.ca_cert_pem).await;
    for declared in [true, false] {
        let body = padded_review("big", 8 * 1024 * 1024);
        let mut req = Request::builder()
            .method("POST")
            .uri(format!("https://localhost:{}/mutate", r.addr.port()))
            .header("content-type", "application/json");
        if declared {
            req = req.header("content-length", body.len());
        }
        let resp = h2
            .send_request(req.body(Full::new(Bytes::from(body))).unwrap())
            .await
            .unwrap_or_else(|e| panic!("declared length {declared}: no response: {e}"));
        assert_eq!(
            resp.status(),
            StatusCode::PAYLOAD_TOO_LARGE,
            "declared {declared}"
        );
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["code"], 413);
    }
    let req = Request::builder()
        .method("POST")
        .uri(format!("https://localhost:{}/mutate", r.addr.port()))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(annotated("daemonset"))))
        .unwrap();
    let resp = h2.send_request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    r.shutdown().await.unwrap();
}

/// Request bodies share one byte budget (a sixth of --memory-budget): a body that cannot fit while others are
/// held gets a fast 503 before any of it is read; once they are answered the budget is free again.
#[tokio::test]
async fn request_bodies_share_one_byte_budget() {
    let b = bundle();
    let mut options = ServeOptions::new(local(), TlsSource::Fixed(material(&b)));
    // 48 MiB: bodies get max(48/6, 7) = 8 MiB at once.
    options.flags.memory_budget = 48 * 1024 * 1024;
    let r = start_with(options, Arc::new(NoCluster)).await;
    let body = padded_review("held", 5 * 1024 * 1024);
    // Hold 5 MiB: headers and all but the last byte, over HTTP/1.1.
    let tcp = TcpStream::connect(r.addr).await.unwrap();
    let mut held = tokio_rustls::TlsConnector::from(default_client(&b.ca_cert_pem))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    held.write_all(
        format!(
            "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    held.write_all(&body[..body.len() - 1]).await.unwrap();
    held.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;

    // A second 5 MiB body does not fit: 503 at once. A small review still does.
    let started = Instant::now();
    let (status, bytes) = call(
        r.addr,
        default_client(&b.ca_cert_pem),
        "POST",
        "/mutate",
        Some("application/json"),
        padded_review("refused", 5 * 1024 * 1024),
    )
    .await
    .unwrap();
    assert_eq!(
        status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        String::from_utf8_lossy(&bytes)
    );
    assert!(String::from_utf8_lossy(&bytes).contains("memory budget"));
    assert!(started.elapsed() < Duration::from_secs(2));
    let (status, _) = post(&r, &b.ca_cert_pem, annotated("daemonset")).await;
    assert_eq!(status, StatusCode::OK);
    let (_, metrics) = get_text(&r, &b.ca_cert_pem, "/metrics").await;
    let held_bytes: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("pdp_injector_request_body_bytes_held "))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(held_bytes, body.len() as u64, "{metrics}");

    // The held body completes and is answered; then the budget is free for the large one.
    held.write_all(&body[body.len() - 1..]).await.unwrap();
    held.flush().await.unwrap();
    let mut answer = vec![0u8; 12];
    held.read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer[9..12], b"200");
    let (status, _) = call(
        r.addr,
        default_client(&b.ca_cert_pem),
        "POST",
        "/mutate",
        Some("application/json"),
        padded_review("later", 5 * 1024 * 1024),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::OK);
    r.shutdown().await.unwrap();
}

/// A `?timeout=` no apiserver would send (too large for a duration, not a number) is ignored: the request is
/// answered under the server's own deadline, and the handler never panics.
#[tokio::test]
async fn absurd_query_timeouts_are_ignored() {
    let b = bundle();
    let r = start(&b).await;
    let body = serde_json::to_vec(&fixture()).unwrap();
    for query in ["99999999999999999999h", "1e400s", "NaN", "-5s", "10parsecs"] {
        let out = post_path(
            &r,
            &b.ca_cert_pem,
            &format!("/mutate?timeout={query}"),
            &body,
        )
        .await;
        assert_eq!(out["response"]["allowed"], true, "{query}: {out}");
    }
}

#[tokio::test]
async fn the_socket_comes_by_csi_once_the_driver_appears_without_a_restart() {
    let b = bundle();
    let (tx, rx) = tokio::sync::watch::channel(false);
    let mut options = ServeOptions::new(local(), TlsSource::Fixed(material(&b)));
    options.flags.reload_interval = Duration::from_millis(50);
    options.csi_driver = Some(rx);
    let r = start_with(options, Arc::new(NoCluster)).await;
    let socket_volume = |out: &Value| {
        let mut pod = serde_json::from_slice::<Value>(&annotated("daemonset")).unwrap()["request"]
            ["object"]
            .clone();
        json_patch::patch(&mut pod, &decode_patch(&out["response"])).unwrap();
        pod["spec"]["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|v| v["name"] == "pdp-injector-socket")
            .cloned()
    };
    // No driver: the unlabelled namespace counts as baseline, so TCP only.
    let (_, out) = post(&r, &b.ca_cert_pem, annotated("daemonset")).await;
    assert_eq!(socket_volume(&out), None, "{out}");
    assert!(out.to_string().contains("downgraded_pss"), "{out}");
    // The driver appears: the next reviews get the CSI volume, with no downgrade.
    tx.send_replace(true);
    let ca = b.ca_cert_pem.clone();
    let got = wait_for(async || {
        let (_, out) = post(&r, &ca, annotated("daemonset")).await;
        socket_volume(&out).is_some_and(|v| v["csi"]["driver"] == "csi.pdp-injector.io")
            && !out.to_string().contains("downgraded_pss")
    })
    .await;
    assert!(got, "the CSI volume never came");
    r.shutdown().await.unwrap();
}
