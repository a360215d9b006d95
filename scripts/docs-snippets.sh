#!/usr/bin/env bash
# Checks of the docs that need tools from npm (tests/docs/ checks everything else, in `cargo test`):
#
# 1. Parses the Mermaid pictures of README.md and docs/*.md with mermaid 11, what GitHub renders
#    (scripts/check-mermaid.mjs, under jsdom).
# 2. Runs the app snippets of docs/apps.md (docs/snippets/*.sh) against a real Cerbos, configured as the
#    cerbos-pdp DaemonSet (manifests/components/pdp-daemonset: its own sockets, behind the front
#    `pdp-injector node-proxy`, plaintext and then with TLS and client certificates) and as the built-in
#    sidecar, with the environment the injector renders for
#    docs/examples/{sidecar,daemonset,daemonset-baseline,tls}.out.yaml. Each snippet must
#    work exactly in the modes docs/apps.md says it does (the test app_snippets_work_where_the_docs_say...).
#
# The npm packages (mermaid, jsdom, and @cerbos/cerbos-linux-x64, which ships the cerbos binary) are cached in
# ${PDP_DOCS_CACHE:-~/.cache/pdp-injector-docs}; PDP_DOCS_CERBOS=/path/to/cerbos uses another Cerbos binary.
# Needs node and npm, curl, and ports 3592 and 3593 free on this machine.
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

echo "==> Mermaid pictures" >&2
if [ ! -d "$cache/mermaid/node_modules/mermaid" ] || [ ! -d "$cache/mermaid/node_modules/jsdom" ]; then
    npm_install "$cache/mermaid" "mermaid@$MERMAID_NPM_VERSION" "jsdom@$JSDOM_NPM_VERSION"
fi
cp scripts/check-mermaid.mjs "$cache/mermaid/check-mermaid.mjs"
node "$cache/mermaid/check-mermaid.mjs" README.md docs/*.md

echo "==> app snippets against Cerbos" >&2
if [ -z "${PDP_DOCS_CERBOS:-}" ]; then
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
export PDP_DOCS_CERBOS
"$PDP_DOCS_CERBOS" --version | head -1 >&2

cargo test --test docs app_snippets_work_where_the_docs_say -- --nocapture
