#!/usr/bin/env bash
# The release artifacts, into dist/ (DIST overrides):
#
#   scripts/release.sh [--target aarch64-unknown-linux-gnu] [binary|sbom|chart]...   (no step: all three)
#
# - binary: `cargo build --profile dist` (Cargo.toml: the release profile, line tables, fat LTO; RELEASE_PROFILE
#   overrides, as CI's cross build does with `release`), then the debug info split off:
#   dist/pdp-injector (debug sections and symbol table stripped, with a .gnu_debuglink naming the debug file) and
#   dist/pdp-injector.debug (`objcopy --only-keep-debug`: line tables and symbols, which gdb, addr2line and a
#   panic's backtrace load when the file sits beside the binary or under /usr/lib/debug); dist/pdp-await
#   (tools/pdp-await, static and stripped by its own profile). The Dockerfile runs this step.
# - binary with --target aarch64-unknown-linux-gnu: the same into dist/aarch64-unknown-linux-gnu/, cross-compiled
#   with Debian's cross toolchain (gcc-aarch64-linux-gnu, libc6-dev-arm64-cross) and std built from source
#   (-Zbuild-std, scripts/rust-src.sh; RUSTC_BOOTSTRAP lets the stable toolchain take that flag), then run under
#   qemu-aarch64 (qemu-user): `--version`, and `inject` of a golden input must print its golden output.
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
target=
if [ "${1:-}" = --target ]; then
    target=${2:?release: --target needs a target triple}
    shift 2
fi
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(binary sbom chart)
mkdir -p "$dist"

binary() {
    local profile=${RELEASE_PROFILE:-dist}
    local out_dir=$dist cargo_target=() built_dir=$target_dir/$profile objcopy=objcopy
    if [ -n "$target" ]; then
        cross_env
        out_dir=$dist/$target
        cargo_target=(--target "$target" -Zbuild-std=std,panic_abort)
        built_dir=$target_dir/$target/$profile
        objcopy=$gnu-objcopy
    fi
    mkdir -p "$out_dir"
    cargo build --profile "$profile" --locked --bin pdp-injector "${cargo_target[@]}"
    local built="$built_dir/pdp-injector" out="$out_dir/pdp-injector"
    echo "built: $(ls -l "$built")"
    "$objcopy" --only-keep-debug "$built" "$out.debug"
    chmod -x "$out.debug"
    # --strip-all: the symbol table alone is 6.8 MB (BENCHMARKS.md); it stays in the debug file.
    "$objcopy" --strip-all --add-gnu-debuglink="$out.debug" "$built" "$out.part"
    mv "$out.part" "$out"
    # Its own target dir: pdp-await's static flags (tools/pdp-await/.cargo/config.toml) differ from the workspace's.
    (cd tools/pdp-await && CARGO_TARGET_DIR="$target_dir/pdp-await" cargo build --release --locked "${cargo_target[@]}")
    local await_dir=$target_dir/pdp-await/release
    [ -z "$target" ] || await_dir=$target_dir/pdp-await/$target/release
    cp "$await_dir/pdp-await" "$out_dir/pdp-await"
    ls -l "$out" "$out.debug" "$out_dir/pdp-await"
    [ -z "$target" ] || run_emulated "$out" "$out_dir/pdp-await"
}

# The cross toolchain for --target: linker, C compiler (ring's C and assembly), std's source, nightly flags.
cross_env() {
    case $target in
        aarch64-unknown-linux-gnu) gnu=aarch64-linux-gnu qemu=qemu-aarch64 ;;
        *) echo "release: no cross toolchain known for '$target' (aarch64-unknown-linux-gnu)" >&2; exit 2 ;;
    esac
    local tool
    for tool in "$gnu-gcc" "$gnu-objcopy" "$qemu"; do
        command -v "$tool" >/dev/null || {
            echo "release: $tool not found; install Debian's gcc-$gnu libc6-dev-arm64-cross qemu-user" >&2
            exit 1
        }
    done
    bash scripts/rust-src.sh >/dev/null
    local triple=${target//-/_}
    export "CARGO_TARGET_${triple^^}_LINKER=$gnu-gcc" "CC_$triple=$gnu-gcc" "AR_$triple=$gnu-ar"
    export RUSTC_BOOTSTRAP=1
}

# The cross-built binaries run under user-mode emulation: the version, and one golden case end to end.
run_emulated() {
    local bin=$1 await=$2 case=tests/golden/default/pod-sidecar got
    local emulate=("$qemu" -L "/usr/$gnu")
    got=$("${emulate[@]}" "$bin" --version)
    [ "$got" = "pdp-injector $version" ] || { echo "release: $bin --version printed '$got'" >&2; exit 1; }
    if ! "${emulate[@]}" "$bin" inject -f "$case.in.yaml" 2>/dev/null | diff <(grep -v '^# ' "$case.out.yaml") -; then
        echo "release: $bin under $qemu: inject of $case.in.yaml differs from its golden output (above)" >&2
        exit 1
    fi
    "$qemu" "$await" --help >/dev/null
    echo "ran under $qemu: $got; inject of $case.in.yaml = its golden output; pdp-await --help"
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
(cd "$dist" && find . -type f ! -name SHA256SUMS ! -name '*.part' -printf '%P\n' | sort \
    | xargs sha256sum > SHA256SUMS)
echo "release $version: $dist/"
