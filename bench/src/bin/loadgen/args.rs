//! The load generator's argument values: the target URL, the bodies and their weights, bounded numbers.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use rustls::pki_types::ServerName;

/// Where `--url` points.
#[derive(Clone)]
pub(crate) struct Target {
    pub(crate) addr: SocketAddr,
    /// Path and query, as sent.
    pub(crate) path: String,
}

/// One `--body`.
#[derive(Clone)]
pub(crate) struct Body {
    pub(crate) file: PathBuf,
    pub(crate) weight: usize,
}

pub(crate) fn parse_url(url: &str) -> Result<Target, String> {
    let rest = url
        .strip_prefix("https://")
        .ok_or("must start with https://")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let addr = authority
        .parse()
        .map_err(|e| format!("{authority:?} is not IP:PORT: {e}"))?;
    // Checked here, not when the first request is built.
    path.parse::<hyper::Uri>()
        .map_err(|e| format!("path {path:?}: {e}"))?;
    Ok(Target {
        addr,
        path: path.to_string(),
    })
}

pub(crate) fn parse_server_name(name: &str) -> Result<ServerName<'static>, String> {
    ServerName::try_from(name.to_string()).map_err(|e| format!("{name:?}: {e}"))
}

pub(crate) fn parse_body(v: &str) -> Result<Body, String> {
    let (file, weight) = match v.rsplit_once('@') {
        Some((f, w)) => (f, w.parse().map_err(|e| format!("weight {w:?}: {e}"))?),
        None => (v, 1),
    };
    if file.is_empty() {
        return Err("no file before @".into());
    }
    if weight > MAX_WEIGHT {
        return Err(format!("weight {weight} is above {MAX_WEIGHT}"));
    }
    Ok(Body {
        file: PathBuf::from(file),
        weight,
    })
}

/// Most connections: one per client port.
pub(crate) const MAX_CONNECTIONS: i64 = 65_536;

/// Largest `--body` weight (the mix is a table with one slot per unit of weight).
pub(crate) const MAX_WEIGHT: usize = 1_000_000;

/// The longest time any flag may ask for: far beyond any run, and well inside what `Instant` can add.
pub(crate) const MAX_SECONDS: f64 = 1e6;

/// A finite number, positive or zero.
pub(crate) fn number(v: &str) -> Result<f64, String> {
    let x: f64 = v.parse().map_err(|e| format!("{v:?}: {e}"))?;
    if !x.is_finite() || x < 0.0 {
        return Err(format!("{v:?} is not a number >= 0"));
    }
    Ok(x)
}

pub(crate) fn positive_number(v: &str) -> Result<f64, String> {
    let x = number(v)?;
    if x == 0.0 {
        return Err(format!("{v:?} is not positive"));
    }
    Ok(x)
}

/// Seconds, possibly fractional: `0.5`, `3`.
pub(crate) fn seconds(v: &str) -> Result<Duration, String> {
    let s = number(v)?;
    if s > MAX_SECONDS {
        return Err(format!("{v:?}: at most {MAX_SECONDS} seconds"));
    }
    Ok(Duration::from_secs_f64(s))
}

pub(crate) fn positive_seconds(v: &str) -> Result<Duration, String> {
    let d = seconds(v)?;
    if d.is_zero() {
        return Err(format!("{v:?} is not positive"));
    }
    Ok(d)
}
