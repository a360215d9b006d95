"""Template tests of the Helm chart (charts/pdp-injector): `helm template` with chosen values, assertions on the
parsed objects. Each optional object is checked off by default and on when its value asks, for each pdp.model;
the schema's refusals of wrong types; the PrometheusRule's metrics exist in the source; the README's values
table is the one scripts/chart_readme.py writes. Run by .ci/run (unittest; pytest collects the same):

    python3 -m unittest discover -s scripts -p 'test_chart.py'

Needs PyYAML (scripts/helm-check.sh installs it), helm (fetched and verified by scripts/helm_check.py) and
promtool (Debian's package prometheus, fetched by apt-get download and cached next to helm; PROMTOOL overrides).
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts/pdp-injector"
sys.path.insert(0, str(REPO / "scripts"))
import chart_readme  # noqa: E402
import helm_check  # noqa: E402

ALERT_TESTS = REPO / "scripts/test_chart_alerts.yaml"
MODELS = ("central", "daemonset", "sidecar")
MONITORING_API = ("monitoring.coreos.com/v1/ServiceMonitor", "monitoring.coreos.com/v1/PrometheusRule")
SM_ON = ("metrics.serviceMonitor.enabled=true",)
PR_ON = ("metrics.prometheusRule.enabled=true",)
FLAG_SYNC = ("pdp.flagSync.enabled=true",)
# Both monitoring objects, with the flag sync, an interval and labels.
ALL_ON = (*SM_ON, *PR_ON, *FLAG_SYNC, "metrics.serviceMonitor.interval=1m",
          "metrics.serviceMonitor.labels.release=prometheus", "metrics.prometheusRule.labels.release=prometheus")
# The metrics the PrometheusRule uses, as Prometheus names them (a counter's _total, a histogram's _bucket).
RULE_METRICS = {
    "pdp_injector_ready",
    "pdp_injector_request_errors_total",
    "pdp_injector_request_duration_seconds_bucket",
    "pdp_injector_denials_total",
    "pdp_injector_config_reloads_total",
    "pdp_injector_certificate_reloads_total",
    "pdp_injector_certificate_expiry_timestamp_seconds",
    "pdp_flag_sync_upstream_generation",
    "pdp_flag_sync_generation",
    "pdp_flag_sync_update_lag_seconds_bucket",
}
HELM = None
_renders = {}


def _helm(sets, api=False, kube="1.33.0", chart=CHART):
    cmd = [str(HELM), "template", "pdp-injector", str(chart), "--namespace", "default", "--kube-version", kube]
    for s in sets:
        cmd += ["--set", s]
    if api:
        for a in MONITORING_API:
            cmd += ["--api-versions", a]
    return subprocess.run(cmd, capture_output=True, text=True)


def render(*sets, api=False, kube="1.33.0"):
    """The objects of one rendering (cached; the module renders every case up front, in parallel)."""
    k = (sets, api, kube)
    if k not in _renders:
        _renders[k] = _helm(sets, api, kube)
    p = _renders[k]
    if p.returncode != 0:
        raise AssertionError(f"helm template {' '.join(sets)} failed: {p.stderr.strip()[-600:]}")
    return [d for d in yaml.safe_load_all(p.stdout) if d]


def refused(*sets, api=False, kube="1.33.0"):
    """helm template's error message; fails the test if it rendered."""
    k = (sets, api, kube)
    if k not in _renders:
        _renders[k] = _helm(sets, api, kube)
    p = _renders[k]
    if p.returncode == 0:
        raise AssertionError(f"helm template {' '.join(sets)} rendered; it must fail")
    return " ".join(p.stderr.split())


def of_kind(objs, kind):
    return [d for d in objs if d["kind"] == kind]


def named(objs, kind, name, namespace=None):
    found = [d for d in objs if d["kind"] == kind and d["metadata"]["name"] == name
             and (namespace is None or d["metadata"].get("namespace") == namespace)]
    if len(found) != 1:
        raise AssertionError(f"{len(found)} {kind} {namespace or ''}/{name} in the rendering, want 1; it has: "
                             + ", ".join(sorted(f"{d['kind']}/{d['metadata']['name']}" for d in objs)))
    return found[0]


def pod_templates(objs, namespace):
    return [d["spec"]["template"] for d in objs if d["kind"] in ("Deployment", "DaemonSet")
            and d["metadata"].get("namespace") == namespace]


def selects(selector, labels):
    return all((labels or {}).get(k) == v for k, v in selector.items())


# Every rendering the tests use, rendered at once.
CASES = (
    [((f"pdp.model={m}",), False, "1.33.0") for m in MODELS]
    + [((f"pdp.model={m}", *SM_ON, *PR_ON), True, "1.33.0") for m in MODELS]
    + [((f"pdp.model={m}", *ALL_ON), True, "1.33.0") for m in MODELS]
    + [((f"pdp.model={m}", "podDisruptionBudget.enabled=false", *FLAG_SYNC, "pdp.flagSync.replicas=2"), False,
        "1.33.0") for m in MODELS]
    + [((f"pdp.model={m}", "networkPolicy.enabled=true"), False, "1.33.0") for m in MODELS]
    + [((f"pdp.model={m}", "networkPolicy.enabled=true", *FLAG_SYNC,
         "networkPolicy.metricsNamespaceSelector.matchLabels.team=monitoring"), False, "1.33.0") for m in MODELS]
)


def setUpModule():
    global HELM
    HELM = helm_check.helm_binary()
    with ThreadPoolExecutor(max_workers=4) as pool:
        for k, p in zip(CASES, pool.map(lambda c: _helm(*c), CASES)):
            _renders[k] = p


class Defaults(unittest.TestCase):
    def test_every_optional_object_is_off_by_default(self):
        for m in MODELS:
            with self.subTest(model=m):
                objs = render(f"pdp.model={m}")
                self.assertEqual(of_kind(objs, "ServiceMonitor"), [])
                self.assertEqual(of_kind(objs, "PrometheusRule"), [])
                self.assertEqual(of_kind(objs, "NetworkPolicy"), [])
                self.assertFalse([d for d in objs if d["metadata"]["name"] == "pdp-flag-sync"])

    def test_the_shipped_budgets_stay_on_by_default(self):
        for m in MODELS:
            with self.subTest(model=m):
                objs = render(f"pdp.model={m}")
                pdbs = {(d["metadata"]["namespace"], d["metadata"]["name"]): d["spec"]
                        for d in of_kind(objs, "PodDisruptionBudget")}
                want = {("pdp-system", "pdp-injector")} | ({("pdp-central", "cerbos-pdp")} if m == "central" else set())
                self.assertEqual(set(pdbs), want)
                for spec in pdbs.values():
                    self.assertEqual(spec["minAvailable"], 1)
                    self.assertNotIn("maxUnavailable", spec)


class ServiceMonitors(unittest.TestCase):
    def test_the_webhook_is_scraped_over_https_in_every_model(self):
        for m in MODELS:
            with self.subTest(model=m):
                objs = render(f"pdp.model={m}", *SM_ON, *PR_ON, api=True)
                self.assertEqual([d["metadata"]["name"] for d in of_kind(objs, "ServiceMonitor")], ["pdp-injector"])
                ep = named(objs, "ServiceMonitor", "pdp-injector", "pdp-system")["spec"]["endpoints"][0]
                self.assertEqual((ep["port"], ep["scheme"], ep["path"], ep["interval"]), ("https", "https", "/metrics", "30s"))
                self.assertEqual(ep["tlsConfig"]["serverName"], "pdp-injector.pdp-system.svc")
                self.assertEqual(ep["tlsConfig"]["ca"]["secret"], {"name": "pdp-injector-tls", "key": "ca.crt"})

    def test_with_flag_sync_the_source_and_the_relays_are_scraped_with_the_values(self):
        for m in MODELS:
            with self.subTest(model=m):
                objs = render(f"pdp.model={m}", *ALL_ON, api=True)
                sms = {(d["metadata"]["namespace"], d["metadata"]["name"]): d for d in of_kind(objs, "ServiceMonitor")}
                self.assertEqual(set(sms), {("pdp-system", "pdp-injector"), ("pdp-system", "pdp-flag-sync"),
                                            ("pdp-flags", "pdp-flag-relay")})
                for sm in sms.values():
                    self.assertEqual(sm["metadata"]["labels"]["release"], "prometheus")
                    self.assertEqual(sm["metadata"]["labels"]["app.kubernetes.io/managed-by"], "Helm")
                    self.assertEqual(sm["spec"]["endpoints"][0]["interval"], "1m")

    def test_each_endpoint_is_a_port_of_a_service_that_reaches_a_container_port(self):
        objs = render("pdp.model=central", *ALL_ON, api=True)
        for sm in of_kind(objs, "ServiceMonitor"):
            with self.subTest(sm=sm["metadata"]["name"]):
                ns = sm["spec"]["namespaceSelector"]["matchNames"]
                self.assertEqual(ns, [sm["metadata"]["namespace"]])
                services = [s for s in of_kind(objs, "Service") if s["metadata"]["namespace"] in ns
                            and selects(sm["spec"]["selector"]["matchLabels"], s["metadata"].get("labels"))]
                self.assertEqual(len(services), 1, f"Services selected: {[s['metadata']['name'] for s in services]}")
                svc = services[0]
                port = next((p for p in svc["spec"]["ports"] if p["name"] == sm["spec"]["endpoints"][0]["port"]), None)
                self.assertIsNotNone(port, f"Service {svc['metadata']['name']} has no port {sm['spec']['endpoints'][0]['port']}")
                pods = [t for t in pod_templates(objs, svc["metadata"]["namespace"])
                        if selects(svc["spec"]["selector"], t["metadata"]["labels"])]
                self.assertTrue(pods, "the Service selects no Pods")
                names = {p.get("name") for t in pods for c in t["spec"]["containers"] for p in c.get("ports", [])}
                self.assertIn(port["targetPort"], names)

    def test_refused_without_the_api_unless_the_check_is_skipped(self):
        err = refused(*SM_ON)
        self.assertIn("metrics.serviceMonitor.enabled needs the API monitoring.coreos.com/v1/ServiceMonitor", err)
        objs = render(*SM_ON, "metrics.serviceMonitor.skipCapabilityCheck=true")
        named(objs, "ServiceMonitor", "pdp-injector", "pdp-system")


class PrometheusRules(unittest.TestCase):
    def rule(self, *sets):
        objs = render(*sets, api=True)
        return objs, named(objs, "PrometheusRule", "pdp-injector", "pdp-system")

    def test_the_webhook_alerts_in_every_model_and_the_flag_sync_alerts_with_it(self):
        for m in MODELS:
            with self.subTest(model=m):
                _, pr = self.rule(f"pdp.model={m}", *SM_ON, *PR_ON)
                self.assertEqual([g["name"] for g in pr["spec"]["groups"]], ["pdp-injector"])
                alerts = {r["alert"] for r in pr["spec"]["groups"][0]["rules"]}
                self.assertTrue({"PdpInjectorUnavailable", "PdpInjectorRequestErrors", "PdpInjectorDenials"} <= alerts)
                _, pr = self.rule(f"pdp.model={m}", *ALL_ON)
                self.assertEqual([g["name"] for g in pr["spec"]["groups"]], ["pdp-injector", "pdp-flag-sync"])
                self.assertEqual(pr["metadata"]["labels"]["release"], "prometheus")

    def test_the_webhook_alerts_are_the_documented_ones(self):
        _, pr = self.rule("pdp.model=central", *SM_ON, *PR_ON)
        docs = yaml.safe_load((REPO / "docs/examples/prometheus-rules.yaml").read_text())
        self.assertEqual(pr["spec"]["groups"], docs["groups"], "the chart's group differs from the documented one")

    def test_every_rule_is_well_formed(self):
        _, pr = self.rule("pdp.model=central", *ALL_ON)
        for r in (r for g in pr["spec"]["groups"] for r in g["rules"]):
            with self.subTest(alert=r["alert"]):
                self.assertRegex(r["alert"], r"^Pdp[A-Za-z]+$")
                self.assertIn(r["labels"]["severity"], ("info", "warning", "critical"))
                self.assertTrue(r["annotations"]["summary"])
                self.assertEqual(r["expr"].count("("), r["expr"].count(")"))
                self.assertNotIn("{{ $labels", r["expr"])

    def test_the_metrics_of_the_rules_exist_in_the_source(self):
        _, pr = self.rule("pdp.model=central", *ALL_ON)
        used = {n for g in pr["spec"]["groups"] for r in g["rules"] for n in re.findall(r"\bpdp_[a-z0-9_]+", r["expr"])}
        self.assertEqual(used, RULE_METRICS)
        known = exported_metrics()
        for name in sorted(RULE_METRICS):
            with self.subTest(metric=name):
                base = re.sub(r"_(total|bucket|sum|count|info)$", "", name)
                self.assertTrue(name in known or base in known, f"{name}: no metric {base} is registered in src/ or crates/")

    def test_the_jobs_of_the_rules_are_the_scraped_services(self):
        objs, pr = self.rule("pdp.model=central", *ALL_ON)
        jobs = {j for g in pr["spec"]["groups"] for r in g["rules"]
                for m in re.findall(r'job=~?"([^"]+)"', r["expr"]) for j in m.split("|")}
        scraped = {s["metadata"]["name"] for sm in of_kind(objs, "ServiceMonitor") for s in of_kind(objs, "Service")
                   if s["metadata"]["namespace"] in sm["spec"]["namespaceSelector"]["matchNames"]
                   and selects(sm["spec"]["selector"]["matchLabels"], s["metadata"].get("labels"))}
        self.assertEqual(jobs, {"pdp-flag-sync", "pdp-flag-relay"})
        self.assertLessEqual(jobs, scraped)
        flag_sync = next(g for g in pr["spec"]["groups"] if g["name"] == "pdp-flag-sync")
        for r in flag_sync["rules"]:
            self.assertRegex(r["expr"], 'job=~?"', f"{r['alert']}: the source's and the relays' metrics share their names")

    def test_each_alert_fires_when_it_should_under_promtool(self):
        _, pr = self.rule("pdp.model=central", *ALL_ON)
        tests = yaml.safe_load(ALERT_TESTS.read_text())
        tested = {t["alertname"] for case in tests["tests"] for t in case["alert_rule_test"]}
        self.assertEqual(tested, {r["alert"] for g in pr["spec"]["groups"] for r in g["rules"]},
                         f"{ALERT_TESTS.name} tests every alert of the rule, and only those")
        tool = promtool()
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "rules.yaml").write_text(yaml.safe_dump(pr["spec"]))
            shutil.copy(ALERT_TESTS, Path(tmp) / ALERT_TESTS.name)
            for cmd in (["check", "rules", "rules.yaml"], ["test", "rules", ALERT_TESTS.name]):
                p = subprocess.run([str(tool), *cmd], cwd=tmp, capture_output=True, text=True)
                self.assertEqual(p.returncode, 0, f"promtool {' '.join(cmd)}: {(p.stdout + p.stderr).strip()[-1500:]}")

    def test_refused_without_the_api_unless_the_check_is_skipped(self):
        err = refused(*PR_ON)
        self.assertIn("metrics.prometheusRule.enabled needs the API monitoring.coreos.com/v1/PrometheusRule", err)
        named(render(*PR_ON, "metrics.prometheusRule.skipCapabilityCheck=true"), "PrometheusRule", "pdp-injector")


def promtool():
    """Prometheus' promtool: $PROMTOOL, on the PATH, or from Debian's prometheus package (apt-get download checks
    its signature), unpacked once into the cache scripts/helm_check.py keeps helm in."""
    if os.environ.get("PROMTOOL"):
        return Path(os.environ["PROMTOOL"])
    if shutil.which("promtool"):
        return Path(shutil.which("promtool"))
    policy = subprocess.run(["apt-cache", "policy", "prometheus"], capture_output=True, text=True).stdout
    version = re.search(r"Candidate: (\S+)", policy)
    if not version or version.group(1) == "(none)":
        raise AssertionError(f"no promtool: set PROMTOOL, or let apt find the package prometheus ({policy.strip()!r})")
    target = helm_check.CACHE / f"promtool-{version.group(1)}" / "promtool"
    if target.exists():
        return target
    with tempfile.TemporaryDirectory() as tmp:
        p = subprocess.run(["apt-get", "download", f"prometheus={version.group(1)}"], cwd=tmp,
                           capture_output=True, text=True)
        debs = list(Path(tmp).glob("prometheus_*.deb"))
        if p.returncode != 0 or not debs:
            raise AssertionError(f"apt-get download prometheus: {p.stderr.strip()[-400:]}")
        subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(Path(tmp) / "x")], check=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_suffix(".part")
        shutil.copy(Path(tmp) / "x/usr/bin/promtool", part)
        part.rename(target)
    return target


def exported_metrics():
    """Metric names registered in src/ and crates/: a name literal followed by its help text (register,
    encode_descriptor, the tables of gauges), with the prefix of the file's sub-registry if it has one."""
    names = set()
    for f in list((REPO / "src").rglob("*.rs")) + list((REPO / "crates").rglob("*.rs")):
        text = f.read_text()
        found = set(re.findall(r'"([a-z][a-z0-9_]*)",\s*"[A-Z0-9]', text))
        for prefix in re.findall(r'sub_registry_with_prefix\(\s*"([a-z0-9_]+)"', text):
            found = {f"{prefix}_{n}" for n in found}
        names |= found
    return names


class NodeLocal(unittest.TestCase):
    def test_the_critical_quota_admits_every_node_local_pod_and_a_surge_on_1000_nodes(self):
        objs = render("pdp.model=daemonset")
        critical = [d for d in of_kind(objs, "DaemonSet") if d["metadata"]["namespace"] == "pdp-node"
                    and d["spec"]["template"]["spec"].get("priorityClassName") == "system-node-critical"]
        self.assertGreaterEqual(len(critical), 3, [d["metadata"]["name"] for d in critical])
        quota = named(objs, "ResourceQuota", "cerbos-pdp-node-critical", "pdp-node")
        pods = quota["spec"]["hard"]["pods"]
        per_node = int(pods.removesuffix("k")) if pods.endswith("k") else int(pods) / 1000
        self.assertGreaterEqual(per_node, len(critical) + 1, f"quota {pods} for {len(critical)} DaemonSets")

    def test_the_node_service_has_no_external_ips(self):
        objs = render("pdp.model=daemonset", "pdp.nodeLocal.service.enabled=true")
        services = [o for o in of_kind(objs, "Service") if o["metadata"]["namespace"] == "pdp-node"]
        self.assertTrue(services)
        for svc in services:
            self.assertNotIn("externalIPs", svc["spec"], svc["metadata"]["name"])
            self.assertEqual(svc["spec"].get("type", "ClusterIP"), "ClusterIP", svc["metadata"]["name"])


class PodDisruptionBudgets(unittest.TestCase):
    def test_off_leaves_none_in_any_model(self):
        for m in MODELS:
            with self.subTest(model=m):
                objs = render(f"pdp.model={m}", "podDisruptionBudget.enabled=false", *FLAG_SYNC, "pdp.flagSync.replicas=2")
                self.assertEqual(of_kind(objs, "PodDisruptionBudget"), [])

    def test_the_budget_values_land_on_every_budget(self):
        for sets, want in ((("podDisruptionBudget.maxUnavailable=1",), {"maxUnavailable": 1}),
                           (("podDisruptionBudget.minAvailable=50%",), {"minAvailable": "50%"})):
            with self.subTest(sets=sets):
                objs = render(*sets, *FLAG_SYNC, "pdp.flagSync.replicas=2")
                pdbs = of_kind(objs, "PodDisruptionBudget")
                self.assertEqual({d["metadata"]["name"] for d in pdbs}, {"pdp-injector", "cerbos-pdp", "pdp-flag-sync"})
                for d in pdbs:
                    got = {k: v for k, v in d["spec"].items() if k in ("minAvailable", "maxUnavailable")}
                    self.assertEqual(got, want, d["metadata"]["name"])

    def test_both_budgets_are_refused(self):
        self.assertIn("set minAvailable or maxUnavailable, not both",
                      refused("podDisruptionBudget.minAvailable=1", "podDisruptionBudget.maxUnavailable=1"))

    def test_the_flag_sync_source_gets_one_with_more_than_one_replica(self):
        self.assertFalse([d for d in of_kind(render(*FLAG_SYNC), "PodDisruptionBudget")
                          if d["metadata"]["name"] == "pdp-flag-sync"])
        for kube, api in (("1.33.0", "policy/v1"), ("1.20.2", "policy/v1beta1")):
            with self.subTest(kube=kube):
                objs = render(*FLAG_SYNC, "pdp.flagSync.replicas=2", kube=kube)
                pdb = named(objs, "PodDisruptionBudget", "pdp-flag-sync", "pdp-system")
                self.assertEqual(pdb["apiVersion"], api)
                self.assertEqual(pdb["spec"].get("unhealthyPodEvictionPolicy"), None if kube < "1.27" else "AlwaysAllow")
                dep = named(objs, "Deployment", "pdp-flag-sync", "pdp-system")
                self.assertTrue(selects(pdb["spec"]["selector"]["matchLabels"], dep["spec"]["template"]["metadata"]["labels"]))

    def test_every_budget_selects_its_workload(self):
        for m in MODELS:
            with self.subTest(model=m):
                objs = render(f"pdp.model={m}")
                for pdb in of_kind(objs, "PodDisruptionBudget"):
                    self.assertTrue([t for t in pod_templates(objs, pdb["metadata"]["namespace"])
                                     if selects(pdb["spec"]["selector"]["matchLabels"], t["metadata"]["labels"])])


class NetworkPolicies(unittest.TestCase):
    def test_the_webhook_takes_its_serving_port_only_in_every_model(self):
        for m in MODELS:
            with self.subTest(model=m):
                objs = render(f"pdp.model={m}", "networkPolicy.enabled=true")
                web = named(objs, "NetworkPolicy", "pdp-injector", "pdp-system")["spec"]
                self.assertEqual(web["ingress"], [{"ports": [{"port": 8443, "protocol": "TCP"}]}])
                container = named(objs, "Deployment", "pdp-injector", "pdp-system")["spec"]["template"]["spec"]["containers"][0]
                self.assertEqual([p["containerPort"] for p in container["ports"]], [8443])
                namespaces = {d["metadata"]["name"] for d in of_kind(objs, "Namespace")}
                for np in of_kind(objs, "NetworkPolicy"):
                    self.assertIn(np["metadata"]["namespace"], namespaces)
                node = {d["metadata"]["name"] for d in of_kind(objs, "NetworkPolicy") if d["metadata"]["namespace"] == "pdp-node"}
                self.assertEqual(node, {"pdp-node-front", "cerbos-pdp"} if m == "daemonset" else set())

    def test_the_flag_sync_source_takes_grpc_and_metrics_from_the_selector(self):
        for m in MODELS:
            with self.subTest(model=m):
                objs = render(f"pdp.model={m}", "networkPolicy.enabled=true", *FLAG_SYNC,
                              "networkPolicy.metricsNamespaceSelector.matchLabels.team=monitoring")
                spec = named(objs, "NetworkPolicy", "pdp-flag-sync", "pdp-system")["spec"]
                self.assertEqual(spec["ingress"], [
                    {"ports": [{"protocol": "TCP", "port": 8015}]},
                    {"from": [{"namespaceSelector": {"matchLabels": {"team": "monitoring"}}}],
                     "ports": [{"protocol": "TCP", "port": 8014}]},
                ])
                dep = named(objs, "Deployment", "pdp-flag-sync", "pdp-system")["spec"]["template"]
                self.assertTrue(selects(spec["podSelector"]["matchLabels"], dep["metadata"]["labels"]))
                ports = {p["containerPort"] for p in dep["spec"]["containers"][0]["ports"]}
                self.assertEqual(ports, {8014, 8015})
        objs = render("networkPolicy.enabled=true", *FLAG_SYNC)
        spec = named(objs, "NetworkPolicy", "pdp-flag-sync", "pdp-system")["spec"]
        self.assertEqual(spec["ingress"][1]["from"], [{"namespaceSelector": {}}])


class HelmTest(unittest.TestCase):
    def helm_test_pod(self, objs=None):
        objs = objs or render()
        return next(d for d in objs if d["kind"] == "Pod"
                    and d["metadata"]["annotations"].get("helm.sh/hook") == "test")

    def test_the_image_is_documented_and_settable(self):
        default = yaml.safe_load((CHART / "values.yaml").read_text())["tests"]["image"]
        self.assertEqual(self.helm_test_pod()["spec"]["containers"][0]["image"], default)
        self.assertIn(f"`{default}`", (CHART / "README.md").read_text())
        objs = render("tests.image=registry.example.com/curl:1", "tests.command={/probe}")
        c = self.helm_test_pod(objs)["spec"]["containers"][0]
        self.assertEqual((c["image"], c["command"]), ("registry.example.com/curl:1", ["/probe"]))

    def test_the_pod_is_wired_in_each_model(self):
        for m in MODELS:
            with self.subTest(model=m):
                pod = self.helm_test_pod(render(f"pdp.model={m}"))
                self.assertEqual(pod["metadata"]["annotations"]["pdp-injector.io/inject"], m)


class Fallback(unittest.TestCase):
    SETS = ("pdp.model=daemonset", "pdp.central.enabled=true", "pdp.nodeLocal.fallback=true")

    def front_args(self, objs):
        return named(objs, "DaemonSet", "pdp-node-front", "pdp-node")["spec"]["template"]["spec"]["containers"][0]["args"]

    def config(self, objs):
        return yaml.safe_load(named(objs, "ConfigMap", "pdp-injector-config")["data"]["config.yaml"])

    def test_the_front_and_the_cerbos_profile_fall_back_to_the_central_service(self):
        objs = render(*self.SETS)
        args = self.front_args(objs)
        self.assertIn("--fallback=cerbos-pdp.pdp-central.svc:3593", args)
        self.assertIn("--fallback-http=cerbos-pdp.pdp-central.svc:3592", args)
        cerbos = self.config(objs)["profiles"]["cerbos"]
        self.assertEqual((cerbos.get("fallback"), cerbos["central"]["address"]),
                         (True, "cerbos-pdp.pdp-central.svc:3593"))

    def test_off_by_default(self):
        objs = render("pdp.model=daemonset", "pdp.central.enabled=true")
        self.assertFalse([a for a in self.front_args(objs) if a.startswith("--fallback")])
        self.assertNotIn("fallback", self.config(objs)["profiles"]["cerbos"])

    def test_refused_without_both_models(self):
        for m in ("daemonset", "central"):
            with self.subTest(model=m):
                self.assertIn("pdp.nodeLocal.fallback", refused(f"pdp.model={m}", "pdp.nodeLocal.fallback=true"))


class Schema(unittest.TestCase):
    def test_wrong_types_and_unknown_keys_are_refused(self):
        for s, want in (
            ("metrics.serviceMonitor.enabled=yes", "'/metrics/serviceMonitor/enabled': got string, want boolean"),
            ("metrics.prometheusRule.enabled=1", "'/metrics/prometheusRule/enabled': got number, want boolean"),
            ("metrics.serviceMonitor.interval=often", "'/metrics/serviceMonitor/interval'"),
            ("metrics.serviceMonitor.labels.tier=1", "'/metrics/serviceMonitor/labels/tier': got number, want string"),
            ("metrics.serviceMonitor.enable=true", "'/metrics/serviceMonitor': additional properties 'enable' not allowed"),
            ("podDisruptionBudget.enabled=no", "'/podDisruptionBudget/enabled': got string, want boolean"),
            ("podDisruptionBudget.minAvailable=true", "'/podDisruptionBudget/minAvailable': got boolean"),
            ("podDisruptionBudget.maxUnavailable=half", "'/podDisruptionBudget/maxUnavailable'"),
            ("networkPolicy.metricsNamespaceSelector=all", "'/networkPolicy/metricsNamespaceSelector': got string, want object"),
            ("pdp.model=node", "'/pdp/model': value must be one of 'central', 'daemonset', 'sidecar'"),
            ("tests.image=", "'/tests/image'"),
        ):
            with self.subTest(set=s):
                err = refused(s)
                self.assertIn("values don't meet the specifications of the schema", err)
                self.assertIn(want, err)


class Readme(unittest.TestCase):
    def test_the_values_table_is_the_one_the_schema_gives(self):
        text, problems = chart_readme.table()
        self.assertEqual(problems, [])
        _, current, _ = chart_readme.split((CHART / "README.md").read_text())
        self.assertEqual(current, "\n" + text + "\n", "stale: run scripts/chart_readme.py")
        for path in ("metrics.serviceMonitor.enabled", "metrics.prometheusRule.enabled", "podDisruptionBudget.enabled",
                     "networkPolicy.metricsNamespaceSelector", "tests.image"):
            self.assertIn(f"| `{path}` |", text)

    def test_a_changed_description_or_a_value_without_one_or_without_a_comment_is_found(self):
        with tempfile.TemporaryDirectory() as tmp:
            chart = Path(tmp)
            for f in ("values.yaml", "values.schema.json", "README.md"):
                shutil.copy(CHART / f, chart / f)
            before, _ = chart_readme.table(chart)
            schema = json.loads((chart / "values.schema.json").read_text())
            schema["properties"]["metrics"]["properties"]["serviceMonitor"]["properties"]["interval"]["description"] = "x"
            del schema["properties"]["tests"]["properties"]["image"]["description"]
            (chart / "values.schema.json").write_text(json.dumps(schema))
            values = (chart / "values.yaml").read_text()
            (chart / "values.yaml").write_text(values.replace("  # Tag of the webhook's image (the chart's appVersion).\n", ""))
            after, problems = chart_readme.table(chart)
            self.assertNotEqual(before, after)
            self.assertEqual(problems, ["image.tag: no comment above it in values.yaml",
                                        "tests.image: no description in values.schema.json"])


if __name__ == "__main__":
    unittest.main()
