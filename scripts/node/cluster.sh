#!/usr/bin/env bash
# A one-node Kubernetes 1.20 cluster on this machine, no container engine (see scripts/node/README.md).
#
#   scripts/node/cluster.sh up        build or find everything, start the cluster (idempotent), print KUBECONFIG
#   scripts/node/cluster.sh down      stop what up started (by PID) and remove what it added
#   scripts/node/cluster.sh status    components, node, Pods; or what down left behind
#
# Needs root and the Debian package registry (first run: packages, the Kubernetes build, ~10 min on 2 cores).
# Environment: PDP_INJECTOR_BIN (the webhook binary to put in its image; default: cargo build in this checkout),
# E2E_CACHE_DIR (default /var/cache/pdp-injector-e2e), NODE_STATE_DIR, NODE_RUN_DIR, NODE_IP (10.245.0.1).
set -euo pipefail
cd "$(dirname "$0")/../.."
HERE=scripts/node
export PYTHONDONTWRITEBYTECODE=1
CACHE_DIR=${E2E_CACHE_DIR:-/var/cache/pdp-injector-e2e}
CERBOS_NPM_VERSION=0.51.0 # the version scripts/docs-snippets.sh runs
NODE_PKGS=$(grep -v '^#' "$HERE/packages.txt" | tr '\n' ' ')

log() { printf '[node] %s\n' "$*" >&2; }

# Everything `up` needs, built or found once and cached in $CACHE_DIR keyed by its inputs. Sets the variables
# BINS (cluster.py flags) and IMAGES (--image NAME ARCHIVE pairs).
prepare() {
    local t0 t
    t0=$(date +%s)
    mapfile -t kube < <(E2E_EXTRA_PKGS="$NODE_PKGS" bash scripts/e2e/build-apiserver.sh \
        kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy | tail -5)
    [ ${#kube[@]} = 5 ] || { log "scripts/e2e/build-apiserver.sh gave no binaries"; return 1; }
    BINS=(--etcd "$(command -v etcd)" --kube-apiserver "${kube[0]}" --kube-controller-manager "${kube[1]}"
          --kube-scheduler "${kube[2]}" --kubelet "${kube[3]}" --kube-proxy "${kube[4]}")
    log "Kubernetes binaries ready ($(( $(date +%s) - t0 ))s)"

    # Cerbos: the binary of the npm package (as scripts/docs-snippets.sh uses it).
    local npm_dir="$CACHE_DIR/npm-cerbos-$CERBOS_NPM_VERSION"
    local cerbos="$npm_dir/node_modules/@cerbos/cerbos-linux-x64/cerbos-linux-x64"
    if [ ! -x "$cerbos" ]; then
        log "npm install @cerbos/cerbos-linux-x64@$CERBOS_NPM_VERSION"
        npm install --prefix "$npm_dir" --no-save --no-audit --no-fund --loglevel=error \
            "@cerbos/cerbos-linux-x64@$CERBOS_NPM_VERSION" >&2
    fi

    # The test client: static Go (standard library + Debian's golang.org/x/net), cached by source and Go version.
    local key client
    key=$(cat "$HERE/pdpclient/main.go" <(go version) | sha256sum | cut -c1-16)
    client="$CACHE_DIR/pdpclient-$key"
    if [ ! -x "$client" ]; then
        t=$(date +%s)
        GO111MODULE=off GOPATH=/usr/share/gocode GOCACHE="$CACHE_DIR/gocache-pdpclient" GOFLAGS= CGO_ENABLED=0 \
            GOTOOLCHAIN=local nice -n 10 go build -trimpath -ldflags=-s -o "$client.tmp" "$HERE/pdpclient/main.go"
        mv "$client.tmp" "$client"
        log "built the test client in $(( $(date +%s) - t ))s"
    fi

    local bin=${PDP_INJECTOR_BIN:-}
    if [ -z "$bin" ]; then
        t=$(date +%s)
        log "cargo build --locked --bin pdp-injector"
        cargo build --locked --quiet --bin pdp-injector >&2
        bin=${CARGO_TARGET_DIR:-target}/debug/pdp-injector
        log "webhook binary ready ($(( $(date +%s) - t ))s)"
    fi
    [ -x "$bin" ] || { log "no pdp-injector binary at $bin"; return 1; }
    # pdp-await, the classic sidecars' helper (the webhook image carries it, as the Dockerfile's does): static,
    # built in its own directory (its .cargo/config.toml links it statically); a few seconds.
    local await_bin=tools/pdp-await/target/release/pdp-await
    (cd tools/pdp-await && CARGO_TARGET_DIR=target cargo build --locked --quiet --release) >&2
    [ -x "$await_bin" ] || { log "no pdp-await binary at $await_bin"; return 1; }

    # The app on the official Rust flagd provider (its own workspace; the provider's build needs protoc).
    local probe_bin=${PDP_FLAGD_PROBE_BIN:-}
    if [ -z "$probe_bin" ]; then
        (cd tools/flagd-probe && CARGO_TARGET_DIR=target cargo build --locked --quiet) >&2
        probe_bin=tools/flagd-probe/target/debug/flagd-probe
    fi
    [ -x "$probe_bin" ] || { log "no flagd-probe binary at $probe_bin"; return 1; }

    IMAGES=()
    local name archive
    while read -r name archive; do IMAGES+=(--image "$name" "$archive"); done < <(
        python3 "$HERE/images.py" --out-dir "$CACHE_DIR/node-images" --pdp-injector "$(realpath "$bin")" \
            --pdp-await "$(realpath "$await_bin")" --cerbos "$cerbos" --busybox /bin/busybox --client "$client" \
            --flagd-probe "$(realpath "$probe_bin")")
    log "prerequisites ready in $(( $(date +%s) - t0 ))s"
}

cmd=${1:-}
case "$cmd" in
    up)
        [ "$(id -u)" = 0 ] || { log "needs root"; exit 1; }
        prepare
        exec python3 "$HERE/cluster.py" up "${BINS[@]}" "${IMAGES[@]}"
        ;;
    down|status|leftovers)
        exec python3 "$HERE/cluster.py" "$cmd"
        ;;
    *)
        sed -n '2,11p' "$0"; exit 2 ;;
esac
