//! What a config must satisfy before it is used: names, profiles, volume sources, the socket directory.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Volume;

use super::security::restricted_violations;
use super::{ConfigError, Profile};

pub(super) fn validate_name(what: &str, name: &str) -> Result<(), ConfigError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(ConfigError::Invalid(format!(
            "{what} {name:?} is not a DNS label (lowercase letters, digits and '-', at most 63)"
        )))
    }
}

fn validate_env_name(profile: &str, name: &str) -> Result<(), ConfigError> {
    let ok = !name.is_empty()
        && !name.as_bytes()[0].is_ascii_digit()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(ConfigError::Invalid(format!(
            "profile {profile:?}: {name:?} is not a valid environment variable name"
        )))
    }
}

pub(super) fn validate_profile(name: &str, p: &Profile) -> Result<(), ConfigError> {
    let bad = |msg: String| Err(ConfigError::Invalid(format!("profile {name:?}: {msg}")));
    validate_name("container name", &p.container_name)?;
    if p.image.trim().is_empty() {
        return bad("image is empty".into());
    }
    if p.ports.is_empty() {
        return bad("ports is empty".into());
    }
    for port in &p.ports {
        if port.port == 0 {
            return bad(format!("port {:?} is 0", port.name));
        }
        validate_name("port name", &port.name)?;
        if port.name.len() > 15 {
            return bad(format!(
                "port name {:?} is longer than 15 characters",
                port.name
            ));
        }
    }
    if !p.ports.iter().any(|port| port.port == p.address_port) {
        return bad(format!(
            "addressPort {} is not one of its ports",
            p.address_port
        ));
    }
    if !p.health.path.starts_with('/') {
        return bad(format!(
            "health.path {:?} must start with '/'",
            p.health.path
        ));
    }
    match (p.http_port, &p.env_names.http_address) {
        (Some(port), _) if !p.ports.iter().any(|q| q.port == port) => {
            return bad(format!("httpPort {port} is not one of its ports"));
        }
        // An `envNames` of the file without `httpAddress` (written before it existed) gives no HTTP variable.
        (None, Some(var)) => {
            return bad(format!(
                "envNames.httpAddress {var:?} needs httpPort (the PDP's HTTP port)"
            ));
        }
        _ => {}
    }
    if p.await_node && p.http_port != Some(p.health.port) {
        return bad(format!(
            "awaitNode needs health.port ({}) to be httpPort ({}): the node's front serves the HTTP port, \
             where the gate asks for {}",
            p.health.port,
            p.http_port
                .map_or_else(|| "unset".to_string(), |h| h.to_string()),
            p.health.path
        ));
    }
    if p.fallback && (p.central.is_none() || p.env_names.fallback_address.is_none()) {
        return bad(
            "fallback needs central.address (the Service to fall back to) and envNames.fallbackAddress (the \
             variable that carries it)"
                .to_string(),
        );
    }
    if let Some(c) = &p.central {
        c.host_port()
            .map_err(|e| ConfigError::Invalid(format!("profile {name:?}: central.address {e}")))?;
    }
    let n = &p.env_names;
    // Every variable name the profile may give app containers: the TLS ones count when `tls` is set (then
    // resolved, built-in defaults included), and are checked for their spelling whenever `envNames` sets them.
    let mut names: Vec<(&str, String)> = vec![
        ("host", n.host.clone()),
        ("address", n.address.clone()),
        ("socket", n.socket.clone()),
    ];
    names.extend(n.port.clone().map(|v| ("port", v)));
    names.extend(n.http_address.clone().map(|v| ("httpAddress", v)));
    names.extend(n.selector.clone().map(|v| ("selector", v)));
    for own in [
        &n.tls,
        &n.tls_ca,
        &n.tls_server_name,
        &n.tls_cert,
        &n.tls_key,
    ]
    .into_iter()
    .flatten()
    {
        validate_env_name(name, own)?;
    }
    if p.tls.is_some() {
        let Some(t) = p.tls_env_names() else {
            return bad(
                "tls is set but envNames does not name every TLS variable (tls, tlsCa, tlsServerName, tlsCert, \
                 tlsKey): a profile that extends no built-in profile has no default names for them"
                    .into(),
            );
        };
        names.extend([
            ("tls", t.flag),
            ("tlsCa", t.ca),
            ("tlsServerName", t.server_name),
            ("tlsCert", t.cert),
            ("tlsKey", t.key),
        ]);
    }
    for (_, n) in &names {
        validate_env_name(name, n)?;
    }
    let mut fixed = BTreeSet::new();
    for e in &p.app_env {
        validate_env_name(name, &e.name)?;
        if e.value_from.is_some() || e.value.is_none() {
            return bad(format!(
                "appEnv {:?} must have a plain value (no valueFrom): app variables never come from the Pod",
                e.name
            ));
        }
        if let Some((key, _)) = names.iter().find(|(_, n)| *n == e.name) {
            return bad(format!("appEnv {:?} is also envNames.{key}", e.name));
        }
        if !fixed.insert(&e.name) {
            return bad(format!("appEnv {:?} is listed twice", e.name));
        }
    }
    for (i, (key, n)) in names.iter().enumerate() {
        if let Some((other, _)) = names[..i].iter().find(|(_, m)| m == n) {
            return bad(format!(
                "envNames must be distinct: {other} and {key} are both {n:?}"
            ));
        }
    }
    for (what, path) in [("socket.dir", &p.socket.dir)]
        .into_iter()
        .chain(p.mtls.as_ref().map(|m| ("mtls.mountPath", &m.mount_path)))
        .chain(p.tls.as_ref().map(|t| ("tls.mountPath", &t.mount_path)))
        .chain(
            p.volumes
                .iter()
                .map(|v| ("volumes[].mountPath", &v.mount_path)),
        )
    {
        if !path.starts_with('/') || path.split('/').any(|seg| seg == "..") {
            return bad(format!(
                "{what} {path:?} must be an absolute path without '..'"
            ));
        }
    }
    if p.socket.file.is_empty() || p.socket.file.contains('/') {
        return bad(format!(
            "socket.file {:?} must be a plain file name",
            p.socket.file
        ));
    }
    if let Some(problem) = socket_dir_problem(&p.socket.dir) {
        return bad(format!("socket.dir {:?} {problem}", p.socket.dir));
    }
    let mut volume_names = BTreeSet::from([
        crate::names::VOLUME_SOCKET,
        crate::names::VOLUME_MTLS,
        crate::names::VOLUME_TLS,
    ]);
    for v in &p.volumes {
        validate_name("volume name", &v.volume.name)?;
        if let Some(problem) = volume_source_problem(&v.volume) {
            return bad(format!("volume {:?} {problem}", v.volume.name));
        }
        if !volume_names.insert(v.volume.name.as_str()) {
            return bad(format!(
                "volume name {:?} is used twice or reserved",
                v.volume.name
            ));
        }
    }
    if let Some(m) = &p.mtls {
        validate_name("mtls.secretName", &m.secret_name)?;
    }
    if let Some(t) = &p.tls {
        if p.mtls.is_some() {
            return bad(
                "tls and mtls are both set: tls mounts its Secret and gives the app the variables to dial with TLS \
                 (tls.clientCertificate: true adds the client certificate); mtls is the older, mount-only form. \
                 Keep one (to move, put mtls.secretName in tls.secretName and remove mtls)"
                    .into(),
            );
        }
        match (&t.secret_name, &t.ca_config_map) {
            (None, None) => {
                return bad(
                    "tls needs secretName (a Secret in the Pod's namespace with ca.crt, and tls.crt and tls.key \
                     with clientCertificate) or caConfigMap (a ConfigMap with the server's ca.crt)"
                        .into(),
                );
            }
            (None, Some(_)) if t.client_certificate => {
                return bad(
                    "tls.clientCertificate needs tls.secretName: the Secret that holds the app's tls.crt and tls.key"
                        .into(),
                );
            }
            (Some(_), Some(_)) if !t.client_certificate => {
                return bad(
                    "tls.secretName is not used: with caConfigMap the CA comes from the ConfigMap, and without \
                     clientCertificate the app needs nothing else; remove secretName or set clientCertificate: true"
                        .into(),
                );
            }
            _ => {}
        }
        if let Some(secret) = &t.secret_name {
            validate_name("tls.secretName", secret)?;
        }
        if let Some(map) = &t.ca_config_map {
            validate_name("tls.caConfigMap", map)?;
        }
        if !super::is_dns_name(&t.server_name)
            || t.server_name.parse::<std::net::Ipv4Addr>().is_ok()
        {
            return bad(format!(
                "tls.serverName {:?} must be the DNS name in the PDP's serving certificate (lowercase letters, \
                 digits, '-' and '.'), such as cerbos-pdp.pdp-node.svc",
                t.server_name
            ));
        }
        let mount = normalise_dir(&t.mount_path);
        let socket = normalise_dir(&p.socket.dir);
        if mount == "/"
            || mount == socket
            || is_parent(&mount, &socket)
            || is_parent(&socket, &mount)
        {
            return bad(format!(
                "tls.mountPath {:?} overlaps socket.dir {:?}: app containers mount both, use a directory of its own \
                 such as {}",
                t.mount_path,
                p.socket.dir,
                super::DEFAULT_TLS_MOUNT_PATH
            ));
        }
    }
    let violations = restricted_violations(&p.security_context);
    if !violations.is_empty() {
        return bad(format!(
            "securityContext does not meet Pod Security restricted: {}",
            violations.join("; ")
        ));
    }
    Ok(())
}

/// The volume sources a profile may give its sidecar: data the apiserver or kubelet hands the Pod, nothing that
/// reaches the node's filesystem (hostPath), network or cluster storage (persistentVolumeClaim, csi, ephemeral,
/// nfs, iscsi, image, ...), and nothing unknown. Field names as in the Kubernetes Volume.
pub const PROFILE_VOLUME_KINDS: [&str; 5] = [
    "configMap",
    "secret",
    "emptyDir",
    "projected",
    "downwardAPI",
];

/// What is wrong with a profile volume's source, if anything: it must have exactly one, from
/// [`PROFILE_VOLUME_KINDS`].
pub(super) fn volume_source_problem(volume: &Volume) -> Option<String> {
    let allowed = PROFILE_VOLUME_KINDS.join(", ");
    // Every source the typed Volume knows, by its field name: the JSON keys other than `name`.
    let sources: Vec<String> = match serde_json::to_value(volume) {
        Ok(serde_json::Value::Object(map)) => map
            .into_iter()
            .map(|(k, _)| k)
            .filter(|k| k != "name")
            .collect(),
        _ => {
            return Some(format!(
                "cannot be read; sidecar volumes may only be {allowed}"
            ));
        }
    };
    if let Some(kind) = sources
        .iter()
        .find(|k| !PROFILE_VOLUME_KINDS.contains(&k.as_str()))
    {
        return Some(format!(
            "is a {kind} volume; sidecar volumes may only be {allowed} (nothing that reaches into the node or \
             cluster storage)"
        ));
    }
    match sources.len() {
        1 => None,
        0 => Some(format!(
            "has no volume source; sidecar volumes must be one of {allowed}"
        )),
        _ => Some(format!(
            "has several volume sources ({}); a volume has exactly one",
            sources.join(", ")
        )),
    }
}

/// Keys of profile volumes in the file that the typed Volume would drop silently (an unknown or misspelt
/// source, or one newer than this build's Kubernetes types): refused, with their path, instead of leaving a
/// volume without its source.
pub(super) fn check_volume_keys(tree: &serde_json::Value) -> Result<(), ConfigError> {
    let Some(profiles) = tree.get("profiles").and_then(serde_json::Value::as_object) else {
        return Ok(());
    };
    for (name, profile) in profiles {
        let Some(volumes) = profile.get("volumes").and_then(serde_json::Value::as_array) else {
            continue;
        };
        for (i, v) in volumes.iter().enumerate() {
            let Some(volume) = v.get("volume").and_then(serde_json::Value::as_object) else {
                continue;
            };
            // The keys the typed Volume keeps; a volume that does not even parse is reported by the
            // deserializer, with its path, and a known but forbidden source by validate_profile.
            let Ok(typed) =
                serde_json::from_value::<Volume>(serde_json::Value::Object(volume.clone()))
            else {
                continue;
            };
            let kept = serde_json::to_value(&typed).unwrap_or_default();
            for key in volume.keys() {
                if kept.get(key).is_none() {
                    return Err(ConfigError::Field {
                        path: format!("profiles.{name}.volumes[{i}].volume.{key}"),
                        message: format!(
                            "{key:?} is not a volume source this injector knows; sidecar volumes may only be {}",
                            PROFILE_VOLUME_KINDS.join(", ")
                        ),
                    });
                }
            }
        }
    }
    Ok(())
}

/// The node directories a profile's `socket.dir` may be (an allow list: a deny list of the node's system
/// trees always misses one, such as /run/k3s, /run/cilium, /run/dbus or the PDP instances' own directory). In
/// daemonset mode `socket.dir` is a hostPath of every node, mounted into every wired Pod (and created, made
/// writable, by the PDP's DaemonSet): the built-in profiles' directories, in both spellings (`/var/run` is a
/// symlink to `/run` on most nodes).
const SOCKET_DIRS: [&str; 4] = [
    "/var/run/cerbos",
    "/run/cerbos",
    "/var/run/flagd",
    "/run/flagd",
];

/// Trees of the node that belong to pdp-injector: any directory below one may be a profile's `socket.dir`.
const SOCKET_DIR_TREES: [&str; 2] = ["/var/run/pdp-injector", "/run/pdp-injector"];

/// `path` with duplicate and trailing slashes and `.` segments removed (`//var/./run/` is `/var/run`).
fn normalise_dir(path: &str) -> String {
    let segments: Vec<&str> = path
        .split('/')
        .filter(|s| !s.is_empty() && *s != ".")
        .collect();
    format!("/{}", segments.join("/"))
}

/// Whether `dir` is a parent of `other` (both normalised).
fn is_parent(dir: &str, other: &str) -> bool {
    dir != other && (dir == "/" || other.starts_with(&format!("{dir}/")))
}

/// What is wrong with `socket.dir` as a node directory, if anything (it is already absolute and without `..`).
pub(super) fn socket_dir_problem(dir: &str) -> Option<String> {
    let norm = normalise_dir(dir);
    if SOCKET_DIRS.contains(&norm.as_str()) || SOCKET_DIR_TREES.iter().any(|t| is_parent(t, &norm))
    {
        return None;
    }
    let shown = if norm == dir {
        String::new()
    } else {
        format!(" (that is {norm})")
    };
    Some(
        format!(
            "{shown} is not a directory a node-local PDP may use: in daemonset mode it is a hostPath of every node, \
             mounted into every wired Pod, so it must be one of {} or a directory below {}",
            SOCKET_DIRS.join(", "),
            SOCKET_DIR_TREES.join(" or ")
        )
        .trim_start()
        .to_string(),
    )
}
