//! When a classic sidecar (clusters without native sidecars, < 1.29) of a Pod that runs to completion should
//! have stopped: what `check` judges from a Pod's container statuses. The stop itself needs no API access: the
//! Pod's watch container (last, started after the apps, [`WATCH_PREFIX`]) sees in the Pod's shared process
//! namespace that no app process is left and writes the file the PDP's liveness probe reads (`pdp-await
//! watch`, `apps-done`); the kubelet then stops the PDP and, under `Never`/`OnFailure`, leaves it stopped.

use k8s_openapi::api::core::v1::Pod;

use crate::core::Status;
use crate::names::{ANNOTATION_STATUS, WATCH_PREFIX};

/// Why the Pod's classic sidecars should stop now (`app: exit 0, report: exit 0`), or `None` while an app
/// container may still run (or be restarted).
pub fn apps_done(pod: &Pod) -> Option<String> {
    let meta = &pod.metadata;
    let annotations = meta.annotations.as_ref()?;
    // Every sidecar this webhook added: the status annotation, and one per further profile (`status-<profile>`).
    let sidecars: Vec<String> = annotations
        .iter()
        .filter(|(k, _)| {
            k.as_str() == ANNOTATION_STATUS || k.starts_with(&format!("{ANNOTATION_STATUS}-"))
        })
        .filter_map(|(_, v)| serde_json::from_str::<Status>(v).ok()?.sidecar)
        .collect();
    if sidecars.is_empty() {
        return None;
    }
    let spec = pod.spec.as_ref()?;
    let on_failure = match spec.restart_policy.as_deref() {
        Some("Never") => false,
        Some("OnFailure") => true,
        _ => return None,
    };
    let status = pod.status.as_ref()?;
    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return None;
    }
    let statuses = status.container_statuses.as_deref().unwrap_or_default();
    let mut ended = Vec::new();
    for app in spec
        .containers
        .iter()
        .filter(|c| !sidecars.contains(&c.name) && !c.name.starts_with(WATCH_PREFIX))
    {
        let terminated = statuses
            .iter()
            .find(|s| s.name == app.name)
            .and_then(|s| s.state.as_ref()?.terminated.as_ref())?;
        // Under OnFailure the kubelet restarts a container that failed: it has not ended for good.
        if on_failure && terminated.exit_code != 0 {
            return None;
        }
        ended.push(format!("{}: exit {}", app.name, terminated.exit_code));
    }
    (!ended.is_empty()).then(|| ended.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(restart: &str, states: serde_json::Value, extra_annotations: serde_json::Value) -> Pod {
        let status = json!({"mode": "sidecar", "profile": "cerbos", "reason": "injected_sidecar",
                            "configHash": "x", "version": "0.1.0", "sidecar": "cerbos-pdp"});
        let mut annotations = json!({ANNOTATION_STATUS: status.to_string()});
        for (k, v) in extra_annotations.as_object().unwrap() {
            annotations[k] = v.clone();
        }
        serde_json::from_value(json!({
            "metadata": {"name": "job-abc", "namespace": "ns", "annotations": annotations},
            "spec": {"restartPolicy": restart, "containers": [
                {"name": "cerbos-pdp"}, {"name": "app"}, {"name": "upload"}]},
            "status": {"phase": "Running", "containerStatuses": states}
        }))
        .unwrap()
    }

    fn state(name: &str, s: serde_json::Value) -> serde_json::Value {
        json!({"name": name, "state": s, "ready": false, "restartCount": 0, "image": "i", "imageID": ""})
    }

    fn ended(code: i32) -> serde_json::Value {
        json!({"terminated": {"exitCode": code}})
    }

    fn running() -> serde_json::Value {
        json!({"running": {}})
    }

    #[test]
    fn done_once_every_app_container_has_ended_for_good() {
        let pdp = state("cerbos-pdp", running());
        let all = json!([pdp, state("app", ended(0)), state("upload", ended(0))]);
        assert_eq!(
            apps_done(&pod("Never", all.clone(), json!({}))).as_deref(),
            Some("app: exit 0, upload: exit 0")
        );
        assert!(apps_done(&pod("OnFailure", all.clone(), json!({}))).is_some());
        // One app still running: not yet.
        let one = json!([pdp, state("app", ended(0)), state("upload", running())]);
        assert_eq!(apps_done(&pod("Never", one, json!({}))), None);
        // A failure ends the Pod under Never, but is restarted under OnFailure.
        let failed = json!([pdp, state("app", ended(1)), state("upload", ended(0))]);
        assert_eq!(
            apps_done(&pod("Never", failed.clone(), json!({}))).as_deref(),
            Some("app: exit 1, upload: exit 0")
        );
        assert_eq!(apps_done(&pod("OnFailure", failed, json!({}))), None);
        // Not a run-to-completion Pod, already marked, or no status yet: nothing to do.
        assert_eq!(apps_done(&pod("Always", all.clone(), json!({}))), None);
        assert_eq!(apps_done(&pod("Never", json!([]), json!({}))), None);
    }

    #[test]
    fn sidecars_of_further_profiles_are_not_app_containers() {
        let flagd = json!({"mode": "sidecar", "profile": "flagd", "reason": "injected_sidecar",
                           "configHash": "x", "version": "0.1.0", "sidecar": "upload"});
        let states = json!([
            state("cerbos-pdp", running()),
            state("app", ended(0)),
            state("upload", running())
        ]);
        let p = pod(
            "Never",
            states,
            json!({format!("{ANNOTATION_STATUS}-flagd"): flagd.to_string()}),
        );
        assert_eq!(apps_done(&p).as_deref(), Some("app: exit 0"));
    }
}
