//! Which workload owns a Pod (ReplicaSet -> Deployment, Job -> CronJob), and the command that replaces its Pods
//! so the webhook wires them again: the unit an operator acts on is the workload, not the Pod.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The object whose Pods are replaced together.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Workload {
    /// `Deployment`, `StatefulSet`, `DaemonSet`, `CronJob`, `Job`, `ReplicaSet`, another controller's kind, or
    /// `Pod` for a Pod without a controller.
    pub kind: String,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl std::fmt::Display for Workload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
    }
}

/// The controller (kind, name) of an object: its owner reference with `controller: true`.
pub fn controller_of(meta: &ObjectMeta) -> Option<(String, String)> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| (o.kind.clone(), o.name.clone()))
}

/// Controllers of the objects between Pods and their workloads (ReplicaSets, Jobs), by namespace, kind, name.
#[derive(Debug, Default, Clone)]
pub struct Owners(HashMap<(String, String, String), (String, String)>);

impl Owners {
    /// Records that `kind` `namespace/name` is controlled by the controller in `meta` (if any).
    pub fn record(&mut self, kind: &str, meta: &ObjectMeta) {
        let (Some(ns), Some(name)) = (&meta.namespace, &meta.name) else {
            return;
        };
        if let Some(owner) = controller_of(meta) {
            self.0
                .insert((ns.clone(), kind.to_string(), name.clone()), owner);
        }
    }
}

/// The workload of a Pod: its controller, and that controller's controller for ReplicaSets and Jobs.
pub fn workload_of(pod: &Pod, owners: &Owners) -> Workload {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let (mut kind, mut name) = controller_of(&pod.metadata).unwrap_or_else(|| {
        (
            "Pod".to_string(),
            pod.metadata.name.clone().unwrap_or_default(),
        )
    });
    if matches!(kind.as_str(), "ReplicaSet" | "Job")
        && let Some((k, n)) = owners
            .0
            .get(&(namespace.clone(), kind.clone(), name.clone()))
    {
        (kind, name) = (k.clone(), n.clone());
    }
    Workload {
        kind,
        namespace,
        name,
    }
}

/// What replaces the Pods of `w` (named in `pods`, without namespace) through the webhook.
pub fn fix(w: &Workload, pods: &[String]) -> String {
    let ns = &w.namespace;
    match w.kind.as_str() {
        "Deployment" | "StatefulSet" | "DaemonSet" => format!(
            "kubectl rollout restart {}/{} -n {ns}",
            w.kind.to_lowercase(),
            w.name
        ),
        "CronJob" => format!(
            "none needed for the next run (its Jobs get new Pods); a running Job keeps its Pods until they end: \
             kubectl create job --from=cronjob/{} {}-rerun -n {ns} to run it now",
            w.name, w.name
        ),
        "Job" => format!(
            "a Job's Pods cannot be restarted in place: re-create the Job (kubectl get job {} -n {ns} -o yaml, \
             delete it, apply it again without its selector and controller-uid labels)",
            w.name
        ),
        "Pod" => format!(
            "kubectl delete pod {} -n {ns}, then create it again from its manifest (no controller recreates it)",
            w.name
        ),
        // A bare ReplicaSet or another controller: deleting the Pods makes it create new ones.
        other => format!(
            "kubectl delete pod {} -n {ns} (its {other} creates new ones)",
            pods.join(" ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn owned(kind: &str, name: &str) -> serde_json::Value {
        json!([{"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": "u", "controller": true}])
    }

    fn pod_owned_by(kind: &str, name: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p-1", "namespace": "shop", "ownerReferences": owned(kind, name)}
        }))
        .unwrap()
    }

    fn meta(name: &str, owner: serde_json::Value) -> ObjectMeta {
        serde_json::from_value(json!({"name": name, "namespace": "shop", "ownerReferences": owner}))
            .unwrap()
    }

    #[test]
    fn resolves_replicaset_to_deployment_and_job_to_cronjob() {
        let mut owners = Owners::default();
        owners.record("ReplicaSet", &meta("web-5d4f", owned("Deployment", "web")));
        owners.record("Job", &meta("nightly-123", owned("CronJob", "nightly")));
        let w = workload_of(&pod_owned_by("ReplicaSet", "web-5d4f"), &owners);
        assert_eq!(w.to_string(), "Deployment shop/web");
        assert_eq!(
            fix(&w, &[]),
            "kubectl rollout restart deployment/web -n shop"
        );
        let w = workload_of(&pod_owned_by("Job", "nightly-123"), &owners);
        assert_eq!(w.to_string(), "CronJob shop/nightly");
        assert!(fix(&w, &[]).contains("--from=cronjob/nightly"));
        // A ReplicaSet without a Deployment stays itself; its Pods are deleted.
        let w = workload_of(&pod_owned_by("ReplicaSet", "lone"), &owners);
        assert_eq!(w.kind, "ReplicaSet");
        assert_eq!(
            fix(&w, &["p-1".into(), "p-2".into()]),
            "kubectl delete pod p-1 p-2 -n shop (its ReplicaSet creates new ones)"
        );
        let w = workload_of(&pod_owned_by("StatefulSet", "db"), &owners);
        assert_eq!(
            fix(&w, &[]),
            "kubectl rollout restart statefulset/db -n shop"
        );
    }

    #[test]
    fn bare_pod_is_its_own_workload() {
        let p: Pod =
            serde_json::from_value(json!({"metadata": {"name": "solo", "namespace": "a"}}))
                .unwrap();
        let w = workload_of(&p, &Owners::default());
        assert_eq!(w.to_string(), "Pod a/solo");
        assert!(fix(&w, &[]).starts_with("kubectl delete pod solo -n a"));
        // Owner references that are not the controller do not count.
        let p: Pod = serde_json::from_value(json!({"metadata": {"name": "x", "namespace": "a",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "n", "uid": "u"}]}}))
        .unwrap();
        assert_eq!(workload_of(&p, &Owners::default()).kind, "Pod");
    }
}
