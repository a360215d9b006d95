//! The server's metrics as the fan-out reads them: one HTTP GET, the scrape, quantiles from histogram buckets.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use super::Fail;

/// An HTTP/1.0 GET of the management port: status and body.
pub(crate) fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String), Fail> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map_err(|e| format!("{addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").map_err(|e| e.to_string())?;
    let mut text = String::new();
    s.read_to_string(&mut text)
        .map_err(|e| format!("GET {path}: {e}"))?;
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("GET {path}: no status line"))?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    Ok((status, body.to_string()))
}

/// The server's metrics of interest: the sent counter and the update lag histogram (cumulative buckets).
#[derive(Default, Clone)]
pub(crate) struct Scrape {
    pub(crate) subscribers: f64,
    pub(crate) sent: f64,
    /// (upper bound, cumulative count), +Inf last.
    pub(crate) buckets: Vec<(f64, f64)>,
    pub(crate) count: f64,
}

pub(crate) fn scrape(addr: SocketAddr) -> Result<Scrape, Fail> {
    let (status, body) = http_get(addr, "/metrics")?;
    if status != 200 {
        return Err(format!("/metrics answered {status}"));
    }
    let mut s = Scrape::default();
    for line in body.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        if name == "pdp_flag_sync_subscribers" {
            s.subscribers = value;
        } else if name == "pdp_flag_sync_sent_total" {
            s.sent = value;
        } else if name == "pdp_flag_sync_update_lag_seconds_count" {
            s.count = value;
        } else if let Some(le) = name
            .strip_prefix("pdp_flag_sync_update_lag_seconds_bucket{le=\"")
            .and_then(|r| r.strip_suffix("\"}"))
        {
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().map_err(|_| format!("bucket bound {le:?}"))?
            };
            s.buckets.push((le, value));
        }
    }
    if s.buckets.is_empty() {
        return Err("/metrics has no pdp_flag_sync_update_lag_seconds histogram".into());
    }
    Ok(s)
}

/// Quantile `q` of the histogram `after - before`, interpolated linearly in its bucket (as Prometheus'
/// histogram_quantile does); `None` when empty. In the +Inf bucket, the last finite bound.
pub(crate) fn histogram_quantile(before: &Scrape, after: &Scrape, q: f64) -> Option<f64> {
    let deltas: Vec<(f64, f64)> = after
        .buckets
        .iter()
        .map(|&(le, c)| {
            let b = before
                .buckets
                .iter()
                .find(|(l, _)| *l == le)
                .map_or(0.0, |x| x.1);
            (le, c - b)
        })
        .collect();
    let total = deltas.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for &(le, c) in &deltas {
        if c >= rank {
            if le.is_infinite() {
                return Some(lower.0);
            }
            let width = c - lower.1;
            let frac = if width > 0.0 {
                (rank - lower.1) / width
            } else {
                1.0
            };
            return Some(lower.0 + (le - lower.0) * frac);
        }
        lower = (le, c);
    }
    None
}
