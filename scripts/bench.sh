#!/usr/bin/env bash
# Performance of pdp-injector against the floor of its own stack, in one go, on this machine (see BENCHMARKS.md).
#
#   scripts/bench.sh            # full run: ~20 minutes on 2 cores
#   scripts/bench.sh --quick    # smoke run (CI): a second or two per case, ~2 minutes after the build
#   scripts/bench.sh --flag-sync   # only the flag sync fan-out (5. below), ~1 minute after the build
#
# Options: --rounds N (default 3; 1 with --quick), --cases "mix inject ..." (default all), --no-criterion,
# --max-wait SECONDS (full run: wait at most this long in all for a quiet machine; default 1200),
# --oha (also run oha, installed with `cargo install oha` if missing, at 8 connections, to cross-check the load
# generator), --strict (exit 1 when a target is missed), --flag-sync (only the flag sync fan-out; with --quick, 200
# streams and 5 changes).
#
# What it does: builds the release binary and the benchmark tools of bench/ (null-server, loadgen, gen-reviews,
# bench-report), generates certificates and AdmissionReview bodies (benches/reviews.rs, the criterion benchmark's
# inputs), then
#   1. criterion: `cargo bench --bench core` (the core path; 22 KiB inject only with --quick), and the core path
#      stage by stage (bench/src/bin/stages.rs, 22 KiB inject: decode, view, decide, render, encode);
#   2. for each case (the request mix and each class alone), the null handler (bench/src/bin/null-server.rs, same
#      stack, same bodies) and `pdp-injector serve` back to back (the order flips every round), each a fresh
#      process pinned to core 0 with the load generator (bench/src/bin/loadgen.rs) pinned to core 1: closed loop
#      with keep-alive at 1, 8 and 64 connections, then open loop at 1,000 req/s on 8 connections (a client that
#      never sleeps, see loadgen() below; the inject case also at 8 connections with a sleeping one); server CPU
#      per request from /proc/PID/stat over the measurement window, peak RSS (VmHWM); the rounds repeat all of
#      it and the report takes medians; the inject case also at 2 and 80 KiB (inject_2k, inject_80k), for the
#      cost per extra KiB against the floor's;
#   3. a flood: 512 connections posting 80 KiB reviews closed-loop at `serve` (default --max-in-flight 256), and
#      the same at the null handler (how much of the memory is the stack's);
#   4. offline `inject` of a 20,000-document YAML stream, on one core and on all (median of 3 each);
#   5. (full run and --flag-sync) the flag sync fan-out (bench/src/bin/sync-fanout.rs): `pdp-injector flag-sync
#      --flags-dir` pinned to core 0, 1,000 SyncFlags streams from core 1, one connection per stream and then 16
#      streams per connection, 20 changes of the flag file: change-to-subscriber p50/p99, server CPU per change,
#      RSS (target/bench/flag-sync.txt; with --flag-sync, its JSON in target/bench/flag-sync.jsonl);
# and prints the tables, the ratios ours/floor and pass/miss per target. Results: target/bench/results.jsonl (every
# run), target/bench/summary.json (the medians and the verdicts), target/bench/report.txt (the printed report).
# Only 127.0.0.1 is used; every process started here is killed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
rounds=
cases="mix inject inject_2k inject_80k opted_out already_injected bare update"
criterion=1
max_wait=1200
oha=0
strict=0
flag_sync_only=0
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=1 ;;
        --rounds) rounds="$2"; shift ;;
        --cases) cases="$2"; shift ;;
        --no-criterion) criterion=0 ;;
        --max-wait) max_wait="$2"; shift ;;
        --oha) oha=1 ;;
        --strict) strict=1 ;;
        --flag-sync) flag_sync_only=1 ;;
        -h|--help) sed -n '2,36p' "$0"; exit 0 ;;
        *) echo "bench.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

if [ "$quick" = 1 ]; then
    rounds="${rounds:-1}"
    closed_warmup=0.3; closed_duration=0.7
    open_warmup=0.5; open_duration=1.5
    flood_warmup=0.5; flood_duration=2
    offline_runs=1
else
    rounds="${rounds:-3}"
    closed_warmup=1; closed_duration=3
    open_warmup=1; open_duration=8
    flood_warmup=1; flood_duration=10
    offline_runs=3
fi
open_rate=1000
open_connections=8

for tool in taskset getconf; do
    command -v "$tool" >/dev/null || { echo "bench.sh: needs $tool" >&2; exit 2; }
done
if [ "$(getconf _NPROCESSORS_ONLN)" -lt 2 ]; then
    echo "bench.sh: needs 2 cores (server on core 0, load generator on core 1)" >&2
    exit 2
fi

# Cargo's target dir (CARGO_TARGET_DIR when set, as .ci/run sets it), where the builds and the results go.
target=${CARGO_TARGET_DIR:-target}
out=$target/bench
mkdir -p "$out"
results="$out/results.jsonl"
# --flag-sync alone leaves the full run's results in place.
if [ "$flag_sync_only" = 1 ]; then results="$out/flag-sync.jsonl"; fi
: > "$results"
clk_tck="$(getconf CLK_TCK)"
bin=$target/release/pdp-injector
tools=$target/release
started_at=$(date +%s)

step() { printf '==> %s\n' "$*" >&2; }

# --- processes started here, killed on exit -------------------------------------------------------------------
pids=()
cleanup() {
    local pid
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- 5. flag sync fan-out (defined here, run after the flood, or alone with --flag-sync) ---------------------------
# sync-fanout starts and stops its own servers (pinned to core 0); it fails when a stream misses a change.
flag_sync() {
    local args=(--streams 1000 --changes 20)
    if [ "$quick" = 1 ]; then args=(--streams 200 --changes 5 --idle 1); fi
    step "flag sync fan-out: ${args[1]} SyncFlags streams, one connection each and 16 per connection, ${args[3]} changes"
    if ! taskset -c 1 "$tools/sync-fanout" --bin "$bin" --server-cpu 0 --per-connection 1,16 "${args[@]}" \
        --work-dir "$out/flag-sync" --clk-tck "$clk_tck" --label flag_sync >> "$results" 2> "$out/flag-sync.txt"; then
        cat "$out/flag-sync.txt" >&2
        echo "bench.sh: the flag sync fan-out failed" >&2
        exit 1
    fi
    cat "$out/flag-sync.txt" >&2
}

# --- build ---------------------------------------------------------------------------------------------------
step "building the release binary and the benchmark tools (bench/)"
cargo build --release --locked --bin pdp-injector >&2
cargo build --release --locked -p pdp-injector-bench \
    --bin null-server --bin loadgen --bin gen-reviews --bin bench-report --bin stages --bin sync-fanout >&2
if [ "$oha" = 1 ] && ! command -v oha >/dev/null; then
    step "installing oha from crates.io"
    cargo install oha --locked >&2
fi

if [ "$flag_sync_only" = 1 ]; then
    flag_sync
    exit 0
fi

step "certificates, bodies and the YAML stream"
"$bin" certs --extra-san 127.0.0.1 --out-dir "$out/certs" >/dev/null 2>&1
"$tools/gen-reviews" bodies "$out/bodies" 2>/dev/null
"$tools/gen-reviews" stream 20000 "$out/stream.yaml"

# --- a quiet machine -----------------------------------------------------------------------------------------
# The full run starts when the 1-minute load is below 1.2, and before each step (when none of its own processes
# runs) waits until other work uses less than a quarter of a core, measured from /proc/stat over 2 s. The waits
# share one budget (--max-wait); past it, the run goes on and the report shows the foreign CPU of every run.
load1() { cut -d' ' -f1 /proc/loadavg; }
busy_ticks() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9; exit}' /proc/stat; }
waited=0
foreign_cores() { # CPU used by others over 2 s, in cores
    local b e
    b=$(busy_ticks); sleep 2; e=$(busy_ticks)
    awk -v b="$b" -v e="$e" -v t="$clk_tck" 'BEGIN{printf "%.2f", (e-b)/t/2}'
}
wait_quiet() {
    [ "$quick" = 0 ] || return 0
    local f
    while f=$(foreign_cores) && awk -v f="$f" 'BEGIN{exit !(f > 0.25)}' && [ "$waited" -lt "$max_wait" ]; do
        step "other work uses $f cores: waiting (${waited}s of ${max_wait}s)"
        sleep 13
        waited=$((waited + 15))
    done
}
if [ "$quick" = 0 ]; then
    while awk -v l="$(load1)" 'BEGIN{exit !(l > 1.2)}' && [ "$waited" -lt "$max_wait" ]; do
        step "1-minute load $(load1) > 1.2 (other work on the machine): waiting (${waited}s of ${max_wait}s)"
        sleep 30
        waited=$((waited + 30))
    done
fi
cpu_model="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//; s/"//g')"
commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
if ! git diff --quiet HEAD -- src Cargo.toml Cargo.lock 2>/dev/null; then commit="$commit+local changes"; fi
printf '{"kind":"meta","quick":%s,"rounds":%s,"cpu":"%s","cores":%s,"clk_tck":%s,"load_before":"%s","kernel":"%s","date":"%s","commit":"%s"}\n' \
    "$([ "$quick" = 1 ] && echo true || echo false)" "$rounds" "$cpu_model" "$(getconf _NPROCESSORS_ONLN)" \
    "$clk_tck" "$(cut -d' ' -f1-3 /proc/loadavg)" "$(uname -r)" "$(date -u +%FT%TZ)" "$commit" >> "$results"

# --- 1. criterion --------------------------------------------------------------------------------------------
if [ "$criterion" = 1 ]; then
    step "criterion: the core path (cargo bench --bench core), pinned to core 0"
    cargo bench --locked --bench core --no-run >&2 2>/dev/null || cargo bench --locked --bench core --no-run >&2
    wait_quiet
    if [ "$quick" = 1 ]; then
        taskset -c 0 cargo bench --locked --bench core -- 'review/Inject/22KiB' \
            --warm-up-time 1 --measurement-time 2 >&2
    else
        taskset -c 0 cargo bench --locked --bench core >&2
    fi
    # Where the core path's time goes, stage by stage (bench/src/bin/stages.rs): the 22 KiB inject review.
    step "the core path stage by stage (22 KiB inject), pinned to core 0"
    wait_quiet
    if [ "$quick" = 1 ]; then stage_args=(--warm-up-time 0.5 --measurement-time 1); else stage_args=(); fi
    taskset -c 0 "$tools/stages" --bench 'Inject/.*/22KiB' "${stage_args[@]}" 2>&1 \
        | awk '/^stage\//{name=$1} /time:/{print "  " name, $(NF-3), $(NF-2)}' | tee "$out/stages.txt" >&2
fi

# --- 2. load runs --------------------------------------------------------------------------------------------
port="${BENCH_PORT:-18443}"
port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
while port_in_use "$port"; do port=$((port + 1)); done
url="https://127.0.0.1:$port/mutate"

# Bodies of a case: FILE@WEIGHT words.
bodies_of() {
    local b="$out/bodies"
    case "$1" in
        mix) echo "$b/inject-22k.json@60 $b/opted_out-22k.json@20 $b/already_injected-22k.json@10 $b/bare-22k.json@5 $b/update-22k.json@5" ;;
        flood) echo "$b/inject-80k.json@1" ;;
        # The same Pod at 2 and 80 KiB: the cost per extra KiB against the floor's.
        inject_2k) echo "$b/inject-2k.json@1" ;;
        inject_80k) echo "$b/inject-80k.json@1" ;;
        *) echo "$b/$1-22k.json@1" ;;
    esac
}

server_pid=
start_server() { # floor|ours [extra serve flags]
    local kind="$1"
    shift
    if port_in_use "$port"; then
        echo "bench.sh: port $port is taken by another process" >&2
        exit 1
    fi
    if [ "$kind" = floor ]; then
        taskset -c 0 "$tools/null-server" --listen "127.0.0.1:$port" \
            --cert "$out/certs/tls.crt" --key "$out/certs/tls.key" 2>/dev/null &
    else
        # Logs (one line per review) go to /dev/null: their formatting is measured, not a log pipeline.
        taskset -c 0 "$bin" serve --listen "127.0.0.1:$port" --cert "$out/certs/tls.crt" \
            --key "$out/certs/tls.key" --cluster off "$@" 2>/dev/null &
    fi
    server_pid=$!
    pids+=("$server_pid")
}

stop_server() {
    kill "$server_pid" 2>/dev/null || true
    local i
    for i in $(seq 1 100); do
        kill -0 "$server_pid" 2>/dev/null || break
        sleep 0.05
    done
    kill -9 "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
}

# The load generator spins (--spin: its thread never sleeps), standing for an apiserver on another machine:
# over loopback, waking a sleeping client is done in the server's write, an interrupt to the client's idle
# vCPU charged to the server's CPU time (about 5 us per answer at ours' rate, next to nothing at the floor's,
# whose client is always busy). SLEEPING_CLIENT=1 measures the way runs before 2026-12-05 did.
loadgen() { # label, connections, warmup, duration, rate (0 = closed loop), bodies...
    local label="$1" conns="$2" warmup="$3" duration="$4" rate="$5"
    shift 5
    local args=() body
    for body in "$@"; do args+=(--body "$body"); done
    if [ "$rate" != 0 ]; then args+=(--rate "$rate"); fi
    if [ "${SLEEPING_CLIENT:-0}" != 1 ]; then args+=(--spin); fi
    local line
    if ! line="$(taskset -c 1 "$tools/loadgen" --url "$url" --ca "$out/certs/ca.crt" "${args[@]}" \
        --connections "$conns" --warmup "$warmup" --duration "$duration" --pid "$server_pid" \
        --clk-tck "$clk_tck" --label "$label" --wait 10)"; then
        echo "bench.sh: loadgen failed for $label" >&2
        exit 1
    fi
    echo "$line" >> "$results"
}

run_case() { # round, case, floor|ours
    local round="$1" case="$2" kind="$3"
    # shellcheck disable=SC2046
    set -- $(bodies_of "$case")
    start_server "$kind"
    local c
    for c in 1 8 64; do
        loadgen "$kind/$case/c$c/r$round" "$c" "$closed_warmup" "$closed_duration" 0 "$@"
    done
    loadgen "$kind/$case/open$open_rate/r$round" "$open_connections" "$open_warmup" "$open_duration" "$open_rate" "$@"
    if [ "$case" = inject ]; then
        SLEEPING_CLIENT=1 loadgen "$kind/$case/c8sleep/r$round" 8 "$closed_warmup" "$closed_duration" 0 "$@"
    fi
    stop_server
}

for round in $(seq 1 "$rounds"); do
    for case in $cases; do
        # Floor and server back to back on the same bodies; the order flips every round.
        if [ $((round % 2)) = 1 ]; then order="floor ours"; else order="ours floor"; fi
        step "round $round/$rounds: $case ($order)"
        wait_quiet
        for kind in $order; do
            run_case "$round" "$case" "$kind"
        done
    done
done

if [ "$oha" = 1 ]; then
    step "cross-check: oha vs loadgen at 8 connections on the floor and on serve, 22 KiB inject body"
    for kind in floor ours; do
        start_server "$kind"
        loadgen "$kind/xcheck/c8/loadgen" 8 1 5 0 "$out/bodies/inject-22k.json@1"
        taskset -c 1 oha --no-tui --worker-threads 1 -c 8 -z 6s --insecure -m POST \
            -H 'content-type: application/json' -D "$out/bodies/inject-22k.json" --output-format json \
            "$url" > "$out/oha-$kind.json" 2>/dev/null || true
        printf '{"kind":"oha","server":"%s","rps":%s}\n' "$kind" \
            "$(grep -o '"requestsPerSec": *[0-9.]*' "$out/oha-$kind.json" | head -1 | sed 's/.*: *//' | grep . || echo null)" >> "$results"
        stop_server
    done
fi

# --- 3. flood --------------------------------------------------------------------------------------------------
step "flood: 512 connections, 80 KiB reviews, closed loop, serve --max-in-flight 256 (default); the floor too"
# shellcheck disable=SC2046
set -- $(bodies_of flood)
for kind in ours floor; do
    wait_quiet
    start_server "$kind"
    loadgen "$kind/flood/c512/r1" 512 "$flood_warmup" "$flood_duration" 0 "$@"
    stop_server
done

# --- 4. offline inject -----------------------------------------------------------------------------------------
step "offline: pdp-injector inject -f (20,000 documents), pinned to core 0, then on every core"
# Pinned, it runs in one thread (its CPU time, as the runs before measured it); unpinned, it shares the stream out
# to one thread per CPU (what a user's machine sees).
all_cpus="0-$(( $(nproc) - 1 ))"
for i in $(seq 1 "$offline_runs"); do
    for cpus in 0 "$all_cpus"; do
        wait_quiet
        t0=$(date +%s%N)
        taskset -c "$cpus" "$bin" inject -f "$out/stream.yaml" > /dev/null 2> "$out/inject.stderr"
        t1=$(date +%s%N)
        summary_line="$(tail -1 "$out/inject.stderr")"
        printf '{"kind":"offline","run":%s,"cpus":%s,"documents":20000,"seconds":%s,"summary":"%s"}\n' \
            "$i" "$(taskset -c "$cpus" nproc)" "$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.3f", (b-a)/1e9}')" \
            "$summary_line" >> "$results"
    done
done

if [ "$quick" = 0 ]; then
    wait_quiet
    flag_sync
fi

printf '{"kind":"meta_end","load_after":"%s","elapsed_s":%s,"waited_s":%s}\n' "$(cut -d' ' -f1-3 /proc/loadavg)" \
    "$(( $(date +%s) - started_at ))" "$waited" >> "$results"

# --- report ------------------------------------------------------------------------------------------------------
report_args=("$results" --criterion "$target/criterion" --summary "$out/summary.json")
if [ "$strict" = 1 ]; then report_args+=(--strict); fi
"$tools/bench-report" "${report_args[@]}" | tee "$out/report.txt"
