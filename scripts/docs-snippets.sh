#!/usr/bin/env bash
# Checks of the docs that need tools from npm (tests/docs/ checks everything else, in `cargo test`):
#
# 1. Parses the Mermaid pictures of README.md and docs/*.md with mermaid 11, what GitHub renders
#    (scripts/check-mermaid.mjs, under jsdom).
# 2. Runs the app snippets of docs/apps.md (docs/snippets/*.sh) against a real Cerbos, configured as the
#    cerbos-pdp DaemonSet (the chart's templates/cerbos-node: its own sockets, behind the front
#    `pdp-injector node-proxy`, plaintext and then with TLS and client certificates) and as the built-in
#    sidecar, with the environment the injector renders for
#    docs/examples/{sidecar,daemonset,daemonset-baseline,tls}.out.yaml. Each snippet must
#    work exactly in the modes docs/apps.md says it does (the test app_snippets_work_where_the_docs_say...).
#
# The npm packages (mermaid, jsdom, and @cerbos/cerbos-linux-x64, which ships the cerbos binary) are cached in
# ${PDP_DOCS_CACHE:-~/.cache/pdp-injector-docs}; PDP_DOCS_CERBOS=/path/to/cerbos uses another Cerbos binary.
# Needs node and npm, curl, and ports 3592 and 3593 free on this machine.
#
#   scripts/docs-snippets.sh                 the pictures, then the snippets
#   scripts/docs-snippets.sh --fetch-only    install the npm packages; print the cerbos binary's path
#   scripts/docs-snippets.sh --mermaid-only  the pictures only
set -euo pipefail
cd "$(dirname "$0")/.."

CERBOS_NPM_VERSION=0.51.0
MERMAID_NPM_VERSION=11
JSDOM_NPM_VERSION=29
cache="${PDP_DOCS_CACHE:-${HOME:-/tmp}/.cache/pdp-injector-docs}"

npm_install() { # directory, packages...
    local dir="$1"
    shift
    mkdir -p "$dir"
    echo "docs-snippets: installing $* into $dir" >&2
    npm install --prefix "$dir" --no-save --no-audit --no-fund --loglevel=error "$@" >&2
}

mode=all
case "${1:-}" in
    --fetch-only) mode=fetch ;;     # install the npm packages, print the cerbos binary's path (what .ci/run does first)
    --mermaid-only) mode=mermaid ;; # only the pictures (.ci/run: the snippets already ran in its `cargo test`)
    "") ;;
    *) echo "usage: scripts/docs-snippets.sh [--fetch-only | --mermaid-only]" >&2; exit 2 ;;
esac

if [ ! -d "$cache/mermaid/node_modules/mermaid" ] || [ ! -d "$cache/mermaid/node_modules/jsdom" ]; then
    npm_install "$cache/mermaid" "mermaid@$MERMAID_NPM_VERSION" "jsdom@$JSDOM_NPM_VERSION"
fi
if [ -z "${PDP_DOCS_CERBOS:-}" ] && [ "$mode" != mermaid ]; then
    bin="$cache/cerbos/node_modules/@cerbos/cerbos-linux-x64/cerbos-linux-x64"
    if [ ! -x "$bin" ]; then
        case "$(uname -sm)" in
            "Linux x86_64") ;;
            *) echo "docs-snippets: the npm package ships a linux-x64 binary only; set PDP_DOCS_CERBOS" >&2; exit 1 ;;
        esac
        npm_install "$cache/cerbos" "@cerbos/cerbos-linux-x64@$CERBOS_NPM_VERSION"
    fi
    PDP_DOCS_CERBOS="$bin"
fi
if [ "$mode" = fetch ]; then
    echo "$PDP_DOCS_CERBOS"
    exit 0
fi

echo "==> Mermaid pictures" >&2
cp scripts/check-mermaid.mjs "$cache/mermaid/check-mermaid.mjs"
node "$cache/mermaid/check-mermaid.mjs" README.md docs/*.md
[ "$mode" = mermaid ] && exit 0

echo "==> app snippets against Cerbos" >&2
export PDP_DOCS_CERBOS
"$PDP_DOCS_CERBOS" --version | head -1 >&2
# Selected exactly, and counted: a renamed test would otherwise run nothing and pass.
test_name=snippets::app_snippets_work_where_the_docs_say_against_cerbos
out=$(mktemp)
status=0
cargo test --locked --test docs -- --exact "$test_name" --nocapture 2>&1 | tee "$out" || status=$?
if [ $status = 0 ] && ! grep -q '^test result: ok. 1 passed' "$out"; then
    echo "docs-snippets: $test_name did not run exactly once (renamed?)" >&2
    status=1
fi
rm -f "$out"
exit $status
