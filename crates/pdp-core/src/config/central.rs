//! Where central mode points (the PDP's Service) and the host names it may use.

use serde::{Deserialize, Serialize};

/// Where central mode points: a PDP that runs as an ordinary Deployment behind a Service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CentralSpec {
    /// `host:port` of the Service, for example `cerbos.cerbos.svc.cluster.local:3593`; an IPv6 host is written
    /// in brackets (`[fd00::1]:3593`).
    pub address: String,
    /// `host:port` of the Service's HTTP port, for the profile's HTTP address variable. Unset: the host of
    /// `address` with the profile's `httpPort` (the shipped Service serves both). Serialized only when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_address: Option<String>,
}

impl CentralSpec {
    /// The HTTP address of the Service: `httpAddress`, or the host of `address` with `http_port`.
    pub fn http_address(&self, http_port: u16) -> String {
        match &self.http_address {
            Some(a) => a.clone(),
            None => {
                let host = self.address.rsplit_once(':').map_or("", |(h, _)| h);
                format!("{host}:{http_port}")
            }
        }
    }

    /// The host (without brackets) and the port of `address`, or why it is not a usable `host:port`.
    pub fn host_port(&self) -> Result<(&str, u16), String> {
        let a = self.address.as_str();
        let (host, port) = a
            .rsplit_once(':')
            .ok_or_else(|| format!("{a:?} is not host:port (no port)"))?;
        let port: u16 = port
            .parse()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("{a:?} has no valid port (1-65535) after the last ':'"))?;
        let host = match host.strip_prefix('[') {
            Some(rest) => {
                let inner = rest
                    .strip_suffix(']')
                    .ok_or_else(|| format!("{a:?}: an IPv6 host needs its closing ']'"))?;
                inner
                    .parse::<std::net::Ipv6Addr>()
                    .map_err(|_| format!("{a:?}: {inner:?} is not an IPv6 address"))?;
                inner
            }
            None if host.contains(':') => {
                return Err(format!(
                    "{a:?}: an IPv6 host must be written in brackets, as in [{host}]:{port}"
                ));
            }
            None => {
                // A DNS name or an IPv4 address: lowercase labels of letters, digits and '-', dot-separated.
                // Anything else (spaces, '$(', '/', a scheme) would end up verbatim in the app's variables.
                if !is_dns_name(host) {
                    return Err(format!(
                        "{a:?}: host {host:?} is not a DNS name or an IP address (lowercase letters, digits, '-' and '.')"
                    ));
                }
                host
            }
        };
        Ok((host, port))
    }
}

/// A DNS name or an IPv4 address as Kubernetes writes them: dot-separated labels of lowercase letters, digits
/// and '-', at most 253 characters.
pub fn is_dns_name(host: &str) -> bool {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    };
    host.len() <= 253 && host.split('.').all(label_ok)
}
