#!/usr/bin/env bash
# Seeds fuzz/corpus/<target>/ from the files the tests already hold, so the repository commits no corpus:
#   review   tests/fixtures/*.json, and every Pod (or Pod template) of tests/golden/*/*.in.yaml and
#            examples/*.yaml wrapped in an AdmissionReview of the real fixture's shape (needs python3 with
#            PyYAML, which .ci/run installs with kubernetes-validate; skipped with a note without it)
#   config   tests/golden/*/config.yaml, the configs in manifests/, fuzz/seeds/config/*
#   offline  tests/golden/*/*.yaml and examples/*.yaml
# Seeds are named by content hash, so running it again adds nothing; files the fuzzer added stay.
set -euo pipefail
cd "$(dirname "$0")/.."

corpus=fuzz/corpus
mkdir -p "$corpus/review" "$corpus/config" "$corpus/offline"

seed() { # target file
    local sum
    sum=$(sha1sum "$2" | cut -c1-16)
    cp "$2" "$corpus/$1/seed-$sum"
}

for f in tests/fixtures/*.json; do seed review "$f"; done
for f in tests/golden/*/config.yaml manifests/overlays/*/config.yaml fuzz/seeds/config/*; do
    [ -f "$f" ] && seed config "$f"
done
for f in tests/golden/*/*.yaml examples/*.yaml; do seed offline "$f"; done

if python3 -c 'import yaml' 2>/dev/null; then
    python3 - "$corpus/review" tests/fixtures/admissionreview-v1-pod-create.json \
        tests/golden/*/*.in.yaml examples/*.yaml <<'EOF'
import hashlib, json, sys, yaml

out, fixture, files = sys.argv[1], sys.argv[2], sys.argv[3:]
base = json.load(open(fixture))
pointers = {"Pod": [], "Deployment": ["spec", "template"], "StatefulSet": ["spec", "template"],
            "DaemonSet": ["spec", "template"], "ReplicaSet": ["spec", "template"], "Job": ["spec", "template"],
            "ReplicationController": ["spec", "template"], "PodTemplate": ["template"],
            "CronJob": ["spec", "jobTemplate", "spec", "template"]}

def pods(doc):
    if not isinstance(doc, dict):
        return
    if doc.get("kind") == "List":
        for item in doc.get("items") or []:
            yield from pods(item)
        return
    path = pointers.get(doc.get("kind"))
    if path is None:
        return
    node = doc
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    if isinstance(node, dict):
        pod = {"kind": "Pod", "apiVersion": "v1", **node}
        pod.setdefault("metadata", {})
        ns = (doc.get("metadata") or {}).get("namespace") or "default"
        yield ns, pod

count = 0
for f in files:
    try:
        docs = list(yaml.safe_load_all(open(f)))
    except yaml.YAMLError:
        continue
    for doc in docs:
        for ns, pod in pods(doc):
            review = json.loads(json.dumps(base))
            review["request"]["namespace"] = ns
            review["request"]["object"] = pod
            text = json.dumps(review, separators=(",", ":"), default=str).encode()
            name = "seed-" + hashlib.sha1(text).hexdigest()[:16]
            open(f"{out}/{name}", "wb").write(text)
            count += 1
print(f"fuzz-seeds: {count} AdmissionReviews from the golden inputs")
EOF
else
    echo "fuzz-seeds: python3 has no PyYAML; review seeds are the fixtures only"
fi
for t in review config offline; do
    printf 'fuzz-seeds: %-8s %s files in %s\n' "$t" "$(find "$corpus/$t" -type f | wc -l)" "$corpus/$t"
done
