#!/usr/bin/env bash
# Node tier: pdp-injector installed with the real manifests on a one-node Kubernetes 1.20 cluster on this machine
# (scripts/node/cluster.sh), Pods really running, the cases of scripts/node/cases.py (pytest: test_node.py). See
# scripts/node/README.md.
#
#   scripts/node/run.sh [--keep] [WORD...]    (WORD: only cases whose name contains it)
#
# Brings the cluster up (or uses the one that `cluster.sh up` left running, and leaves it running), installs,
# runs the cases, and takes the cluster down again, then checks that nothing was left behind. --keep: leave the
# cluster up afterwards (`scripts/node/cluster.sh down` removes it). On failure, the component logs and the
# Pods' logs and descriptions are printed and kept in a directory named at the end.
#
# Output: pytest's line per case with its outcome and figures, its summary; each step's duration.
set -euo pipefail
cd "$(dirname "$0")/../.."
HERE=scripts/node
export PYTHONDONTWRITEBYTECODE=1
STATE=${NODE_STATE_DIR:-/var/lib/pdp-injector-node}

keep=0
filters=()
for a in "$@"; do
    case "$a" in
        --keep) keep=1 ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) filters+=(--case "$a") ;;
    esac
done

log() { printf '[node] %s\n' "$*" >&2; }
t0=$(date +%s)
python3 -c 'import pytest' 2>/dev/null || { log "python3 with pytest is required (pip install pytest; .ci/run does)"; exit 1; }

# A full disk shows up much later as something else (the kubelet "cannot find" an image it just imported), so
# say it first. The images, containerd's snapshots and the Pods' logs need a few GiB under /var.
need_gib=${NODE_MIN_FREE_GIB:-4}
free_gib=$(df --output=avail -BG /var 2>/dev/null | tail -1 | tr -dc '0-9')
if [ -n "$free_gib" ] && [ "$free_gib" -lt "$need_gib" ]; then
    log "only ${free_gib} GiB free under /var (need ${need_gib}; NODE_MIN_FREE_GIB): free some space first"
    exit 1
fi
# One node tier per machine (fixed ports, the node address, containerd's state): a second run waits its turn.
exec 8>/var/lock/pdp-injector-node-tier.lock
if ! flock -n 8; then
    log "another node tier run holds /var/lock/pdp-injector-node-tier.lock: waiting for it"
    flock 8
fi
ours=1
if [ -d "$STATE" ] && python3 "$HERE/cluster.py" status >/dev/null 2>&1; then
    log "a cluster is already up ($STATE): using it, leaving it up"
    ours=0
fi

rc=0
dump() {
    local dir
    dir=$(mktemp -d /tmp/pdp-injector-node-failed-XXXXXX)
    [ -d "$STATE/logs" ] && cp -r "$STATE/logs" "$dir/" || true
    local kc="$STATE/admin.kubeconfig"
    if [ -f "$kc" ]; then
        {
            kubectl --kubeconfig "$kc" --request-timeout=20s get nodes,pods -A -o wide
            kubectl --kubeconfig "$kc" --request-timeout=20s describe node
            for ns in pdp-system pdp-node; do
                kubectl --kubeconfig "$kc" --request-timeout=20s -n "$ns" describe pods
                kubectl --kubeconfig "$kc" --request-timeout=20s -n "$ns" get events --sort-by=.lastTimestamp
                for p in $(kubectl --kubeconfig "$kc" --request-timeout=20s -n "$ns" get pods -o name); do
                    echo "--- logs $ns $p"
                    kubectl --kubeconfig "$kc" --request-timeout=20s -n "$ns" logs "$p" --all-containers --tail=80
                done
            done
        } >"$dir/cluster.txt" 2>&1 || true
    fi
    echo "==================== node tier failed: diagnostics (kept in $dir) ====================" >&2
    for c in kubelet containerd kube-apiserver kube-controller-manager kube-scheduler kube-proxy; do
        [ -f "$dir/logs/$c.log" ] || continue
        echo "--- $c (last 25 lines of $dir/logs/$c.log)" >&2
        grep -v '^I[0-9]' "$dir/logs/$c.log" | tail -25 >&2 || true
    done
    [ -f "$dir/cluster.txt" ] && { echo "--- cluster ($dir/cluster.txt, last 150 lines)" >&2; tail -150 "$dir/cluster.txt" >&2; }
}

finish() {
    local status=$?
    [ $rc = 0 ] && rc=$status
    trap - EXIT INT TERM
    [ $rc != 0 ] && dump
    if [ $ours = 1 ] && [ $keep = 0 ]; then
        local td
        td=$(date +%s)
        if bash "$HERE/cluster.sh" down; then
            log "cluster down in $(( $(date +%s) - td ))s, nothing left behind"
        else
            echo "FAIL cluster-down-leaves-nothing: see the 'left behind' lines above"
            rc=1
        fi
    elif [ $keep = 1 ]; then
        log "cluster left up (--keep): KUBECONFIG=$STATE/admin.kubeconfig; scripts/node/cluster.sh down removes it"
    fi
    echo "node tier: $([ $rc = 0 ] && echo passed || echo FAILED) in $(( $(date +%s) - t0 ))s (cluster up ${t_up:-?}s, cases ${t_cases:-?}s)"
    exit $rc
}
trap finish EXIT
trap 'rc=130; exit 130' INT TERM

ts=$(date +%s)
if [ $ours = 1 ]; then
    kubeconfig=$(bash "$HERE/cluster.sh" up | tail -1)
else
    kubeconfig=$STATE/admin.kubeconfig
fi
t_up=$(( $(date +%s) - ts ))
log "cluster ready in ${t_up}s"

ts=$(date +%s)
# -s: progress and figures as they come; -p tier_pytest: the tiers' plugin (scripts/lib).
PYTHONPATH=scripts/lib:$HERE${PYTHONPATH:+:$PYTHONPATH} python3 -m pytest --rootdir=. -p tier_pytest -p no:cacheprovider \
    -v -s -rfE --tb=short --color=no --durations=0 --durations-min=1 "$HERE/test_node.py" --kubeconfig "$kubeconfig" \
    ${filters[@]+"${filters[@]}"} || rc=$?
t_cases=$(( $(date +%s) - ts ))
