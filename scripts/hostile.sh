#!/usr/bin/env bash
# Hostile clients, drain under load and resource growth against the real `pdp-injector serve` (tests/hostile.rs),
# the long cases included: 1,000 idle connections, 30 s without keep-alive (descriptors and memory), a keep-alive
# connection still open and answering after 120 s idle. About three minutes of run time, one test at a time (they
# measure time and count descriptors). Nothing is skipped: a known bug is a failing test, not a listed one.
#
#   scripts/hostile.sh                  release build (the timing bounds are for optimised code)
#   HOSTILE_PROFILE=debug scripts/hostile.sh   reuse the debug build of `cargo test` (looser time bounds)
#   scripts/hostile.sh drain            only tests whose name contains "drain"
set -euo pipefail
cd "$(dirname "$0")/.."

profile=()
[ "${HOSTILE_PROFILE:-release}" = release ] && profile=(--release)
limit=$(ulimit -n)
if [ "$limit" != unlimited ] && [ "$limit" -lt 4096 ]; then
    ulimit -n 4096 2>/dev/null || echo "hostile: open-file limit $limit; the 1,000-connection test needs ~2,100"
fi
started=$(date +%s)
cargo test --locked "${profile[@]}" --test hostile -- --include-ignored --test-threads=1 --nocapture "$@"
echo "hostile: $(( $(date +%s) - started )) s"
