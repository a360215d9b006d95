#!/usr/bin/env bash
# p99 answer time of a 22 KiB review with the server limited to a tenth of a core (tests/hostile/cpu_quota.rs).
#
# The quota is a cgroup: v2 cpu.max where /sys/fs/cgroup is cgroup2 with the cpu controller, else v1
# cpu.cfs_quota_us under /sys/fs/cgroup/cpu; the server is also pinned to CPU 0 with taskset. systemd-run
# (`--scope -p CPUQuota=10%`) needs systemd as PID 1, which containers and CI sandboxes usually lack, so the test
# writes the cgroup itself (root needed). Without any mechanism it prints "NOT MEASURED" and why, and fails.
#
#   scripts/cpu-quota.sh                       10% of a core
#   PDP_CPU_QUOTA_PERCENT=5 scripts/cpu-quota.sh
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
    echo "cpu-quota: not root, so probably no writable cgroup (the test says)" >&2
fi
out=$(mktemp)
cargo test --locked --release --test hostile -- --include-ignored --nocapture cpu_quota:: 2>&1 | tee "$out"
status=${PIPESTATUS[0]}
echo
echo "== cpu-quota summary"
grep '^cpu-quota:' "$out" || echo "cpu-quota: no figure: the test did not get that far (see above)"
rm -f "$out"
exit "$status"
