//! The floor of the load benchmarks: a handler that does nothing, on exactly the HTTPS stack of
//! `pdp_injector::webhook::server::start` (same rustls configuration from `pdp_injector::tls::build`, axum-server with
//! `RustlsAcceptor`, the same handshake, first-request and header-read timeouts, HTTP/1 keep-alive, the same
//! body reading with `axum::body::to_bytes(body, limit)`, the same multi-thread tokio runtime as the binary).
//! It answers every `POST /mutate` with a fixed AdmissionReview the size of a skip answer, so the difference
//! between `pdp-injector serve` and this server is the webhook's own work: decoding, deciding, rendering,
//! diffing, encoding, metrics, logs, the in-flight bound and the deadline.
//!
//! ```text
//! null_server --listen 127.0.0.1:18443 --cert tls.crt --key tls.key [--http1-max-buf-size BYTES]
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum_server::tls_rustls::{RustlsAcceptor, RustlsConfig};
use pdp_injector::tls::{self, TlsFiles};
use pdp_injector::webhook::server::DEFAULT_BODY_LIMIT;

/// What `serve` answers for a Pod it skips (`opted_out`), with the benchmark bodies' uid: same size.
const REPLY: &[u8] = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"705ab4f5-6393-11e8-b7cc-42010a800002","allowed":true,"auditAnnotations":{"decision":"skip","reason":"opted_out"}}}"#;

async fn mutate(request: Request) -> Response {
    match axum::body::to_bytes(request.into_body(), DEFAULT_BODY_LIMIT).await {
        Ok(body) => {
            std::hint::black_box(&body);
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                Body::from(REPLY),
            )
                .into_response()
        }
        Err(_) => (StatusCode::BAD_REQUEST, "cannot read body").into_response(),
    }
}

struct Args {
    listen: SocketAddr,
    cert: PathBuf,
    key: PathBuf,
    timeout: Duration,
    /// An experiment knob, off by default (then the stack is exactly `serve`'s): hyper's `max_buf_size` for
    /// HTTP/1 connections, to see how much of the memory under a flood is per-connection read buffering.
    max_buf_size: Option<usize>,
}

fn args() -> Result<Args, String> {
    let mut listen = None;
    let mut cert = None;
    let mut key = None;
    // `serve`'s default --handshake-timeout, used for the handshake, the first request and header reads.
    let mut timeout = Duration::from_secs(5);
    let mut max_buf_size = None;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--listen" => listen = Some(value()?.parse().map_err(|e| format!("--listen: {e}"))?),
            "--cert" => cert = Some(PathBuf::from(value()?)),
            "--key" => key = Some(PathBuf::from(value()?)),
            "--http1-max-buf-size" => {
                max_buf_size = Some(
                    value()?
                        .parse()
                        .map_err(|e| format!("--http1-max-buf-size: {e}"))?,
                )
            }
            "--handshake-timeout" => {
                timeout = pdp_injector::webhook::server::parse_duration(&value()?)
                    .ok_or("--handshake-timeout: bad duration")?
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(Args {
        listen: listen.ok_or("--listen is required")?,
        cert: cert.ok_or("--cert is required")?,
        key: key.ok_or("--key is required")?,
        timeout,
        max_buf_size,
    })
}

fn main() {
    let args = args().unwrap_or_else(|e| {
        eprintln!("null_server: {e}\nusage: null_server --listen ADDR --cert FILE --key FILE");
        std::process::exit(2);
    });
    tls::install_default_provider();
    let material = TlsFiles {
        cert: args.cert,
        key: args.key,
        client_ca: None,
    }
    .read()
    .and_then(|m| tls::build(&m))
    .unwrap_or_else(|e| {
        eprintln!("null_server: {e}");
        std::process::exit(1);
    });
    // The binary's runtime: multi-thread, one worker per available core (one under `taskset -c 0`).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async move {
        let app = Router::new()
            .route("/mutate", post(mutate))
            .route("/healthz", get(|| async { "ok\n" }));
        let acceptor = RustlsAcceptor::new(RustlsConfig::from_config(material.config))
            .handshake_timeout(args.timeout);
        let mut server = axum_server::bind(args.listen)
            .acceptor(acceptor)
            .first_request_timeout(args.timeout);
        server
            .http_builder()
            .http1()
            .header_read_timeout(Some(args.timeout))
            .keep_alive(true);
        if let Some(max) = args.max_buf_size {
            server.http_builder().http1().max_buf_size(max);
        }
        eprintln!("null_server: listening on {}", args.listen);
        if let Err(e) = server.serve(app.into_make_service()).await {
            eprintln!("null_server: {e}");
            std::process::exit(1);
        }
    });
}
