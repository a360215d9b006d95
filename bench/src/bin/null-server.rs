//! The floor of the load benchmarks: a handler that does nothing, on exactly the HTTPS stack of
//! `pdp_webhook::server::start` (same rustls configuration from `pdp_tls::build`, axum-server with
//! `RustlsAcceptor`, the same handshake, first-request and header-read timeouts, HTTP/1 keep-alive, the same
//! body reading with `axum::body::to_bytes(body, limit)`, the same multi-thread tokio runtime as the binary).
//! It answers every `POST /mutate` with a fixed AdmissionReview the size of a skip answer, so the difference
//! between `pdp-injector serve` and this server is the webhook's own work: decoding, deciding, rendering,
//! diffing, encoding, metrics, logs, the in-flight bound and the deadline.
//!
//! ```text
//! null-server --listen 127.0.0.1:18443 --cert tls.crt --key tls.key [--handshake-timeout 5s] [--http1-max-buf-size BYTES]
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
use clap::Parser;
use pdp_tls::{self as tls, TlsFiles};
use pdp_webhook::server::DEFAULT_BODY_LIMIT;

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

/// The flags; `--help` prints them.
#[derive(Parser)]
#[command(
    name = "null-server",
    about = "The floor of scripts/bench.sh: a handler that does nothing, on the HTTPS stack of `pdp-injector serve`"
)]
struct Args {
    /// Address to listen on, IP:PORT.
    #[arg(long, value_name = "ADDR")]
    listen: SocketAddr,
    /// PEM certificate chain of the server.
    #[arg(long, value_name = "FILE")]
    cert: PathBuf,
    /// PEM private key of the server.
    #[arg(long, value_name = "FILE")]
    key: PathBuf,
    /// TLS handshake, first-request and header-read timeout, as `serve --handshake-timeout` (its default).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = timeout)]
    handshake_timeout: Duration,
    /// An experiment knob, off by default (then the stack is exactly `serve`'s): hyper's `max_buf_size` for
    /// HTTP/1 connections, to see how much of the memory under a flood is per-connection read buffering.
    #[arg(long = "http1-max-buf-size", value_name = "BYTES", value_parser = max_buf_size)]
    max_buf_size: Option<usize>,
}

/// A duration as `serve` reads one (`500ms`, `5s`, `1m`).
fn timeout(v: &str) -> Result<Duration, String> {
    pdp_core::duration::duration_flag(v)
}

/// hyper's smallest `max_buf_size` (it panics below it).
const MIN_MAX_BUF_SIZE: usize = 8192;

fn max_buf_size(v: &str) -> Result<usize, String> {
    let n: usize = v.parse().map_err(|e| format!("{v:?}: {e}"))?;
    if n < MIN_MAX_BUF_SIZE {
        return Err(format!(
            "{n} is below hyper's minimum of {MIN_MAX_BUF_SIZE}"
        ));
    }
    Ok(n)
}

fn main() {
    let args = Args::parse();
    tls::install_default_provider();
    let material = TlsFiles {
        cert: args.cert,
        key: args.key,
        client_ca: None,
    }
    .read()
    .and_then(|m| tls::build(&m))
    .unwrap_or_else(|e| {
        eprintln!("null-server: {e}");
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
            .handshake_timeout(args.handshake_timeout);
        let mut server = axum_server::bind(args.listen)
            .acceptor(acceptor)
            .first_request_timeout(args.handshake_timeout);
        server
            .http_builder()
            .http1()
            .header_read_timeout(Some(args.handshake_timeout))
            .keep_alive(true);
        if let Some(max) = args.max_buf_size {
            server.http_builder().http1().max_buf_size(max);
        }
        eprintln!("null-server: listening on {}", args.listen);
        if let Err(e) = server.serve(app.into_make_service()).await {
            eprintln!("null-server: {e}");
            std::process::exit(1);
        }
    });
}
