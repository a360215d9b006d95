#!/usr/bin/env python3
"""Validate Kubernetes YAML strictly against the 1.33 schema with kubernetes-validate.

Usage: validate_k8s.py FILE...   (multi-document YAML; List items are validated one by one)

K8S_VERSION=1.20.0 picks another schema version (scripts/helm_check.py: with kubernetes-validate 1.28.0 on
PYTHONPATH, the newest release that still has the 1.20 schemas).

Every document must validate: an unknown or misplaced field, or a kind without a schema, fails the run.
Files whose first line is `# error:` (golden files of denied inputs) hold no object and are skipped.
"""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

K8S_VERSION = os.environ.get("K8S_VERSION", "1.33.0")


def documents(path):
    text = Path(path).read_text()
    if text.startswith("# error:"):
        return
    for doc in yaml.safe_load_all(text):
        if doc is None:
            continue
        if doc.get("kind") == "List":
            yield from doc.get("items") or []
        else:
            yield doc


def main(paths):
    if not paths:
        print("usage: validate_k8s.py FILE...", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for path in paths:
            for n, doc in enumerate(documents(path)):
                out = Path(tmp) / f"{len(files):05d}-{Path(path).stem}-{n}.yaml"
                out.write_text(yaml.safe_dump(doc))
                files.append(out)
        if not files:
            print("validate_k8s: no documents found", file=sys.stderr)
            return 1
        result = subprocess.run(
            [sys.executable, "-m", "kubernetes_validate", "--strict", "-k", K8S_VERSION, *map(str, files)],
            capture_output=True,
            text=True,
        )
        output = result.stdout + result.stderr
        bad = [l for l in output.splitlines() if l.startswith(("ERROR", "WARN"))]
        for line in bad:
            print(line)
        passed = sum(1 for l in output.splitlines() if l.startswith("INFO") and " passed " in l)
        print(f"validate_k8s: {passed} documents passed, {len(bad)} failed (Kubernetes {K8S_VERSION}, strict)")
        return 1 if bad or result.returncode != 0 or passed != len(files) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
