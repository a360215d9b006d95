#!/usr/bin/env bash
# flagd's official OpenFeature providers against this project, in two parts:
# 1. the injected wiring: openfeature-provider-flagd (PyPI) and @openfeature/flagd-provider (npm), each built
#    from the environment `pdp-injector inject` gives an app, for every flagd profile and mode
#    (scripts/flagd-providers/check.py; how the providers read the variables, nothing connects);
# 2. flags evaluated: the Python, Node and Rust (open-feature-flagd, tools/flagd-probe) providers in in-process
#    mode, each evaluating flags through `pdp-injector flag-sync` on loopback (scripts/flagd-providers/
#    test_sync.py, pytest): values, changes and their lag, scope, and the source restarted under them.
# No flagd runs here (none is reachable from the package registries).
#
# The providers are installed, pinned, into ${PDP_FLAGD_CACHE:-~/.cache/pdp-injector-flagd} (a venv from
# scripts/flagd-providers/requirements.txt, and node_modules), once per set of versions. PDP_INJECTOR_BIN
# uses another pdp-injector binary (default: cargo build in this checkout). Needs python3 (venv), node, npm.
# A missing tool or a failed install fails the run: nothing here is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

# The JavaScript provider and its peer dependencies, exact versions (bump together with requirements.txt's).
NPM_PACKAGES=(@openfeature/flagd-provider@0.16.1 @openfeature/server-sdk@1.23.0 @openfeature/core@1.12.0
    @openfeature/flagd-core@4.0.1 @grpc/grpc-js@1.14.7)
cache="${PDP_FLAGD_CACHE:-${HOME:-/tmp}/.cache/pdp-injector-flagd}"
key=$(printf '%s\n' "${NPM_PACKAGES[@]}" | cat - scripts/flagd-providers/requirements.txt | sha256sum | cut -c1-12)
dir="$cache/$key"

if [ ! -x "$dir/py/bin/python" ] || [ ! -d "$dir/node/node_modules/@openfeature/flagd-provider" ]; then
    echo "flagd-providers: installing the providers into $dir" >&2
    rm -rf "$dir"
    mkdir -p "$dir"
    python3 -m venv "$dir/py.tmp"
    "$dir/py.tmp/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
        -r scripts/flagd-providers/requirements.txt >&2
    mkdir -p "$dir/node.tmp"
    npm install --prefix "$dir/node.tmp" --no-save --no-audit --no-fund --loglevel=error "${NPM_PACKAGES[@]}" >&2
    # Renamed last: a broken install is never taken for a finished one.
    mv "$dir/node.tmp" "$dir/node"
    mv "$dir/py.tmp" "$dir/py"
fi

bin="${PDP_INJECTOR_BIN:-}"
if [ -z "$bin" ]; then
    cargo build --locked --quiet --bin pdp-injector >&2
    bin="${CARGO_TARGET_DIR:-target}/debug/pdp-injector"
fi

"$dir/py/bin/python" scripts/flagd-providers/check.py --bin "$bin" --python "$dir/py/bin/python" \
    --node-modules "$dir/node/node_modules"

# The Rust provider's app (its own workspace; the provider's build needs protoc).
probe="${PDP_FLAGD_PROBE_BIN:-}"
if [ -z "$probe" ]; then
    command -v protoc >/dev/null || { echo "flagd-providers: protoc is missing (Debian: protobuf-compiler)" >&2; exit 1; }
    (cd tools/flagd-probe && CARGO_TARGET_DIR=target cargo build --locked --quiet) >&2
    probe=tools/flagd-probe/target/debug/flagd-probe
fi

PDP_INJECTOR_BIN="$bin" PDP_FLAGD_PYTHON="$dir/py/bin/python" PDP_FLAGD_NODE_MODULES="$dir/node/node_modules" \
    PDP_FLAGD_PROBE_BIN="$probe" "$dir/py/bin/python" -m pytest -p no:cacheprovider -ra \
    scripts/flagd-providers/test_sync.py
