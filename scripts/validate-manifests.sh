#!/usr/bin/env bash
# Renders every kustomize overlay under manifests/overlays and validates what `kubectl apply -k` would send:
#
#   1. `kubectl kustomize manifests/overlays/<overlay>` must succeed.
#   2. Every Kubernetes document is validated strictly (unknown fields are errors) against the Kubernetes
#      1.33 OpenAPI schemas with kubernetes-validate. A document without a schema is a failure, not a warning.
#   3. cert-manager documents (Certificate, Issuer), for which kubernetes-validate has no schema, get a
#      structural check instead: required fields, and every reference (issuerRef, CA Secret,
#      cert-manager.io/inject-ca-from, the webhook's TLS Secret) resolves inside the rendered overlay.
#      FeatureFlag objects (core.openfeature.dev/v1beta1, flagd's Kubernetes sync) likewise: the fields flagd
#      reads, and every flagd --uri=core.openfeature.dev/<ns>/<name> names one of the overlay.
#   4. Every namespaced object names its namespace (nothing lands in `default` by accident), no cluster-scoped
#      one does, and no object appears twice.
#   4a. References the schema cannot check: a Pod template's priorityClassName names a PriorityClass of the
#      overlay (or a system one; user-defined values at most 1000000000, never globalDefault), every
#      ValidatingAdmissionPolicy has a binding that denies, and every NetworkPolicy selects the Pods of a
#      workload in its namespace and opens only ports that those Pods declare.
#   4b. Every ValidatingAdmissionPolicy (the guard on the webhook's own MutatingWebhookConfiguration) is compiled
#      and evaluated with cel-expr-python (the CEL C++ runtime, with the optional-types extension Kubernetes
#      enables) on ~80 updates of the rendered pdp-injector configuration, defaulted as the apiserver stores it:
#      the webhook's ServiceAccount changing caBundle only is allowed; changing, adding or removing any other
#      field of any webhook, a webhook, or the metadata is denied; other users and other objects are not
#      affected. An offline evaluation, not an apiserver: Kubernetes' typed objects and list-type semantics are
#      approximated by plain maps and lists.
#   5. If a pdp-injector binary is available (PDP_INJECTOR_BIN, or target/{release,debug}/pdp-injector; this
#      script never builds one), the rendered config.yaml is loaded by the real parser, and a sample opted-in
#      Pod is injected with it to check that the daemonset wiring holds end to end: the address port and socket
#      path are the front's (pdp-node-front), and the front forwards to where the cerbos-pdp DaemonSet's Cerbos
#      listens. Without a binary this step is reported as skipped.
#
# Usage: scripts/validate-manifests.sh [overlay...]   (default: every overlay). Run from anywhere.
# Needs: kubectl (with its built-in kustomize), python3 (3.11+); installs kubernetes-validate==1.37.0 and
# cel-expr-python==0.1.3 with pip if missing. Exits non-zero on any failure.
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
CEL_VERSION="0.1.3"
if ! python3 -c 'from cel_expr_python import cel; from cel_expr_python.ext.ext_optional import ExtOptional' >/dev/null 2>&1; then
  echo "installing cel-expr-python==${CEL_VERSION} (pip)"
  python3 -m pip install --quiet "cel-expr-python==${CEL_VERSION}" || die "cannot install cel-expr-python (needs Python 3.11+)"
fi
kv_installed="$(python3 -c 'from kubernetes_validate.version import __version__ as v; print(v)')"
if [[ "$kv_installed" != "$KV_VERSION" ]]; then
  echo "note: kubernetes-validate ${kv_installed} installed (this script is tested with ${KV_VERSION})"
fi

bin="${PDP_INJECTOR_BIN:-}"
if [[ -z "$bin" ]]; then
  # The newer of the two builds: a release binary left from an earlier checkout must not judge this one's config.
  for candidate in target/release/pdp-injector target/debug/pdp-injector; do
    if [[ -x "$candidate" ]] && { [[ -z "$bin" ]] || [[ "$candidate" -nt "$bin" ]]; }; then
      bin="$candidate"
    fi
  done
fi

if [[ $# -gt 0 ]]; then
  overlays=("$@")
else
  overlays=()
  for dir in manifests/overlays/*/; do
    # k8s-1.20 is the test shim for the real-node tier's Kubernetes 1.20 (policy/v1beta1 and no newer fields):
    # it is checked by applying it to that apiserver (scripts/node), not against the 1.33 schema; so is
    # flagd-node-k8s-1.20, built on it (both rendered and checked without a schema at the end).
    [[ "$(basename "$dir")" == *k8s-1.20 ]] && continue
    [[ -f "${dir}kustomization.yaml" ]] && overlays+=("$(basename "$dir")")
  done
fi
[[ ${#overlays[@]} -gt 0 ]] || die "no overlays found under manifests/overlays"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT


echo "validate-manifests: overlays: ${overlays[*]}"
echo "  schema: kubernetes-validate ${kv_installed} --strict -k ${K8S_VERSION} (documents without a schema fail)"
echo "  cert-manager.io documents: structural and reference checks"
echo "  references (PriorityClass, policy bindings, NetworkPolicy selectors and ports): checked"
echo "  ValidatingAdmissionPolicy CEL: evaluated offline with cel-expr-python ${CEL_VERSION}"
if [[ -n "$bin" ]]; then
  echo "  pdp-injector config and daemonset wiring: checked with ${bin}"
elif [[ "${CI:-}" == true ]]; then
  die "no pdp-injector binary to check the config and the daemonset wiring with (set PDP_INJECTOR_BIN): under CI=true that is a failure, not a skip"
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
  if ! counts="$(python3 scripts/validate_manifests.py split "$out" 2>"$out/split.err")"; then
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

  refs_note=""
  if refs_out="$(python3 scripts/validate_manifests.py refs "$out" 2>"$out/refs.err")"; then
    refs_note="; references ok (${refs_out})"
  else
    cat "$out/refs.err"
    ok=0
  fi
  if cel_out="$(python3 scripts/validate_manifests.py cel "$out" 2>"$out/cel.err")"; then
    refs_note="${refs_note}; ${cel_out}"
  else
    cat "$out/cel.err"
    ok=0
  fi

  wiring_note=""
  if [[ -n "$bin" ]]; then
    if python3 scripts/validate_manifests.py configs "$out" 2>&1; then
      if ! cfg_out="$("$bin" inject --config "$out/config.yaml" -f /dev/null 2>&1)"; then
        echo "  error: pdp-injector refuses the rendered config.yaml: $cfg_out"
        ok=0
      elif wiring="$(python3 scripts/validate_manifests.py wiring "$out" "$bin" 2>"$out/wiring.err")"; then
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
    echo "ok   overlay ${overlay}: ${total} documents (${passed} schema-valid against Kubernetes ${K8S_VERSION}, strict; ${n_cm} cert-manager or FeatureFlag checked${refs_note}${wiring_note})"
  else
    echo "FAIL overlay ${overlay}: ${total} documents"
    failed+=("$overlay")
  fi
done

# The Kubernetes 1.20 overlays: kubernetes-validate has no schemas before 1.25, so they are rendered and given
# the checks that need no schema (namespaces, duplicates, FeatureFlag objects and the flagd --uri they answer);
# the node tier applies k8s-1.20 to a real 1.20 cluster. Only when every overlay was asked for.
if [[ $# -eq 0 ]]; then
  for dir in manifests/overlays/*k8s-1.20/; do
    overlay="$(basename "$dir")"
    out="$tmp/$overlay"
    mkdir -p "$out"
    echo "--- $overlay (Kubernetes 1.20: rendered, checked without a schema)"
    if ! kubectl kustomize "$dir" >"$out/rendered.yaml" 2>"$out/kustomize.err"; then
      echo "  error: kubectl kustomize $dir failed:"
      sed 's/^/    /' "$out/kustomize.err" | head -20
      failed+=("$overlay")
    elif counts="$(python3 scripts/validate_manifests.py split "$out")"; then
      read -r total _ _ <<<"$counts"
      echo "ok   overlay ${overlay}: ${total} documents rendered (no 1.20 schema here)"
    else
      failed+=("$overlay")
    fi
  done
fi

if [[ ${#failed[@]} -gt 0 ]]; then
  echo "validate-manifests: FAILED: ${failed[*]}" >&2
  exit 1
fi
if [[ $# -eq 0 ]]; then
  echo "validate-manifests: all ${#overlays[@]} overlays valid, and the Kubernetes 1.20 ones rendered"
else
  echo "validate-manifests: all ${#overlays[@]} overlays valid"
fi
