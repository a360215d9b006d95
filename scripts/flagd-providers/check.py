"""The injected flagd wiring, resolved by the real OpenFeature flagd providers (scripts/flagd-providers.sh runs it).

For every flagd profile and mode, `pdp-injector inject` wires a Pod; the app container's environment is then
computed as the kubelet would (the Downward API's node address, `$(VAR)` references), and each provider, the
Python one (openfeature-provider-flagd) and the JavaScript one (@openfeature/flagd-provider), is built from that
environment alone in its own process (probe.py, probe.js: nothing passed in code). Each case asserts what the
provider resolved to: the resolver, host, port, socket path, TLS (on or off, the CA file it read, and the
name TLS is checked against) and, in-process, the selector its sync stream sends. No flagd runs: this checks the wiring as the providers read it, not flagd.

One PASS/FAIL line per case and provider, then `N passed, M failed`; exit status 1 when any failed.

Usage: check.py --bin PDP_INJECTOR --python VENV_PYTHON --node-modules DIR
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
BASE_CONFIG = ROOT / "manifests/overlays/daemonset/config.yaml"
CENTRAL_CONFIG = ROOT / "docs/examples/central.config.yaml"
# What the Downward API gives the app in these cases.
NODE_IP = "10.0.1.7"
NODE_NAME = "node-1"


def pod(profile, mode, flag_sets=None):
    flag_sets = {"pdp-injector.io/flag-sets": flag_sets} if flag_sets else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web",
            "namespace": "shop",
            "annotations": {"pdp-injector.io/inject": mode, "pdp-injector.io/profile": profile, **flag_sets},
        },
        "spec": {"containers": [{"name": "web", "image": "registry.example/web:2"}]},
    }


def namespace(level):
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "shop", "labels": {"pod-security.kubernetes.io/enforce": level}},
    }


def expect(resolver, host=None, port=None, socket=None, tls=False, ca=None, name=None, selector=None):
    """What a provider must resolve to. `name` is the name TLS is checked against (JavaScript: grpc-js's
    servername; Python: the authority override the provider passes to gRPC, None when it passes none).
    `selector`, for in-process: the flag sets its sync stream asks for ("" without the annotation)."""
    want = {"resolver": resolver, "host": host, "port": port, "socket": socket, "tls": tls, "ca": ca, "name": name}
    if resolver == "in-process":
        want["selector"] = selector or ""
    return want


def cases(tls_dir):
    """(name, config, documents, Python's expectation, JavaScript's expectation)."""
    tls_config = tls_dir / "config.yaml"
    ca = str(tls_dir / "tls/ca.crt")
    rpc_node = expect("rpc", NODE_IP, 8013)
    return [
        ("flagd, sidecar", BASE_CONFIG, [pod("flagd", "sidecar")],
         expect("rpc", "127.0.0.1", 8013), expect("rpc", "127.0.0.1", 8013)),
        ("flagd, daemonset, privileged namespace (the front's evaluation socket)", BASE_CONFIG,
         [namespace("privileged"), pod("flagd", "daemonset")],
         # The Python provider has no socket setting: it keeps to FLAGD_HOST:FLAGD_PORT.
         rpc_node, expect("rpc", socket="/var/run/flagd/flagd.sock")),
        ("flagd, daemonset, baseline namespace (TCP only)", BASE_CONFIG,
         [namespace("baseline"), pod("flagd", "daemonset")], rpc_node, rpc_node),
        ("flagd, daemonset, restricted namespace (TCP only)", BASE_CONFIG,
         [namespace("restricted"), pod("flagd", "daemonset")], rpc_node, rpc_node),
        ("flagd, central", CENTRAL_CONFIG, [pod("flagd", "central")],
         expect("rpc", "flagd.flagd.svc.cluster.local", 8013),
         expect("rpc", "flagd.flagd.svc.cluster.local", 8013)),
        ("flagd-node (RPC), daemonset, privileged namespace (TCP only: the front's port 8013)", BASE_CONFIG,
         [namespace("privileged"), pod("flagd-node", "daemonset")], rpc_node, rpc_node),
        ("flagd-node (RPC), daemonset, baseline namespace", BASE_CONFIG,
         [namespace("baseline"), pod("flagd-node", "daemonset")], rpc_node, rpc_node),
        ("flagd-in-process, daemonset (the front's port 8015)", BASE_CONFIG,
         [pod("flagd-in-process", "daemonset")],
         expect("in-process", NODE_IP, 8015), expect("in-process", NODE_IP, 8015)),
        ("flagd-in-process, daemonset, flag sets named by the Pod's pdp-injector.io/flag-sets", BASE_CONFIG,
         [pod("flagd-in-process", "daemonset", "shop/app-flags,configmap/shop/more")],
         expect("in-process", NODE_IP, 8015, selector="shop/app-flags,configmap/shop/more"),
         expect("in-process", NODE_IP, 8015, selector="shop/app-flags,configmap/shop/more")),
        ("flagd-in-process, daemonset, restricted namespace", BASE_CONFIG,
         [namespace("restricted"), pod("flagd-in-process", "daemonset")],
         expect("in-process", NODE_IP, 8015), expect("in-process", NODE_IP, 8015)),
        ("flagd-in-process-socket, daemonset, privileged namespace (the front's sync socket)", BASE_CONFIG,
         [namespace("privileged"), pod("flagd-in-process-socket", "daemonset")],
         expect("in-process", NODE_IP, 8015), expect("in-process", socket="/var/run/flagd/sync.sock")),
        ("flagd-in-process-socket, daemonset, baseline namespace (the front's port 8015)", BASE_CONFIG,
         [namespace("baseline"), pod("flagd-in-process-socket", "daemonset")],
         expect("in-process", NODE_IP, 8015), expect("in-process", NODE_IP, 8015)),
        ("flagd-sync (sidecar syncing from the node), sidecar", BASE_CONFIG, [pod("flagd-sync", "sidecar")],
         expect("rpc", "127.0.0.1", 8013), expect("rpc", "127.0.0.1", 8013)),
        # A profile with tls (written for this test): TLS on and the CA file are read by both providers; the
        # profile's server name (FLAGD_TLS_SERVER_NAME) by neither, so TLS is checked against the node's IP.
        ("flagd with tls, daemonset (the profile's serverName is not read)", tls_config,
         [pod("flagd-tls", "daemonset")],
         expect("rpc", NODE_IP, 8013, tls=True, ca=ca), expect("rpc", NODE_IP, 8013, tls=True, ca=ca, name=NODE_IP)),
        ("flagd-in-process with tls, daemonset", tls_config, [pod("flagd-in-process-tls", "daemonset")],
         expect("in-process", NODE_IP, 8015, tls=True, ca=ca),
         expect("in-process", NODE_IP, 8015, tls=True, ca=ca, name=NODE_IP)),
    ]


def write_tls_config(binary, tls_dir):
    """A config with TLS profiles whose CA file is a real one (the providers read it), and the CA itself."""
    subprocess.run([binary, "certs", "--out-dir", str(tls_dir / "tls")], check=True, capture_output=True)
    base = yaml.safe_load(BASE_CONFIG.read_text())
    tls = {"secretName": "flagd-tls", "serverName": "flagd-node.flagd-node.svc", "mountPath": str(tls_dir / "tls")}
    base["profiles"]["flagd-tls"] = {"extends": "flagd", "hostSocket": False, "tls": tls}
    base["profiles"]["flagd-in-process-tls"] = {"extends": "flagd-in-process", "tls": tls}
    (tls_dir / "config.yaml").write_text(yaml.safe_dump(base))


def injected_env(binary, config, documents):
    """The app container's environment after injection, as the kubelet computes it."""
    stream = "".join("---\n" + yaml.safe_dump(d) for d in documents)
    out = subprocess.run([binary, "inject", "--config", str(config), "-f", "-"], input=stream, text=True,
                         capture_output=True)
    if out.returncode != 0:
        raise RuntimeError(f"pdp-injector inject failed: {out.stderr.strip()}")
    pods = [d for d in yaml.safe_load_all(out.stdout) if d and d.get("kind") == "Pod"]
    app = next(c for c in pods[0]["spec"]["containers"] if c["name"] == "web")
    annotations = pods[0]["metadata"].get("annotations") or {}
    env = {}
    for var in app.get("env", []):
        field = var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        annotation = re.fullmatch(r"metadata\.annotations\['([^']+)'\]", field or "")
        if "value" in var:
            env[var["name"]] = expand(var["value"], env)
        elif field == "status.hostIP":
            env[var["name"]] = NODE_IP
        elif field == "spec.nodeName":
            env[var["name"]] = NODE_NAME
        elif annotation:
            # The kubelet gives an absent annotation as the empty string.
            env[var["name"]] = annotations.get(annotation.group(1), "")
        else:
            raise RuntimeError(f"variable {var['name']}: a source this check does not model: {var}")
    return env


def expand(value, env):
    """The kubelet's `$(VAR)`: a variable defined earlier in the list is replaced, `$$` is a `$`, anything else
    stays as written."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), value)


def resolve(command, env, node_modules):
    # Nothing of this process's environment but what runs the interpreters: no FLAGD_* of the caller leaks in.
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp"),
            "NODE_PATH": str(node_modules)}
    out = subprocess.run(command, env={**base, **env}, text=True, capture_output=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"{command[0]} exited {out.returncode}: {out.stderr.strip()[-400:]}")
    got = json.loads(out.stdout.strip().splitlines()[-1])
    if "error" in got:
        raise RuntimeError(got["error"])
    return got


def main():
    args = argparse.ArgumentParser()
    args.add_argument("--bin", required=True)
    args.add_argument("--python", required=True)
    args.add_argument("--node-modules", required=True)
    a = args.parse_args()
    here = Path(__file__).resolve().parent
    probes = {
        "python": [a.python, str(here / "probe.py")],
        "javascript": ["node", str(here / "probe.js")],
    }
    passed = failed = 0
    with tempfile.TemporaryDirectory(prefix="flagd-providers-") as tmp:
        tls_dir = Path(tmp)
        write_tls_config(a.bin, tls_dir)
        for name, config, documents, want_py, want_js in cases(tls_dir):
            try:
                env = injected_env(a.bin, config, documents)
            except Exception as e:  # every provider's line fails, with the reason
                env, env_error = None, str(e)
            for provider, want in (("python", want_py), ("javascript", want_js)):
                label = f"{provider:<10} {name}"
                try:
                    if env is None:
                        raise RuntimeError(env_error)
                    got = resolve(probes[provider], env, a.node_modules)
                    got["name"] = got.get("servername") if provider == "javascript" else got.get("authority")
                    diff = {k: (got.get(k), v) for k, v in want.items() if got.get(k) != v}
                    if diff:
                        raise AssertionError(", ".join(f"{k}: got {g!r}, want {w!r}" for k, (g, w) in diff.items()))
                except Exception as e:
                    failed += 1
                    print(f"FAIL {label}: {e}", flush=True)
                    continue
                passed += 1
                where = got["socket"] or f"{got['host']}:{got['port']}"
                tls = f"TLS (CA {got['ca']}, name {got['name']})" if got["tls"] else "plaintext"
                sets = f", selector {got['selector']!r}" if "selector" in want else ""
                print(f"PASS {label}: {got['resolver']} {where} {tls}{sets}", flush=True)
    print(f"flagd-providers: {passed} passed, {failed} failed")
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
