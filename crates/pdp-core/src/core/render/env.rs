//! The variables of app containers: what the wiring gives ([`app_env`]), and how it is laid into a container's
//! own list without replacing what the Pod author wrote.

use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector};

use super::Wiring;
use crate::config::{HostField, Mode, NodeAddressFamily, Profile};
use crate::core::view::{ContainerView, EnvEntry, Str};
use crate::core::{Warning, WarningCode};
use crate::names::ANNOTATION_FLAG_SETS;

/// The variables an app container receives, in the order they are prepended.
///
/// Central mode takes host and port from the profile's `central.address`; a profile without one gives no
/// variables at all, and [`render`] refuses such a Pod before it gets here.
pub fn app_env(profile: &Profile, wiring: Wiring) -> Vec<EnvVar> {
    let Wiring {
        mode,
        socket: with_socket,
        ..
    } = wiring;
    let names = &profile.env_names;
    let value = |name: &str, value: String| EnvVar {
        name: name.to_string(),
        value: Some(value),
        value_from: None,
    };
    let mut env = Vec::with_capacity(9);
    if mode == Mode::Central {
        let Some((central, Ok((host, port)))) =
            profile.central.as_ref().map(|c| (c, c.host_port()))
        else {
            return vec![];
        };
        env.push(value(&names.host, host.to_string()));
        if let Some(port_name) = &names.port {
            env.push(value(port_name, port.to_string()));
        }
        // The address as the admin wrote it (brackets kept for IPv6), so that it is a valid host:port.
        env.push(value(&names.address, central.address.clone()));
        if let (Some(var), Some(http_port), true) =
            (&names.http_address, profile.http_port, wiring.http)
        {
            env.push(value(var, central.http_address(http_port)));
        }
    } else {
        let port = profile.address_port;
        env.push(match mode {
            Mode::Sidecar | Mode::Central => value(&names.host, "127.0.0.1".into()),
            Mode::Daemonset => node_host_var(profile),
        });
        if let Some(port_name) = &names.port {
            env.push(value(port_name, port.to_string()));
        }
        let address = |var: &str, port: u16| match mode {
            Mode::Sidecar | Mode::Central => value(var, format!("127.0.0.1:{port}")),
            Mode::Daemonset => value(var, node_address(profile, wiring.family, port)),
        };
        env.push(address(&names.address, port));
        if let (Some(var), Some(http_port), true) =
            (&names.http_address, profile.http_port, wiring.http)
        {
            env.push(address(var, http_port));
        }
        if with_socket {
            env.push(value(&names.socket, profile.socket.path()));
        }
        if mode == Mode::Daemonset
            && profile.fallback
            && let (Some(central), Some(var)) = (&profile.central, &names.fallback_address)
        {
            env.push(value(var, central.address.clone()));
            if let (Some(var), Some(http_port), true) =
                (&names.fallback_http_address, profile.http_port, wiring.http)
            {
                env.push(value(var, central.http_address(http_port)));
            }
        }
    }
    if wiring.tls
        && mode != Mode::Sidecar
        && let (Some(tls), Some(t)) = (&profile.tls, profile.tls_env_names())
    {
        env.push(value(&t.flag, "true".into()));
        env.push(value(&t.ca, tls.file("ca.crt")));
        env.push(value(&t.server_name, tls.server_name.clone()));
        if tls.client_certificate {
            env.push(value(&t.cert, tls.file("tls.crt")));
            env.push(value(&t.key, tls.file("tls.key")));
        }
    }
    if let Some(var) = &names.selector {
        env.push(field_var(
            var,
            &format!("metadata.annotations['{ANNOTATION_FLAG_SETS}']"),
        ));
    }
    env.extend(profile.app_env.iter().cloned());
    env
}

fn field_var(name: &str, field_path: &str) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                api_version: Some("v1".into()),
                field_path: field_path.into(),
            }),
            ..Default::default()
        }),
    }
}

/// The node's address variable of daemonset mode, from the Downward API field the profile names.
pub(super) fn node_host_var(profile: &Profile) -> EnvVar {
    field_var(&profile.env_names.host, profile.host_field.field_path())
}

/// `$(HOST):port` on the node, as the kubelet expands it. It cannot add brackets on its own: an IPv6 node
/// address gets them here. A node name (`spec.nodeName`) is a DNS name and never takes them.
pub(super) fn node_address(profile: &Profile, family: NodeAddressFamily, port: u16) -> String {
    let host = &profile.env_names.host;
    if family == NodeAddressFamily::IPv6 && profile.host_field == HostField::HostIp {
        format!("[$({host})]:{port}")
    } else {
        format!("$({host}):{port}")
    }
}

/// What makes two variables the same for rendering: the value, or the field a value comes from.
#[derive(PartialEq, Eq)]
struct EnvSource<'a> {
    value: &'a str,
    field: Option<&'a str>,
    has_source: bool,
}

impl<'a> EnvSource<'a> {
    fn of_existing(e: &'a EnvEntry<'_>) -> Self {
        EnvSource {
            value: e.value.as_ref().map_or("", Str::as_str),
            field: e
                .value_from
                .as_ref()
                .and_then(|v| v.field_ref.as_ref())
                .map(|f| f.field_path.as_str()),
            has_source: e.value_from.is_some(),
        }
    }

    fn of_ours(e: &'a EnvVar) -> Self {
        EnvSource {
            value: e.value.as_deref().unwrap_or(""),
            field: e
                .value_from
                .as_ref()
                .and_then(|v| v.field_ref.as_ref())
                .map(|f| f.field_path.as_str()),
            has_source: e.value_from.is_some(),
        }
    }

    fn describe(&self) -> String {
        match self.field {
            Some(f) => format!("from {f}"),
            None => format!("{:?}", self.value),
        }
    }
}

/// Whether a variable of the Pod's has the value (or the field) of one of ours, and how ours reads if not.
pub fn same_source(existing: &EnvEntry<'_>, ours: &EnvVar) -> Result<(), String> {
    let theirs = EnvSource::of_existing(existing);
    let wanted = EnvSource::of_ours(ours);
    if theirs == wanted {
        Ok(())
    } else {
        Err(wanted.describe())
    }
}

/// Where each variable the container lacks goes: prepended, so that the container's own variables can use
/// them as `$(VAR)`; a variable the container already defines differently is kept and reported. Returns the
/// insertions in the order they apply: each variable's index in the list as it is at that point, and its index
/// in `ours` (the caller writes each of ours once for all containers).
pub(super) fn ensure_env(
    container: &str,
    existing: &[EnvEntry<'_>],
    ours: &[EnvVar],
    dependent: Option<(&[Option<&str>], &str)>,
    warnings: &mut Vec<Warning>,
) -> Vec<(usize, usize)> {
    let mut missing = Vec::new();
    for (i, var) in ours.iter().enumerate() {
        // The last definition is the one the kubelet uses.
        match existing.iter().rev().find(|e| e.name.as_str() == var.name) {
            None => missing.push((i, var)),
            Some(e) if EnvSource::of_existing(e) == EnvSource::of_ours(var) => {}
            Some(e) => warnings.push(Warning {
                code: WarningCode::EnvKept,
                message: format!(
                    "container {container:?} keeps its own {} ({}) instead of the injected value ({})",
                    var.name,
                    EnvSource::of_existing(e).describe(),
                    EnvSource::of_ours(var).describe()
                ),
            }),
        }
    }
    let mut names: Vec<&str> = existing.iter().map(|e| e.name.as_str()).collect();
    let mut inserts = Vec::with_capacity(missing.len());
    let mut at = 0;
    for (i, var) in missing {
        // The addresses refer to the host variable: when the app defines the host itself, they must come
        // after the app's definition for `$(HOST)` to expand.
        let after = dependent
            .filter(|(deps, _)| deps.contains(&Some(var.name.as_str())))
            .and_then(|(_, host)| names.iter().position(|n| *n == host))
            .filter(|&h| h >= at);
        let index = match after {
            Some(h) => h + 1,
            None => {
                at += 1;
                at - 1
            }
        };
        names.insert(index, &var.name);
        inserts.push((index, i));
    }
    inserts
}

/// The names of the variables rendering gives, prepared to search env lists for them.
pub(super) struct OurNames<'a> {
    names: Vec<&'a str>,
    /// `"` and the names' longest shared prefix (`"CERBOS_PDP_`), when they share one: a list without it
    /// anywhere names none of them, which one vectorised search tells.
    prefix: Option<memchr::memmem::Finder<'static>>,
}

impl<'a> OurNames<'a> {
    pub(super) fn new(names: Vec<&'a str>) -> Self {
        let shared = names.split_first().map_or(0, |(first, rest)| {
            rest.iter().fold(first.len(), |n, name| {
                first.as_bytes()[..n]
                    .iter()
                    .zip(name.as_bytes())
                    .take_while(|(a, b)| a == b)
                    .count()
            })
        });
        let prefix = (shared > 0).then(|| {
            let needle = format!("\"{}", &names[0][..shared]);
            memchr::memmem::Finder::new(needle.as_bytes()).into_owned()
        });
        OurNames { names, prefix }
    }

    /// Whether a JSON text without backslashes may name one of the names as a variable: some `"name"` key
    /// whose value is one of them. Without a backslash nothing is escaped, so the text says it literally; a
    /// `"name"` key of a nested object (a `configMapKeyRef`) can only make this true by mistake, and then the
    /// list is parsed. At most two passes over the text whatever the number of names, one when the text lacks
    /// the names' shared prefix as the start of a string.
    fn any_in(&self, text: &str) -> bool {
        if let Some(prefix) = &self.prefix
            && prefix.find(text.as_bytes()).is_none()
        {
            return false;
        }
        names_any(text, &self.names)
    }
}

/// [`OurNames::any_in`] without the prefix: each `"name"` key's value compared with the names.
fn names_any(text: &str, names: &[&str]) -> bool {
    const KEY: &str = "\"name\"";
    // One searcher for the process: `str::find` would build a new one at every call, for every entry.
    static FINDER: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(KEY));
    for at in FINDER.find_iter(text.as_bytes()) {
        // `at` starts an ASCII quote, so the slice after the key is on a character boundary.
        let rest = &text[at + KEY.len()..];
        let Some(value) = rest.trim_start().strip_prefix(':') else {
            continue;
        };
        if let Some(value) = value.trim_start().strip_prefix('"')
            && let Some(end) = memchr::memchr(b'"', value.as_bytes())
            && names.contains(&&value[..end])
        {
            return true;
        }
    }
    false
}

/// The entries of a container's `env` that rendering must compare: those that may define one of `names`.
/// Rendering puts its variables in front of the list, so the other entries matter to nothing but their
/// positions, which a prepend leaves alone. A list whose text has no escape and no `"name": "NAME"` for any of
/// `names`, and to which no earlier profile of the review added one of them, cannot define one (a JSON string
/// without escapes is written literally): none of it is parsed, which is most of the work of wiring a large
/// Pod. Any other list is parsed whole, with what earlier profiles inserted at its places.
pub(super) fn relevant_env<'c>(
    container: &'c ContainerView<'_>,
    names: &OurNames<'_>,
    what: impl FnOnce() -> String,
) -> Result<Option<Vec<EnvEntry<'c>>>, String> {
    if !container.has_env() {
        return Ok(None);
    }
    // memchr's vectorised search: `str::contains(char)` reads a word at a time, and the lists are long.
    let own_irrelevant = container.env.is_none_or(|raw| {
        let text = raw.get();
        text.starts_with('[')
            && memchr::memchr(b'\\', text.as_bytes()).is_none()
            && !names.any_in(text)
    });
    let added_irrelevant = container
        .added_env
        .iter()
        .all(|(_, v)| !names.names.contains(&v.name.as_str()));
    if own_irrelevant && added_irrelevant {
        return Ok(Some(Vec::new()));
    }
    container.env_entries(what)
}
