#!/usr/bin/env bash
# Renders every kustomize overlay under manifests/overlays and validates what `kubectl apply -k` would send:
#
#   1. `kubectl kustomize manifests/overlays/<overlay>` must succeed.
#   2. Every Kubernetes document is validated strictly (unknown fields are errors) against the Kubernetes
#      1.33 OpenAPI schemas with kubernetes-validate. A document without a schema is a failure, not a warning.
#   3. cert-manager documents (Certificate, Issuer), for which kubernetes-validate has no schema, get a
#      structural check instead: required fields, and every reference (issuerRef, CA Secret,
#      cert-manager.io/inject-ca-from, the webhook's TLS Secret) resolves inside the rendered overlay.
#   4. Every namespaced object names its namespace (nothing lands in `default` by accident), and no object
#      appears twice.
#   5. If a pdp-injector binary is available (PDP_INJECTOR_BIN, or target/{release,debug}/pdp-injector; this
#      script never builds one), the rendered config.yaml is loaded by the real parser, and a sample opted-in
#      Pod is injected with it to check that the daemonset wiring (address port, socket path) matches the
#      cerbos-pdp DaemonSet of the same overlay. Without a binary this step is reported as skipped.
#
# Usage: scripts/validate-manifests.sh [overlay...]   (default: every overlay). Run from anywhere.
# Needs: kubectl (with its built-in kustomize), python3; installs kubernetes-validate==1.37.0 with pip if
# missing. Exits non-zero on any failure.
set -euo pipefail

K8S_VERSION="1.33.0"
KV_VERSION="1.37.0"

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

die() {
  echo "FAIL $*" >&2
  exit 1
}

command -v kubectl >/dev/null 2>&1 || die "kubectl not found (it provides 'kubectl kustomize')"
command -v python3 >/dev/null 2>&1 || die "python3 not found"

if ! python3 -c 'import kubernetes_validate, yaml' >/dev/null 2>&1; then
  echo "installing kubernetes-validate==${KV_VERSION} (pip)"
  python3 -m pip install --quiet "kubernetes-validate==${KV_VERSION}" || die "cannot install kubernetes-validate"
fi
kv_installed="$(python3 -c 'from kubernetes_validate.version import __version__ as v; print(v)')"
if [[ "$kv_installed" != "$KV_VERSION" ]]; then
  echo "note: kubernetes-validate ${kv_installed} installed (this script is tested with ${KV_VERSION})"
fi

bin="${PDP_INJECTOR_BIN:-}"
if [[ -z "$bin" ]]; then
  for candidate in target/release/pdp-injector target/debug/pdp-injector; do
    if [[ -x "$candidate" ]]; then
      bin="$candidate"
      break
    fi
  done
fi

if [[ $# -gt 0 ]]; then
  overlays=("$@")
else
  overlays=()
  for dir in manifests/overlays/*/; do
    [[ -f "${dir}kustomization.yaml" ]] && overlays+=("$(basename "$dir")")
  done
fi
[[ ${#overlays[@]} -gt 0 ]] || die "no overlays found under manifests/overlays"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# The structural checks, in Python (PyYAML comes with kubernetes-validate).
cat >"$tmp/check.py" <<'PY'
import json, os, re, subprocess, sys
import yaml

CLUSTER_SCOPED = {
    "Namespace", "ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration", "PriorityClass", "CustomResourceDefinition", "ClusterIssuer",
    "StorageClass", "RuntimeClass", "PersistentVolume",
}
ISSUER_TYPES = ("selfSigned", "ca", "acme", "vault", "venafi")
SAN_FIELDS = ("dnsNames", "ipAddresses", "uris", "emailAddresses", "commonName", "otherNames")


def load(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def ident(d):
    m = d.get("metadata") or {}
    ns = m.get("namespace")
    return f"{d.get('kind')}/{(ns + '/') if ns else ''}{m.get('name')}"


def split(outdir):
    """Writes one file per Kubernetes document into outdir/k8s, checks cert-manager documents in place,
    prints 'total k8s certmanager' on stdout and problems on stderr; exit 1 on any problem."""
    docs = load(os.path.join(outdir, "rendered.yaml"))
    errors, seen = [], set()
    k8s, cm = [], []
    for i, d in enumerate(docs):
        for field in ("apiVersion", "kind"):
            if not d.get(field):
                errors.append(f"document {i}: no {field}")
        if not (d.get("metadata") or {}).get("name"):
            errors.append(f"document {i} ({d.get('kind')}): no metadata.name")
            continue
        key = (d["apiVersion"].split("/")[0] if "/" in d["apiVersion"] else "", d["kind"], ident(d))
        if key in seen:
            errors.append(f"{ident(d)}: appears twice")
        seen.add(key)
        if d["kind"] not in CLUSTER_SCOPED and not d["metadata"].get("namespace"):
            errors.append(f"{ident(d)}: namespaced object without metadata.namespace")
        if d["kind"] in CLUSTER_SCOPED and d["metadata"].get("namespace"):
            errors.append(f"{ident(d)}: cluster-scoped object with a namespace")
        if d["apiVersion"].split("/")[0].endswith("cert-manager.io"):
            cm.append(d)
        else:
            k8s.append(d)
    os.makedirs(os.path.join(outdir, "k8s"), exist_ok=True)
    for i, d in enumerate(k8s):
        name = re.sub(r"[^A-Za-z0-9.-]", "_", f"{i:03d}-{d['kind']}-{d['metadata']['name']}")
        with open(os.path.join(outdir, "k8s", name + ".yaml"), "w") as f:
            yaml.safe_dump(d, f, sort_keys=False)
    errors += check_cert_manager(cm, docs)
    for e in errors:
        print(f"  error: {e}", file=sys.stderr)
    print(len(docs), len(k8s), len(cm))
    return 1 if errors else 0


def check_cert_manager(cm, docs):
    errors = []
    issuers = {}
    certs = {}
    for d in cm:
        where = ident(d)
        if d["apiVersion"] != "cert-manager.io/v1":
            errors.append(f"{where}: apiVersion {d['apiVersion']} (expected cert-manager.io/v1)")
        spec = d.get("spec")
        if not isinstance(spec, dict):
            errors.append(f"{where}: no spec")
            continue
        ns = d["metadata"].get("namespace")
        if d["kind"] in ("Issuer", "ClusterIssuer"):
            types = [t for t in ISSUER_TYPES if t in spec]
            if len(types) != 1:
                errors.append(f"{where}: needs exactly one of {', '.join(ISSUER_TYPES)}, has {types or 'none'}")
            if "ca" in spec and not (spec["ca"] or {}).get("secretName"):
                errors.append(f"{where}: spec.ca.secretName is required")
            unknown = set(spec) - set(ISSUER_TYPES)
            if unknown:
                errors.append(f"{where}: unknown spec fields {sorted(unknown)}")
            issuers[(d["kind"], ns if d["kind"] == "Issuer" else None, d["metadata"]["name"])] = d
        elif d["kind"] == "Certificate":
            if not spec.get("secretName"):
                errors.append(f"{where}: spec.secretName is required")
            ref = spec.get("issuerRef") or {}
            if not ref.get("name"):
                errors.append(f"{where}: spec.issuerRef.name is required")
            if ref.get("kind", "Issuer") not in ("Issuer", "ClusterIssuer") or ref.get("group", "cert-manager.io") != "cert-manager.io":
                errors.append(f"{where}: issuerRef must be a cert-manager.io Issuer or ClusterIssuer")
            if not any(spec.get(f) for f in SAN_FIELDS):
                errors.append(f"{where}: needs at least one of {', '.join(SAN_FIELDS)}")
            for name in spec.get("dnsNames") or []:
                if not re.fullmatch(r"(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", name):
                    errors.append(f"{where}: dnsNames entry {name!r} is not a DNS name")
            pk = spec.get("privateKey") or {}
            if pk.get("algorithm", "RSA") not in ("RSA", "ECDSA", "Ed25519"):
                errors.append(f"{where}: privateKey.algorithm {pk.get('algorithm')!r}")
            certs[(ns, d["metadata"]["name"])] = d
        else:
            errors.append(f"{where}: unexpected cert-manager kind (only Certificate, Issuer, ClusterIssuer are checked)")
    # References must resolve inside the overlay (a ClusterIssuer may live outside it).
    for (ns, name), d in certs.items():
        ref = d["spec"].get("issuerRef") or {}
        kind = ref.get("kind", "Issuer")
        if kind == "Issuer" and ("Issuer", ns, ref.get("name")) not in issuers:
            errors.append(f"{ident(d)}: issuerRef Issuer {ns}/{ref.get('name')} is not in the overlay")
    secrets_issued = {(ns, d["spec"].get("secretName")) for (ns, _), d in certs.items()}
    for (kind, ns, name), d in issuers.items():
        ca = d["spec"].get("ca")
        if ca and kind == "Issuer" and (ns, ca.get("secretName")) not in secrets_issued:
            errors.append(f"{ident(d)}: CA Secret {ns}/{ca.get('secretName')} is issued by no Certificate in the overlay")
    for d in docs:
        ann = (d.get("metadata") or {}).get("annotations") or {}
        ref = ann.get("cert-manager.io/inject-ca-from")
        if ref:
            ns, _, name = ref.partition("/")
            if (ns, name) not in certs:
                errors.append(f"{ident(d)}: cert-manager.io/inject-ca-from {ref} names no Certificate in the overlay")
        if d.get("kind") == "Deployment" and certs:
            ns = d["metadata"].get("namespace")
            for v in d["spec"]["template"]["spec"].get("volumes") or []:
                secret = (v.get("secret") or {}).get("secretName")
                if secret and (ns, secret) not in secrets_issued:
                    errors.append(f"{ident(d)}: mounts Secret {secret}, which no Certificate in the overlay issues")
    return errors


def configs(outdir):
    """Writes the pdp-injector config.yaml of the overlay to outdir/config.yaml."""
    for d in load(os.path.join(outdir, "rendered.yaml")):
        if d.get("kind") == "ConfigMap" and d["metadata"]["name"] == "pdp-injector-config":
            text = (d.get("data") or {}).get("config.yaml")
            if text is None:
                print("  error: ConfigMap pdp-injector-config has no key config.yaml", file=sys.stderr)
                return 1
            with open(os.path.join(outdir, "config.yaml"), "w") as f:
                f.write(text)
            return 0
    print("  error: no ConfigMap pdp-injector-config", file=sys.stderr)
    return 1


def wiring(outdir, binary):
    """Injects a sample opted-in Pod with the overlay's config and checks the result against the overlay's
    cerbos-pdp DaemonSet. Prints a one-line summary."""
    docs = load(os.path.join(outdir, "rendered.yaml"))
    ds = [d for d in docs if d.get("kind") == "DaemonSet" and d["metadata"]["name"] == "cerbos-pdp"]
    if not ds:
        print("no DaemonSet in this overlay, wiring not compared")
        return 0
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "wiring-check", "namespace": "demo",
                     "annotations": {"pdp-injector.io/inject": "daemonset"}},
        "spec": {"containers": [{"name": "app", "image": "example.invalid/app:1"}]},
    }
    res = subprocess.run([binary, "inject", "--config", os.path.join(outdir, "config.yaml"), "-f", "-"],
                         input=yaml.safe_dump(pod), capture_output=True, text=True)
    if res.returncode != 0:
        print(f"  error: pdp-injector inject failed: {res.stderr.strip()}", file=sys.stderr)
        return 1
    out = [d for d in yaml.safe_load_all(res.stdout) if d][0]
    app = out["spec"]["containers"][0]
    env = {e["name"]: e for e in app.get("env") or []}
    errors = []
    spec = ds[0]["spec"]["template"]["spec"]
    host_ports = {p.get("hostPort") for c in spec["containers"] for p in c.get("ports") or [] if p.get("hostPort")}
    host_paths = {v["hostPath"]["path"].rstrip("/") for v in spec.get("volumes") or [] if v.get("hostPath")}
    addr = (env.get("CERBOS_PDP_ADDR") or {}).get("value", "")
    port = addr.rsplit(":", 1)[-1] if ":" in addr else ""
    if not port.isdigit() or int(port) not in host_ports:
        errors.append(f"CERBOS_PDP_ADDR={addr!r} does not point at a hostPort of cerbos-pdp {sorted(host_ports)}")
    sock = (env.get("CERBOS_PDP_SOCKET") or {}).get("value", "")
    if os.path.dirname(sock) not in host_paths:
        errors.append(f"CERBOS_PDP_SOCKET={sock!r} is not in a hostPath of cerbos-pdp {sorted(host_paths)}")
    cerbos_conf = [d for d in docs if d.get("kind") == "ConfigMap" and d["metadata"]["name"] == "cerbos-pdp-config"]
    if cerbos_conf:
        server = yaml.safe_load(cerbos_conf[0]["data"]["config.yaml"]).get("server", {})
        listeners = {server.get("httpListenAddr", ""), server.get("grpcListenAddr", "")}
        if f"unix:{sock}" not in listeners:
            errors.append(f"no Cerbos listener on unix:{sock} (listeners: {sorted(listeners)})")
        if not any(l.endswith(f":{port}") and not l.startswith("unix:") for l in listeners):
            errors.append(f"no Cerbos TCP listener on port {port} (listeners: {sorted(listeners)})")
    for e in errors:
        print(f"  error: {e}", file=sys.stderr)
    if not errors:
        print(f"injected Pod: CERBOS_PDP_ADDR={addr}, CERBOS_PDP_SOCKET={sock}; matches cerbos-pdp")
    return 1 if errors else 0


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "split":
        sys.exit(split(sys.argv[2]))
    if cmd == "configs":
        sys.exit(configs(sys.argv[2]))
    if cmd == "wiring":
        sys.exit(wiring(sys.argv[2], sys.argv[3]))
    sys.exit(f"unknown command {cmd}")
PY

echo "validate-manifests: overlays: ${overlays[*]}"
echo "  schema: kubernetes-validate ${kv_installed} --strict -k ${K8S_VERSION} (documents without a schema fail)"
echo "  cert-manager.io documents: structural and reference checks"
if [[ -n "$bin" ]]; then
  echo "  pdp-injector config and daemonset wiring: checked with ${bin}"
else
  echo "  pdp-injector config and daemonset wiring: SKIPPED (no binary; set PDP_INJECTOR_BIN or build one)"
fi

failed=()
for overlay in "${overlays[@]}"; do
  dir="manifests/overlays/$overlay"
  out="$tmp/$overlay"
  mkdir -p "$out"
  echo "--- $overlay"
  if [[ ! -f "$dir/kustomization.yaml" ]]; then
    echo "  error: $dir/kustomization.yaml not found"
    failed+=("$overlay")
    continue
  fi
  if ! kubectl kustomize "$dir" >"$out/rendered.yaml" 2>"$out/kustomize.err"; then
    echo "  error: kubectl kustomize $dir failed:"
    sed 's/^/    /' "$out/kustomize.err" | head -20
    failed+=("$overlay")
    continue
  fi

  ok=1
  if ! counts="$(python3 "$tmp/check.py" split "$out" 2>"$out/split.err")"; then
    ok=0
  fi
  cat "$out/split.err"
  read -r total n_k8s n_cm <<<"${counts:-0 0 0}"

  # Strict schema validation. kubernetes-validate exits 0 on a document it has no schema for (it prints WARN),
  # so the log is checked too: every Kubernetes document must have an INFO ... passed line.
  shopt -s nullglob
  files=("$out"/k8s/*.yaml)
  shopt -u nullglob
  if [[ ${#files[@]} -gt 0 ]]; then
    if ! python3 -m kubernetes_validate --strict -k "$K8S_VERSION" "${files[@]}" >"$out/validate.log" 2>&1; then
      ok=0
    fi
    if grep -Ev '^INFO .* passed for resource' "$out/validate.log" | grep -q .; then
      ok=0
      grep -Ev '^INFO .* passed for resource' "$out/validate.log" | sed "s|$out/k8s/||; s/^/  /"
    fi
    passed="$(grep -Ec '^INFO .* passed for resource' "$out/validate.log" || true)"
    if [[ "$passed" != "${#files[@]}" ]]; then
      echo "  error: ${passed} of ${#files[@]} Kubernetes documents passed schema validation"
      ok=0
    fi
  else
    passed=0
  fi

  wiring_note=""
  if [[ -n "$bin" ]]; then
    if python3 "$tmp/check.py" configs "$out" 2>&1; then
      if ! cfg_out="$("$bin" inject --config "$out/config.yaml" -f /dev/null 2>&1)"; then
        echo "  error: pdp-injector refuses the rendered config.yaml: $cfg_out"
        ok=0
      elif wiring="$(python3 "$tmp/check.py" wiring "$out" "$bin" 2>"$out/wiring.err")"; then
        wiring_note="; config.yaml accepted; ${wiring}"
      else
        cat "$out/wiring.err"
        ok=0
      fi
    else
      ok=0
    fi
  fi

  if [[ $ok -eq 1 ]]; then
    echo "ok   overlay ${overlay}: ${total} documents (${passed} schema-valid against Kubernetes ${K8S_VERSION}, strict; ${n_cm} cert-manager checked${wiring_note})"
  else
    echo "FAIL overlay ${overlay}: ${total} documents"
    failed+=("$overlay")
  fi
done

if [[ ${#failed[@]} -gt 0 ]]; then
  echo "validate-manifests: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "validate-manifests: all ${#overlays[@]} overlays valid"
