#!/usr/bin/env bash
# Server instructions per request, ours against the floor, counted by callgrind: the same ratio as
# scripts/bench.sh's "server CPU per request", but deterministic. On a shared VM the CPU time of one binary moves
# 30-40% from minute to minute (BENCHMARKS.md); an instruction count does not, so a change that saves 3% shows.
#
#   scripts/bench-instructions.sh                          # every class, 22 KiB, 8 connections; ~6 minutes
#   scripts/bench-instructions.sh --cases "inject bare" --seconds 20
#
# For each case, the null handler (bench/src/bin/null-server.rs) and `pdp-injector serve --cluster off` run one
# after the other under `valgrind --tool=callgrind`, pinned to core 0; a first load run opens the
# connections and warms both up, then the counters are zeroed, a second load run (bench/src/bin/loadgen.rs, core 1,
# 8 keep-alive connections, closed loop) is measured, and the dump's total is divided by the requests that run
# answered. Every thread of the server is counted (hyper, rustls, tokio, the review, the logs).
#
# What it does not say: time, nor the kernel's share. callgrind counts the process's user-space instructions only
# (the floor spends most of its time in the kernel's TCP, so its CPU ratio is lower than this one), and
# instructions are not cycles (cache misses; memcpy by `rep movsb` is counted per byte). Read it beside
# bench.sh's CPU figures, not instead of them. Only 127.0.0.1 is used; every
# process started here is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

cases="inject opted_out already_injected bare update"
seconds=10
while [ $# -gt 0 ]; do
    case "$1" in
        --cases) cases="$2"; shift ;;
        --seconds) seconds="$2"; shift ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        *) echo "bench-instructions.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
for tool in valgrind callgrind_control taskset python3; do
    command -v "$tool" >/dev/null || { echo "bench-instructions.sh: needs $tool (apt-get install valgrind)" >&2; exit 2; }
done

target=${CARGO_TARGET_DIR:-target}
out=$target/bench-instructions
mkdir -p "$out"
bin=$target/release/pdp-injector
tools=$target/release

pids=()
cleanup() {
    local pid
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

printf '==> building the release binary and the benchmark tools\n' >&2
cargo build --release --locked --bin pdp-injector >&2
cargo build --release --locked -p pdp-injector-bench --bin null-server --bin loadgen --bin gen-reviews >&2
"$bin" certs --extra-san 127.0.0.1 --out-dir "$out/certs" >/dev/null 2>&1
"$tools/gen-reviews" bodies "$out/bodies" 2>/dev/null

port="${BENCH_PORT:-18543}"
port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
while port_in_use "$port"; do port=$((port + 1)); done
url="https://127.0.0.1:$port/mutate"

load() { # body, seconds, warm-up: prints the requests answered in the window
    taskset -c 1 "$tools/loadgen" --url "$url" --ca "$out/certs/ca.crt" --body "$1" --connections 8 \
        --warmup "$3" --duration "$2" --wait 120 |
        python3 -c 'import json, sys; d = json.load(sys.stdin); assert not d["errors"], d["error_samples"]; print(d["requests"])'
}

measure() { # kind (floor|ours), case: prints instructions per request
    local kind="$1" case="$2" body="$out/bodies/$2-22k.json" file="$out/$1-$2.callgrind"
    rm -f "$file"*
    local server=("$bin" serve --listen "127.0.0.1:$port" --cert "$out/certs/tls.crt" --key "$out/certs/tls.key"
        --cluster off)
    [ "$kind" = floor ] && server=("$tools/null-server" --listen "127.0.0.1:$port" --cert "$out/certs/tls.crt"
        --key "$out/certs/tls.key")
    taskset -c 0 valgrind --tool=callgrind --callgrind-out-file="$file" "${server[@]}" \
        >/dev/null 2>"$out/$kind-$case.log" &
    local pid=$!
    pids+=("$pid")
    load "$body" 3 1 >/dev/null 2>&1
    callgrind_control --zero "$pid" >/dev/null 2>&1
    local requests
    requests=$(load "$body" "$seconds" 0 2>/dev/null)
    callgrind_control --dump="$case" "$pid" >/dev/null 2>&1
    kill "$pid" 2>/dev/null || true
    local i
    for i in $(seq 1 60); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.5
    done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    # The dump of the measured window: the one with our label (callgrind numbers dumps .1, .2, ...).
    python3 - "$requests" "$case" "$file"* <<'EOF'
import sys
requests, label, files = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
total = 0
for f in files:
    text = open(f, errors="replace").read()
    if f"desc: Trigger: dump {label}\n" not in text:
        continue
    for line in text.splitlines():
        if line.startswith("summary:") or line.startswith("totals:"):
            total += int(line.split()[1])
            break
if not total or not requests:
    sys.exit(f"no counted dump ({files}) or no request ({requests})")
print(f"{total / requests:.0f} {requests}")
EOF
}

printf '%-18s %14s %14s %7s  %s\n' case "floor instr/req" "ours instr/req" ratio "requests (floor, ours)"
for case in $cases; do
    read -r floor floor_n < <(measure floor "$case")
    read -r ours ours_n < <(measure ours "$case")
    printf '%-18s %14s %14s %6.2fx  %s, %s\n' "$case" "$floor" "$ours" \
        "$(python3 -c "print($ours / $floor)")" "$floor_n" "$ours_n"
done
