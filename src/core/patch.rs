//! patch = diff(before, after), specialised for what rendering changes.
//!
//! Rendering only touches the annotations, the volumes, the init containers and the app containers' `env` and
//! `volumeMounts`, and it only inserts. A generic JSON diff would serialise both Pods whole and, because the
//! injected variables are *prepended*, turn every shifted list element into a `replace`: hundreds of
//! operations for a Pod with many variables. This diff compares the typed sections, serialises only what was
//! added, and expresses insertions as RFC 6902 `add` at an index, so a patch has a handful of operations and
//! never rewrites a user's field. The tests check it against the rendered Pod: applying the patch to the input
//! must give exactly the rendered Pod.

use std::collections::BTreeMap;

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation, ReplaceOperation};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use serde::Serialize;
use serde_json::Value;

struct Ops(Vec<PatchOperation>);

fn value<T: Serialize>(v: &T) -> Value {
    // Typed Kubernetes objects always serialize: string keys, finite numbers.
    serde_json::to_value(v).expect("Kubernetes objects serialize to JSON")
}

impl Ops {
    fn add<T: Serialize>(&mut self, path: PointerBuf, v: &T) {
        self.0.push(PatchOperation::Add(AddOperation {
            path,
            value: value(v),
        }));
    }

    fn replace<T: Serialize>(&mut self, path: PointerBuf, v: &T) {
        self.0.push(PatchOperation::Replace(ReplaceOperation {
            path,
            value: value(v),
        }));
    }
}

fn child(path: &PointerBuf, token: impl ToString) -> PointerBuf {
    let mut p = path.clone();
    p.push_back(token.to_string());
    p
}

/// A map that only gains or changes keys: `add` per key (RFC 6902 `add` on an existing member replaces it),
/// or one `add` of the whole map when it did not exist.
fn diff_map(
    ops: &mut Ops,
    path: PointerBuf,
    before: &Option<BTreeMap<String, String>>,
    after: &Option<BTreeMap<String, String>>,
) {
    match (before, after) {
        (_, None) => {
            if before.is_some() {
                ops.0
                    .push(PatchOperation::Remove(json_patch::RemoveOperation { path }));
            }
        }
        (None, Some(a)) => ops.add(path, a),
        (Some(b), Some(a)) => {
            for (k, v) in a {
                if b.get(k) != Some(v) {
                    ops.add(child(&path, k), v);
                }
            }
            if b.keys().any(|k| !a.contains_key(k)) {
                // Never produced by rendering; stay correct anyway.
                ops.replace(path, a);
            }
        }
    }
}

/// A list that only gains elements: walks both lists and emits `add` at the index where each new element
/// belongs. `nested` diffs an element that changed in place (matched by `same_item`). Anything else (an element
/// removed or reordered) replaces the whole list, which is correct, only larger.
fn diff_list<T: PartialEq + Serialize>(
    ops: &mut Ops,
    path: PointerBuf,
    before: &[T],
    after: &[T],
    same_item: fn(&T, &T) -> bool,
    nested: Option<fn(&mut Ops, PointerBuf, &T, &T)>,
) {
    let mut local = Ops(Vec::new());
    let (mut i, mut j) = (0, 0);
    while j < after.len() {
        match before.get(i) {
            Some(b) if *b == after[j] => {
                i += 1;
                j += 1;
            }
            Some(b) if nested.is_some() && same_item(b, &after[j]) => {
                if let Some(f) = nested {
                    f(&mut local, child(&path, j), b, &after[j]);
                }
                i += 1;
                j += 1;
            }
            _ => {
                local.add(child(&path, j), &after[j]);
                j += 1;
            }
        }
    }
    if i == before.len() {
        ops.0.extend(local.0);
    } else {
        ops.replace(path, &after);
    }
}

fn diff_opt_list<T: PartialEq + Serialize>(
    ops: &mut Ops,
    path: PointerBuf,
    before: &Option<Vec<T>>,
    after: &Option<Vec<T>>,
    same_item: fn(&T, &T) -> bool,
    nested: Option<fn(&mut Ops, PointerBuf, &T, &T)>,
) {
    match (before, after) {
        (b, a) if b == a => {}
        (None, Some(a)) => ops.add(path, a),
        (Some(b), Some(a)) => diff_list(ops, path, b, a, same_item, nested),
        (Some(_), None) => ops
            .0
            .push(PatchOperation::Remove(json_patch::RemoveOperation { path })),
        (None, None) => {}
    }
}

fn atomic<T>(_: &T, _: &T) -> bool {
    false
}

fn same_name(a: &Container, b: &Container) -> bool {
    a.name == b.name
}

/// An app container that changed in place: its `env` and `volumeMounts` gained entries. Any other change
/// replaces the container whole.
fn diff_container(ops: &mut Ops, path: PointerBuf, before: &Container, after: &Container) {
    let rest_same = container_rest_same(before, after);
    if !rest_same {
        ops.replace(path, after);
        return;
    }
    diff_opt_list(
        ops,
        child(&path, "env"),
        &before.env,
        &after.env,
        atomic,
        None,
    );
    diff_opt_list(
        ops,
        child(&path, "volumeMounts"),
        &before.volume_mounts,
        &after.volume_mounts,
        atomic,
        None,
    );
}

/// The JSON Patch from `before` to `after`, where `after` is `before` with PDP wiring rendered onto it.
pub fn diff_pods(before: &Pod, after: &Pod) -> Patch {
    let mut ops = Ops(Vec::new());
    let root = PointerBuf::root();
    let metadata = child(&root, "metadata");
    diff_map(
        &mut ops,
        child(&metadata, "annotations"),
        &before.metadata.annotations,
        &after.metadata.annotations,
    );
    diff_map(
        &mut ops,
        child(&metadata, "labels"),
        &before.metadata.labels,
        &after.metadata.labels,
    );
    match (&before.spec, &after.spec) {
        (Some(b), Some(a)) if b != a => {
            let spec = child(&root, "spec");
            let rest_same = spec_rest_same(b, a);
            if !rest_same {
                ops.replace(spec, a);
            } else {
                diff_opt_list(
                    &mut ops,
                    child(&spec, "initContainers"),
                    &b.init_containers,
                    &a.init_containers,
                    same_name,
                    Some(diff_container),
                );
                diff_list(
                    &mut ops,
                    child(&spec, "containers"),
                    &b.containers,
                    &a.containers,
                    same_name,
                    Some(diff_container),
                );
                diff_opt_list(
                    &mut ops,
                    child(&spec, "volumes"),
                    &b.volumes,
                    &a.volumes,
                    atomic,
                    None,
                );
            }
        }
        (b, a) if b != a => ops.replace(child(&root, "spec"), a),
        _ => {}
    }
    Patch(ops.0)
}

/// True when `a` and `b` differ at most in `containers`, `init_containers`, `volumes`. The exhaustive pattern makes a
/// new Kubernetes field a compile error here instead of a field the patch silently misses.
fn spec_rest_same(a: &PodSpec, b: &PodSpec) -> bool {
    let PodSpec {
        active_deadline_seconds,
        affinity,
        automount_service_account_token,
        dns_config,
        dns_policy,
        enable_service_links,
        ephemeral_containers,
        host_aliases,
        host_ipc,
        host_network,
        host_pid,
        host_users,
        hostname,
        image_pull_secrets,
        node_name,
        node_selector,
        os,
        overhead,
        preemption_policy,
        priority,
        priority_class_name,
        readiness_gates,
        resource_claims,
        resources,
        restart_policy,
        runtime_class_name,
        scheduler_name,
        scheduling_gates,
        security_context,
        service_account,
        service_account_name,
        set_hostname_as_fqdn,
        share_process_namespace,
        subdomain,
        termination_grace_period_seconds,
        tolerations,
        topology_spread_constraints,
        containers: _,
        init_containers: _,
        volumes: _,
    } = a;
    *active_deadline_seconds == b.active_deadline_seconds
        && *affinity == b.affinity
        && *automount_service_account_token == b.automount_service_account_token
        && *dns_config == b.dns_config
        && *dns_policy == b.dns_policy
        && *enable_service_links == b.enable_service_links
        && *ephemeral_containers == b.ephemeral_containers
        && *host_aliases == b.host_aliases
        && *host_ipc == b.host_ipc
        && *host_network == b.host_network
        && *host_pid == b.host_pid
        && *host_users == b.host_users
        && *hostname == b.hostname
        && *image_pull_secrets == b.image_pull_secrets
        && *node_name == b.node_name
        && *node_selector == b.node_selector
        && *os == b.os
        && *overhead == b.overhead
        && *preemption_policy == b.preemption_policy
        && *priority == b.priority
        && *priority_class_name == b.priority_class_name
        && *readiness_gates == b.readiness_gates
        && *resource_claims == b.resource_claims
        && *resources == b.resources
        && *restart_policy == b.restart_policy
        && *runtime_class_name == b.runtime_class_name
        && *scheduler_name == b.scheduler_name
        && *scheduling_gates == b.scheduling_gates
        && *security_context == b.security_context
        && *service_account == b.service_account
        && *service_account_name == b.service_account_name
        && *set_hostname_as_fqdn == b.set_hostname_as_fqdn
        && *share_process_namespace == b.share_process_namespace
        && *subdomain == b.subdomain
        && *termination_grace_period_seconds == b.termination_grace_period_seconds
        && *tolerations == b.tolerations
        && *topology_spread_constraints == b.topology_spread_constraints
}

/// True when `a` and `b` differ at most in `env`, `volume_mounts`. The exhaustive pattern makes a
/// new Kubernetes field a compile error here instead of a field the patch silently misses.
fn container_rest_same(a: &Container, b: &Container) -> bool {
    let Container {
        args,
        command,
        env_from,
        image,
        image_pull_policy,
        lifecycle,
        liveness_probe,
        name,
        ports,
        readiness_probe,
        resize_policy,
        resources,
        restart_policy,
        security_context,
        startup_probe,
        stdin,
        stdin_once,
        termination_message_path,
        termination_message_policy,
        tty,
        volume_devices,
        working_dir,
        env: _,
        volume_mounts: _,
    } = a;
    *args == b.args
        && *command == b.command
        && *env_from == b.env_from
        && *image == b.image
        && *image_pull_policy == b.image_pull_policy
        && *lifecycle == b.lifecycle
        && *liveness_probe == b.liveness_probe
        && *name == b.name
        && *ports == b.ports
        && *readiness_probe == b.readiness_probe
        && *resize_policy == b.resize_policy
        && *resources == b.resources
        && *restart_policy == b.restart_policy
        && *security_context == b.security_context
        && *startup_probe == b.startup_probe
        && *stdin == b.stdin
        && *stdin_once == b.stdin_once
        && *termination_message_path == b.termination_message_path
        && *termination_message_policy == b.termination_message_policy
        && *tty == b.tty
        && *volume_devices == b.volume_devices
        && *working_dir == b.working_dir
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(v: Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    fn check(before: Value, after: Value) -> Vec<Value> {
        let (b, a) = (pod(before), pod(after));
        let patch = diff_pods(&b, &a);
        let mut doc = serde_json::to_value(&b).unwrap();
        json_patch::patch(&mut doc, &patch).unwrap();
        assert_eq!(doc, serde_json::to_value(&a).unwrap());
        patch
            .0
            .iter()
            .map(|op| serde_json::to_value(op).unwrap())
            .collect()
    }

    #[test]
    fn prepended_env_is_inserted_not_rewritten() {
        let ops = check(
            json!({"spec": {"containers": [{"name": "a", "env": [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}]}]}}),
            json!({"spec": {"containers": [{"name": "a", "env": [{"name": "H", "value": "h"}, {"name": "X", "value": "1"}, {"name": "A", "value": "a"}, {"name": "Y", "value": "2"}]}]}}),
        );
        assert_eq!(ops.len(), 2, "{ops:?}");
        assert_eq!(ops[0]["op"], "add");
        assert_eq!(ops[0]["path"], "/spec/containers/0/env/0");
        assert_eq!(ops[1]["path"], "/spec/containers/0/env/2");
    }

    #[test]
    fn missing_parents_are_added_whole_and_keys_escaped() {
        let ops = check(
            json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}]}}),
            json!({"metadata": {"name": "p", "annotations": {"x/y~z": "1"}},
                   "spec": {"containers": [{"name": "a", "env": [{"name": "H", "value": "h"}]}],
                            "volumes": [{"name": "v", "emptyDir": {}}],
                            "initContainers": [{"name": "s", "image": "i"}]}}),
        );
        let paths: Vec<&str> = ops.iter().map(|o| o["path"].as_str().unwrap()).collect();
        assert_eq!(
            paths,
            [
                "/metadata/annotations",
                "/spec/initContainers",
                "/spec/containers/0/env",
                "/spec/volumes"
            ]
        );
        let ops = check(
            json!({"metadata": {"annotations": {"a": "1"}}, "spec": {"containers": [{"name": "a"}]}}),
            json!({"metadata": {"annotations": {"a": "1", "x/y~z": "2"}}, "spec": {"containers": [{"name": "a"}]}}),
        );
        assert_eq!(ops[0]["path"], "/metadata/annotations/x~1y~0z");
    }

    #[test]
    fn anything_unexpected_falls_back_to_replace_and_stays_correct() {
        check(
            json!({"spec": {"containers": [{"name": "a", "env": [{"name": "X", "value": "1"}]}]}}),
            json!({"spec": {"containers": [{"name": "a", "env": [{"name": "Y", "value": "2"}]}]}}),
        );
        check(
            json!({"spec": {"containers": [{"name": "a", "image": "1"}]}}),
            json!({"spec": {"containers": [{"name": "a", "image": "2"}]}}),
        );
        check(
            json!({"spec": {"hostNetwork": true, "containers": [{"name": "a"}]}}),
            json!({"spec": {"containers": [{"name": "a"}]}}),
        );
        check(
            json!({"metadata": {"annotations": {"a": "1", "b": "2"}}, "spec": {"containers": []}}),
            json!({"metadata": {"annotations": {"a": "1"}}, "spec": {"containers": []}}),
        );
        check(
            json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}]}}),
            json!({"spec": {"containers": [{"name": "b"}, {"name": "a"}, {"name": "c"}]}}),
        );
    }
}
