//! `check --pre`'s nodes section: the nodes, the node ports they hold, and the kubelet's root directory.

use k8s_openapi::api::core::v1::Node;

use super::{DEFAULT_KUBELET_DIR, Pre};
use crate::check::codes::FindingCode as Code;
use crate::check::report::{Finding, Section, Severity};
use crate::config::Mode;

/// The kubelet root a node shows, where its distribution says: (the directory, how it is known).
fn kubelet_dir_of(node: &Node) -> Option<(&'static str, &'static str)> {
    let kubelet = node
        .status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .map(|i| i.kubelet_version.as_str())
        .unwrap_or("");
    let labels = node.metadata.labels.as_ref();
    if kubelet.contains("k0s") {
        Some(("/var/lib/k0s/kubelet", "a k0s kubelet"))
    } else if labels.is_some_and(|l| l.contains_key("microk8s.io/cluster")) {
        Some((
            "/var/snap/microk8s/common/var/lib/kubelet",
            "a MicroK8s node",
        ))
    } else if kubelet.contains("k3s") || kubelet.contains("rke2") {
        Some((DEFAULT_KUBELET_DIR, "a k3s/RKE2 kubelet"))
    } else {
        None
    }
}

impl Pre<'_> {
    pub(super) fn nodes(&mut self, s: &mut Section) {
        let nodes = match &self.view.nodes {
            Ok(n) => n.as_slice(),
            Err(e) => {
                self.stop(
                    s,
                    Finding::new(
                        Severity::Error,
                        Code::NodesUnreadable,
                        "nodes",
                        format!("cannot list nodes: {e}"),
                    ),
                    &[Mode::Daemonset],
                );
                &[]
            }
        };
        s.summary = format!("{} node(s)", nodes.len());
        match &self.view.port_claims {
            Err(e) => self.stop(
                s,
                Finding::new(
                    Severity::Error,
                    Code::PreReadFailed,
                    "node ports",
                    format!("cannot list Pods, DaemonSets or Services: {e}"),
                ),
                &[Mode::Daemonset],
            ),
            Ok(claims) if claims.is_empty() => s.push(Finding::new(
                Severity::Ok,
                Code::NodePortsFree,
                "node ports",
                "no Pod, DaemonSet or Service holds 3592 or 3593 on the nodes",
            )),
            Ok(claims) => {
                for c in claims {
                    let on = c
                        .node
                        .as_ref()
                        .map_or(String::new(), |n| format!(" on node {n}"));
                    self.stop(
                        s,
                        Finding::new(
                            Severity::Error,
                            Code::NodePortTaken,
                            &c.subject,
                            format!(
                                "holds port {} ({}){on}: the node-local front cannot bind it",
                                c.port, c.how
                            ),
                        )
                        .fix(format!(
                            "move {} off port {}, or choose the central or sidecar model",
                            c.subject, c.port
                        )),
                        &[Mode::Daemonset],
                    );
                }
            }
        }
        self.kubelet(s, nodes);
    }

    fn kubelet(&mut self, s: &mut Section, nodes: &[Node]) {
        let want = self.view.kubelet_dir.trim_end_matches('/');
        let mut unknown = 0;
        let mut matching = 0;
        for node in nodes {
            let name = node.metadata.name.as_deref().unwrap_or("");
            match kubelet_dir_of(node) {
                None => unknown += 1,
                Some((dir, _)) if dir == want => matching += 1,
                Some((dir, why)) => self.stop(
                    s,
                    Finding::new(
                        Severity::Error,
                        Code::KubeletDirDiffers,
                        format!("node {name}"),
                        format!(
                            "{why}: its kubelet root is {dir}, not {want}: the CSI node plugin would not register there"
                        ),
                    )
                    .fix(format!("helm install ... --set pdp.nodeLocal.csi.kubeletDir={dir} (check --pre --kubelet-dir={dir})")),
                    &[Mode::Daemonset],
                ),
            }
        }
        if matching > 0 {
            s.push(Finding::new(
                Severity::Ok,
                Code::KubeletDir,
                "kubelet root",
                format!("{matching} node(s) known to use {want}"),
            ));
        }
        if unknown > 0 {
            s.push(
                Finding::new(
                    Severity::Info,
                    Code::KubeletDirUnknown,
                    "kubelet root",
                    format!("{unknown} node(s) do not show their kubelet root: {want} assumed"),
                )
                .fix("on a node: ps -o args= -C kubelet (its --root-dir), then check --pre --kubelet-dir=DIR"),
            );
        }
    }
}
