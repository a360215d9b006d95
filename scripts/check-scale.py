#!/usr/bin/env python3
"""`pdp-injector check` at cluster scale: time and peak memory against a real kube-apiserver full of Pods.

    scripts/check-scale.sh [COUNT...]        (default: 10000 50000)

Starts etcd and kube-apiserver 1.20.2 as the e2e tier does (its harness, scripts/e2e/e2e.py), installs what
`check` looks for, then for each COUNT fills the namespace `scale` (labelled to opt in) up to COUNT Pods of about
4 KiB: nine in ten wired as the webhook would (`pdp-injector inject` made them), one in ten not, in 100
workloads; runs `pdp-injector check -A -o json` and prints its wall time and peak RSS, with the RSS per Pod
beyond the first count and the extrapolation to 150,000 Pods. A benchmark, not a test (BENCHMARKS.md, "check at
cluster scale"): the figures go there. Every process it starts is stopped by its PID.
"""
import argparse
import concurrent.futures
import json
import os
import resource
import ssl
import subprocess
import sys
import time
import http.client
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "e2e"))
import e2e  # noqa: E402  (the e2e tier's harness: etcd, kube-apiserver, kubectl, the fixtures check reads)

NAMESPACE = "scale"
WORKLOADS = 100
TARGET = 150_000


log = e2e.tier.logger("check-scale")


def pod_templates(h):
    """A wired Pod (as `pdp-injector inject` writes it with the harness's config) and the same Pod unwired."""
    padding = "x" * 2500  # labels and annotations a real Pod carries, to about 4 KiB stored
    base = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "template", "namespace": NAMESPACE,
                     "labels": {"app": "web", "team": "shop"},
                     "annotations": {"example.com/notes": padding}},
        "spec": {"containers": [{"name": "app", "image": e2e.PAUSE,
                                 "env": [{"name": "LOG_LEVEL", "value": "info"}]}]},
    }
    out = e2e.run([h.bin, "inject", "--config", str(h.classic_config_path), "--mode", "enabled",
                   "--namespace", NAMESPACE, "-f", "-"], input=json.dumps(base))
    import yaml
    wired = yaml.safe_load(out.stdout)
    return wired, base


class Api:
    """POSTs Pods straight to the apiserver (kubectl would take minutes for 50,000), a connection per thread."""

    def __init__(self, kubeconfig):
        import yaml
        cfg = yaml.safe_load(Path(kubeconfig).read_text())
        server = cfg["clusters"][0]["cluster"]["server"]
        self.host, self.port = server.removeprefix("https://").split(":")
        self.ca = cfg["clusters"][0]["cluster"]["certificate-authority"]
        self.token = cfg["users"][0]["user"]["token"]

    def connection(self):
        ctx = ssl.create_default_context(cafile=self.ca)
        return http.client.HTTPSConnection(self.host, int(self.port), context=ctx, timeout=60)

    def create_range(self, wired, unwired, start, stop):
        conn = self.connection()
        path = f"/api/v1/namespaces/{NAMESPACE}/pods"
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        for i in range(start, stop):
            pod = json.loads(json.dumps(unwired if i % 10 == 9 else wired))
            w = i % WORKLOADS
            pod["metadata"]["name"] = f"web-{w}-{i}"
            pod["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                                   "name": f"web-{w}-7d9f", "uid": f"rs-{w}", "controller": True}]
            conn.request("POST", path, body=json.dumps(pod), headers=headers)
            r = conn.getresponse()
            body = r.read()
            if r.status != 201:
                raise RuntimeError(f"creating Pod {i}: HTTP {r.status}: {body[:300]!r}")
        conn.close()


def fill(api, wired, unwired, have, want, threads=8):
    t0 = time.monotonic()
    step = max(1, (want - have) // (threads * 4))
    ranges = [(s, min(s + step, want)) for s in range(have, want, step)]
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for f in concurrent.futures.as_completed(
                [pool.submit(api.create_range, wired, unwired, a, b) for a, b in ranges]):
            f.result()
    took = time.monotonic() - t0
    log(f"created Pods {have}..{want} in {took:.0f} s ({(want - have) / max(took, 0.001):.0f}/s)")


def measure(h):
    """Wall time and peak RSS of `check -A -o json`, and what its report says about the Pods."""
    env = {**os.environ, "KUBECONFIG": str(h.kubeconfig), "NO_COLOR": "1"}
    env.pop("PDP_INJECTOR_CONFIG", None)
    t0 = time.monotonic()
    p = subprocess.run(["/usr/bin/time", "-f", "%M", h.bin, "check", "-A", "-o", "json"],
                       capture_output=True, text=True, env=env, timeout=1800)
    wall = time.monotonic() - t0
    if p.returncode not in (0, 1):
        raise RuntimeError(f"check exited {p.returncode}: {p.stderr[-2000:]}")
    peak_kib = int(p.stderr.strip().splitlines()[-1])
    report = json.loads(p.stdout)
    pods = next(s for s in report["sections"] if s["name"] == "pods")
    return wall, peak_kib / 1024, pods["summary"], len(pods["findings"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pdp-injector", required=True)
    ap.add_argument("--kube-apiserver", required=True)
    ap.add_argument("--etcd", default="etcd")
    ap.add_argument("--kubectl", default="kubectl")
    ap.add_argument("counts", nargs="*", type=int, default=[10_000, 50_000])
    args = ap.parse_args()
    counts = sorted(args.counts)
    h = e2e.Harness(SimpleNamespace(pdp_injector=args.pdp_injector, kubectl=args.kubectl, kubeconfig=None,
                                    kube_apiserver=args.kube_apiserver, etcd=args.etcd,
                                    webhook_host="127.0.0.1", webhook_port=0))
    rows = []
    try:
        h.start_local_cluster()
        h.bootstrap_local_cluster()
        h.write_config()
        h.make_webhook_certs()
        h.install_check_fixtures()
        h.kubectl("create", "namespace", NAMESPACE)
        h.kubectl("label", "namespace", NAMESPACE, f"{e2e.NS_LABEL}=enabled", f"{e2e.NAME_LABEL}={NAMESPACE}")
        # The installed ConfigMap is the harness's config; on 1.20 the webhook and check both use it with classic
        # sidecars, which is the reference config the Pods are wired with (pod_templates).
        wired, unwired = pod_templates(h)
        log(f"a wired Pod is {len(json.dumps(wired))} bytes of JSON")
        api = Api(h.kubeconfig)
        have = 0
        for count in counts:
            fill(api, wired, unwired, have, count)
            have = count
            wall, rss, summary, findings = measure(h)
            log(f"{count} Pods: check -A took {wall:.1f} s, peak RSS {rss:.0f} MiB ({summary}; {findings} findings)")
            rows.append((count, wall, rss))
    finally:
        for name in list(h.procs):
            h.stop(name)
    print("| Pods | check -A -o json | peak RSS |")
    print("|---|---|---|")
    for count, wall, rss in rows:
        print(f"| {count:,} | {wall:.1f} s | {rss:.0f} MiB |")
    if len(rows) >= 2:
        (c0, _, r0), (c1, _, r1) = rows[0], rows[-1]
        per_pod = (r1 - r0) / (c1 - c0) * 1024
        print(f"\nRSS per extra Pod: {per_pod:.2f} KiB; extrapolated to {TARGET:,} Pods: "
              f"{r1 + (TARGET - c1) * per_pod / 1024:.0f} MiB (target 512 MiB)")
    print(f"(this process: peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024} MiB)")


if __name__ == "__main__":
    main()
