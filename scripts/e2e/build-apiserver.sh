#!/usr/bin/env bash
# Builds (once per machine) a real kube-apiserver from Debian bookworm's `kubernetes` source package and makes
# sure etcd, Go and the helpers are installed. Prints the path of the cached binary on its last stdout line.
#
#   build-apiserver.sh [COMPONENT...]
#   build-apiserver.sh --packages-only   install the Debian packages (runtime, E2E_EXTRA_PKGS, the build's) only
#   build-apiserver.sh --cached COMPONENT...   exit 0 when every component is cached, 1 otherwise; installs nothing
#
# With arguments (cmd/ names of the same source tree: kube-apiserver, kubelet, kube-controller-manager,
# kube-scheduler, kube-proxy, ...), makes sure each is cached as $E2E_CACHE_DIR/<component>-<version> and prints
# their paths, one per line, in the order given. The missing ones are built together in ONE `make WHAT="cmd/a
# cmd/b ..."` (they share most compiled packages). The Go build cache is kept in $E2E_CACHE_DIR/gocache-<version>
# (the source tree is always unpacked at the same path), so a later build of other components of the same source
# version reuses what an earlier one compiled. Concurrent runs wait for each other (flock on the cache directory).
#
# Exit codes: 0 ok; 3 = prerequisites unavailable (no apt, no source package, build failed): the caller reports
# the tier as SKIPPED (loudly) or failed.
#
# Environment:
#   E2E_CACHE_DIR        cache directory (default /var/cache/pdp-injector-e2e)
#   E2E_EXTRA_PKGS       more Debian packages to install (same apt path, no service started); scripts/node uses it
#   E2E_KUBE_SRC_VERSION Debian source version to build, without the Debian revision (default
#                        1.20.5+really1.20.2: upstream 1.20.2; the revision, e.g. -1.1+deb12u1, is whatever
#                        bookworm serves, and is recorded next to the cached binary)
set -euo pipefail

CACHE_DIR=${E2E_CACHE_DIR:-/var/cache/pdp-injector-e2e}
SRC_VERSION=${E2E_KUBE_SRC_VERSION:-1.20.5+really1.20.2}
UPSTREAM=${SRC_VERSION##*really}           # 1.20.2
# Source patches applied before the build (scripts/e2e/patches/*.patch, in name order); the cached binaries' names
# carry their hash, so a changed patch set rebuilds them.
PATCH_DIR="$(cd "$(dirname "$0")" && pwd)/patches"
PATCHES=()
for p in "$PATCH_DIR"/*.patch; do [ -e "$p" ] && PATCHES+=("$p"); done
# Build tags: no in-tree cloud providers (the clusters here have none) and no dockershim (the kubelet talks CRI to
# containerd); together they leave about a third of the packages uncompiled. They are part of the binaries' names.
TAGS=providerless,dockerless
LABEL=$UPSTREAM-${TAGS//,/-}
[ ${#PATCHES[@]} -eq 0 ] || LABEL="$LABEL-p$(cat "${PATCHES[@]}" | sha256sum | cut -c1-8)"
LOG="$CACHE_DIR/build-$LABEL.log"
mode=build
case "${1:-}" in
    --packages-only) mode=packages; shift ;;
    --cached) mode=cached; shift ;;
esac
COMPONENTS=("$@")
[ ${#COMPONENTS[@]} -gt 0 ] || COMPONENTS=(kube-apiserver)
for c in "${COMPONENTS[@]}"; do
    case "$c" in */*|""|.*) echo "[build-apiserver] not a component name: $c" >&2; exit 2 ;; esac
done

log() { printf '[build-apiserver] %s\n' "$*" >&2; }
unavailable() { log "UNAVAILABLE: $*"; exit 3; }

mkdir -p "$CACHE_DIR"
cached() { [ -x "$CACHE_DIR/$1-$LABEL" ] && "$CACHE_DIR/$1-$LABEL" --version >/dev/null 2>&1; }
if [ $mode = cached ]; then
    for c in "${COMPONENTS[@]}"; do cached "$c" || exit 1; done
    exit 0
fi

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo -n "$@"; else return 1; fi; }

apt_updated=0
apt_update() {
    [ "$apt_updated" = 1 ] && return 0
    log "apt-get update"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 || unavailable "apt-get update failed"
    apt_updated=1
}
need_pkgs() {  # install the Debian packages among "$@" that are missing
    local missing=() p
    for p in "$@"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p"); done
    [ ${#missing[@]} -eq 0 ] && return 0
    command -v apt-get >/dev/null || unavailable "apt-get not found (need: ${missing[*]})"
    apt_update
    log "apt-get install ${missing[*]}"
    # policy-rc.d: never let a package start a system service (etcd-server would start its own etcd).
    local prc=/usr/sbin/policy-rc.d created_prc=0
    if [ ! -e $prc ]; then printf '#!/bin/sh\nexit 101\n' | as_root tee $prc >/dev/null; as_root chmod +x $prc; created_prc=1; fi
    local rc=0
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" \
        >"$CACHE_DIR/apt-install.log" 2>&1 || { rc=$?; tail -20 "$CACHE_DIR/apt-install.log" >&2; }
    [ $created_prc = 1 ] && as_root rm -f $prc
    [ $rc = 0 ] || unavailable "apt-get install ${missing[*]} failed"
}

# Runtime needs: etcd (the apiserver's store) and openssl (certs). kubectl comes with the machine image; if it is
# missing, the cached build includes one (see below).
need_pkgs etcd-server openssl ${E2E_EXTRA_PKGS:-}
BUILD_PKGS="golang-go golang-github-modern-go-reflect2-dev rsync dpkg-dev make patch"
if [ $mode = packages ]; then
    # shellcheck disable=SC2086
    need_pkgs $BUILD_PKGS
    log "packages installed"
    exit 0
fi

missing_components() { local c; for c in "${COMPONENTS[@]}"; do cached "$c" || echo "$c"; done; }
print_paths() { local c; for c in "${COMPONENTS[@]}"; do echo "$CACHE_DIR/$c-$LABEL"; done; }

if [ -z "$(missing_components)" ]; then
    for c in "${COMPONENTS[@]}"; do log "cached: $CACHE_DIR/$c-$LABEL ($("$CACHE_DIR/$c-$LABEL" --version))"; done
    print_paths; exit 0
fi

# One build at a time per cache directory (the source tree and the Go cache are shared); whoever waited re-checks.
exec 9>"$CACHE_DIR/.build.lock"
if ! flock -n 9; then
    log "another build holds $CACHE_DIR/.build.lock: waiting for it"
    flock 9
fi
mapfile -t MISSING < <(missing_components)
if [ ${#MISSING[@]} -eq 0 ]; then print_paths; exit 0; fi

log "not cached: ${MISSING[*]} $UPSTREAM: building from Debian's source package kubernetes=$SRC_VERSION (5-10 min on 2 cores)"
# shellcheck disable=SC2086
need_pkgs $BUILD_PKGS

# deb-src for bookworm main, with the same signed-by keyring as the existing binary entry.
SRC_LIST=/etc/apt/sources.list.d/pdp-injector-e2e-src.sources
src_version() { apt-cache showsrc kubernetes 2>/dev/null | sed -n 's/^Version: //p' | grep -F "$SRC_VERSION-" | sort -V | tail -1; }
if [ -z "$(src_version)" ]; then
    keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    uri=http://deb.debian.org/debian
    if [ -f /etc/apt/sources.list.d/debian.sources ]; then
        k=$(sed -n 's/^[Ss]igned-[Bb]y:[[:space:]]*//p' /etc/apt/sources.list.d/debian.sources | head -1)
        u=$(sed -n 's/^URIs:[[:space:]]*//p' /etc/apt/sources.list.d/debian.sources | head -1 | awk '{print $1}')
        [ -n "$k" ] && keyring=$k; [ -n "$u" ] && uri=$u
    fi
    log "adding deb-src entry $SRC_LIST ($uri bookworm main, signed-by $keyring)"
    printf 'Types: deb-src\nURIs: %s\nSuites: bookworm\nComponents: main\nSigned-By: %s\n' "$uri" "$keyring" \
        | as_root tee "$SRC_LIST" >/dev/null
    apt_updated=0; apt_update
fi

DEB_VERSION=$(src_version)
[ -n "$DEB_VERSION" ] || unavailable "no source package kubernetes=$SRC_VERSION-* in the apt sources"
WORK="$CACHE_DIR/src-$UPSTREAM"
rm -rf "$WORK"; mkdir -p "$WORK"
log "apt-get source --download-only kubernetes=$DEB_VERSION"
( cd "$WORK" && apt-get source --download-only -qq "kubernetes=$DEB_VERSION" >&2 ) \
    || unavailable "apt-get source kubernetes=$DEB_VERSION failed"
dsc=$(ls "$WORK"/kubernetes_*.dsc | head -1)
( cd "$WORK" && dpkg-source -x "$dsc" tree >&2 ) || unavailable "dpkg-source -x failed"
TREE="$WORK/tree"
[ -d "$TREE/vendor/github.com/modern-go/reflect2" ] || unavailable "unexpected source layout (no vendored reflect2)"

# reflect2 1.0.1 segfaults under Go >= 1.18 whenever a map is encoded: swap in Debian's 1.0.2 sources, keeping the
# old files' mtimes (newer vendor files would make the build regenerate code).
R_OLD="$TREE/vendor/github.com/modern-go/reflect2"
R_NEW=/usr/share/gocode/src/github.com/modern-go/reflect2
stamp=$(stat -c %Y "$R_OLD/reflect2.go")
find "$R_OLD" -maxdepth 1 -type f \( -name '*.go' -o -name '*.s' \) -delete
for f in "$R_NEW"/*.go "$R_NEW"/*.s; do
    [ -e "$f" ] || continue
    case "$f" in *_test.go) continue;; esac
    cp "$f" "$R_OLD/"
done
find "$R_OLD" -type f -exec touch -d "@$stamp" {} +

# The patches, each changed file keeping the tree's mtime (as above).
for p in "${PATCHES[@]}"; do
    log "applying $(basename "$p")"
    files=$(sed -n 's|^+++ b/||p' "$p")
    ( cd "$TREE" && patch -p1 --forward --batch --quiet <"$p" >&2 ) || unavailable "patch $(basename "$p") does not apply"
    for f in $files; do [ -e "$TREE/$f" ] && touch -d "@$stamp" "$TREE/$f"; done
done

export GOPATH="$WORK/gopath" GOCACHE="$WORK/gocache" GO111MODULE=off GOPROXY=off GOFLAGS=-tags=$TAGS GOTOOLCHAIN=local
# The Go build cache outlives the tree (unpacked at the same path every time, so its entries match): building
# more components of this source version later recompiles only what they add. Kubernetes' build scripts set
# GOCACHE=_output/local/go/cache themselves, so that path is made a link to the kept cache.
mkdir -p "$CACHE_DIR/gocache-$UPSTREAM" "$TREE/_output/local/go"
ln -sfn "$CACHE_DIR/gocache-$UPSTREAM" "$TREE/_output/local/go/cache"
what=$(printf 'cmd/%s ' "${MISSING[@]}"); what=${what% }
log "make WHAT=\"$what\" (log: $LOG)"
start=$(date +%s)
if ! ( cd "$TREE" && nice -n 10 make WHAT="$what" >"$LOG" 2>&1 ); then
    tail -30 "$LOG" >&2
    unavailable "build of ${MISSING[*]} failed (log: $LOG)"
fi
log "built ${MISSING[*]} in $(( $(date +%s) - start ))s"
for c in "${MISSING[@]}"; do
    out=$(ls "$TREE/_output/bin/$c" "$TREE"/_output/local/bin/*/*/"$c" 2>/dev/null | head -1)
    [ -x "$out" ] || unavailable "build produced no $c"
    bin="$CACHE_DIR/$c-$LABEL"
    install -m 0755 "$out" "$bin.tmp" && mv "$bin.tmp" "$bin"
    echo "kubernetes source package $DEB_VERSION, reflect2 replaced by Debian's $(dpkg-query -W -f='${Version}' golang-github-modern-go-reflect2-dev), patches: ${PATCHES[*]##*/}, $(go version)" >"$bin.source"
    log "cached: $bin ($("$bin" --version))"
done
rm -rf "$WORK"
print_paths
