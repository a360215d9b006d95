#!/usr/bin/env bash
# Runs the cargo-fuzz targets (fuzz/README.md) for a fixed time each; fails on the first crash, leak, timeout or
# out-of-memory, leaving the input in fuzz/artifacts/<target>/.
#
#   scripts/fuzz.sh               20 s per target (what .ci/run uses)
#   scripts/fuzz.sh 600           10 minutes per target
#   scripts/fuzz.sh 3600 review   one target for an hour
#
# Environment: FUZZ_JOBS=N runs N fuzzing processes per target (default 1); FUZZ_SANITIZER=address builds with
# AddressSanitizer (default none: the crate forbids unsafe code, and ASan doubles the build); FUZZ_TARGET_DIR
# moves the build (default fuzz/target, never the main target/, which other builds use with other flags).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-20}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(review config offline)
sanitizer=${FUZZ_SANITIZER:-none}
jobs=${FUZZ_JOBS:-1}
target_dir=${FUZZ_TARGET_DIR:-$PWD/fuzz/target}

# cargo-fuzz from crates.io, pinned; libFuzzer comes with the libfuzzer-sys crate (built with the C++ compiler).
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz (crates.io)"
    cargo install --locked cargo-fuzz --version 0.13.2
fi
# cargo-fuzz passes -Z flags (sanitizer coverage) to rustc; the stable toolchain accepts them with this.
export RUSTC_BOOTSTRAP=1

bash scripts/fuzz-seeds.sh

# Optimised, with debug assertions and overflow checks (cargo-fuzz's default without --release), and 16
# codegen units instead of cargo-fuzz's 1: the build takes a fraction of the time, the runs are barely slower.
flags=(--sanitizer "$sanitizer" --codegen-units 16 --target-dir "$target_dir")
build() { cargo fuzz build "${flags[@]}" "$@"; }
started=$(date +%s)
if [ $# -eq 0 ] && [ ${#targets[@]} -eq 3 ]; then
    build
else
    for t in "${targets[@]}"; do build "$t"; done
fi
echo "fuzz: build took $(( $(date +%s) - started )) s"

parallel=()
if [ "$jobs" -gt 1 ]; then
    parallel=(-jobs="$jobs" -workers="$jobs")
fi
status=0
for t in "${targets[@]}"; do
    echo "fuzz: $t for ${seconds}s (corpus fuzz/corpus/$t, dictionary fuzz/dict/$t.dict)"
    log=$(mktemp)
    if cargo fuzz run "${flags[@]}" "$t" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
        -dict="fuzz/dict/$t.dict" -print_final_stats=1 "${parallel[@]}" >"$log" 2>&1; then
        grep -hE '^Done [0-9]+ runs|stat::number_of_executed_units|stat::average_exec_per_sec|stat::new_units_added|stat::peak_rss_mb' \
            "$log" fuzz-*.log 2>/dev/null | sed "s/^/fuzz: $t: /" || true
    else
        status=1
        echo "fuzz: $t FAILED; the input is in fuzz/artifacts/$t/: minimise it (cargo fuzz tmin), add it to"
        echo "fuzz: fuzz/regressions/$t/ (tests/it/fuzz_regressions.rs replays it), and fix the bug"
        tail -60 "$log"
    fi
    rm -f "$log" fuzz-*.log
done
echo "fuzz: $(( $(date +%s) - started )) s in all"
exit $status
