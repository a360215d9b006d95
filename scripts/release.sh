#!/usr/bin/env bash
# The release artifacts, into dist/ (DIST overrides), for x86_64-unknown-linux-gnu (aarch64 is not built here):
#
#   scripts/release.sh [binary|sbom|chart]...   (no argument: all three)
#
# - binary: `cargo build --release` (line tables, Cargo.toml's release profile), then the debug info split off:
#   dist/pdp-injector (debug sections and symbol table stripped, with a .gnu_debuglink naming the debug file) and
#   dist/pdp-injector.debug (`objcopy --only-keep-debug`: line tables and symbols, which gdb, addr2line and a
#   panic's backtrace load when the file sits beside the binary or under /usr/lib/debug); dist/pdp-await
#   (tools/pdp-await, static and stripped by its own profile). The Dockerfile runs this step.
# - sbom: dist/pdp-injector-VERSION.cdx.json, CycloneDX of the crates in the binary (scripts/sbom.py, from
#   `cargo metadata` and Cargo.lock).
# - chart: dist/pdp-injector-VERSION.tgz, `helm package` with version and appVersion set to the crate's version
#   (refused when charts/pdp-injector/Chart.yaml says otherwise: scripts/helm-check.sh checks the same).
# Then dist/SHA256SUMS of what is there. Needs cargo, objcopy (binutils); python3 for sbom and chart (helm is
# fetched and verified by scripts/helm_check.py).
set -euo pipefail
cd "$(dirname "$0")/.."
dist=$(realpath -m "${DIST:-dist}")
target_dir=$(realpath -m "${CARGO_TARGET_DIR:-target}")
# The [package] version: the first `version = ` line of Cargo.toml.
version=$(sed -n 's/^version = "\([^"]*\)"$/\1/p' Cargo.toml | head -n 1)
[ -n "$version" ] || { echo "release: no version in Cargo.toml" >&2; exit 1; }
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(binary sbom chart)
mkdir -p "$dist"

binary() {
    cargo build --release --locked --bin pdp-injector
    local built="$target_dir/release/pdp-injector" out="$dist/pdp-injector"
    echo "built: $(ls -l "$built")"
    objcopy --only-keep-debug "$built" "$out.debug"
    chmod -x "$out.debug"
    # --strip-all: the symbol table alone is 6.8 MB (BENCHMARKS.md); it stays in the debug file.
    objcopy --strip-all --add-gnu-debuglink="$out.debug" "$built" "$out.part"
    mv "$out.part" "$out"
    # Its own target dir: pdp-await's static flags (tools/pdp-await/.cargo/config.toml) differ from the workspace's.
    (cd tools/pdp-await && CARGO_TARGET_DIR="$target_dir/pdp-await" cargo build --release --locked)
    cp "$target_dir/pdp-await/release/pdp-await" "$dist/pdp-await"
    ls -l "$dist/pdp-injector" "$dist/pdp-injector.debug" "$dist/pdp-await"
}

sbom() {
    python3 scripts/sbom.py --package pdp-injector > "$dist/pdp-injector-$version.cdx.json.part"
    mv "$dist/pdp-injector-$version.cdx.json.part" "$dist/pdp-injector-$version.cdx.json"
    echo "sbom: $dist/pdp-injector-$version.cdx.json"
}

chart() {
    local chart=charts/pdp-injector app
    app=$(sed -n 's/^appVersion: "\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$chart/Chart.yaml")
    if [ "$app" != "$version" ]; then
        echo "release: $chart/Chart.yaml appVersion is '$app', the crate is $version: set both alike" >&2
        exit 1
    fi
    local helm
    helm=$(python3 -c 'import sys; sys.path.insert(0, "scripts"); import helm_check; print(helm_check.helm_binary())')
    "$helm" package "$chart" --version "$version" --app-version "$version" -d "$dist"
}

for step in "${steps[@]}"; do
    case $step in
        binary | sbom | chart) "$step" ;;
        *) echo "release: unknown step '$step' (binary, sbom, chart)" >&2; exit 2 ;;
    esac
done
(cd "$dist" && find . -maxdepth 1 -type f ! -name SHA256SUMS ! -name '*.part' -printf '%P\n' | sort \
    | xargs sha256sum > SHA256SUMS)
echo "release $version: $dist/"
