"""Every finding code of `pdp-injector check` produced against the real apiserver: one table, one row per code.

A row names the code, the check run that must report it (with that severity and subject) and how the state is
made. The states are grouped so that one run reports many codes: a run points check at objects made for it
(`--webhook-config`, `--secret`, `--deployment`, `--config-map`, `--pdp-daemonset`), so the installed objects the
other cases read stay untouched, and everything made here is deleted again. Node-local states are API objects:
Nodes, Pods with a nodeName and a status, DaemonSets and their ControllerRevisions, CSINodes. The codes of
`check --pre` that need a cluster other than this one (APIs turned off, a missing system PriorityClass, 1,003
Nodes) come from a second, short-lived kube-apiserver with a world of its own in the same etcd (`--etcd-prefix`).

`UNIT_ONLY` holds the codes no Kubernetes 1.20 apiserver can produce, with the reason; the unit fixtures
(crates/pdp-core/src/check) produce those. `table_covers_every_code` holds the table against the Rust source.
"""
import base64
import http.client
import http.server
import ipaddress
import json
import os
import re
import secrets
import ssl
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections import namedtuple
from pathlib import Path

import yaml

import tier
from tier import Fail, check, free_port, one_line

REPO = Path(__file__).resolve().parents[2]
CHECK_SRC = REPO / "crates/pdp-core/src/check"
E = None  # what this uses of e2e.py (pod(), needs_local(), log(), constants), set by register()

# pods: the finding's Pods; says: words its message must hold.
Row = namedtuple("Row", "code run severity subject how pods says", defaults=(None, None))

# Runs (all `check -o json`; `--pre` where said):
#   inorder   admin, -n A, --pdp-daemonset cerbos=PDP/e2e-pdp: the installed objects, A's Pods and the nodes
#   csi       admin, -n A, --config with socketVolume csi, --webhook-config and --pdp-daemonset naming nothing
#   install-1 .. install-4: admin, other objects named by flags (see the rows)
#   nobody    a user without any grant, -n A
#   no-nodes, no-daemonsets, no-csinodes: the shipped check role minus one resource (impersonated users)
#   pre       admin, --pre -n A;  pre-nobody: the user without grants, --pre
#   pre-off-1, pre-off-2: admin, --pre, against the second apiserver (admissionregistration.k8s.io/v1 and
#             storage.k8s.io/v1 turned off)
ROWS = [
    # -- Install: the config
    Row("config_loaded", "inorder", "ok", "config", "the installed ConfigMap pdp-injector-config",
        says="ConfigMap pdp-system/pdp-injector-config loads"),
    Row("config_missing", "install-1", "warning", "config", "--config-map naming no ConfigMap",
        says="judging by the built-in config"),
    Row("config_invalid", "install-2", "error", "config", "a ConfigMap whose config.yaml does not load",
        says="does not load"),
    Row("config_unreadable", "nobody", "error", "config", "a user who may not get the ConfigMap"),
    # -- Install: the registration
    Row("webhook_registered", "inorder", "ok", "MutatingWebhookConfiguration pdp-injector", "the registration"),
    Row("webhook_missing", "csi", "error", "MutatingWebhookConfiguration e2e-codes-absent",
        "--webhook-config naming no configuration"),
    Row("webhook_unreadable", "nobody", "error", "MutatingWebhookConfiguration pdp-injector",
        "a user who may not get it"),
    Row("webhook_entry_missing", "install-1", "error", "MutatingWebhookConfiguration e2e-codes-differs",
        "a copy of the registration without its pods.pdp-injector.io entry", says="pods.pdp-injector.io"),
    Row("webhook_entry_differs", "install-1", "error",
        "MutatingWebhookConfiguration e2e-codes-differs entry namespaces.pdp-injector.io",
        "the same copy with failurePolicy Ignore on its Fail entry", says="failurePolicy Ignore"),
    Row("ca_bundle_missing", "install-2", "error", "caBundle", "a copy of the registration without caBundle"),
    Row("ca_bundle_invalid", "install-3", "error", "caBundle", "a copy whose caBundle holds no certificate"),
    # -- Install: certificates and the endpoint
    Row("serving_cert_trusted", "inorder", "ok", "Secret pdp-system/pdp-injector-tls", "the webhook's Secret"),
    Row("serving_cert_untrusted", "install-4", "error", "Secret pdp-system/pdp-injector-tls",
        "a copy of the registration whose caBundle is another CA's"),
    Row("serving_cert_invalid", "install-2", "error", "Secret pdp-system/e2e-codes-garbage",
        "a Secret whose tls.crt is a PEM block of no certificate"),
    Row("serving_secret_missing", "install-1", "warning", "Secret pdp-system/e2e-codes-absent",
        "--secret naming no Secret, the endpoint unreachable (a warning: nothing else vouches for the certificate)"),
    Row("serving_secret_unreadable", "nobody", "info", "Secret pdp-system/pdp-injector-tls",
        "a user who may not get Secrets"),
    Row("certificate_expiry", "install-3", "warning", "Secret pdp-system/e2e-codes-expiring certificate",
        "a Secret whose certificate has 2 of its 12 days left", says="expires in"),
    Row("endpoint_trusted", "inorder", "ok", "endpoint 127.0.0.1:{webhook_port}", "the running webhook"),
    Row("endpoint_untrusted", "install-4", "error", "endpoint 127.0.0.1:{webhook_port}",
        "the running webhook dialled with another CA's caBundle"),
    Row("endpoint_unreachable", "install-1", "info", "endpoint 127.0.0.1:{dead_port}",
        "a copy of the registration whose URL names a port nothing listens on", says="Connection refused"),
    # -- Install: the webhook Deployment
    Row("webhook_ready", "inorder", "ok", "Deployment pdp-system/pdp-injector", "2 of 2 replicas ready"),
    Row("webhook_degraded", "install-3", "warning", "Deployment pdp-system/e2e-codes-degraded",
        "a Deployment whose status says 1 of 2 ready", says="1 of 2"),
    Row("webhook_not_ready", "install-2", "error", "Deployment pdp-system/e2e-codes-down",
        "a Deployment without ready replicas", says="0 of 2"),
    Row("deployment_missing", "install-1", "error", "Deployment pdp-system/e2e-codes-absent",
        "--deployment naming no Deployment"),
    Row("deployment_unreadable", "nobody", "error", "Deployment pdp-system/pdp-injector", "a user who may not get it"),
    # -- Nodes
    Row("pdp_daemonset", "inorder", "ok", "DaemonSet {pdp_ns}/e2e-pdp", "the PDP DaemonSet named by --pdp-daemonset"),
    Row("pdp_daemonset_missing", "csi", "error", "profile cerbos", "--pdp-daemonset naming no DaemonSet"),
    Row("pdp_front", "inorder", "ok", "DaemonSet {pdp_ns}/e2e-front", "a front DaemonSet beside the PDP's"),
    Row("pdp_outdated", "inorder", "warning", "node {node_a}",
        "a ready PDP Pod labelled with another controller-revision-hash than the DaemonSet's newest revision",
        says="runs revision old, the DaemonSet's current revision is new"),
    Row("front_outdated", "inorder", "warning", "node {node_a}", "the same for the front's Pod",
        says="runs revision old, the DaemonSet's current revision is new"),
    Row("node_without_pdp", "inorder", "error", "node {node_c}", "a Node with a daemonset-wired Pod and no PDP Pod",
        pods=["{ns}/on-c"]),
    Row("node_without_front", "inorder", "error", "node {node_b}", "a Node with a ready PDP Pod and no front Pod",
        pods=["{ns}/on-b"]),
    Row("node_without_csi_driver", "csi", "error", "node {node_b}",
        "socketVolume csi, and a Node whose CSINode does not list csi.pdp-injector.io", pods=["{ns}/on-b"],
        says="(cerbos) stays in ContainerCreating"),
    Row("csi_nodes_unreadable", "no-csinodes", "warning", "CSI nodes", "socketVolume csi, CSINodes forbidden"),
    Row("nodes_unreadable", "no-nodes", "error", "nodes", "a daemonset namespace, nodes forbidden"),
    Row("pdp_unreadable", "no-daemonsets", "error", "PDP DaemonSets", "a daemonset namespace, DaemonSets forbidden"),
    Row("flag_relays_current", "inorder", "ok", "flag sync pdp-system/pdp-flag-sync",
        "the flag sync Deployment, a ready source Pod and a relay Pod whose /metrics (served here, read through "
        "the apiserver's Pod proxy) give the same generation", says="generation 5"),
    Row("flag_relay_behind", "csi", "warning", "node {node_a} (relay e2e-codes-relay)",
        "the relay's generation one behind the source's, still after check's second look",
        says="serves generation 4"),
    Row("flag_sync_unreadable", "nobody", "warning", "flag sync pdp-system/pdp-flag-sync",
        "a user who may not get the flag sync Deployment"),
    # -- Namespaces
    Row("namespace_opted_in", "inorder", "ok", "namespace {ns}", "a namespace labelled daemonset"),
    Row("namespace_opted_out", "no-csinodes", "info", "namespace {ns_off}", "a namespace labelled disabled"),
    Row("namespace_excluded", "install-3", "warning", "namespace {ns_excluded}",
        "a namespace labelled enabled that the ConfigMap's excludedNamespaces names"),
    Row("namespace_not_found", "install-1", "warning", "namespace {ns_absent}", "-n naming no namespace"),
    Row("namespace_not_selected", "install-4", "error", "namespace {ns_on}",
        "a namespace labelled enabled that the copy's Fail entry does not select"),
    Row("invalid_namespace_label", "install-2", "error", "namespace {ns_bad}", "a namespace labelled bogus"),
    Row("namespaces_unreadable", "nobody", "error", "namespaces", "a user who may not list namespaces"),
    # -- Pods: a Pod of A each, created, then changed where a Pod may change (annotations, status)
    Row("pods_unreadable", "nobody", "error", "pods", "a user who may not list Pods"),
    Row("not_wired", "inorder", "error", "Pod {ns}/not-wired", "created inject=disabled, then annotated daemonset"),
    Row("not_wanted", "inorder", "error", "Pod {ns}/not-wanted", "wired, then annotated disabled",
        says="(opted_out)"),
    Row("other_mode", "inorder", "error", "Pod {ns}/other-mode", "wired as a sidecar, then annotated central",
        says="would get central mode"),
    Row("stale_config", "csi", "error", "Pod {ns}/socket", "wired by the installed config, judged by another",
        says="wired by config"),
    Row("stale_version", "inorder", "error", "Pod {ns}/version", "the version in its status annotation made 0.0.1",
        says="wired by injector 0.0.1"),
    Row("other_wiring", "inorder", "error", "Pod {ns}/socket",
        "wired with the socket in a privileged namespace, which then enforces baseline",
        says="volumes pdp-injector-socket no longer"),
    Row("would_be_denied", "inorder", "error", "Pod {ns}/denied", "created inject=disabled, then annotated sidecars",
        says='"sidecars"'),
    Row("status_unreadable", "inorder", "warning", "Pod {ns}/garbled", "a status annotation that is not JSON"),
    Row("status_not_carried", "inorder", "error", "Pod {ns}/copied", "an unwired Pod given another Pod's status",
        says="is missing"),
    Row("classic_sidecar_not_stopped", "inorder", "error", "classic sidecars",
        "a Pod with restartPolicy Never and a classic sidecar whose app ended 5 min ago, its PDP still running",
        pods=["{ns}/job"]),
    # -- check --pre, this apiserver
    Row("kubernetes_version", "pre", "ok", "Kubernetes", "1.20.2", says="v1.20"),
    Row("admission_api", "pre", "ok", "admissionregistration.k8s.io/v1", "served"),
    Row("admission_policies_skipped", "pre", "info", "ValidatingAdmissionPolicy", "below 1.30"),
    Row("csi_api", "pre", "ok", "storage.k8s.io/v1", "CSIDriver served"),
    Row("critical_priority", "pre", "ok", "PriorityClass system-node-critical", "the apiserver's own"),
    Row("namespace_pod_security", "pre", "ok", "namespace {ns}", "-n A", says="Pod Security baseline"),
    Row("model_can_run", "pre", "ok", "model central", "nothing stops central here"),
    Row("pre_read_failed", "pre-nobody", "error", "node ports", "a user who may not list Pods"),
    # -- check --pre, the second apiserver
    Row("admission_api_missing", "pre-off-1", "error", "admissionregistration.k8s.io/v1",
        "--runtime-config admissionregistration.k8s.io/v1=false"),
    Row("csi_api_missing", "pre-off-1", "error", "storage.k8s.io/v1", "--runtime-config storage.k8s.io/v1=false"),
    Row("model_cannot_run", "pre-off-1", "error", "model daemonset", "no admission API",
        says="[admission_api_missing]"),
    Row("no_namespaces_to_opt_in", "pre-off-1", "info", "namespaces", "no namespace labelled, no -n"),
    Row("node_ports_free", "pre-off-1", "ok", "node ports", "nothing holds 3592 or 3593"),
    Row("kubelet_dir", "pre-off-1", "ok", "kubelet root", "a Node whose kubelet version says k3s"),
    Row("kubelet_dir_differs", "pre-off-1", "error", "node {k0s_node}", "a Node whose kubelet version says k0s",
        says="/var/lib/k0s/kubelet"),
    Row("kubelet_dir_unknown", "pre-off-1", "info", "kubelet root", "Nodes that show nothing of it"),
    Row("critical_priority_quota_short", "pre-off-1", "error", "ResourceQuota pdp-node/cerbos-pdp-node-critical",
        "1,003 Nodes: more node Pods than the shipped quota's 3,000", says="1003 nodes need up to 3009"),
    Row("priority_class_exists", "pre-off-1", "info", "PriorityClass pdp-injector-webhook",
        "the PriorityClass with a Helm release's annotation"),
    Row("quota_too_small", "pre-off-1", "error", "ResourceQuota pdp-central/e2e-small", "a quota of 1 Pod",
        says="admits 1 more Pod"),
    Row("quota_limits_install", "pre-off-1", "warning", "ResourceQuota pdp-system/e2e-limits",
        "a quota on requests.cpu only"),
    Row("critical_priority_missing", "pre-off-2", "error", "PriorityClass system-node-critical",
        "deleted in etcd (the apiserver refuses to delete a system PriorityClass)"),
    Row("priority_class_taken", "pre-off-2", "error", "PriorityClass pdp-injector-webhook",
        "the same PriorityClass, its Helm annotation removed"),
    Row("node_port_taken", "pre-off-2", "error", "DaemonSet pdp-system/e2e-ports", "a DaemonSet with hostPort 3593",
        says="port 3593 (hostPort)"),
]

UNIT_ONLY = {
    "kubernetes_too_old": "needs an apiserver older than 1.20; this tier's is 1.20.2, the oldest the chart renders for",
    "admission_policies": "needs Kubernetes 1.30+ serving ValidatingAdmissionPolicy v1, which 1.20 has not",
    "admission_policy_api_missing": "judged only from Kubernetes 1.30 on (below, admission_policies_skipped); this "
                                    "tier's apiserver is 1.20",
}

# Produced by the node tier too (scripts/node/cases.py): here they need an address of this machine that the
# apiserver's Pod proxy dials (not loopback) and its ports 8014 and 8017.
NODE_TIER_TOO = {"flag_relays_current", "flag_relay_behind"}


def rust_codes():
    """The codes of codes.rs (FindingCode::code) and pods.rs (Drift::code), read from the source."""
    out = []
    for file, enum in [("codes.rs", "FindingCode"), ("pods.rs", "Drift")]:
        text = (CHECK_SRC / file).read_text()
        body = re.search(r"pub fn code\(self\) -> &'static str \{(.*?)\n    \}\n", text, re.S)
        check(body, f"no fn code in {file}")
        found = re.findall(rf'{enum}::\w+ => "([a-z_]+)"', body.group(1))
        check(found, f"no codes in {file}")
        out += found
    return out


def table_covers_every_code():
    codes = rust_codes()
    check(len(codes) == len(set(codes)), "a code twice in the Rust source")
    rows = [r.code for r in ROWS]
    twice = sorted({c for c in rows if rows.count(c) > 1} | (set(rows) & set(UNIT_ONLY)))
    check(not twice, f"codes with more than one row: {twice}")
    missing = sorted(set(codes) - set(rows) - set(UNIT_ONLY))
    check(not missing, f"codes without a row (a live producer, or UNIT_ONLY with the reason): {missing}")
    unknown = sorted((set(rows) | set(UNIT_ONLY)) - set(codes))
    check(not unknown, f"rows for codes the source does not have: {unknown}")
    bad = [r.code for r in ROWS if r.severity not in ("ok", "info", "warning", "error")]
    check(not bad, f"rows with an unknown severity: {bad}")
    return codes


# ---------------------------------------------------------------------------------------------------------------
# the apiserver's REST API, without kubectl (a request takes milliseconds, kubectl a few hundred)

KINDS = {
    "Namespace": ("/api/v1", "namespaces", False),
    "Pod": ("/api/v1", "pods", True),
    "Node": ("/api/v1", "nodes", False),
    "Secret": ("/api/v1", "secrets", True),
    "ConfigMap": ("/api/v1", "configmaps", True),
    "ResourceQuota": ("/api/v1", "resourcequotas", True),
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "DaemonSet": ("/apis/apps/v1", "daemonsets", True),
    "ControllerRevision": ("/apis/apps/v1", "controllerrevisions", True),
    "MutatingWebhookConfiguration": ("/apis/admissionregistration.k8s.io/v1", "mutatingwebhookconfigurations", False),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
    "CSINode": ("/apis/storage.k8s.io/v1", "csinodes", False),
    "PriorityClass": ("/apis/scheduling.k8s.io/v1", "priorityclasses", False),
    "SubjectAccessReview": ("/apis/authorization.k8s.io/v1", "subjectaccessreviews", False),
}


class Api:
    """One apiserver, as the user of a token kubeconfig; one keep-alive connection per thread."""

    def __init__(self, kubeconfig):
        kc = json.loads(Path(kubeconfig).read_text())
        cluster, user = kc["clusters"][0]["cluster"], kc["users"][0]["user"]
        url = urllib.parse.urlsplit(cluster["server"])
        self.host, self.port = url.hostname, url.port
        self.ctx = ssl.create_default_context(cafile=cluster["certificate-authority"])
        self.token = user["token"]
        self.local = threading.local()

    def request(self, method, path, body=None, content_type="application/json", ok=(200, 201)):
        data = None if body is None else json.dumps(body)
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": content_type, "Accept": "application/json"}
        for attempt in (0, 1):
            conn = getattr(self.local, "conn", None)
            if conn is None:
                conn = self.local.conn = http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=30)
            try:
                conn.request(method, path, data, headers)
                r = conn.getresponse()
                raw = r.read()
                break
            except (http.client.HTTPException, OSError):
                conn.close()
                self.local.conn = None
                if attempt:
                    raise
        try:
            out = json.loads(raw) if raw.strip() else None
        except ValueError:  # /readyz answers text
            out = raw.decode(errors="replace")
        if ok and r.status not in ok:
            raise Fail(f"{method} {path}: {r.status} {one_line(raw.decode(errors='replace'), 300)}")
        return r.status, out

    @staticmethod
    def path(kind, name=None, namespace=None, sub=None):
        prefix, plural, namespaced = KINDS[kind]
        p = prefix + (f"/namespaces/{namespace}" if namespaced else "") + f"/{plural}"
        return p + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")

    def create(self, obj):
        meta = obj["metadata"]
        return self.request("POST", self.path(obj["kind"], namespace=meta.get("namespace")), obj)[1]

    def get(self, kind, name, namespace=None):
        status, out = self.request("GET", self.path(kind, name, namespace), ok=(200, 404))
        return out if status == 200 else None

    def patch(self, kind, name, namespace, body, sub=None):
        return self.request("PATCH", self.path(kind, name, namespace, sub), body,
                            content_type="application/merge-patch+json")[1]

    def delete(self, kind, name, namespace=None):
        # Grace 0: a Pod on a node no kubelet runs would otherwise stay Terminating.
        body = {"gracePeriodSeconds": 0} if kind == "Pod" else None
        self.request("DELETE", self.path(kind, name, namespace), body, ok=(200, 202, 404))


# ---------------------------------------------------------------------------------------------------------------
# helpers


def meta(name, namespace=None, labels=None, annotations=None, owner=None):
    m = {"name": name}
    if namespace:
        m["namespace"] = namespace
    if labels:
        m["labels"] = labels
    if annotations:
        m["annotations"] = annotations
    if owner:
        m["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner["kind"], "name": owner["metadata"]["name"],
                                 "uid": owner["metadata"]["uid"], "controller": True}]
    return m


def routable_ipv4():
    """The IPv4 addresses of this machine that the apiserver's Pod proxy dials (it refuses loopback and
    link-local ones)."""
    try:
        out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    found = [ipaddress.ip_address(m.group(1)) for m in re.finditer(r"\binet (\d+\.\d+\.\d+\.\d+)/", out)]
    return [str(ip) for ip in found if not (ip.is_loopback or ip.is_link_local)]


class Metrics:
    """`/metrics` of the flag sync source (ADDR:8014) and of a relay (ADDR:8017), as a Pod whose status.podIP is
    ADDR serves them through the apiserver's Pod proxy."""

    def __init__(self, addr):
        self.values = {8014: ("pdp_flag_sync_generation", 5), 8017: ("pdp_flag_sync_upstream_generation", 5)}
        self.servers = []
        for port in self.values:
            metrics = self

            class Handler(http.server.BaseHTTPRequestHandler):
                def do_GET(self):
                    gauge, value = metrics.values[self.server.server_address[1]]
                    body = f"# TYPE {gauge} gauge\n{gauge} {value}\n".encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

                def log_message(self, *_):
                    pass

            try:
                server = http.server.ThreadingHTTPServer((addr, port), Handler)
            except OSError:
                self.stop()
                raise
            server.daemon_threads = True
            self.servers.append(server)
            threading.Thread(target=server.serve_forever, daemon=True).start()

    def set(self, port, value):
        self.values[port] = (self.values[port][0], value)

    def stop(self):
        for s in self.servers:
            s.shutdown()
            s.server_close()


def expiring_cert(dir, days_before, days_after):
    """A self-signed certificate valid from `days_before` days ago to `days_after` days from now (openssl ca sets
    both dates, openssl 3.0's req and x509 only the length)."""
    dir.mkdir(parents=True, exist_ok=True)
    (dir / "index.txt").write_text("")
    (dir / "serial").write_text("01\n")
    (dir / "ca.cnf").write_text(
        f"[ca]\ndefault_ca = d\n[d]\ndatabase = {dir}/index.txt\nnew_certs_dir = {dir}\nserial = {dir}/serial\n"
        "default_md = sha256\npolicy = p\nunique_subject = no\n[p]\ncommonName = supplied\n")
    stamp = lambda days: time.strftime("%Y%m%d%H%M%SZ", time.gmtime(time.time() + days * 86400))  # noqa: E731
    tier.run("openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", dir / "tls.key")
    tier.run("openssl", "req", "-new", "-key", dir / "tls.key", "-subj", "/CN=pdp-injector.pdp-system.svc",
             "-out", dir / "tls.csr")
    tier.run("openssl", "ca", "-batch", "-config", dir / "ca.cnf", "-selfsign", "-keyfile", dir / "tls.key",
             "-in", dir / "tls.csr", "-out", dir / "tls.crt", "-notext",
             "-startdate", stamp(-days_before), "-enddate", stamp(days_after))
    return (dir / "tls.crt").read_text()


def impersonating_kubeconfig(h, user):
    """The admin's kubeconfig acting as `user` (who gets only what RBAC grants `user`)."""
    kc = json.loads(h.kubeconfig.read_text())
    kc["users"][0]["user"]["as"] = user
    path = h.workdir / f"{user}.kubeconfig"
    path.write_text(json.dumps(kc, indent=1))
    return path


def run_check(h, run, *args, kubeconfig=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PDP_INJECTOR_") and k != "POD_NAMESPACE"}
    env.update(KUBECONFIG=str(kubeconfig or h.kubeconfig), NO_COLOR="1")
    t = time.monotonic()
    p = tier.run([h.bin, "check", "-o", "json", *args], check_rc=False, env=env, timeout=120)
    E.log(f"check run {run}: {time.monotonic() - t:.1f}s")
    report = json.loads(p.stdout) if p.stdout.strip() else None
    check(report is not None, f"check run {run} ({' '.join(args)}): exit {p.returncode}, {one_line(p.stderr)}")
    errors = any(f["severity"] == "error" for s in report["sections"] for f in s["findings"])
    check(p.returncode == (1 if errors else 0), f"check run {run}: exit {p.returncode} with errors={errors}")
    (h.workdir / f"check-codes-{run}.json").write_text(p.stdout)  # kept with the work directory on failure
    return report


def judge(runs, ctx):
    """Every row against its run's report: the code with the row's severity and subject (and Pods)."""
    bad = []
    for r in ROWS:
        if r.code in NODE_TIER_TOO and ctx.get("no_flags"):
            E.log(f"{r.code}: not produced here ({ctx['no_flags']}); scripts/node/cases.py produces it")
            continue
        report = runs.get(r.run)
        if report is None:
            bad.append(f"{r.code}: run {r.run} did not run")
            continue
        subject = r.subject.format(**ctx)
        found = [f for s in report["sections"] for f in s["findings"] if f["code"] == r.code]
        hit = [f for f in found if f["subject"] == subject and f["severity"] == r.severity]
        if not hit:
            bad.append(f"{r.code} ({r.run}): no {r.severity} on {subject!r}; found "
                       + (one_line(json.dumps([[f["severity"], f["subject"]] for f in found]), 200) if found
                          else "none"))
            continue
        f = hit[0]
        if r.pods and sorted(f.get("pods") or []) != sorted(p.format(**ctx) for p in r.pods):
            bad.append(f"{r.code} ({r.run}): pods {f.get('pods')}, expected {r.pods}")
        if r.says and r.says not in f["message"]:
            bad.append(f"{r.code} ({r.run}): message {f['message']!r} lacks {r.says!r}")
        if not f["message"].strip() or "  " in f["message"]:
            bad.append(f"{r.code} ({r.run}): an empty message or one with a run of spaces: {f['message']!r}")
    # Without the ConfigMap, what loads is the built-in config.
    loaded = [f["message"] for s in runs.get("install-1", {}).get("sections", []) for f in s["findings"]
              if f["code"] == "config_loaded"]
    if not (loaded and loaded[0].startswith("the built-in config loads")):
        bad.append(f"config_loaded (install-1): {loaded}")
    return bad


# ---------------------------------------------------------------------------------------------------------------
# the second apiserver

PRE_PREFIX = "/registry-check-pre"


class PreApiserver:
    """kube-apiserver without admissionregistration.k8s.io/v1 and storage.k8s.io/v1, on the tier's etcd under its
    own prefix: an empty cluster of its own. Without those APIs the webhook admission plugins and the
    StorageClass-reading ones would never become ready: they are off."""

    NAME = "kube-apiserver-check-pre"

    def __init__(self, h):
        self.h = h
        port = free_port()
        h.start(self.NAME, h.apiserver_argv(
            port, "apiserver-check-pre-certs", etcd_prefix=PRE_PREFIX,
            runtime_config="admissionregistration.k8s.io/v1=false,storage.k8s.io/v1=false", enable=(),
            disable=("MutatingAdmissionWebhook", "ValidatingAdmissionWebhook", "DefaultStorageClass",
                     "PersistentVolumeClaimResize")))
        self.kubeconfig = h.workdir / "check-pre.kubeconfig"
        self.kubeconfig.write_text(h.kubeconfig_text(port, h.workdir / "pki/ca.crt", h.admin_token, "e2e-admin"))
        self.api = Api(self.kubeconfig)

    def wait_ready(self):
        def ready():
            return (self.api.request("GET", "/readyz", ok=None)[0] == 200
                    and self.api.get("PriorityClass", "system-node-critical") is not None)

        self.h.wait_for("the second apiserver", ready, timeout=90, proc=self.NAME, interval=0.3)

    def etcd_delete(self, key):
        body = json.dumps({"key": base64.b64encode(f"{PRE_PREFIX}/{key}".encode()).decode()}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.h.etcd_client}/v3/kv/deleterange", data=body,
                                     method="POST")
        with urllib.request.urlopen(req, timeout=10) as r:
            check(json.loads(r.read()).get("deleted") == "1", f"etcd did not delete {key}")

    def stop(self):
        self.h.stop(self.NAME)


def pre_runs(h, pre, runs):
    api = pre.api
    pre.wait_ready()
    t0 = time.monotonic()
    E.log("check codes: the second apiserver is ready")
    for ns in ["pdp-system", "pdp-central"]:
        api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": meta(ns)})
    # More than the shipped quota's 3,000 node Pods (3 a node): 1,001 Nodes that show no kubelet root, a k3s
    # one (the default root) and a k0s one (another root).
    info = {k: "" for k in ["machineID", "systemUUID", "bootID", "kernelVersion", "osImage",
                            "containerRuntimeVersion", "kubeProxyVersion", "operatingSystem", "architecture"]}

    def node(name, kubelet=""):
        api.create({"apiVersion": "v1", "kind": "Node", "metadata": meta(name),
                    "status": {"nodeInfo": {**info, "kubeletVersion": kubelet}}})

    def bulk(k):
        for i in range(k, 1001, 4):
            node(f"bulk-{i:04d}")

    errors = []
    workers = [threading.Thread(target=_collect, args=(lambda k=k: bulk(k), errors)) for k in range(4)]
    for w in workers:
        w.start()
    node("k3s-node", "v1.20.2+k3s1")
    node("k0s-node", "v1.20.2+k0s")
    for w in workers:
        w.join()
    check(not errors, f"creating the nodes: {errors[:1]}")
    E.log(f"check codes: nodes made in {time.monotonic() - t0:.1f}s")
    api.create({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "value": 1000,
                "metadata": meta("pdp-injector-webhook", annotations={"meta.helm.sh/release-name": "pdp-injector",
                                                                      "meta.helm.sh/release-namespace": "pdp-system"})})
    api.create({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": meta("e2e-small", "pdp-central"),
                "spec": {"hard": {"pods": "1"}}})
    api.create({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": meta("e2e-limits", "pdp-system"),
                "spec": {"hard": {"requests.cpu": "2"}}})
    runs["pre-off-1"] = run_check(h, "pre-off-1", "--pre", kubeconfig=pre.kubeconfig)
    # The apiserver refuses to delete a system PriorityClass, and recreates one only when it starts.
    pre.etcd_delete("priorityclasses/system-node-critical")
    h.wait_for("system-node-critical gone", lambda: api.get("PriorityClass", "system-node-critical") is None,
               timeout=30, interval=0.2)
    api.patch("PriorityClass", "pdp-injector-webhook", None,
              {"metadata": {"annotations": {"meta.helm.sh/release-name": None,
                                            "meta.helm.sh/release-namespace": None}}})
    labels = {"app": "e2e-ports"}
    api.create({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": meta("e2e-ports", "pdp-system"),
                "spec": {"selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}, "spec": {
                    "containers": [{"name": "c", "image": E.PAUSE,
                                    "ports": [{"containerPort": 3593, "hostPort": 3593}]}]}}}})
    runs["pre-off-2"] = run_check(h, "pre-off-2", "--pre", kubeconfig=pre.kubeconfig)


def _collect(fn, errors):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - reported by the caller
        errors.append(e)


# ---------------------------------------------------------------------------------------------------------------
# this apiserver


class Made:
    """Objects made by the case, deleted again (newest first) whatever happens."""

    def __init__(self, api):
        self.api, self.items = api, []

    def __call__(self, obj):
        out = self.api.create(obj)
        self.items.append((obj["kind"], out["metadata"]["name"], out["metadata"].get("namespace")))
        return out

    def delete_all(self):
        for kind, name, ns in reversed(self.items):
            try:
                self.api.delete(kind, name, ns)
            except Exception as e:  # noqa: BLE001 - the others are still deleted
                E.log(f"could not delete {kind} {ns or ''}/{name}: {e}")


def inert_copy(h, name, change):
    """The registered configuration under another name, its entries selecting no namespace (the apiserver never
    calls them), changed by `change(webhooks)`."""
    mwc = h.webhook_configuration()
    mwc["metadata"]["name"] = name
    for w in mwc["webhooks"]:
        w["namespaceSelector"] = {"matchLabels": {"e2e.pdp-injector.io/check-codes": "never"}}
    change(mwc["webhooks"])
    return mwc


def namespace(h, make, slug, labels=None):
    name = f"e2e-{slug}-{secrets.token_hex(2)}"
    make_ns = {"apiVersion": "v1", "kind": "Namespace",
               "metadata": meta(name, labels={E.NAME_LABEL: name, E.RUN_LABEL: h.run_id, **(labels or {})})}
    make.api.create(make_ns)  # namespaces never finish deleting here: kept, like every case's
    h.created_namespaces.append(name)
    return name


def status_of(pod):
    return json.loads(pod["metadata"]["annotations"][E.STATUS])


def annotate(api, pod, **annotations):
    api.patch("Pod", pod["metadata"]["name"], pod["metadata"]["namespace"], {"metadata": {"annotations": annotations}})


def live(h):
    check(h.etcd_client and h.admin_token, "the local cluster's etcd and admin token are unknown")
    t0 = time.monotonic()
    api = Api(h.kubeconfig)
    make = Made(api)
    pre = PreApiserver(h)  # starts while this apiserver is set up
    metrics = None
    runs = {}
    run_id = h.run_id
    ctx = {"webhook_port": h.webhook_port, "dead_port": free_port(), "ns_absent": f"e2e-codes-absent-{run_id}",
           "node_a": f"e2e-codes-a-{run_id}", "node_b": f"e2e-codes-b-{run_id}", "node_c": f"e2e-codes-c-{run_id}",
           "k0s_node": "k0s-node"}
    try:
        ns = ctx["ns"] = namespace(h, make, "codes-pods", {E.NS_LABEL: "daemonset", E.PSS_LABEL: "privileged"})
        pdp_ns = ctx["pdp_ns"] = namespace(h, make, "codes-pdp")
        ctx["ns_bad"] = namespace(h, make, "codes-bad-label", {E.NS_LABEL: "bogus"})
        ctx["ns_excluded"] = namespace(h, make, "codes-excluded", {E.NS_LABEL: "enabled"})
        ctx["ns_on"] = namespace(h, make, "codes-unselected", {E.NS_LABEL: "enabled"})
        ns_off = ctx["ns_off"] = namespace(h, make, "codes-opted-out")

        # Nodes: A runs PDP and front at an older revision, B a current PDP and no front, C nothing. Only A's
        # CSINode lists the node plugin.
        for n in "abc":
            make({"apiVersion": "v1", "kind": "Node", "metadata": meta(ctx[f"node_{n}"])})
        make({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode", "metadata": meta(ctx["node_a"]),
              "spec": {"drivers": [{"name": "csi.pdp-injector.io", "nodeID": ctx["node_a"]}]}})

        def pod(name, annotations=None, namespace=ns, **spec):
            return make(E.pod(name, namespace, annotations=annotations, **spec))

        wired = {
            "socket": pod("socket"),
            "on-b": pod("on-b", nodeName=ctx["node_b"]),
            "on-c": pod("on-c", nodeName=ctx["node_c"]),
            "not-wanted": pod("not-wanted"),
            "version": pod("version", {E.INJECT: "sidecar"}),
            "other-mode": pod("other-mode", {E.INJECT: "sidecar"}),
            "job": pod("job", {E.INJECT: "sidecar"}, restartPolicy="Never"),
        }
        plain = {name: pod(name, {E.INJECT: "disabled"}) for name in ["not-wired", "denied", "garbled", "copied"]}
        for name, p in wired.items():
            check(E.STATUS in (p["metadata"].get("annotations") or {}), f"Pod {name} was not wired")
        for name, p in plain.items():
            check(E.STATUS not in (p["metadata"].get("annotations") or {}), f"Pod {name} was wired")
        # What may change after creation: the namespace's labels, a Pod's annotations, its status.
        api.patch("Namespace", ns, None, {"metadata": {"labels": {E.PSS_LABEL: "baseline"}}})
        annotate(api, wired["not-wanted"], **{E.INJECT: "disabled"})
        annotate(api, wired["other-mode"], **{E.INJECT: "central"})
        version = status_of(wired["version"])
        version["version"] = "0.0.1"
        annotate(api, wired["version"], **{E.STATUS: json.dumps(version)})
        annotate(api, plain["not-wired"], **{E.INJECT: "daemonset"})
        annotate(api, plain["denied"], **{E.INJECT: "sidecars"})
        annotate(api, plain["garbled"], **{E.STATUS: "{not json"})
        annotate(api, plain["copied"], **{E.INJECT: "daemonset", E.STATUS: json.dumps(status_of(wired["on-b"]))})
        ago = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 300))

        def container(name, state, ready):
            return {"name": name, "ready": ready, "restartCount": 0, "image": E.PAUSE, "imageID": "", "state": state}

        sidecar = status_of(wired["job"])["sidecar"]
        api.patch("Pod", "job", ns, {"status": {"phase": "Running", "containerStatuses": [
            container("app", {"terminated": {"exitCode": 0, "startedAt": ago, "finishedAt": ago}}, False),
            container(sidecar, {"running": {"startedAt": ago}}, True)]}}, sub="status")
        # A Pod wired for daemonset mode before its namespace opted out.
        pod("wired", {E.INJECT: "daemonset"}, namespace=ns_off)
        api.patch("Namespace", ns_off, None, {"metadata": {"labels": {E.NS_LABEL: "disabled"}}})

        # The PDP and its front: DaemonSets, their newest revision ("new"), their Pods, ready.
        def daemonset(name, component):
            labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/component": component}
            ds = make({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": meta(name, pdp_ns, labels),
                       "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": name}},
                                "template": {"metadata": {"labels": labels},
                                             "spec": {"containers": [{"name": "c", "image": E.PAUSE}]}}}})
            make({"apiVersion": "apps/v1", "kind": "ControllerRevision", "revision": 2, "data": {},
                  "metadata": meta(f"{name}-new", pdp_ns, {"controller-revision-hash": "new"}, owner=ds)})
            return ds, labels

        ready = {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
        for name, component, on in [("e2e-pdp", "pdp", [("a", "old"), ("b", "new")]),
                                    ("e2e-front", "pdp-front", [("a", "old")])]:
            ds, labels = daemonset(name, component)
            for node, rev in on:
                p = make({"apiVersion": "v1", "kind": "Pod",
                          "metadata": meta(f"{name}-{node}", pdp_ns, {**labels, "controller-revision-hash": rev},
                                           owner=ds),
                          "spec": {"nodeName": ctx[f"node_{node}"], "containers": [{"name": "c", "image": E.PAUSE}]}})
                api.patch("Pod", p["metadata"]["name"], pdp_ns, ready, sub="status")

        # The flag sync source and one relay on A, their /metrics served here.
        ctx["no_flags"] = "this machine has no address the apiserver's Pod proxy dials"
        for addr in routable_ipv4():
            try:
                metrics = Metrics(addr)
                ctx.pop("no_flags")
                break
            except OSError as e:  # the ports are fixed: another process may hold them
                ctx["no_flags"] = f"cannot listen on {addr}:8014 and 8017: {e}"
        if metrics:
            at = {"status": {**ready["status"], "podIP": addr, "podIPs": [{"ip": addr}]}}
            if api.get("Namespace", "pdp-flags") is None:
                api.create({"apiVersion": "v1", "kind": "Namespace",
                            "metadata": meta("pdp-flags", labels={E.NAME_LABEL: "pdp-flags"})})
            src = {"app.kubernetes.io/name": "pdp-flag-sync"}
            make({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta("pdp-flag-sync", "pdp-system", src),
                  "spec": {"selector": {"matchLabels": src}, "template": {
                      "metadata": {"labels": src}, "spec": {"containers": [{"name": "c", "image": E.PAUSE}]}}}})
            for name, pns, labels, node in [
                    ("e2e-codes-flag-source", "pdp-system", src, None),
                    ("e2e-codes-relay", "pdp-flags", {"app.kubernetes.io/name": "pdp-flag-relay"}, ctx["node_a"])]:
                make({"apiVersion": "v1", "kind": "Pod", "metadata": meta(name, pns, labels),
                      "spec": {**({"nodeName": node} if node else {}),
                               "containers": [{"name": "c", "image": E.PAUSE}]}})
                api.patch("Pod", name, pns, at, sub="status")

        # Install objects under other names, and inert copies of the registration.
        garbage = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
        expiring = expiring_cert(h.workdir / "check-codes-expiring", 10, 2)
        for name, crt in [("e2e-codes-garbage", garbage), ("e2e-codes-expiring", expiring)]:
            make({"apiVersion": "v1", "kind": "Secret", "metadata": meta(name, "pdp-system"),
                  "data": {"tls.crt": base64.b64encode(crt.encode()).decode()}})
        excluding = yaml.safe_load(h.config_path.read_text())
        excluding["excludedNamespaces"] = [ctx["ns_excluded"]]
        for name, text in [("e2e-codes-invalid", "defaultMode: sometimes\n"),
                           ("e2e-codes-excluding", yaml.safe_dump(excluding, sort_keys=False))]:
            make({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(name, "pdp-system"),
                  "data": {"config.yaml": text}})
        for name, ready_replicas in [("e2e-codes-down", None), ("e2e-codes-degraded", 1)]:
            labels = {"app": name}
            make({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta(name, "pdp-system"),
                  "spec": {"replicas": 2, "selector": {"matchLabels": labels}, "template": {
                      "metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": E.PAUSE}]}}}})
            if ready_replicas:
                api.patch("Deployment", name, "pdp-system",
                          {"status": {"replicas": 2, "readyReplicas": ready_replicas}}, sub="status")

        def differs(webhooks):
            webhooks[:] = [w for w in webhooks if w["name"] == "namespaces.pdp-injector.io"]
            webhooks[0]["failurePolicy"] = "Ignore"
            for w in webhooks:
                w["clientConfig"]["url"] = f"https://127.0.0.1:{ctx['dead_port']}/mutate/opted-in"

        def bundle(value):
            def change(webhooks):
                for w in webhooks:
                    if value is None:
                        w["clientConfig"].pop("caBundle")
                    else:
                        w["clientConfig"]["caBundle"] = value
            return change

        for name, change in [("e2e-codes-differs", differs), ("e2e-codes-nobundle", bundle(None)),
                             ("e2e-codes-badbundle", bundle(base64.b64encode(b"not a certificate").decode())),
                             ("e2e-codes-otherca", bundle(h.adder_ca_bundle))]:
            make(inert_copy(h, name, change))

        # Users with the shipped check role minus one resource each.
        shipped = {d["kind"]: d for d in yaml.safe_load_all((REPO / "manifests/overlays/daemonset/webhook/rbac-check.yaml").read_text())}
        make({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta("e2e-codes-check",
              "pdp-system"), "rules": shipped["Role"]["rules"]})
        users = {}
        for without in ["nodes", "daemonsets", "csinodes"]:
            user = f"e2e-codes-no-{without}"
            rules = [{**r, "resources": [x for x in r["resources"] if x != without]}
                     for r in shipped["ClusterRole"]["rules"]]
            make({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": meta(user),
                  "rules": [r for r in rules if r["resources"]]})
            subject = [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]
            make({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": meta(user),
                  "subjects": subject, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                                   "name": user}})
            make({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                  "metadata": meta(user, "pdp-system"), "subjects": subject,
                  "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "e2e-codes-check"}})
            users[without] = impersonating_kubeconfig(h, user)

        def granted():
            for without in users:
                review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": {
                    "user": f"e2e-codes-no-{without}", "groups": ["system:authenticated"],
                    "resourceAttributes": {"namespace": "pdp-system", "verb": "get", "resource": "configmaps",
                                           "name": "pdp-injector-config"}}}
                if not api.request("POST", Api.path("SubjectAccessReview"), review)[1]["status"].get("allowed"):
                    return False
            return True

        h.wait_for("the check users' grants", granted, timeout=30, interval=0.2)

        csi_config = h.workdir / "config-csi.yaml"
        cfg = yaml.safe_load(h.config_path.read_text())
        cfg["socketVolume"] = "csi"
        csi_config.write_text(yaml.safe_dump(cfg, sort_keys=False))

        E.log(f"check codes: set up in {time.monotonic() - t0:.1f}s")
        # -- the runs against this apiserver
        mine = ["--pdp-daemonset", f"cerbos={pdp_ns}/e2e-pdp"]
        runs["inorder"] = run_check(h, "inorder", "-n", ns, *mine)
        if metrics:
            metrics.set(8017, 4)
        runs["csi"] = run_check(h, "csi", "-n", ns, "--config", str(csi_config),
                                "--webhook-config", "e2e-codes-absent", "--pdp-daemonset",
                                f"cerbos={pdp_ns}/e2e-codes-absent")
        if metrics:
            metrics.set(8017, 5)  # current again: check waits 2 s on a relay behind
        runs["install-1"] = run_check(h, "install-1", "-n", ctx["ns_absent"], "--webhook-config", "e2e-codes-differs",
                                      "--secret", "e2e-codes-absent", "--deployment", "e2e-codes-absent",
                                      "--config-map", "e2e-codes-absent")
        runs["install-2"] = run_check(h, "install-2", "-n", ctx["ns_bad"], "--webhook-config", "e2e-codes-nobundle",
                                      "--secret", "e2e-codes-garbage", "--deployment", "e2e-codes-down",
                                      "--config-map", "e2e-codes-invalid")
        runs["install-3"] = run_check(h, "install-3", "-n", ctx["ns_excluded"], "--webhook-config",
                                      "e2e-codes-badbundle", "--secret", "e2e-codes-expiring", "--deployment",
                                      "e2e-codes-degraded", "--config-map", "e2e-codes-excluding")
        runs["install-4"] = run_check(h, "install-4", "-n", ctx["ns_on"], "--webhook-config", "e2e-codes-otherca")
        runs["nobody"] = run_check(h, "nobody", "-n", ns, kubeconfig=h.nobody_kubeconfig)
        runs["no-nodes"] = run_check(h, "no-nodes", "-n", ns, kubeconfig=users["nodes"])
        runs["no-daemonsets"] = run_check(h, "no-daemonsets", "-n", ns, kubeconfig=users["daemonsets"])
        runs["no-csinodes"] = run_check(h, "no-csinodes", "-n", ns_off, "--config", str(csi_config),
                                        kubeconfig=users["csinodes"])
        runs["pre"] = run_check(h, "pre", "--pre", "-n", ns)
        runs["pre-nobody"] = run_check(h, "pre-nobody", "--pre", kubeconfig=h.nobody_kubeconfig)
        E.log(f"check codes: runs here done at {time.monotonic() - t0:.1f}s")
        pre_runs(h, pre, runs)
        E.log(f"check codes: second apiserver's runs done at {time.monotonic() - t0:.1f}s")
    finally:
        t = time.monotonic()
        pre.stop()
        if metrics:
            metrics.stop()
        make.delete_all()
        E.log(f"check codes: cleaned up in {time.monotonic() - t:.1f}s")
    bad = judge(runs, ctx)
    check(not bad, f"{len(bad)} problem(s) in the {len(ROWS)} rows: " + "; ".join(bad))


def register(case, e2e):
    """Adds the cases to e2e.py's list where this is called (the order of the cases); `e2e`: what of e2e.py the
    cases use."""
    global E
    E = e2e

    @case("check-codes-table-covers-every-code")
    def _(h):
        codes = table_covers_every_code()
        E.log(f"{len(codes)} codes: {len(ROWS)} produced live, {len(UNIT_ONLY)} unit only")

    @case("check-codes-every-code-live")
    def _(h):
        if E.needs_local(h):
            return
        live(h)
