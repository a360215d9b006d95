#!/usr/bin/env python3
"""A CycloneDX 1.5 JSON SBOM of the Rust crates linked into one binary of this workspace.

    scripts/sbom.py [--package pdp-injector] [--target x86_64-unknown-linux-gnu] > pdp-injector.cdx.json

From `cargo metadata --format-version 1 --locked --filter-platform TARGET` (the resolved graph, no network) and
Cargo.lock (each crate's sha256): the package and every crate reached from it through normal and build
dependencies (dev-dependencies are not in the binary), each with its purl, license expression, source and
hash. The output is deterministic (no timestamp, no random serial number) so two runs on one Cargo.lock are
byte-identical; scripts/release.sh writes it next to the binary.
"""
import argparse
import hashlib
import json
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--package", default="pdp-injector")
    ap.add_argument("--target", default="x86_64-unknown-linux-gnu")
    args = ap.parse_args()
    meta = json.loads(subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--locked", "--filter-platform", args.target],
        cwd=REPO, check=True, capture_output=True, text=True).stdout)
    lock = tomllib.loads((REPO / "Cargo.lock").read_text())
    checksums = {(p["name"], p["version"]): p.get("checksum") for p in lock["package"]}
    packages = {p["id"]: p for p in meta["packages"]}
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    root = next(p["id"] for p in meta["packages"]
                if p["name"] == args.package and p["id"] in meta["workspace_members"])

    # Normal and build edges only: what is compiled into (or to build) the binary.
    seen, todo, edges = {root}, [root], {}
    while todo:
        pid = todo.pop()
        deps = []
        for d in nodes[pid]["deps"]:
            if any(k["kind"] in (None, "build") for k in d["dep_kinds"]):
                deps.append(d["pkg"])
                if d["pkg"] not in seen:
                    seen.add(d["pkg"])
                    todo.append(d["pkg"])
        edges[pid] = sorted(set(deps))

    def ref(pid):
        p = packages[pid]
        return f"pkg:cargo/{p['name']}@{p['version']}"

    def component(pid):
        p = packages[pid]
        c = {"type": "application" if pid == root else "library", "bom-ref": ref(pid), "name": p["name"],
             "version": p["version"], "purl": ref(pid)}
        if p.get("description"):
            c["description"] = " ".join(p["description"].split())
        if p.get("license"):
            c["licenses"] = [{"expression": p["license"]}]
        digest = checksums.get((p["name"], p["version"]))
        if digest:
            c["hashes"] = [{"alg": "SHA-256", "content": digest}]
        source = p.get("source") or ""
        if source.startswith("registry+"):
            c["externalReferences"] = [{"type": "distribution",
                                        "url": f"https://crates.io/crates/{p['name']}/{p['version']}"}]
        elif not source:
            c["properties"] = [{"name": "cargo:source", "value": "workspace path"}]
        return c

    ordered = sorted(seen - {root}, key=lambda pid: (packages[pid]["name"], packages[pid]["version"]))
    body = {
        "metadata": {"component": component(root),
                     "tools": {"components": [{"type": "application", "name": "scripts/sbom.py"}]},
                     "properties": [{"name": "cargo:target", "value": args.target}]},
        "components": [component(pid) for pid in ordered],
        "dependencies": [{"ref": ref(pid), "dependsOn": [ref(d) for d in edges[pid]]}
                         for pid in [root, *ordered]],
    }
    # A serial number derived from the content: stable for one Cargo.lock, new when it changes.
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    serial = f"urn:uuid:{digest[:8]}-{digest[8:12]}-5{digest[13:16]}-8{digest[17:20]}-{digest[20:32]}"
    bom = {"bomFormat": "CycloneDX", "specVersion": "1.5", "serialNumber": serial, "version": 1, **body}
    json.dump(bom, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
