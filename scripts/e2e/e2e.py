#!/usr/bin/env python3
"""End-to-end tier: pdp-injector behind a real kube-apiserver.

Started by scripts/e2e/run.sh (which builds or finds the binaries); see scripts/e2e/README.md. Local mode starts
etcd and kube-apiserver on 127.0.0.1, then `pdp-injector serve` and a second test webhook, registers the webhook
with the MutatingWebhookConfiguration of manifests/overlays/daemonset (clientConfig turned into a 127.0.0.1 URL plus caBundle),
runs the cases through kubectl and checks the stored objects. Every process it starts is stopped by its PID on
exit, also on failure, timeout or signal.

The cases are pytest tests (test_e2e.py, conftest.py: the options and the session's harness); run.sh runs
`pytest -v`: one line per case with its outcome, the reason of each failure, exit status 1 if any failed, if a
case word matches no case, or if no case ran.
"""
import base64
import copy
import json
import os
import re
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import types
import urllib.error
import urllib.request
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(REPO / "scripts/lib"))
sys.path.insert(0, str(HERE))
import tier  # noqa: E402  (what the tiers share: scripts/lib/tier.py)
from tier import Fail, check, free_port, one_line  # noqa: E402,F401
import check_codes  # noqa: E402  (the table of every check finding code)
WEBHOOK_MANIFEST = REPO / "manifests/overlays/daemonset/webhook/mutatingwebhookconfiguration.yaml"
BASE_CONFIG = REPO / "manifests/overlays/daemonset/config.yaml"
PAUSE = "registry.k8s.io/pause:3.9"
RUN_LABEL = "e2e.pdp-injector.io/run"
ADDER_NS_LABEL = "e2e.pdp-injector.io/adder"
ADD_ANNOTATION = "e2e.pdp-injector.io/add-container"
STATUS = "pdp-injector.io/status"
INJECT = "pdp-injector.io/inject"
PROFILE = "pdp-injector.io/profile"
NS_LABEL = "pdp-injector.io/injection"
REQUIRED_LABEL = "pdp-injector.io/required"
CENTRAL_ADDR = "cerbos.cerbos.svc.cluster.local:3593"
PSS_LABEL = "pod-security.kubernetes.io/enforce"
# Kubernetes 1.21+ sets this label on every namespace; the webhook configuration's exclusions rely on it.
NAME_LABEL = "kubernetes.io/metadata.name"
SYSTEM_NAMESPACES = ["kube-system", "kube-public", "kube-node-lease", "default"]


log = tier.logger("e2e")


class Timeout(Exception):
    pass


def die_with_parent():
    """In the child before exec: SIGTERM it if the harness dies without cleaning up (e.g. SIGKILL)."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - best effort, Linux only
        pass


def run(argv, *, input=None, timeout=60, check_rc=True, env=None):
    return tier.run(argv, input=input, timeout=timeout, check_rc=check_rc, env=env)


# ---------------------------------------------------------------------------------------------------------------
# comparisons


def diff_subset(expected, actual, path="$"):
    """Mismatches where `actual` does not contain `expected`. Objects: every expected key must be present with a
    matching value (the API server may add defaulted fields). Lists: same length (no duplicates, nothing missing),
    element by element."""
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return [f"{path}: expected an object, got {one_line(json.dumps(actual), 120)}"]
        out = []
        for k, v in expected.items():
            if k not in actual:
                out.append(f"{path}.{k}: missing (expected {one_line(json.dumps(v), 120)})")
            else:
                out += diff_subset(v, actual[k], f"{path}.{k}")
        return out
    if isinstance(expected, list):
        if not isinstance(actual, list):
            return [f"{path}: expected a list, got {one_line(json.dumps(actual), 120)}"]
        if len(expected) != len(actual):
            names = lambda l: [x.get("name", "?") if isinstance(x, dict) else x for x in l]  # noqa: E731
            return [f"{path}: expected {len(expected)} items {names(expected)}, got {len(actual)} {names(actual)}"]
        out = []
        for i, (e, a) in enumerate(zip(expected, actual)):
            out += diff_subset(e, a, f"{path}[{i}]")
        return out
    if expected != actual:
        return [f"{path}: expected {one_line(json.dumps(expected), 120)}, got {one_line(json.dumps(actual), 120)}"]
    return []


def assert_contains(expected, actual, what):
    d = diff_subset(expected, actual)
    check(not d, f"{what} differs from the offline injector's output: " + "; ".join(d[:4]))


def status_of(pod):
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(STATUS)
    return json.loads(raw) if raw else None


def by_name(items, name):
    for x in items or []:
        if x.get("name") == name:
            return x
    return None


def env_names(container):
    return [e["name"] for e in container.get("env") or []]


# ---------------------------------------------------------------------------------------------------------------
# the harness


class Harness:
    def __init__(self, args):
        self.args = args
        self.bin = args.pdp_injector
        self.procs = {}  # name -> (Popen, log path)
        self.created_namespaces = []
        self.created_cluster_objects = []  # (kind, name) to delete in existing-cluster mode
        self.created_pods_elsewhere = []  # (namespace, name) in namespaces we did not create
        self.existing = bool(args.kubeconfig)
        self.workdir = Path(tempfile.mkdtemp(prefix="pdp-injector-e2e-"))
        self.run_id = secrets.token_hex(3)
        self.kubeconfig = Path(args.kubeconfig).resolve() if self.existing else self.workdir / "admin.kubeconfig"
        self.webhook_kubeconfig = self.kubeconfig
        self.webhook_host = args.webhook_host
        self.webhook_port = args.webhook_port or free_port(self.webhook_host)
        self.adder_port = free_port(self.webhook_host)
        self.server_minor = None
        self.etcd_client = self.admin_token = None  # local mode
        self.adder_record = self.workdir / "adder-reviews.jsonl"

    # -- processes ------------------------------------------------------------------------------------------------
    def start(self, name, argv, env=None):
        logf = self.workdir / f"{name}.log"
        fh = open(logf, "ab")
        p = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env={**os.environ, **(env or {})}, start_new_session=True, preexec_fn=die_with_parent)
        fh.close()
        self.procs[name] = (p, logf)
        log(f"started {name} (pid {p.pid}), log {logf}")
        return p

    def stop(self, name, timeout=20):
        entry = self.procs.pop(name, None)
        if not entry:
            return None
        p, _ = entry
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGTERM)  # by PID: only the process this harness started
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                log(f"{name} (pid {p.pid}) ignored SIGTERM for {timeout}s: SIGKILL")
                p.kill()
                p.wait(timeout=10)
            except ProcessLookupError:
                pass
        log(f"stopped {name} (pid {p.pid}, exit {p.returncode})")
        return p.returncode

    def alive(self, name):
        entry = self.procs.get(name)
        return entry is not None and entry[0].poll() is None

    def log_tail(self, name, n=30):
        path = self.workdir / f"{name}.log"
        if not path.exists():
            return ""
        lines = path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    def wait_for(self, what, fn, timeout, proc=None, interval=0.5):
        def gone():
            if proc and not self.alive(proc):
                return f"{proc} exited:\n{self.log_tail(proc)}"
            return None
        tier.wait_for(what, fn, timeout, interval=interval, still_alive=gone)

    # -- kubectl ----------------------------------------------------------------------------------------------------
    def kubectl(self, *args, input=None, check_rc=True, timeout=60):
        argv = [self.args.kubectl, f"--kubeconfig={self.kubeconfig}", "--request-timeout=30s", *args]
        if isinstance(input, (dict, list)):
            input = json.dumps(input)
        return run(argv, input=input, check_rc=check_rc, timeout=timeout)

    def create(self, obj, *, dry_run=False, client_validation=True):
        """Create through the API. Returns (object as answered, stderr, returncode); never raises on refusal."""
        args = ["create", "-f", "-", "-o", "json"]
        if dry_run:
            args.append("--dry-run=server")
        if not client_validation:
            args.append("--validate=false")
        p = self.kubectl(*args, input=obj, check_rc=False)
        out = json.loads(p.stdout) if p.returncode == 0 and p.stdout.strip() else None
        return out, p.stderr, p.returncode

    def must_create(self, obj, **kw):
        out, err, rc = self.create(obj, **kw)
        check(rc == 0, f"create {obj['kind']} {obj['metadata'].get('name')} refused: {one_line(err)}")
        return out, err

    def get(self, kind, name, namespace=None):
        args = ["get", kind, name, "-o", "json"] + (["-n", namespace] if namespace else [])
        p = self.kubectl(*args, check_rc=False)
        if p.returncode != 0:
            if "NotFound" in p.stderr or "not found" in p.stderr:
                return None
            raise RuntimeError(p.stderr.strip())
        return json.loads(p.stdout)

    def namespace(self, slug, labels=None):
        name = f"e2e-{slug}"[:50].rstrip("-") + f"-{secrets.token_hex(2)}"
        ns = {"apiVersion": "v1", "kind": "Namespace",
              "metadata": {"name": name, "labels": {NAME_LABEL: name, RUN_LABEL: self.run_id, **(labels or {})}}}
        self.must_create(ns)
        self.created_namespaces.append(name)
        if self.args.ns_settle:
            time.sleep(self.args.ns_settle)
        return name

    def server_version(self):
        v = json.loads(self.kubectl("get", "--raw", "/version").stdout)
        minor = int(re.match(r"\d+", v["minor"]).group(0))
        return int(v["major"]), minor, v.get("gitVersion", "")

    def native_sidecars(self):
        return self.server_minor >= 29

    # -- the webhook ---------------------------------------------------------------------------------------------
    def https_get(self, port, path, host=None):
        ctx = ssl.create_default_context(cafile=str(self.workdir / "webhook-certs/ca.crt"))
        ctx.check_hostname = False  # the certificate names 127.0.0.1 as an IP SAN; we connect by IP
        url = f"https://{host or self.webhook_host}:{port}{path}"
        with urllib.request.urlopen(url, context=ctx, timeout=5) as r:
            return r.status, r.read().decode()

    def start_webhook(self):
        argv = [self.bin, "serve", "--listen", f"{self.webhook_host}:{self.webhook_port}",
                "--cert", str(self.workdir / "webhook-certs/tls.crt"),
                "--key", str(self.workdir / "webhook-certs/tls.key"),
                "--config", str(self.config_path)]
        self.start("pdp-injector", argv, env={"KUBECONFIG": str(self.webhook_kubeconfig), "RUST_BACKTRACE": "1"})
        self.wait_for("pdp-injector /readyz", lambda: self.https_get(self.webhook_port, "/readyz")[0] == 200,
                      timeout=60, proc="pdp-injector")

    def reviews_answered(self):
        _, text = self.https_get(self.webhook_port, "/metrics")
        total = 0.0
        for line in text.splitlines():
            if line.startswith("pdp_injector_admission_reviews_total"):
                total += float(line.rsplit(" ", 1)[1])
        return total

    # -- offline reference --------------------------------------------------------------------------------------
    def offline(self, *docs, namespace_doc=None, native=None):
        """What `pdp-injector inject` (the same core, offline) makes of these documents, for this API server
        (classic sidecars below 1.29) unless `native` says which form."""
        if native is None:
            native = self.native_sidecars()
        stream = ([namespace_doc] if namespace_doc else []) + list(docs)
        text = "---\n".join(yaml.safe_dump(d, sort_keys=False) for d in stream)
        cfg = self.config_path if native else self.classic_config_path
        p = run([self.bin, "inject", "-f", "-", "--config", str(cfg)], input=text, check_rc=False)
        if p.returncode != 0:
            raise Fail(f"offline inject failed: {one_line(p.stderr)}")
        out = [d for d in yaml.safe_load_all(p.stdout) if d]
        return [d for d in out if d.get("kind") != "Namespace"]

    # -- setup ----------------------------------------------------------------------------------------------------
    def setup(self):
        if not self.existing:
            self.start_local_cluster()
        major, minor, git = self.server_version()
        self.server_minor = minor
        log(f"kube-apiserver {git} (native sidecars: {'yes' if minor >= 29 else 'no, 1.29+ only'})")
        if not self.existing:
            self.bootstrap_local_cluster()
        self.write_config()
        self.make_webhook_certs()
        self.start_webhook()
        self.start_adder()
        self.register_webhooks()
        if not self.existing:
            self.install_check_fixtures()

    def install_check_fixtures(self):
        """What an install has besides the webhook process, so that `pdp-injector check` finds it in order: the
        serving certificate's Secret, the config's ConfigMap, the webhook Deployment (its status set through the
        status subresource: no controller runs here) and the cerbos-pdp DaemonSet of manifests/overlays/daemonset."""
        certs = self.workdir / "webhook-certs"
        self.kubectl("-n", "pdp-system", "create", "secret", "tls", "pdp-injector-tls",
                     f"--cert={certs / 'tls.crt'}", f"--key={certs / 'tls.key'}")
        self.kubectl("-n", "pdp-system", "create", "configmap", "pdp-injector-config",
                     f"--from-file=config.yaml={self.config_path}")
        labels = {"app.kubernetes.io/name": "pdp-injector"}
        template = {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "pdp-injector", "image": PAUSE}]}}
        self.kubectl("apply", "-f", "-", input={
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "pdp-injector", "namespace": "pdp-system", "labels": labels},
            "spec": {"replicas": 2, "selector": {"matchLabels": labels}, "template": template}})
        self.kubectl("-n", "pdp-system", "patch", "deployment", "pdp-injector", "--subresource=status",
                     "--type=merge", "-p", json.dumps({"status": {"replicas": 2, "readyReplicas": 2}}))
        self.kubectl("apply", "-f", "-", input={
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "pdp-node", "labels": {NAME_LABEL: "pdp-node"}}})
        pdp = {"app.kubernetes.io/name": "cerbos-pdp", "app.kubernetes.io/component": "pdp"}
        self.kubectl("apply", "-f", "-", input={
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "cerbos-pdp", "namespace": "pdp-node", "labels": pdp},
            "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": "cerbos-pdp"}},
                     "template": {"metadata": {"labels": pdp},
                                  "spec": {"containers": [{"name": "cerbos", "image": PAUSE}]}}}})

    def check(self, namespace, *extra, kubeconfig=None):
        """`pdp-injector check -n NAMESPACE -o json`: (exit status, report or None, stderr)."""
        env = {**os.environ, "KUBECONFIG": str(kubeconfig or self.kubeconfig), "NO_COLOR": "1"}
        env.pop("PDP_INJECTOR_CONFIG", None)
        p = run([self.bin, "check", "-n", namespace, "-o", "json", *extra], check_rc=False, env=env, timeout=120)
        report = json.loads(p.stdout) if p.stdout.strip() else None
        return p.returncode, report, p.stderr

    def start_local_cluster(self):
        w = self.workdir
        pki = w / "pki"
        # CA, serving certificate (IP SAN 127.0.0.1), service-account key pair, static tokens.
        ca = tier.Pki(pki)
        ca.cert("ca", "/CN=pdp-injector-e2e-kube-ca", ca=True)
        ca.cert("apiserver", "/CN=kube-apiserver", server=True,
                san="IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default.svc")
        ca.service_account_keys()
        admin_token, webhook_token, nobody_token, checker_token = (secrets.token_hex(16) for _ in range(4))
        # The webhook authenticates as its ServiceAccount's user name, so manifests/overlays/daemonset/webhook/rbac.yaml (bound to that
        # ServiceAccount) is what authorizes it: the harness runs it with exactly the permissions it ships with.
        (pki / "tokens.csv").write_text(
            f'{admin_token},e2e-admin,e2e-admin,"system:masters"\n'
            f'{webhook_token},system:serviceaccount:pdp-system:pdp-injector,pdp-injector-sa,'
            f'"system:serviceaccounts,system:serviceaccounts:pdp-system"\n'
            # A user without any grant: a webhook that cannot read a single namespace (the doubt case).
            f'{nobody_token},e2e-nobody,e2e-nobody\n'
            # Whoever runs `pdp-injector check`: bound to manifests/overlays/daemonset/webhook/rbac-check.yaml by the case that uses it.
            f'{checker_token},e2e-checker,e2e-checker\n')
        os.chmod(pki / "tokens.csv", 0o600)

        etcd_client, etcd_peer = free_port(), free_port()
        self.start("etcd", tier.etcd_argv(self.args.etcd, "e2e", w / "etcd", etcd_client, etcd_peer))
        self.wait_for("etcd", lambda: tier.etcd_healthy("127.0.0.1", etcd_client), timeout=30, proc="etcd")

        self.etcd_client = etcd_client
        self.admin_token = admin_token
        api_port = free_port()
        self.start("kube-apiserver", self.apiserver_argv(api_port, "apiserver-certs"))
        (w / "admin.kubeconfig").write_text(self.kubeconfig_text(api_port, pki / "ca.crt", admin_token, "e2e-admin"))
        self.webhook_kubeconfig = w / "pdp-injector.kubeconfig"
        self.webhook_kubeconfig.write_text(
            self.kubeconfig_text(api_port, pki / "ca.crt", webhook_token, "pdp-injector"))
        self.nobody_kubeconfig = w / "nobody.kubeconfig"
        self.nobody_kubeconfig.write_text(self.kubeconfig_text(api_port, pki / "ca.crt", nobody_token, "e2e-nobody"))
        self.checker_kubeconfig = w / "checker.kubeconfig"
        self.checker_kubeconfig.write_text(
            self.kubeconfig_text(api_port, pki / "ca.crt", checker_token, "e2e-checker"))

        def api_ready():
            return self.kubectl("get", "--raw", "/readyz", check_rc=False, timeout=15).returncode == 0

        self.wait_for("kube-apiserver /readyz", api_ready, timeout=120, proc="kube-apiserver", interval=1)

        # A build with the vendored reflect2 1.0.1 under Go >= 1.18 dies on the first map it encodes: check once.
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        req = urllib.request.Request(f"https://127.0.0.1:{api_port}/api/v1/namespaces/default",
                                     headers={"Authorization": f"Bearer {admin_token}", "Accept": "application/yaml"})
        # The namespace `default` is created by the apiserver's own bootstrap a moment after /readyz can pass
        # (CI once got 404 here): a 404 is waited on, for up to 60 s.
        deadline = time.monotonic() + 60
        try:
            while True:
                try:
                    with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
                        body = r.read().decode()
                    break
                except urllib.error.HTTPError as e:
                    if e.code != 404 or time.monotonic() > deadline or not self.alive("kube-apiserver"):
                        raise
                    time.sleep(0.5)
            check("kind: Namespace" in body, f"unexpected YAML answer: {one_line(body, 200)}")
        except Exception as e:  # noqa: BLE001
            raise RuntimeError(f"kube-apiserver cannot encode YAML ({e}); alive: {self.alive('kube-apiserver')}: "
                               "was reflect2 replaced before the build? (scripts/e2e/build-apiserver.sh)") from e

    def apiserver_argv(self, port, cert_dir, *, etcd_prefix=None, runtime_config=None,
                       enable=("MutatingAdmissionWebhook", "ValidatingAdmissionWebhook"), disable=()):
        """kube-apiserver on 127.0.0.1:`port` with this harness's etcd, PKI and tokens. `etcd_prefix` gives a second
        apiserver a world of its own in the same etcd; `runtime_config` turns APIs off."""
        w, pki = self.workdir, self.workdir / "pki"
        return [
            self.args.kube_apiserver,
            "--etcd-servers", f"http://127.0.0.1:{self.etcd_client}",
            *(["--etcd-prefix", etcd_prefix] if etcd_prefix else []),
            *(["--runtime-config", runtime_config] if runtime_config else []),
            "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
            "--secure-port", str(port),
            "--cert-dir", str(w / cert_dir),
            "--tls-cert-file", str(pki / "apiserver.crt"), "--tls-private-key-file", str(pki / "apiserver.key"),
            "--client-ca-file", str(pki / "ca.crt"),
            "--token-auth-file", str(pki / "tokens.csv"),
            "--authorization-mode", "RBAC",
            "--service-account-key-file", str(pki / "sa.pub"),
            "--service-account-signing-key-file", str(pki / "sa.key"),
            "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
            "--service-cluster-ip-range", "10.0.0.0/24",
            # No controllers run: no ServiceAccount token controller, so the ServiceAccount admission plugin would
            # refuse every Pod; no endpoints for a loopback advertise address.
            *(["--enable-admission-plugins", ",".join(enable)] if enable else []),
            "--disable-admission-plugins", ",".join(("ServiceAccount", *disable)),
            "--endpoint-reconciler-type", "none",
            "--allow-privileged=true",
            "--profiling=false", "--logtostderr", "-v", "1"]

    @staticmethod
    def kubeconfig_text(port, ca, token, user):
        return tier.kubeconfig(f"https://127.0.0.1:{port}", ca, user, token=token, context="e2e")

    def bootstrap_local_cluster(self):
        # Kubernetes 1.20 does not set kubernetes.io/metadata.name on namespaces (1.21+ does, on every namespace);
        # the registered configuration excludes the control plane through that label, so the harness sets it, as a
        # 1.21+ server would, on the namespaces that exist and on every namespace it creates.
        self.wait_for("system namespaces", lambda: all(self.get("namespace", n) for n in SYSTEM_NAMESPACES[:2]),
                      timeout=60)
        for n in SYSTEM_NAMESPACES:
            if self.get("namespace", n):
                self.kubectl("label", "namespace", n, f"{NAME_LABEL}={n}", "--overwrite")
        # The webhook's namespace, ServiceAccount and least-privilege RBAC, from manifests/overlays/daemonset/webhook.
        for f in ["namespace.yaml", "serviceaccount.yaml", "rbac.yaml"]:
            self.kubectl("apply", "-f", str(REPO / "manifests/overlays/daemonset/webhook" / f))
        self.kubectl("label", "namespace", "pdp-system", f"{NAME_LABEL}=pdp-system", "--overwrite")

    def write_config(self):
        """manifests/overlays/daemonset/config.yaml plus one profile, cerbos-classic, that asks for the classic sidecar form (an
        ordinary container): the only form Kubernetes < 1.29 stores."""
        cfg = yaml.safe_load(BASE_CONFIG.read_text()) or {}
        classic = {"extends": "cerbos", "sidecar": {"placement": "afterInit", "native": False, "unixSocket": False}}
        cfg.setdefault("profiles", {})["cerbos-classic"] = classic
        # Central mode points at a Service; nothing needs to answer there for admission.
        cerbos = cfg["profiles"].setdefault("cerbos", {}) or {}
        cerbos["central"] = {"address": CENTRAL_ADDR}
        cfg["profiles"]["cerbos"] = cerbos
        self.config_path = self.workdir / "config.yaml"
        self.config_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        # The offline injector cannot be told the server version. Against a server without native sidecars the
        # webhook uses the same config with every profile's sidecar made classic (and hashes that); the offline
        # reference gets that config spelled out. Built-in sidecar defaults: placement afterInit, unixSocket false.
        ref = copy.deepcopy(cfg)
        for name in set(ref["profiles"]) | {"cerbos", "flagd"}:
            prof = ref["profiles"].setdefault(name, {}) or {}
            ref["profiles"][name] = prof
            sc = prof.get("sidecar") or {}
            prof["sidecar"] = {"placement": sc.get("placement", "afterInit"), "native": False,
                               "unixSocket": sc.get("unixSocket", False)}
        self.classic_config_path = self.workdir / "config-classic-reference.yaml"
        self.classic_config_path.write_text(yaml.safe_dump(ref, sort_keys=False))

    def make_webhook_certs(self):
        out = run([self.bin, "certs", "--service", "pdp-injector", "--webhook-namespace", "pdp-system",
                   "--extra-san", self.webhook_host, "--out-dir", str(self.workdir / "webhook-certs"), "--days", "2"])
        self.ca_bundle = out.stdout.strip().splitlines()[-1].strip()
        base64.b64decode(self.ca_bundle, validate=True)
        out = run([self.bin, "certs", "--service", "e2e-adder", "--webhook-namespace", "pdp-system",
                   "--extra-san", self.webhook_host, "--out-dir", str(self.workdir / "adder-certs"), "--days", "2"])
        self.adder_ca_bundle = out.stdout.strip().splitlines()[-1].strip()

    def start_adder(self):
        c = self.workdir / "adder-certs"
        self.start("adder-webhook", [sys.executable, str(HERE / "adder_webhook.py"),
                                     "--listen", f"{self.webhook_host}:{self.adder_port}",
                                     "--cert", str(c / "tls.crt"), "--key", str(c / "tls.key"),
                                     "--record", str(self.adder_record)])

        def adder_up():
            ctx = ssl.create_default_context(cafile=str(c / "ca.crt"))
            ctx.check_hostname = False
            with urllib.request.urlopen(f"https://{self.webhook_host}:{self.adder_port}/healthz", context=ctx,
                                        timeout=3) as r:
                return r.status == 200

        self.wait_for("adder webhook", adder_up, timeout=20, proc="adder-webhook")

    def webhook_configuration(self):
        """manifests/overlays/daemonset's MutatingWebhookConfiguration, with clientConfig.service replaced by a URL on the local
        listener and the caBundle filled in; nothing else changes."""
        docs = [d for d in yaml.safe_load_all(WEBHOOK_MANIFEST.read_text()) if d]
        check(len(docs) == 1 and docs[0]["kind"] == "MutatingWebhookConfiguration", "unexpected manifest layout")
        mwc = docs[0]
        for wh in mwc["webhooks"]:
            svc = wh["clientConfig"].pop("service")
            wh["clientConfig"] = {"url": f"https://{self.webhook_host}:{self.webhook_port}{svc.get('path', '/')}",
                                  "caBundle": self.ca_bundle}
        mwc["metadata"].setdefault("labels", {})["app.kubernetes.io/managed-by"] = "pdp-injector-e2e"
        return mwc

    def adder_configuration(self):
        # Its name sorts after "pdp-injector", so the API server calls it after ours; IfNeeded makes the server
        # call ours again once it has added a container.
        return {
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "zz-pdp-injector-e2e-adder",
                         "labels": {"app.kubernetes.io/managed-by": "pdp-injector-e2e"}},
            "webhooks": [{
                "name": "adder.e2e.pdp-injector.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                "reinvocationPolicy": "IfNeeded", "timeoutSeconds": 5, "failurePolicy": "Fail",
                "clientConfig": {"url": f"https://{self.webhook_host}:{self.adder_port}/mutate",
                                 "caBundle": self.adder_ca_bundle},
                "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                           "resources": ["pods"], "scope": "Namespaced"}],
                "namespaceSelector": {"matchLabels": {ADDER_NS_LABEL: "on"}},
            }],
        }

    def register_webhooks(self):
        for mwc in [self.webhook_configuration(), self.adder_configuration()]:
            name = mwc["metadata"]["name"]
            existing = self.get("mutatingwebhookconfiguration", name)
            if existing and (existing["metadata"].get("labels") or {}).get("app.kubernetes.io/managed-by") \
                    != "pdp-injector-e2e":
                raise RuntimeError(f"MutatingWebhookConfiguration {name} already exists and is not the harness's: "
                                   "refusing to replace it (is pdp-injector installed in this cluster?)")
            self.kubectl("apply", "-f", "-", input=mwc)
            self.created_cluster_objects.append(("mutatingwebhookconfiguration", name))
        (self.workdir / "registered-webhook.yaml").write_text(yaml.safe_dump(self.webhook_configuration()))
        # The API server picks new configurations up asynchronously: probe with a dry run until both answer.
        ns = self.namespace("warmup", {ADDER_NS_LABEL: "on"})
        probe = pod("warmup", ns, annotations={INJECT: "daemonset", ADD_ANNOTATION: "warmup-added"})

        def both_active():
            out, err, rc = self.create(probe, dry_run=True)
            if rc != 0:
                raise RuntimeError(one_line(err))
            names = [c["name"] for c in out["spec"]["containers"]]
            return status_of(out) is not None and "warmup-added" in names

        self.wait_for("webhook registration to take effect", both_active, timeout=60, interval=1)

    # -- teardown -------------------------------------------------------------------------------------------------
    def teardown(self, failed):
        if self.existing:
            for kind, name in reversed(self.created_cluster_objects):
                self.kubectl("delete", kind, name, "--ignore-not-found", check_rc=False)
            for ns, name in self.created_pods_elsewhere:
                self.kubectl("delete", "pod", "-n", ns, name, "--ignore-not-found", "--wait=false", check_rc=False)
            if self.created_namespaces:
                self.kubectl("delete", "namespace", "--wait=false", "--ignore-not-found", *self.created_namespaces,
                             check_rc=False, timeout=120)
        for name in reversed(list(self.procs)):
            self.stop(name)
        if failed or self.args.keep:
            log(f"work directory kept: {self.workdir}")
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)


def pod(name, namespace, *, annotations=None, labels=None, containers=None, **spec):
    meta = {"name": name, "namespace": namespace}
    if annotations:
        meta["annotations"] = annotations
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": containers or [{"name": "app", "image": PAUSE}], **spec}}


# ---------------------------------------------------------------------------------------------------------------
# cases (run in this order; the webhook-down cases come last)

CASES = []


def case(name, needs=None):
    def deco(fn):
        CASES.append((name, fn, needs))
        return fn
    return deco


def create_and_compare(h, p, namespace_doc=None):
    """Create `p`, check the stored Pod contains exactly what the offline injector makes of it. Returns it."""
    expected = h.offline(p, namespace_doc=namespace_doc)[0]
    h.must_create(p)
    stored = h.get("pod", p["metadata"]["name"], p["metadata"]["namespace"])
    check(stored is not None, "Pod not stored")
    assert_contains(expected, stored, "stored Pod")
    return stored, expected


@case("pod-annotation-daemonset")
def _(h):
    ns = h.namespace("pod-ann-daemonset")
    stored, _ = create_and_compare(h, pod("app", ns, annotations={INJECT: "daemonset"}))
    st = status_of(stored)
    check(st and st["mode"] == "daemonset" and st["reason"] == "injected_daemonset", f"status annotation: {st}")


@case("pod-annotation-enabled-default-mode")
def _(h):
    ns = h.namespace("pod-ann-enabled")
    stored, _ = create_and_compare(h, pod("app", ns, annotations={INJECT: "enabled"}))
    st = status_of(stored)
    check(st and st["mode"] == "daemonset", f"enabled should mean the config's default mode daemonset: {st}")


@case("pod-label-opt-in")
def _(h):
    ns = h.namespace("pod-label")
    stored, _ = create_and_compare(h, pod("app", ns, labels={INJECT: "daemonset"}))
    check(status_of(stored), "a Pod label pdp-injector.io/inject=daemonset did not opt in")


@case("daemonset-wiring-stored-exactly")
def _(h):
    # The node socket is mounted only where Pod Security allows hostPath (privileged); unlabelled counts as baseline.
    ns = h.namespace("ds-wiring", {PSS_LABEL: "privileged"})
    p = pod("app", ns, annotations={INJECT: "daemonset"},
            containers=[{"name": "app", "image": PAUSE,
                         "env": [{"name": "PDP_URL", "value": "http://$(CERBOS_PDP_ADDR)"}]},
                        {"name": "worker", "image": PAUSE}])
    nsd = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {PSS_LABEL: "privileged"}}}
    stored, _ = create_and_compare(h, p, namespace_doc=nsd)
    want_env = [
        {"name": "CERBOS_PDP_HOST", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.hostIP"}}},
        {"name": "CERBOS_PDP_ADDR", "value": "$(CERBOS_PDP_HOST):3593"},
        {"name": "CERBOS_PDP_HTTP_ADDR", "value": "$(CERBOS_PDP_HOST):3592"},
        {"name": "CERBOS_PDP_SOCKET", "value": "/var/run/cerbos/cerbos.sock"},
    ]
    want_mount = {"name": "pdp-injector-socket", "mountPath": "/var/run/cerbos", "readOnly": True}
    for c in stored["spec"]["containers"]:
        env = [e for e in c.get("env") or [] if e["name"].startswith("CERBOS_")]
        check(env == want_env, f"container {c['name']} env as stored: {json.dumps(env)}")
        check(c.get("volumeMounts") == [want_mount], f"container {c['name']} mounts: {c.get('volumeMounts')}")
    # The app's own variable that refers to the injected one comes after it, so $(CERBOS_PDP_ADDR) expands.
    names = env_names(stored["spec"]["containers"][0])
    check(names.index("PDP_URL") > names.index("CERBOS_PDP_ADDR"), f"env order {names}")
    vols = stored["spec"].get("volumes") or []
    sock = by_name(vols, "pdp-injector-socket")
    check(sock and sock.get("hostPath") == {"path": "/var/run/cerbos", "type": "Directory"},
          f"socket volume as stored: {sock}")
    check(len([v for v in vols if "hostPath" in v]) == 1, f"volumes: {vols}")
    # Only the start-up gate, first: the hostPath socket does not hold the Pod until its node's PDP answers.
    inits = [c["name"] for c in stored["spec"].get("initContainers") or []]
    check(inits == ["pdp-injector-await"], f"daemonset mode init containers: {inits}")
    check(status_of(stored).get("gate") == "pdp-injector-await", f"the status does not record the gate: {status_of(stored)}")


@case("not-opted-in-untouched")
def _(h):
    ns = h.namespace("not-opted-in")
    p = pod("app", ns)
    before = h.reviews_answered()
    stored, _ = create_and_compare(h, p)
    check(status_of(stored) is None, "an unrelated Pod got a status annotation")
    check(env_names(stored["spec"]["containers"][0]) == [], "an unrelated Pod got env")
    check(not stored["spec"].get("volumes"), "an unrelated Pod got volumes")
    check(h.reviews_answered() > before, "the Ignore entry did not send the Pod to the webhook at all")


@case("opt-out-in-enabled-namespace")
def _(h):
    ns = h.namespace("opt-out", {NS_LABEL: "enabled"})
    stored, _ = create_and_compare(h, pod("app", ns, annotations={INJECT: "disabled"}))
    check(status_of(stored) is None and not stored["spec"].get("volumes")
          and env_names(stored["spec"]["containers"][0]) == [], "a Pod that opted out was injected")


@case("invalid-annotation-denied")
def _(h):
    ns = h.namespace("invalid")
    out, err, rc = h.create(pod("app", ns, annotations={INJECT: "sidecars"}))
    check(rc != 0, "a Pod with pdp-injector.io/inject=sidecars was admitted")
    for needle in ["pdp-injector.io/inject", '"sidecars"', "sidecar, daemonset, central, enabled, disabled"]:
        check(needle in err, f"denial message lacks {needle!r}: {one_line(err)}")
    check(h.get("pod", "app", ns) is None, "the denied Pod was stored")


@case("reserved-priority-class-refused-on-the-real-apiserver")
def _(h):
    # The webhook's PriorityClass (999000000) would let any Pod preempt ordinary workloads: the webhook refuses
    # it to every Pod it reviews, opted in or not; another class passes. The classes made here are removed again
    # (check --pre judges a PriorityClass no release owns as taken).
    made = []
    if h.get("priorityclass", "pdp-injector-webhook") is None:
        h.kubectl("apply", "-f", str(REPO / "manifests/overlays/daemonset/webhook/priorityclass.yaml"))
        made.append("pdp-injector-webhook")
    h.kubectl("apply", "-f", "-", input={"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                         "metadata": {"name": "e2e-other"}, "value": 1000})
    made.append("e2e-other")
    try:
        ns = h.namespace("reserved-priority")
        p = pod("app", ns)
        p["spec"]["priorityClassName"] = "pdp-injector-webhook"
        out, err, rc = h.create(p)
        check(rc != 0, "a Pod naming the webhook's PriorityClass was admitted outside pdp-system")
        for needle in ["reserved_priority_class", "pdp-injector-webhook", "choose another priorityClassName"]:
            check(needle in err, f"denial message lacks {needle!r}: {one_line(err)}")
        check(h.get("pod", "app", ns) is None, "the denied Pod was stored")
        opted = h.namespace("reserved-priority-in", {NS_LABEL: "enabled"})
        p = pod("app", opted)
        p["spec"]["priorityClassName"] = "pdp-injector-webhook"
        out, err, rc = h.create(p)
        check(rc != 0 and "reserved_priority_class" in err, f"opted-in namespace: {one_line(err)}")
        ok = pod("other", ns)
        ok["spec"]["priorityClassName"] = "e2e-other"
        h.must_create(ok)
        h.kubectl("-n", ns, "delete", "pod", "other", "--wait=false")
    finally:
        h.kubectl("delete", "priorityclass", *made, check_rc=False)


@case("unknown-profile-denied")
def _(h):
    ns = h.namespace("unknown-profile")
    out, err, rc = h.create(pod("app", ns, annotations={INJECT: "daemonset", PROFILE: "nope"}))
    check(rc != 0, "a Pod with an unknown profile was admitted")
    for needle in [PROFILE, '"nope"', "cerbos", "flagd"]:
        check(needle in err, f"denial message lacks {needle!r}: {one_line(err)}")
    check(h.get("pod", "app", ns) is None, "the denied Pod was stored")


@case("warnings-visible-to-client")
def _(h):
    ns = h.namespace("warnings")
    p = pod("app", ns, annotations={INJECT: "daemonset"},
            containers=[{"name": "app", "image": PAUSE, "env": [{"name": "CERBOS_PDP_HOST", "value": "pdp.example"}]}])
    expected = h.offline(p)[0]
    out, err = h.must_create(p)
    check(re.search(r"^Warning: pdp-injector env_kept: .*CERBOS_PDP_HOST", err, re.M),
          f"kubectl showed no env_kept warning: {one_line(err)}")
    stored = h.get("pod", "app", ns)
    assert_contains(expected, stored, "stored Pod")
    host = by_name(stored["spec"]["containers"][0]["env"], "CERBOS_PDP_HOST")
    check(host == {"name": "CERBOS_PDP_HOST", "value": "pdp.example"}, f"the app's own value was not kept: {host}")


@case("excluded-namespaces-untouched")
def _(h):
    targets = ["pdp-system"] + ([] if h.existing else ["kube-system"])
    for ns in targets:
        if h.get("namespace", ns) is None:  # existing cluster without pdp-injector installed
            h.must_create({"apiVersion": "v1", "kind": "Namespace",
                           "metadata": {"name": ns, "labels": {NAME_LABEL: ns, RUN_LABEL: h.run_id}}})
            h.created_namespaces.append(ns)
        name = f"e2e-excluded-{secrets.token_hex(2)}"
        before = h.reviews_answered()
        h.must_create(pod(name, ns, annotations={INJECT: "daemonset"}))
        h.created_pods_elsewhere.append((ns, name))
        stored = h.get("pod", name, ns)
        check(status_of(stored) is None and not stored["spec"].get("volumes"), f"a Pod in {ns} was injected")
        check(h.reviews_answered() == before, f"the API server sent a Pod in {ns} to the webhook: the "
              "configuration's namespaceSelector should exclude it")


@case("dry-run-identical-and-not-stored")
def _(h):
    ns = h.namespace("dry-run")
    p = pod("app", ns, annotations={INJECT: "daemonset"})
    dry, _ = h.must_create(p, dry_run=True)
    check(h.get("pod", "app", ns) is None, "a dry-run create stored the Pod")
    check(status_of(dry), "the dry-run answer was not injected")
    real, _ = h.must_create(p)
    for path in [("spec",), ("metadata", "annotations"), ("metadata", "labels")]:
        a, b = dry, real
        for k in path:
            a, b = (a or {}).get(k), (b or {}).get(k)
        check(a == b, f"dry-run and real create differ at {'.'.join(path)}: " + "; ".join(diff_subset(b, a)[:3]))


@case("sidecar-classic-profile")
def _(h):
    ns = h.namespace("sidecar-classic")
    p = pod("app", ns, annotations={INJECT: "sidecar", PROFILE: "cerbos-classic"})
    stored, _ = create_and_compare(h, p)
    st = status_of(stored)
    check(st and st["mode"] == "sidecar", f"status {st}")
    check(by_name(stored["spec"]["containers"], st["sidecar"]), "no classic PDP container in spec.containers")


@case("native-sidecar-form-offline")
def _(h):
    """The native form (init container with restartPolicy Always and a startupProbe) from the same core, and what
    this API server makes of it: refused below 1.29 (why the webhook must fall back), stored as is from 1.29."""
    ns = h.namespace("native-form")
    out = h.offline(pod("app", ns, annotations={INJECT: "sidecar"}), native=True)[0]
    st = status_of(out)
    init = by_name(out["spec"].get("initContainers"), st and st.get("sidecar"))
    check(init and init.get("restartPolicy") == "Always" and init.get("startupProbe"),
          f"offline sidecar is not native: {one_line(json.dumps(init), 200)}")
    check(not by_name(out["spec"]["containers"], init["name"]), "native sidecar also in containers")
    # Already carries the status annotation, so the webhook leaves it alone: this checks the API server only.
    # kubectl's own schema check (from this server's OpenAPI) would refuse restartPolicy first: skip it.
    res, err, rc = h.create(out, dry_run=True, client_validation=False)
    if h.native_sidecars():
        check(rc == 0, f"a {h.server_minor} API server refused the native sidecar: {one_line(err)}")
        assert_contains(out, res, "native sidecar as answered")
    else:
        check(rc != 0 and "must not be set for init containers" in err,
              f"expected 1.{h.server_minor} to refuse probes on init containers, got rc={rc} {one_line(err)}")


def check_sidecar(h, p, stored, expected, namespace_doc=None):
    """Stored sidecar Pod: exactly the offline output for this server (`expected`), in the native form from 1.29,
    otherwise as a classic container in spec.containers; either way the same container as the native form."""
    assert_contains(expected, stored, "stored Pod")
    st = status_of(stored)
    check(st and st["mode"] == "sidecar", f"status annotation: {st}")
    name = st["sidecar"]
    init, regular = by_name(stored["spec"].get("initContainers"), name), by_name(stored["spec"]["containers"], name)
    if h.native_sidecars():
        check(init and init.get("restartPolicy") == "Always" and not regular,
              f"1.{h.server_minor} supports native sidecars, but {name} is not a native sidecar")
        return
    check(regular and not init, f"1.{h.server_minor} has no native sidecars, but {name} is not a classic container")
    # The classic form: first among the containers, held there by its postStart wait, its helper from the init
    # container pdp-injector-tools (mounted read-only), and otherwise the native form's container.
    check(stored["spec"]["containers"][0]["name"] == name, f"the classic sidecar {name} is not the first container")
    hook = (((regular.get("lifecycle") or {}).get("postStart") or {}).get("exec") or {}).get("command") or []
    check(hook[1:2] == ["wait"], f"the classic sidecar has no postStart wait: {hook}")
    check(by_name(stored["spec"].get("initContainers"), "pdp-injector-tools"), "no init container pdp-injector-tools")
    native = by_name(h.offline(p, namespace_doc=namespace_doc, native=True)[0]["spec"]["initContainers"], name)
    mounts = [m for m in regular.get("volumeMounts") or [] if m["name"] != "pdp-injector-tools"]
    check(len(mounts) + 1 == len(regular.get("volumeMounts") or []), "the classic sidecar does not mount its helper")
    for k in ["image", "args", "ports", "securityContext", "resources", "volumeMounts", "readinessProbe"]:
        d = diff_subset(native.get(k), mounts if k == "volumeMounts" else regular.get(k))
        check(not d, f"classic sidecar .{k} differs from the native one: {'; '.join(d[:3])}")


@case("pod-annotation-sidecar-default-profile", needs="server-version detection (classic sidecar below 1.29)")
def _(h):
    ns = h.namespace("pod-ann-sidecar")
    p = pod("app", ns, annotations={INJECT: "sidecar"})
    expected = h.offline(p)[0]
    _, err, rc = h.create(p)
    check(rc == 0, f"refused: {one_line(err)}")
    check_sidecar(h, p, h.get("pod", "app", ns), expected)


def namespace_case(h, value, *, pod_annotations=None):
    ns = h.namespace(f"ns-{value}", {NS_LABEL: value})
    p = pod("app", ns, annotations=pod_annotations)
    nsd = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {NS_LABEL: value}}}
    expected = h.offline(p, namespace_doc=nsd)[0]
    _, err, rc = h.create(p)
    check(rc == 0, f"refused: {one_line(err)}")
    return h.get("pod", "app", ns), expected, err, p, nsd


@case("namespace-opt-in-enabled", needs="namespace watch")
def _(h):
    stored, expected, *_ = namespace_case(h, "enabled")
    check(status_of(stored), "not injected in a namespace labelled pdp-injector.io/injection=enabled")
    assert_contains(expected, stored, "stored Pod")


@case("namespace-opt-in-daemonset", needs="namespace watch")
def _(h):
    stored, expected, *_ = namespace_case(h, "daemonset")
    check(status_of(stored), "not injected in a namespace labelled pdp-injector.io/injection=daemonset")
    assert_contains(expected, stored, "stored Pod")


@case("namespace-opt-in-sidecar", needs="namespace watch and server-version detection")
def _(h):
    stored, expected, _, p, nsd = namespace_case(h, "sidecar")
    check(status_of(stored), "not injected in a namespace labelled pdp-injector.io/injection=sidecar")
    check_sidecar(h, p, stored, expected, namespace_doc=nsd)


@case("namespace-disabled-beats-pod", needs="namespace watch")
def _(h):
    stored, expected, err, *_ = namespace_case(h, "disabled", pod_annotations={INJECT: "daemonset"})
    check(status_of(stored) is None and not stored["spec"].get("volumes"),
          "injected although the namespace is labelled pdp-injector.io/injection=disabled")
    check("namespace_override" in err, f"no namespace_override warning shown: {one_line(err)}")
    assert_contains(expected, stored, "stored Pod")


@case("pss-baseline-downgrade", needs="namespace watch")
def _(h):
    ns = h.namespace("pss-baseline", {PSS_LABEL: "baseline"})
    p = pod("app", ns, annotations={INJECT: "daemonset"})
    nsd = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {PSS_LABEL: "baseline"}}}
    expected = h.offline(p, namespace_doc=nsd)[0]
    out, err = h.must_create(p)
    stored = h.get("pod", "app", ns)
    check(status_of(stored), "not injected")
    check(not any("hostPath" in v for v in stored["spec"].get("volumes") or []),
          "a hostPath was added in a namespace enforcing baseline")
    check("CERBOS_PDP_ADDR" in env_names(stored["spec"]["containers"][0]), "TCP address not kept")
    check(re.search(r"^Warning: pdp-injector downgraded_pss", err, re.M),
          f"kubectl showed no downgraded_pss warning: {one_line(err)}")
    assert_contains(expected, stored, "stored Pod")


@case("reinvocation-wires-added-container-once")
def _(h):
    ns = h.namespace("reinvocation", {ADDER_NS_LABEL: "on"})
    p = pod("app", ns, annotations={INJECT: "daemonset", ADD_ANNOTATION: "late"})
    # Expected: ours, then the adder's container, then ours again on its own output.
    first = h.offline(p)[0]
    check(not by_name(first["spec"]["containers"], "late"), "offline reference already has the late container")
    first["spec"]["containers"].append({"name": "late", "image": PAUSE})
    expected = h.offline(first)[0]
    start = len(h.adder_record.read_text().splitlines()) if h.adder_record.exists() else 0
    h.must_create(p)
    stored = h.get("pod", "app", ns)
    calls = [json.loads(l) for l in h.adder_record.read_text().splitlines()[start:]]
    check(any(c["patched"] for c in calls), "the second webhook never added its container")
    late = by_name(stored["spec"]["containers"], "late")
    check(late, "container 'late' from the second webhook is missing")
    check(env_names(late).count("CERBOS_PDP_ADDR") == 1, f"late container not wired exactly once: {env_names(late)}")
    app = stored["spec"]["containers"][0]
    check(env_names(app).count("CERBOS_PDP_ADDR") == 1, f"app container env duplicated: {env_names(app)}")
    assert_contains(expected, stored, "stored Pod")


# -- pdp-injector check ---------------------------------------------------------------------------------------------
# Local mode only: the harness installs what `check` reads besides the webhook (Secret, ConfigMap, Deployment,
# the PDP DaemonSet) in setup, so Install is in order and every finding comes from the case itself.


def findings(report, severity=None):
    return [f for s in report["sections"] for f in s["findings"] if severity is None or f["severity"] == severity]


def codes(report, severity="error"):
    return sorted({f["code"] for f in findings(report, severity)})


def finding(report, code):
    for f in findings(report):
        if f["code"] == code:
            return f
    raise Fail(f"check reported no {code}: " + one_line(json.dumps(findings(report, "error")), 500))


def needs_local(h):
    if h.existing:
        log("check cases need the local cluster (they install check's fixtures): skipped")
        return True
    return False


def workload(h, ns, name="web", pods=("web-a", "web-b"), **pod_kw):
    """Deployment `name` -> ReplicaSet `name-1` -> Pods, linked by owner references as the controllers would
    (none runs here), so that check can resolve the Pods' workload."""
    labels = {"app": name}
    tmpl = {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "app", "image": PAUSE}]}}
    dep, _ = h.must_create({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": ns},
                            "spec": {"replicas": len(pods), "selector": {"matchLabels": labels}, "template": tmpl}})
    owner = lambda kind, o: [{"apiVersion": "apps/v1", "kind": kind, "name": o["metadata"]["name"],  # noqa: E731
                              "uid": o["metadata"]["uid"], "controller": True}]
    rs, _ = h.must_create({"apiVersion": "apps/v1", "kind": "ReplicaSet",
                           "metadata": {"name": f"{name}-1", "namespace": ns, "ownerReferences": owner("Deployment", dep)},
                           "spec": {"replicas": len(pods), "selector": {"matchLabels": labels}, "template": tmpl}})
    for p in pods:
        body = pod(p, ns, labels=labels, **pod_kw)
        body["metadata"]["ownerReferences"] = owner("ReplicaSet", rs)
        h.must_create(body)


@case("check-in-order-reports-nothing")
def _(h):
    if needs_local(h):
        return
    ns = h.namespace("check-in-order", {NS_LABEL: "enabled", PSS_LABEL: "privileged"})
    workload(h, ns)
    h.must_create(pod("solo", ns, annotations={INJECT: "sidecar"}))
    rc, report, err = h.check(ns)
    check(rc == 0, f"exit {rc} on a cluster in order: errors {codes(report) if report else err}: "
                   f"{one_line(json.dumps(findings(report, 'error')) if report else '', 1500)}")
    check(report["ok"] and not findings(report, "warning"),
          f"warnings on a cluster in order: {one_line(json.dumps(findings(report, 'warning')))}")
    for code in ["config_loaded", "webhook_registered", "serving_cert_trusted", "endpoint_trusted", "webhook_ready",
                 "pdp_daemonset", "namespace_opted_in"]:
        finding(report, code)
    check("socket" in finding(report, "namespace_opted_in")["message"], "namespace line does not explain the socket")
    pods_section = [s for s in report["sections"] if s["name"] == "pods"][0]
    check(pods_section["summary"].startswith("3 Pods compared"), f"pods summary {pods_section['summary']!r}")
    # The readable form: sections and a verdict, no colour when not on a terminal.
    env = {**os.environ, "KUBECONFIG": str(h.kubeconfig)}
    text = run([h.bin, "check", "-n", ns], check_rc=False, env=env, timeout=120)
    check(text.returncode == 0 and "Install" in text.stdout and "in order:" in text.stdout
          and "\x1b[" not in text.stdout, f"text report: {one_line(text.stdout[-300:])}")
    # No cluster to check: exit status 2, not 1.
    bogus = h.workdir / "nowhere.kubeconfig"
    bogus.write_text(h.kubeconfig_text(free_port(), h.workdir / "pki/ca.crt", "x", "nobody"))
    rc, _, err = h.check(ns, kubeconfig=bogus)
    check(rc == 2 and "cannot reach the apiserver" in err, f"unreachable cluster: exit {rc}, {one_line(err)}")


@case("check-pod-created-while-webhook-not-registered")
def _(h):
    if needs_local(h):
        return
    ns = h.namespace("check-unregistered")
    h.kubectl("delete", "mutatingwebhookconfiguration", "pdp-injector")
    try:
        probe = pod("probe", ns, annotations={INJECT: "daemonset"})
        h.wait_for("the apiserver to stop calling the webhook",
                   lambda: status_of(h.create(probe, dry_run=True)[0]) is None, timeout=30)
        h.must_create(pod("app", ns, annotations={INJECT: "daemonset"}))
        rc, report, err = h.check(ns)
        check(rc == 1, f"exit {rc}, expected 1: {one_line(err)}")
        check("webhook_missing" in codes(report), f"errors {codes(report)}")
        f = finding(report, "not_wired")
        check(f["subject"] == f"Pod {ns}/app" and f["pods"] == [f"{ns}/app"], f"finding {f}")
    finally:
        h.register_webhooks()
    rc, report, _ = h.check(ns)
    check(codes(report) == ["not_wired"], f"after re-registering: errors {codes(report)}")
    check("kubectl delete pod app" in finding(report, "not_wired")["fix"], "no fix for a bare Pod")


@case("check-namespace-labelled-after-its-pods")
def _(h):
    if needs_local(h):
        return
    ns = h.namespace("check-late-label")
    workload(h, ns, pods=("web-a",))
    check(status_of(h.get("pod", "web-a", ns)) is None, "injected before the namespace opted in")
    rc, report, _ = h.check(ns)
    check(rc == 0, f"exit {rc} before the label: {codes(report)}")
    h.kubectl("label", "namespace", ns, f"{NS_LABEL}=enabled")
    rc, report, _ = h.check(ns)
    check(rc == 1 and codes(report) == ["not_wired"], f"exit {rc}, errors {codes(report)}")
    f = finding(report, "not_wired")
    check(f["subject"] == f"Deployment {ns}/web", f"not grouped by its Deployment: {f['subject']}")
    check(f["fix"] == f"kubectl rollout restart deployment/web -n {ns}", f"fix {f['fix']!r}")


@case("check-config-change-makes-pods-stale")
def _(h):
    if needs_local(h):
        return
    ns = h.namespace("check-stale", {NS_LABEL: "enabled"})
    workload(h, ns)
    rc, report, _ = h.check(ns)
    check(rc == 0, f"exit {rc} with the installed config: {codes(report)}")
    cfg = yaml.safe_load(h.config_path.read_text())
    cfg["profiles"]["cerbos"]["image"] = "ghcr.io/cerbos/cerbos:0.99.0"
    changed = h.workdir / "config-changed.yaml"
    changed.write_text(yaml.safe_dump(cfg, sort_keys=False))
    rc, report, _ = h.check(ns, "--config", str(changed))
    check(rc == 1 and codes(report) == ["stale_config"], f"exit {rc}, errors {codes(report)}")
    f = finding(report, "stale_config")
    check(sorted(f["pods"]) == [f"{ns}/web-a", f"{ns}/web-b"], f"pods {f['pods']}")
    check(f["fix"] == f"kubectl rollout restart deployment/web -n {ns}", f"fix {f['fix']!r}")
    # A config that does not load: exit 2, before anything is read.
    bad = h.workdir / "config-bad.yaml"
    bad.write_text("defaultMode: sometimes\n")
    rc, _, err = h.check(ns, "--config", str(bad))
    check(rc == 2 and "defaultMode" in err, f"bad --config: exit {rc}, {one_line(err)}")


@case("check-opted-out-after-wiring")
def _(h):
    if needs_local(h):
        return
    ns = h.namespace("check-opt-out", {NS_LABEL: "enabled"})
    h.must_create(pod("app", ns))
    h.must_create(pod("annotated", ns, annotations={INJECT: "daemonset"}))
    check(status_of(h.get("pod", "app", ns)), "not injected in an opted-in namespace")
    # A Pod's annotations may change after creation (its spec may not): opted out, still wired.
    h.kubectl("annotate", "pod", "-n", ns, "annotated", f"{INJECT}=disabled", "--overwrite")
    rc, report, _ = h.check(ns)
    f = finding(report, "not_wanted")
    check(rc == 1 and f["pods"] == [f"{ns}/annotated"] and "opted_out" in f["message"], f"finding {f}")
    h.kubectl("label", "namespace", ns, f"{NS_LABEL}=disabled", "--overwrite")
    rc, report, _ = h.check(ns)
    wanted = [f for f in findings(report, "error") if f["code"] == "not_wanted"]
    check(len(wanted) == 2 and any("namespace_opted_out" in f["message"] for f in wanted),
          f"after the namespace opted out: {one_line(json.dumps(wanted))}")
    check(finding(report, "namespace_opted_out")["severity"] == "info", "namespace not listed as opted out")


@case("check-pre-judges-each-model")
def _(h):
    # Before install, on this 1.20 server: no guards below 1.30, and a Pod holding hostPort 3593 stops only the
    # daemonset model; asking for central alone is then in order.
    ns = h.namespace("check-pre", {PSS_LABEL: "restricted"})
    h.must_create(pod("holder", ns, containers=[
        {"name": "c", "image": PAUSE, "ports": [{"containerPort": 8080, "hostPort": 3593}]}]))
    rc, report, err = h.check(ns, "--pre")
    check(rc == 1 and report is not None, f"exit {rc}, expected 1: {one_line(err)}")
    check(finding(report, "kubernetes_version")["message"].startswith("v1.20"), "version")
    check(finding(report, "admission_policies_skipped")["severity"] == "info", "guards below 1.30")
    check(finding(report, "admission_api")["severity"] == "ok", "admissionregistration.k8s.io/v1")
    check(finding(report, "csi_api")["severity"] == "ok", "storage.k8s.io/v1 CSIDriver")
    f = finding(report, "namespace_pod_security")
    check(f["subject"] == f"namespace {ns}" and "restricted" in f["message"], f"finding {f}")
    f = finding(report, "node_port_taken")
    check(f["subject"] == f"Pod {ns}/holder" and "3593" in f["message"] and f.get("fix"), f"finding {f}")
    check(finding(report, "critical_priority")["severity"] == "ok", "system-node-critical")
    verdicts = {f["subject"]: f for f in findings(report) if f["code"].startswith("model_")}
    ds = verdicts["model daemonset"]
    check(ds["code"] == "model_cannot_run" and "[node_port_taken]" in ds["message"], f"daemonset {ds}")
    for m in ["central", "sidecar"]:
        check(verdicts[f"model {m}"]["code"] == "model_can_run", f"{m}: {verdicts[f'model {m}']}")
    rc, report, err = h.check(ns, "--pre", "--model", "central")
    check(rc == 0, f"exit {rc} with --model central: {one_line(err)} {codes(report) if report else ''}")
    check(finding(report, "node_port_taken")["severity"] == "warning", "not asked: a warning")


@case("check-node-without-pdp")
def _(h):
    if needs_local(h):
        return
    ns = h.namespace("check-node", {NS_LABEL: "daemonset"})
    node = f"e2e-node-{secrets.token_hex(2)}"
    # No kubelet runs here: a Node object is all the API needs, and no DaemonSet controller gives it a PDP.
    h.must_create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    try:
        h.must_create(pod("app", ns, nodeName=node))
        rc, report, _ = h.check(ns)
        check(rc == 1, f"exit {rc}, expected 1")
        f = finding(report, "node_without_pdp")
        check(f["subject"] == f"node {node}" and f["pods"] == [f"{ns}/app"], f"finding {f}")
        check("cerbos-pdp" in f["message"], f"message {f['message']!r}")
        # The PDP DaemonSet gone: every daemonset-wired Pod lacks its PDP.
        ds = h.get("daemonset", "cerbos-pdp", "pdp-node")
        h.kubectl("-n", "pdp-node", "delete", "daemonset", "cerbos-pdp")
        try:
            rc, report, _ = h.check(ns)
            check("pdp_daemonset_missing" in codes(report), f"errors {codes(report)}")
        finally:
            for k in ["resourceVersion", "uid", "creationTimestamp", "generation", "managedFields"]:
                ds["metadata"].pop(k, None)
            ds.pop("status", None)
            h.kubectl("apply", "-f", "-", input=ds)
    finally:
        h.kubectl("delete", "pod", "-n", ns, "app", "--wait=false", check_rc=False)
        h.kubectl("delete", "node", node, "--wait=false", check_rc=False)


@case("pod-annotation-central")
def _(h):
    ns = h.namespace("pod-ann-central")
    stored, _ = create_and_compare(h, pod("app", ns, annotations={INJECT: "central"}))
    st = status_of(stored)
    check(st and st["mode"] == "central" and st["reason"] == "injected_central", f"status annotation: {st}")
    env = {e["name"]: e.get("value") for e in stored["spec"]["containers"][0].get("env") or []}
    check(env.get("CERBOS_PDP_ADDR") == CENTRAL_ADDR, f"CERBOS_PDP_ADDR as stored: {env}")
    check(not stored["spec"].get("volumes") and not stored["spec"].get("initContainers"),
          "central mode added volumes or containers")


@case("namespace-opt-in-central", needs="namespace watch")
def _(h):
    stored, expected, *_ = namespace_case(h, "central")
    check((status_of(stored) or {}).get("mode") == "central",
          "not wired centrally in a namespace labelled pdp-injector.io/injection=central")
    assert_contains(expected, stored, "stored Pod")


@case("several-profiles-reinvocation")
def _(h):
    # cerbos and flagd-node in one Pod, then a second webhook adds a container: each profile wires it once.
    ns = h.namespace("several", {ADDER_NS_LABEL: "on"})
    p = pod("app", ns, annotations={INJECT: "daemonset", PROFILE: "cerbos,flagd-node", ADD_ANNOTATION: "late"})
    first = h.offline(p)[0]
    first["spec"]["containers"].append({"name": "late", "image": PAUSE})
    expected = h.offline(first)[0]
    h.must_create(p)
    stored = h.get("pod", "app", ns)
    late = by_name(stored["spec"]["containers"], "late")
    check(late, "container 'late' from the second webhook is missing")
    for var in ["CERBOS_PDP_ADDR", "FLAGD_ADDR", "FLAGD_RESOLVER"]:
        for c in (stored["spec"]["containers"][0], late):
            check(env_names(c).count(var) == 1, f"{c['name']} not wired exactly once with {var}: {env_names(c)}")
    ann = stored["metadata"].get("annotations") or {}
    check("pdp-injector.io/status-flagd-node" in ann, f"no status of the second profile: {ann}")
    assert_contains(expected, stored, "stored Pod")


@case("flagd-node-manifests-accepted")
def _(h):
    # The node-local flagd as overlays/flagd-node-k8s-1.20 renders it, judged by this apiserver (1.20.2 when the
    # tier builds its own): the FeatureFlag CRD (pdp.flagdNode.installCRD) and the namespace flagd-node created
    # for real, then every object of the overlay sent as a server-side dry run, so this version's schemas,
    # defaulting and admission see them and the FeatureFlag is checked against the CRD's schema. Only the CRD and
    # the namespace are stored (no flagd runs: no image of it is reachable here).
    if needs_local(h):
        return
    crd = REPO / "manifests/overlays/flagd-node-crd/flagd-node/featureflags-crd.yaml"
    rendered = h.kubectl("kustomize", str(REPO / "manifests/overlays/flagd-node-k8s-1.20")).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    kinds = {d["kind"] for d in docs}
    check({"FeatureFlag", "DaemonSet", "Role", "ValidatingAdmissionPolicy"} & kinds
          == {"FeatureFlag", "DaemonSet", "Role"}, f"unexpected kinds in the 1.20 overlay: {sorted(kinds)}")
    h.kubectl("apply", "-f", str(crd))
    try:
        h.kubectl("wait", "--for=condition=Established", "crd/featureflags.core.openfeature.dev", "--timeout=30s")
        ns = next(d for d in docs if d["kind"] == "Namespace" and d["metadata"]["name"] == "flagd-node")
        h.kubectl("apply", "-f", "-", input=ns)
        out = h.kubectl("apply", "--dry-run=server", "-f", "-", input={"apiVersion": "v1", "kind": "List",
                                                                        "items": docs}, check_rc=False)
        check(out.returncode == 0, f"the apiserver refused objects of the overlay: {out.stderr.strip()[-800:]}")
        lines = [line for line in out.stdout.splitlines() if line.strip()]
        check(len(lines) == len(docs) and all("(server dry run)" in line for line in lines),
              f"{len(lines)} of {len(docs)} objects answered as a server dry run: {lines[:5]}")
        # A flag the CRD's schema forbids is refused by the apiserver, not only by flagd.
        ff = copy.deepcopy(next(d for d in docs if d["kind"] == "FeatureFlag"))
        ff["spec"]["flagSpec"]["flags"]["new-checkout"]["state"] = "ON"
        bad = h.kubectl("apply", "--dry-run=server", "-f", "-", input=ff, check_rc=False)
        check(bad.returncode != 0 and "state" in bad.stderr, f"a FeatureFlag with state ON: {bad.stderr.strip()}")
    finally:
        # No namespace controller runs here: the namespace stays Terminating, with nothing in it.
        h.kubectl("delete", "namespace", "flagd-node", "--wait=false", check_rc=False)
        h.kubectl("delete", "-f", str(crd), "--wait=false", check_rc=False)


@case("required-namespace-refuses-forged-status-and-opt-out", needs="namespace watch")
def _(h):
    ns = h.namespace("required", {NS_LABEL: "daemonset", REQUIRED_LABEL: "true"})
    h.must_create(pod("wired", ns))
    status = (h.get("pod", "wired", ns)["metadata"].get("annotations") or {}).get(STATUS)
    check(status, "a Pod of a required namespace was not wired")
    app = {"name": "app", "image": PAUSE}
    refused = [
        ("forged", {STATUS: status}, None, "forged_status"),
        ("opted-out", {INJECT: "disabled"}, None, "required_opt_out"),
        ("named", None, [app, {"name": "cerbos-pdp", "image": PAUSE}], "pdp_container_named"),
    ]
    for name, ann, containers, code in refused:
        out, err, rc = h.create(pod(name, ns, annotations=ann, containers=containers))
        check(rc != 0 and code in err and ns in err, f"{name}: not refused with {code}: rc {rc}, {one_line(err)}")
        check(h.get("pod", name, ns) is None, f"{name}: the refused Pod was stored")
    # Only the chosen profile's container name counts: a container named flagd does not stop the Cerbos wiring.
    h.must_create(pod("flagd", ns, containers=[app, {"name": "flagd", "image": PAUSE}]))
    stored = h.get("pod", "flagd", ns)
    check((status_of(stored) or {}).get("profile") == "cerbos", f"not wired for cerbos: {status_of(stored)}")
    check("CERBOS_PDP_ADDR" in env_names(by_name(stored["spec"]["containers"], "app")), "app container not wired")
    # Elsewhere the copied status is not believed either: the Pod is wired, with a warning.
    other = h.namespace("forged-elsewhere", {NS_LABEL: "daemonset"})
    out, err = h.must_create(pod("forged", other, annotations={STATUS: status}))
    stored = h.get("pod", "forged", other)
    check("CERBOS_PDP_ADDR" in env_names(stored["spec"]["containers"][0]),
          "a Pod with a copied status was left unwired")
    check("status_not_carried" in err, f"kubectl showed no status_not_carried warning: {one_line(err)}")


@case("check-flags-a-status-the-pod-does-not-carry")
def _(h):
    if needs_local(h):
        return
    ns = h.namespace("check-forged")
    wired, _ = create_and_compare(h, pod("wired", ns, annotations={INJECT: "daemonset"}))
    h.must_create(pod("copied", ns))
    # The status of the wired Pod, written onto an unwired one (an UPDATE, which the webhook never sees).
    h.kubectl("-n", ns, "annotate", "pod", "copied", f"{INJECT}=daemonset",
              f"{STATUS}={wired['metadata']['annotations'][STATUS]}")
    rc, report, err = h.check(ns)
    check(rc != 0, f"check exited {rc} with a Pod whose status claims a wiring it does not carry")
    f = finding(report, "status_not_carried")
    check("copied" in json.dumps(f) and "is missing" in f["message"], f"finding {f}")
    check(f["severity"] == "error", f"severity {f['severity']}")


@case("check-flags-nothing-in-order-with-the-shipped-role-and-no-secret-read")
def _(h):
    # check as its shipped role allows (manifests/overlays/daemonset/webhook/rbac-check.yaml): list and get, no Secret. The serving
    # certificate is judged at the live endpoint against caBundle; the Secret is said to be unreadable (info).
    if needs_local(h):
        return
    h.kubectl("apply", "-f", str(REPO / "manifests/overlays/daemonset/webhook/rbac-check.yaml"))
    for kind in ["clusterrolebinding", "rolebinding"]:
        args = ["create", kind, "e2e-checker", f"--{'clusterrole' if kind == 'clusterrolebinding' else 'role'}"
                "=pdp-injector-check", "--user=e2e-checker"] + (["-n", "pdp-system"] if kind == "rolebinding" else [])
        h.kubectl(*args)
    out = h.kubectl("auth", "can-i", "get", "secret/pdp-injector-tls", "-n", "pdp-system", "--as=e2e-checker",
                    check_rc=False)
    check(out.stdout.strip() == "no", f"the check role may read the TLS Secret: {out.stdout.strip()}")
    ns = h.namespace("check-role", {NS_LABEL: "enabled", PSS_LABEL: "privileged"})
    h.must_create(pod("app", ns))
    rc, report, err = h.check(ns, kubeconfig=h.checker_kubeconfig)
    check(rc == 0, f"exit {rc} with the shipped role: errors {codes(report) if report else err}")
    check(finding(report, "serving_secret_unreadable")["severity"] == "info", "Secret finding not info")
    finding(report, "endpoint_trusted")


@case("doubt-on-generic-path-fail-refuses-ignore-admits")
def _(h):
    # A second webhook whose account may read no namespace (and that never saw one), registered on the generic
    # path /mutate twice: a Fail entry, as an admin might write by hand, and an Ignore entry. Doubt is answered
    # with an error on /mutate too, so the failure policy decides: Fail refuses, Ignore admits as before.
    if needs_local(h):
        return
    port = free_port(h.webhook_host)
    c = h.workdir / "webhook-certs"
    h.start("doubtful-webhook", [h.bin, "serve", "--listen", f"{h.webhook_host}:{port}", "--cert",
                                 str(c / "tls.crt"), "--key", str(c / "tls.key"), "--config", str(h.config_path)],
            env={"KUBECONFIG": str(h.nobody_kubeconfig)})
    label = "e2e.pdp-injector.io/doubt"

    def entry(policy):
        return {"name": f"doubt-{policy.lower()}.e2e.pdp-injector.io", "admissionReviewVersions": ["v1"],
                "sideEffects": "None", "timeoutSeconds": 5, "failurePolicy": policy,
                "clientConfig": {"url": f"https://{h.webhook_host}:{port}/mutate", "caBundle": h.ca_bundle},
                "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                           "resources": ["pods"], "scope": "Namespaced"}],
                "namespaceSelector": {"matchLabels": {label: policy.lower()}}}

    name = "zz-pdp-injector-e2e-doubt"
    mwc = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
           "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "pdp-injector-e2e"}},
           "webhooks": [entry("Fail"), entry("Ignore")]}
    try:
        h.wait_for("doubtful webhook /healthz", lambda: h.https_get(port, "/healthz")[0] == 200, timeout=30,
                   proc="doubtful-webhook")
        h.kubectl("apply", "-f", "-", input=mwc)
        fail_ns = h.namespace("doubt-fail", {label: "fail"})
        ignore_ns = h.namespace("doubt-ignore", {label: "ignore"})
        p = pod("app", fail_ns, annotations={INJECT: "daemonset"})
        state = {}

        def refused_by_doubt():
            state["out"], state["err"], state["rc"] = h.create(p, dry_run=True)
            return state["rc"] != 0 and "doubt-fail.e2e.pdp-injector.io" in state["err"]

        h.wait_for("the doubt registration to take effect", refused_by_doubt, timeout=60, interval=1)
        out, err, rc = h.create(p)
        check(rc != 0, "a Pod whose namespace the webhook could not read was admitted through a Fail entry on /mutate")
        # An HTTP 503, which the apiserver reports as a failed call (it does not quote the body); the webhook's
        # log says why.
        check('failed calling webhook "doubt-fail.e2e.pdp-injector.io"' in err, f"unexpected refusal: {one_line(err)}")
        said = [line for line in h.log_tail("doubtful-webhook", 200).splitlines()
                if "namespace_unreadable" in line and fail_ns in line]
        check(said, f"the webhook's log does not say why: {one_line(h.log_tail('doubtful-webhook', 5))}")
        check(h.get("pod", "app", fail_ns) is None, "the refused Pod was stored")
        q = pod("app", ignore_ns, annotations={INJECT: "daemonset"})
        out, err, rc = h.create(q)
        check(rc == 0, f"the Ignore entry on /mutate refused the Pod: {one_line(err)}")
        # The shipped webhook (which can read the namespace) still wired it.
        check(status_of(h.get("pod", "app", ignore_ns)), "the Pod admitted past the Ignore entry is not wired")
    finally:
        h.kubectl("delete", "mutatingwebhookconfiguration", name, "--ignore-not-found", check_rc=False)
        h.stop("doubtful-webhook")


# -- every finding code of check, each produced here: the table of scripts/e2e/check_codes.py -----------------------

check_codes.register(case, types.SimpleNamespace(
    pod=pod, needs_local=needs_local, log=log, PAUSE=PAUSE, STATUS=STATUS, INJECT=INJECT, NS_LABEL=NS_LABEL,
    PSS_LABEL=PSS_LABEL, NAME_LABEL=NAME_LABEL, RUN_LABEL=RUN_LABEL))


# -- the webhook down, then back ----------------------------------------------------------------------------------

@case("webhook-down-ignore-admits-other-namespaces")
def _(h):
    h.stop("pdp-injector")
    plain = h.namespace("down-ignore")
    disabled = h.namespace("down-ignore-disabled", {NS_LABEL: "disabled"})
    for ns, ann in [(plain, {}), (plain, {INJECT: "daemonset"}), (disabled, {})]:
        name = f"app-{len(ann)}"
        out, err, rc = h.create(pod(name, ns, annotations=ann))
        check(rc == 0, f"Pod {ns}/{name} refused while the webhook is down (Ignore entry): {one_line(err)}")
        stored = h.get("pod", name, ns)
        check(status_of(stored) is None, "injected while the webhook was down?")


@case("webhook-down-fail-blocks-opted-in-namespaces")
def _(h):
    check(not h.alive("pdp-injector"), "the webhook is still running")
    for value in ["enabled", "sidecar", "daemonset", "central"]:
        ns = h.namespace(f"down-fail-{value}", {NS_LABEL: value})
        out, err, rc = h.create(pod("app", ns))
        check(rc != 0, f"a Pod in a namespace labelled {value} was admitted while the webhook is down")
        check('failed calling webhook "namespaces.pdp-injector.io"' in err, f"unexpected refusal: {one_line(err)}")
        check(h.get("pod", "app", ns) is None, "the refused Pod was stored")


@case("webhook-recovers")
def _(h):
    h.start_webhook()
    ns = h.namespace("recovered", {NS_LABEL: "enabled"})
    # Annotated too, so this checks recovery of the Fail entry even without the namespace watch.
    deadline = time.monotonic() + 30
    while True:
        out, err, rc = h.create(pod("app", ns, annotations={INJECT: "daemonset"}))
        if rc == 0 or time.monotonic() > deadline:
            break
        time.sleep(1)
    check(rc == 0, f"still refused 30 s after the webhook came back: {one_line(err)}")
    check(status_of(h.get("pod", "app", ns)), "not injected after recovery (namespace labelled enabled)")
    plain = h.namespace("recovered-plain")
    create_and_compare(h, pod("app", plain, annotations={INJECT: "daemonset"}))
