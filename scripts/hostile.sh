#!/usr/bin/env bash
# Hostile clients, drain under load and resource growth against the real `pdp-injector serve` and `node-proxy`
# (tests/hostile/main.rs), the long cases included: 1,000 idle connections, 30 s without keep-alive (descriptors and
# memory), a keep-alive connection still open and answering after 120 s idle, Pods of 100,000 containers and at
# the body limit, 30 concurrent 2.5 MiB Pods naming two profiles, 10,000 reviews of random namespaces, 5,000 +
# 5,000 idle connections to the front. About four minutes of run time, one test at a time (they measure time and
# count descriptors). Nothing is skipped: a known bug is a failing test, not a listed one.
#
#   scripts/hostile.sh                  release build (the timing bounds are for optimised code)
#   HOSTILE_PROFILE=debug scripts/hostile.sh   reuse the debug build of `cargo test` (looser time bounds)
#   scripts/hostile.sh drain            only tests whose name contains "drain"
#   HOSTILE_BIN=/path/pdp-injector scripts/hostile.sh   another build's figures (announced; refused under CI=true
#                                       unless it is this build)
set -euo pipefail
cd "$(dirname "$0")/.."

profile=()
[ "${HOSTILE_PROFILE:-release}" = release ] && profile=(--release)
# The front's test holds 5,000 + 5,000 idle connections and the front's own side of them: ~13,000 descriptors.
need=16384
limit=$(ulimit -n)
if [ "$limit" != unlimited ] && [ "$limit" -lt "$need" ]; then
    if ! ulimit -n "$need" 2>/dev/null; then
        hard=$(ulimit -Hn)
        if [ "$hard" = unlimited ] || [ "$hard" -gt "$limit" ]; then ulimit -n "$hard"; fi
        msg="hostile: open-file limit $(ulimit -n) (hard limit $hard), below the $need the front's idle-connection test needs: raise the hard limit (ulimit -Hn, or LimitNOFILE)"
        if [ "${CI:-}" = true ]; then echo "$msg" >&2; exit 1; fi
        echo "$msg; that test will fail" >&2
    fi
fi
started=$(date +%s)
cargo test --locked "${profile[@]}" --test hostile -- --include-ignored --test-threads=1 --nocapture --skip cpu_quota:: "$@"
echo "hostile: $(( $(date +%s) - started )) s"
