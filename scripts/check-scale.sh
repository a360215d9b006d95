#!/usr/bin/env bash
# `pdp-injector check` at cluster scale (scripts/check-scale.py): time and peak RSS of `check -A` against a real
# kube-apiserver 1.20.2 (built once by scripts/e2e/build-apiserver.sh) holding 10,000 and 50,000 Pods.
#
#   scripts/check-scale.sh [COUNT...]
#
# A benchmark for BENCHMARKS.md ("check at cluster scale"), not a CI stage: the 50,000 Pods take minutes to create.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONDONTWRITEBYTECODE=1
bin=${PDP_INJECTOR_BIN:-}
if [ -z "$bin" ]; then
    echo "[check-scale] cargo build --release --bin pdp-injector" >&2
    cargo build --locked --quiet --release --bin pdp-injector >&2
    bin=${CARGO_TARGET_DIR:-target}/release/pdp-injector
fi
apiserver=$(bash scripts/e2e/build-apiserver.sh | tail -1)
exec python3 scripts/check-scale.py --pdp-injector "$(realpath "$bin")" --kube-apiserver "$apiserver" \
    --etcd "$(command -v etcd)" --kubectl "$(command -v kubectl)" "$@"
