//! The hardening of every container the injector adds, and the Pod Security `restricted` check that profiles
//! are held to.

use k8s_openapi::api::core::v1::{Capabilities, SeccompProfile, SecurityContext};

/// Lays an admin's security context over the restricted baseline, so that an admin who only sets a user does not
/// lose the rest of the hardening.
pub(super) fn overlay_security_context(admin: SecurityContext) -> SecurityContext {
    let base = restricted_security_context(None);
    SecurityContext {
        allow_privilege_escalation: admin
            .allow_privilege_escalation
            .or(base.allow_privilege_escalation),
        capabilities: admin.capabilities.or(base.capabilities),
        privileged: admin.privileged.or(base.privileged),
        read_only_root_filesystem: admin
            .read_only_root_filesystem
            .or(base.read_only_root_filesystem),
        run_as_non_root: admin.run_as_non_root.or(base.run_as_non_root),
        seccomp_profile: admin.seccomp_profile.or(base.seccomp_profile),
        ..admin
    }
}

/// The hardening every injected container gets: Pod Security `restricted`.
pub fn restricted_security_context(user: Option<i64>) -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            add: None,
        }),
        privileged: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        run_as_user: user,
        run_as_group: user,
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            localhost_profile: None,
        }),
        ..Default::default()
    }
}

/// SELinux types that Pod Security `baseline` (and so `restricted`) allows on a container, unset included.
/// `container_engine_t` is allowed only from Kubernetes 1.31 on; the install supports 1.30, where Pod Security
/// admission refuses it, and a PDP runs no container engine: it is refused here.
pub const SELINUX_TYPES_ALLOWED: [&str; 4] =
    ["", "container_t", "container_init_t", "container_kvm_t"];

/// Checks a container security context against Pod Security `restricted` (which includes `baseline`), as the
/// Pod Security admission plugin would: every control of the Pod Security Standards page that a container's
/// `securityContext` can break. Returns one message per violation, each naming the field and its value.
pub fn restricted_violations(sc: &SecurityContext) -> Vec<String> {
    let mut v = Vec::new();
    // baseline: Privileged Containers.
    if sc.privileged == Some(true) {
        v.push("privileged is true".to_string());
    }
    // restricted: Privilege Escalation.
    if sc.allow_privilege_escalation != Some(false) {
        v.push("allowPrivilegeEscalation is not false".to_string());
    }
    // restricted: Running as Non-root, Running as Non-root user.
    if sc.run_as_non_root != Some(true) {
        v.push("runAsNonRoot is not true".to_string());
    }
    if sc.run_as_user == Some(0) {
        v.push("runAsUser is 0".to_string());
    }
    // restricted: Capabilities (drop ALL, add at most NET_BIND_SERVICE; stricter than baseline's list).
    let caps = sc.capabilities.as_ref();
    let drops_all = caps
        .and_then(|c| c.drop.as_ref())
        .is_some_and(|d| d.iter().any(|c| c == "ALL"));
    if !drops_all {
        v.push("capabilities.drop does not contain ALL".to_string());
    }
    if let Some(add) = caps.and_then(|c| c.add.as_ref()) {
        let extra: Vec<&str> = add
            .iter()
            .map(String::as_str)
            .filter(|c| *c != "NET_BIND_SERVICE")
            .collect();
        if !extra.is_empty() {
            v.push(format!(
                "capabilities.add holds {} (only NET_BIND_SERVICE is allowed)",
                extra.join(", ")
            ));
        }
    }
    // restricted: Seccomp (baseline only forbids Unconfined; restricted requires a profile).
    match sc.seccomp_profile.as_ref().map(|s| s.type_.as_str()) {
        Some("RuntimeDefault") | Some("Localhost") => {}
        Some(other) => v.push(format!(
            "seccompProfile.type is {other:?} (allowed: RuntimeDefault, Localhost)"
        )),
        None => {
            v.push("seccompProfile.type is unset (allowed: RuntimeDefault, Localhost)".to_string())
        }
    }
    // baseline: /proc Mount Type.
    if let Some(mount) = sc.proc_mount.as_deref()
        && mount != "Default"
    {
        v.push(format!(
            "procMount is {mount:?} (allowed: Default or unset)"
        ));
    }
    // baseline: SELinux (type from a fixed list; user and role never set).
    if let Some(se) = &sc.se_linux_options {
        if let Some(t) = se.type_.as_deref()
            && !SELINUX_TYPES_ALLOWED.contains(&t)
        {
            v.push(format!(
                "seLinuxOptions.type is {t:?} (allowed: unset, \"\", container_t, container_init_t, container_kvm_t)"
            ));
        }
        for (field, value) in [("user", &se.user), ("role", &se.role)] {
            if let Some(value) = value.as_deref()
                && !value.is_empty()
            {
                v.push(format!(
                    "seLinuxOptions.{field} is {value:?} (must be unset or \"\")"
                ));
            }
        }
    }
    // baseline: AppArmor.
    if let Some(profile) = &sc.app_armor_profile
        && !matches!(profile.type_.as_str(), "RuntimeDefault" | "Localhost")
    {
        v.push(format!(
            "appArmorProfile.type is {:?} (allowed: RuntimeDefault, Localhost, or no appArmorProfile)",
            profile.type_
        ));
    }
    // baseline: HostProcess (Windows).
    if sc
        .windows_options
        .as_ref()
        .and_then(|w| w.host_process)
        .unwrap_or(false)
    {
        v.push("windowsOptions.hostProcess is true".to_string());
    }
    v
}
