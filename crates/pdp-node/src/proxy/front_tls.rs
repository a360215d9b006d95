//! TLS on the TCP path of the front.
//!
//! **TLS terminates here, on the TCP path only** (`--tls-cert`, `--tls-key`, optionally `--tls-client-ca`).
//! Cerbos, given `server.tls`, wraps every listener in TLS, its node socket too, and only verifies a client
//! certificate when one is presented; the front instead requires one when a client CA is set, keeps the stable
//! socket plaintext (local, permissioned by the filesystem) and the instances on plain Unix sockets, and
//! forwards the decrypted bytes of a TCP connection exactly as it forwards a plaintext one. ALPN offers `h2`
//! only on the gRPC port (its backend is the instance's gRPC listener), `h2` and `http/1.1` on the HTTP port
//! (its backend, the instance's HTTP listener, speaks both). One certificate serves both ports. The files are read again every
//! `--tls-reload-interval` and a changed, valid set is used for the next handshake; a broken one is logged and
//! the last good one stays.
use std::io;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

use crate::proxy::forward::serve;
use crate::proxy::stats::Shared;
use crate::proxy::{HTTP_ROUTE, Phase, Route};
use crate::slots::Slot;
use pdp_tls::identity::IdentityRefused;
use pdp_tls::{Reload, Reloader, TlsFiles};

/// The TLS side of a TCP route: the configuration in use, swapped by the reload task.
pub(super) struct FrontTls {
    pub(super) config: RwLock<Arc<rustls::ServerConfig>>,
    /// The ALPN protocols of this route's port (the reloaded configuration is given them).
    pub(super) alpn: &'static [&'static [u8]],
    pub(super) handshake_timeout: Duration,
    /// When a handshake failure was last logged at `info` (the others go to `debug`).
    pub(super) noted: Mutex<Option<Instant>>,
}

/// At most one handshake failure per this interval is logged at `info`; every one is at `debug` and counted.
pub(super) const TLS_FAILURE_NOTE_EVERY: Duration = Duration::from_secs(10);

impl FrontTls {
    pub(super) fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(
            self.config
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        )
    }

    /// A TLS side for a port with the protocols `alpn`, from a loaded configuration.
    pub(super) fn new(
        config: &Arc<rustls::ServerConfig>,
        alpn: &'static [&'static [u8]],
        handshake_timeout: Duration,
    ) -> Self {
        Self {
            config: RwLock::new(with_alpn(config, alpn)),
            alpn,
            handshake_timeout,
            noted: Mutex::new(None),
        }
    }

    pub(super) fn set(&self, config: &Arc<rustls::ServerConfig>) {
        *self.config.write().unwrap_or_else(|e| e.into_inner()) = with_alpn(config, self.alpn);
    }

    /// Whether this failure is the one logged at `info` in its interval.
    pub(super) fn note(&self) -> bool {
        let mut noted = self.noted.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if noted.is_some_and(|at| now.duration_since(at) < TLS_FAILURE_NOTE_EVERY) {
            return false;
        }
        *noted = Some(now);
        true
    }
}

/// `config` offering `alpn`: itself when it does already, else a copy (the certificate and the client checks are
/// shared; only the protocol list differs between the two ports).
fn with_alpn(config: &Arc<rustls::ServerConfig>, alpn: &[&[u8]]) -> Arc<rustls::ServerConfig> {
    if config
        .alpn_protocols
        .iter()
        .map(Vec::as_slice)
        .eq(alpn.iter().copied())
    {
        return config.clone();
    }
    let mut copy = (**config).clone();
    copy.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(copy)
}

/// One TCP client connection on the TLS port: the handshake (bounded, holding the connection's place), then
/// [`serve`] on the decrypted stream. A failed handshake forwards nothing.
pub(super) async fn serve_tls(
    client: TcpStream,
    peer: String,
    tls: Arc<FrontTls>,
    route: Arc<Route>,
    shared: Arc<Shared>,
    slot: Slot,
) {
    let mut phase = shared.phase.subscribe();
    let handshake = tokio::time::timeout(tls.handshake_timeout, tls.acceptor().accept(client));
    let done = tokio::select! {
        done = handshake => done,
        _ = phase.wait_for(|p| *p == Phase::Stopped) => {
            shared.count(|s| s.cut_at_drain += 1);
            return;
        }
        _ = slot.conn.taken() => return,
    };
    let failure = match done {
        Ok(Ok(stream)) => return serve(stream, peer, route, shared, slot).await,
        Ok(Err(e)) => handshake_failure(&e, route.kind),
        Err(_) => format!(
            "no complete handshake within --tls-handshake-timeout ({:?})",
            tls.handshake_timeout
        ),
    };
    shared.count(|s| s.tls_failed += 1);
    if tls.note() {
        info!(
            route = route.kind,
            peer,
            reason = failure,
            "TLS handshake failed: connection closed (further failures in the next 10 s at debug; all counted in tls_failed)"
        );
    } else {
        debug!(
            route = route.kind,
            peer,
            reason = failure,
            "TLS handshake failed: connection closed"
        );
    }
}

/// Why a handshake failed, in the words an operator needs.
pub(super) fn handshake_failure(error: &io::Error, route: &str) -> String {
    let Some(tls) = error
        .get_ref()
        .and_then(|e| e.downcast_ref::<rustls::Error>())
    else {
        return match error.kind() {
            io::ErrorKind::UnexpectedEof => {
                "the client closed the connection during the handshake".into()
            }
            _ => error.to_string(),
        };
    };
    match tls {
        rustls::Error::NoApplicationProtocol if route == HTTP_ROUTE => {
            "the client offers neither h2 nor http/1.1 in ALPN: this port speaks the PDP's HTTP API".into()
        }
        rustls::Error::NoApplicationProtocol => {
            "the client offers no h2 in ALPN (an HTTP/1.1-only client? use the HTTP port): this port speaks gRPC over HTTP/2 only".into()
        }
        rustls::Error::NoCertificatesPresented => {
            "the client presented no certificate, and --tls-client-ca requires one".into()
        }
        rustls::Error::InvalidCertificate(rustls::CertificateError::Other(other))
            if other.0.is::<IdentityRefused>() =>
        {
            other.0.to_string()
        }
        rustls::Error::InvalidCertificate(why) => {
            format!("the client's certificate is refused: {why:?} (--tls-client-ca)")
        }
        rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => {
            format!("not a TLS client hello (a plaintext client on the TLS port?): {tls}")
        }
        rustls::Error::AlertReceived(alert) => {
            format!("the client aborted the handshake ({alert:?}; does it trust the front's certificate?)")
        }
        other => other.to_string(),
    }
}

/// Reads the TLS files every `every` and puts a changed, valid set in use for the next handshakes; a broken
/// set is logged once and the last good configuration stays. Never panics: the front keeps serving.
pub(super) async fn reload_tls(
    files: TlsFiles,
    mut reloader: Reloader,
    sides: Vec<Arc<FrontTls>>,
    shared: Arc<Shared>,
    every: Duration,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        match reloader.offer(files.read()) {
            Reload::Unchanged => {}
            Reload::Loaded(loaded) => {
                for side in &sides {
                    side.set(&loaded.config);
                }
                shared.count(|s| s.tls_reloaded += 1);
                info!(
                    cert = %files.cert.display(),
                    not_after = loaded.not_after,
                    "TLS certificate reloaded: new handshakes use it"
                );
            }
            Reload::Failed(e) => {
                shared.count(|s| s.tls_reload_failed += 1);
                warn!(error = %e, "new TLS files cannot be used; keeping the current certificate");
            }
        }
    }
}
