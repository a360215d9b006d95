#!/usr/bin/env bash
# Makes the active toolchain's standard library source available, which `cargo -Zbuild-std` needs to build std for
# a target whose prebuilt std rustup cannot fetch (scripts/release.sh --target):
#
#   scripts/rust-src.sh        prints the toolchain's library source directory, installing it first if absent
#
# Where `rustup component add rust-src` works it is the same thing; here static.rust-lang.org is not reachable, so
# the source comes from Debian's `rust-src` package of exactly the toolchain's version (apt verifies its signature
# and checksum; trixie-backports and sid carry the current releases), unpacked under the cache
# (PDP_RUST_SRC_CACHE, default /var/cache/pdp-injector/rust-src) and linked where rustup would put it.
set -euo pipefail
sysroot=$(rustc --print sysroot)
link=$sysroot/lib/rustlib/src/rust
if [ -f "$link/library/Cargo.lock" ]; then
    echo "$link/library"
    exit 0
fi
# "rustc 1.95.0 (59807616e 2026-04-14)" -> 1.95.0
version=$(rustc -V | awk '{print $2}')
cache=${PDP_RUST_SRC_CACHE:-/var/cache/pdp-injector/rust-src}
unpacked=$cache/$version
if [ ! -f "$unpacked/library/Cargo.lock" ]; then
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    mkdir -p "$work/lists/partial" "$work/archives/partial" "$cache"
    keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    for suite in trixie-backports sid; do
        echo "deb [signed-by=$keyring] http://deb.debian.org/debian $suite main"
    done > "$work/sources.list"
    apt_opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
        -o "Dir::State=$work" -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work"
        -o "Dir::Cache::Archives=$work/archives" -o Dir::State::status=/var/lib/dpkg/status
        -o APT::Sandbox::User=root)
    echo "[rust-src] rustc $version: fetching Debian's rust-src $version" >&2
    apt-get "${apt_opts[@]}" -qq update >&2
    # Debian's versions read "1.95.0+dfsg1-2~bpo13+1": the upstream version, then Debian's own suffix.
    versions=$(apt-cache "${apt_opts[@]}" madison rust-src | awk -F'|' '{gsub(/ /, "", $2); print $2}')
    deb_version=$(grep -F "$version+" <<<"$versions" | head -n 1 || true)
    if [ -z "$deb_version" ]; then
        echo "[rust-src] Debian has no rust-src $version (it has: $(tr '\n' ' ' <<<"$versions")); install the" \
            "source with 'rustup component add rust-src' or use a toolchain of one of those versions" >&2
        exit 1
    fi
    (cd "$work" && apt-get "${apt_opts[@]}" -qq download "rust-src=$deb_version") >&2
    dpkg-deb -x "$work"/rust-src_*.deb "$work/root"
    rm -rf "$unpacked.part"
    mv "$work/root/usr/src/rustc-$version" "$unpacked.part"
    mv "$unpacked.part" "$unpacked"
    echo "[rust-src] rust-src $deb_version unpacked into $unpacked" >&2
fi
mkdir -p "$(dirname "$link")"
ln -sfn "$unpacked" "$link"
echo "$link/library"
