//! The self-healing round's decisions (`pdp-injector heal`): which Pods that are not wired as the webhook would
//! wire them now are replaced, one at a time per namespace, through their controller. Pure: the caller lists
//! Pods and namespaces, evicts, and keeps [`Memory`] between rounds.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use k8s_openapi::api::core::v1::Pod;

use super::pods::{self, Drift};
use super::workloads::controller_of;
use crate::config::Config;
use crate::core::NamespaceInfo;

/// One Pod of a round, as the planner needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// Its controller (kind, name); `None` for a bare Pod.
    pub controller: Option<(String, String)>,
    /// All its containers ready.
    pub ready: bool,
    /// How it differs from what the webhook would do now, when it is one of the drifts healed.
    pub drift: Option<Drift>,
}

/// What a round does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Evict this Pod: its controller replaces it and the webhook wires the new one.
    Evict {
        namespace: String,
        pod: String,
        controller: (String, String),
        drift: Drift,
    },
    /// Report, once, a Pod that is never evicted: a bare Pod (nothing would replace it) or a Job's (the Job
    /// would count it failed).
    Report {
        namespace: String,
        pod: String,
        drift: Drift,
        why: &'static str,
    },
}

/// What one round leaves for the next: the Pods already reported.
#[derive(Debug, Default)]
pub struct Memory {
    reported: HashSet<String>,
}

/// The drifts healed: a Pod the webhook would wire but that carries no wiring, or one wired by another config.
pub const HEALED: [Drift; 2] = [Drift::NotWired, Drift::StaleConfig];

const BARE: &str =
    "a Pod without a controller is never deleted: delete and create it again to wire it";
const JOB: &str = "a Job's Pod is not evicted (the Job would count it as failed): it is wired when the Job runs again";

/// The Pod as the planner sees it; `None` for a finished or terminating Pod.
pub fn see(
    pod: &Pod,
    labels: &BTreeMap<String, String>,
    config: &Config,
    healed: &BTreeSet<Drift>,
) -> Option<Seen> {
    let meta = &pod.metadata;
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if meta.deletion_timestamp.is_some() || matches!(phase, Some("Succeeded" | "Failed")) {
        return None;
    }
    let namespace = meta.namespace.clone().unwrap_or_default();
    let info = NamespaceInfo::from_labels(namespace.clone(), labels);
    let drift = pods::compare(pod, &info, config)
        .map(|d| d.drift)
        .filter(|d| healed.contains(d));
    let ready = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    Some(Seen {
        namespace,
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        controller: controller_of(meta),
        ready,
        drift,
    })
}

/// The round's actions over every Pod seen (all of them, wired or not: a controller with a wired Pod not ready
/// yet, a replacement starting, is left alone until it is). Per namespace, one controller at a time (the first by
/// kind and name with a Pod to heal) and one eviction; at most `budget` evictions in all.
pub fn plan(seen: &[Seen], memory: &mut Memory, budget: usize) -> Vec<Action> {
    let mut actions = Vec::new();
    let starting: BTreeSet<(&str, &(String, String))> = seen
        .iter()
        .filter(|s| !s.ready && s.drift.is_none())
        .filter_map(|s| Some((s.namespace.as_str(), s.controller.as_ref()?)))
        .collect();
    // Per namespace, per controller: the Pods to heal, in name order.
    let mut todo: BTreeMap<&str, BTreeMap<&(String, String), Vec<&Seen>>> = BTreeMap::new();
    for s in seen {
        let Some(drift) = s.drift else { continue };
        match &s.controller {
            Some(c) if c.0 != "Job" => todo
                .entry(s.namespace.as_str())
                .or_default()
                .entry(c)
                .or_default()
                .push(s),
            other => {
                if memory.reported.insert(s.uid.clone()) {
                    actions.push(Action::Report {
                        namespace: s.namespace.clone(),
                        pod: s.name.clone(),
                        drift,
                        why: if other.is_some() { JOB } else { BARE },
                    });
                }
            }
        }
    }
    let mut evictions = 0;
    for (ns, controllers) in todo {
        if evictions == budget {
            break;
        }
        let Some((controller, pods)) = controllers.into_iter().next() else {
            continue;
        };
        if starting.contains(&(ns, controller)) {
            continue;
        }
        let mut pods = pods;
        pods.sort_by(|a, b| a.name.cmp(&b.name));
        let pod = pods[0];
        actions.push(Action::Evict {
            namespace: pod.namespace.clone(),
            pod: pod.name.clone(),
            controller: controller.clone(),
            drift: pod.drift.unwrap_or(Drift::NotWired),
        });
        evictions += 1;
    }
    actions
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(
        ns: &str,
        name: &str,
        controller: Option<(&str, &str)>,
        ready: bool,
        drift: Option<Drift>,
    ) -> Seen {
        Seen {
            namespace: ns.into(),
            name: name.into(),
            uid: format!("{ns}/{name}"),
            controller: controller.map(|(k, n)| (k.into(), n.into())),
            ready,
            drift,
        }
    }

    fn evicted(actions: &[Action]) -> Vec<(&str, &str)> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Evict { namespace, pod, .. } => Some((namespace.as_str(), pod.as_str())),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn one_controller_at_a_time_per_namespace_one_eviction_each() {
        let rs = Some(("ReplicaSet", "web-1"));
        let other = Some(("StatefulSet", "db"));
        let all = vec![
            seen("a", "web-1-x", rs, true, Some(Drift::NotWired)),
            seen("a", "web-1-y", rs, true, Some(Drift::NotWired)),
            seen("a", "db-0", other, true, Some(Drift::StaleConfig)),
            seen("b", "web-1-z", rs, true, Some(Drift::NotWired)),
            seen("b", "fine", rs, true, None),
        ];
        let mut m = Memory::default();
        assert_eq!(
            evicted(&plan(&all, &mut m, 10)),
            [("a", "web-1-x"), ("b", "web-1-z")]
        );
        // The budget bounds the round.
        assert_eq!(evicted(&plan(&all, &mut m, 1)), [("a", "web-1-x")]);
        assert!(plan(&all, &mut m, 0).is_empty());
    }

    #[test]
    fn a_controller_with_a_pod_starting_waits() {
        let rs = Some(("ReplicaSet", "web-1"));
        let all = vec![
            seen("a", "web-1-new", rs, false, None),
            seen("a", "web-1-y", rs, true, Some(Drift::NotWired)),
        ];
        assert!(evicted(&plan(&all, &mut Memory::default(), 10)).is_empty());
        // A Pod that is not ready because it is not wired (an app that needs its PDP) is healed all the same.
        let crashing = vec![seen("a", "web-1-y", rs, false, Some(Drift::NotWired))];
        assert_eq!(
            evicted(&plan(&crashing, &mut Memory::default(), 10)),
            [("a", "web-1-y")]
        );
    }

    #[test]
    fn bare_and_job_pods_are_reported_once_never_evicted() {
        let all = vec![
            seen("a", "bare", None, true, Some(Drift::NotWired)),
            seen(
                "a",
                "job-x",
                Some(("Job", "job")),
                true,
                Some(Drift::NotWired),
            ),
        ];
        let mut m = Memory::default();
        let first = plan(&all, &mut m, 10);
        assert!(evicted(&first).is_empty());
        let reported: Vec<(&str, &str)> = first
            .iter()
            .filter_map(|a| match a {
                Action::Report { pod, why, .. } => Some((pod.as_str(), *why)),
                _ => None,
            })
            .collect();
        assert_eq!(reported, [("bare", BARE), ("job-x", JOB)]);
        assert!(plan(&all, &mut m, 10).is_empty());
    }

    #[test]
    fn a_pod_the_webhook_would_not_wire_is_not_seen_as_drifted() {
        use crate::names::ANNOTATION_INJECT;
        let config = Config::builtin();
        let healed: BTreeSet<Drift> = HEALED.into_iter().collect();
        let pod = |annotations: serde_json::Value| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "namespace": "shop", "uid": "u", "annotations": annotations,
                             "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1",
                                                  "uid": "r", "controller": true}]},
                "spec": {"containers": [{"name": "app", "image": "x"}]},
                "status": {"phase": "Running"}
            }))
            .unwrap()
        };
        let none = BTreeMap::new();
        let unwired = see(
            &pod(serde_json::json!({ANNOTATION_INJECT: "sidecar"})),
            &none,
            &config,
            &healed,
        )
        .unwrap();
        assert_eq!(unwired.drift, Some(Drift::NotWired));
        assert_eq!(
            unwired.controller,
            Some(("ReplicaSet".into(), "web-1".into()))
        );
        assert!(!unwired.ready);
        let plain = see(&pod(serde_json::json!({})), &none, &config, &healed).unwrap();
        assert_eq!(plain.drift, None);
    }
}
