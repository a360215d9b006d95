"""What the cluster tiers share (scripts/e2e, scripts/node, scripts/check-scale.py): logging, commands, waiting on
a condition, a free port, an openssl PKI, etcd's command line and health, kubeconfigs. Standard library only.

    sys.path.insert(0, str(REPO / "scripts/lib")); import tier
"""
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


class Fail(Exception):
    """A case's check did not hold; the message is the one-line reason."""


def check(cond, why):
    if not cond:
        raise Fail(why)


def select(cases, filters):
    """The cases (tuples, the name first) whose name contains one of `filters`, all of them without filters. A
    filter that matches no case, or a selection of none, raises Fail: a tier that runs no case proves nothing."""
    unmatched = [f for f in filters if not any(f in c[0] for c in cases)]
    if unmatched:
        raise Fail(f"no case matches {' '.join(unmatched)}")
    chosen = [c for c in cases if not filters or any(f in c[0] for f in filters)]
    if not chosen:
        raise Fail("no case to run")
    return chosen


def none_ran(ran):
    """The FAIL line of a run in which no case ran (`ran` counts those that did), or None."""
    return None if ran else "FAIL no-case-ran: zero cases ran, and a tier that runs none proves nothing"


def logger(prefix):
    """A `log(msg)` that writes `[prefix] msg` to stderr at once."""
    def log(msg):
        print(f"[{prefix}] {msg}", file=sys.stderr, flush=True)
    return log


def one_line(s, limit=400):
    s = " ".join(str(s).split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


def run(*argv, input=None, timeout=120, check_rc=True, env=None):
    """Runs a command (arguments may be paths) and returns the finished process; a failure raises with the end of
    its stderr, unless `check_rc` is false."""
    argv = [str(a) for a in (argv[0] if len(argv) == 1 and isinstance(argv[0], (list, tuple)) else argv)]
    p = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout, env=env)
    if check_rc and p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])}... failed ({p.returncode}): {p.stderr.strip()[-1500:]}")
    return p


def wait_for(what, fn, timeout, interval=0.5, still_alive=None, error=RuntimeError):
    """Waits until `fn()` is true (exceptions count as not yet), at most `timeout` seconds, and returns what it
    gave. `still_alive()`, when given, returns None while the process waited on runs, or why it does not (then
    waiting stops at once). A timeout raises `error` (a case's `Fail`, or a harness error)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if still_alive and (gone := still_alive()):
            raise error(f"{gone} while waiting for {what}")
        try:
            if v := fn():
                return v
        except Exception as e:  # noqa: BLE001 - retried until the deadline
            last = e
        time.sleep(interval)
    raise error(f"timed out after {timeout}s waiting for {what}"
                + (f" (last error: {one_line(last, 300)})" if last else ""))


def free_port(host="127.0.0.1"):
    """A port of `host` that was free a moment ago, for a process that must be told its port."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Pki:
    """An openssl PKI in `dir`: one CA (`ca.crt`, `ca.key`) and certificates it signs, EC P-256, 30 days. A
    certificate already there is kept, so a restarted tier reuses its PKI."""

    def __init__(self, dir):
        self.dir = Path(dir)
        self.dir.mkdir(parents=True, exist_ok=True)

    def path(self, name, ext):
        return self.dir / f"{name}.{ext}"

    def cert(self, name, subj, *, ca=False, san=None, client=False, server=False):
        key, crt = self.path(name, "key"), self.path(name, "crt")
        if crt.exists():
            return crt
        run("openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", key)
        if ca:
            run("openssl", "req", "-x509", "-new", "-key", key, "-out", crt, "-days", "30", "-subj", subj,
                "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
            return crt
        ext = self.path(name, "ext")
        usage = ",".join(u for u, on in [("serverAuth", server), ("clientAuth", client)] if on)
        ext.write_text("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                       f"extendedKeyUsage={usage}\n" + (f"subjectAltName={san}\n" if san else ""))
        run("openssl", "req", "-new", "-key", key, "-out", self.path(name, "csr"), "-subj", subj)
        run("openssl", "x509", "-req", "-in", self.path(name, "csr"), "-CA", self.path("ca", "crt"),
            "-CAkey", self.path("ca", "key"), "-CAcreateserial", "-out", crt, "-days", "30", "-extfile", ext)
        return crt

    def service_account_keys(self):
        """`sa.key` and `sa.pub`: the apiserver signs ServiceAccount tokens with them."""
        if not self.path("sa", "key").exists():
            run("openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", self.path("sa", "key"))
            run("openssl", "ec", "-in", self.path("sa", "key"), "-pubout", "-out", self.path("sa", "pub"))
        return self.path("sa", "key"), self.path("sa", "pub")


def etcd_argv(etcd, name, data_dir, client_port, peer_port, host="127.0.0.1"):
    """etcd serving plain HTTP on `host` only: the tiers' apiservers are its only clients."""
    return [str(etcd), "--name", name, "--data-dir", str(data_dir),
            "--listen-client-urls", f"http://{host}:{client_port}",
            "--advertise-client-urls", f"http://{host}:{client_port}",
            "--listen-peer-urls", f"http://{host}:{peer_port}",
            "--initial-advertise-peer-urls", f"http://{host}:{peer_port}",
            "--initial-cluster", f"{name}=http://{host}:{peer_port}",
            "--logger", "zap", "--log-level", "warn"]


def etcd_healthy(host, client_port):
    with urllib.request.urlopen(f"http://{host}:{client_port}/health", timeout=2) as r:
        return json.loads(r.read()).get("health") == "true"


def kubeconfig(server, ca, user, *, token=None, cert=None, key=None, context="tier"):
    """A kubeconfig's text (JSON, which is YAML) for one user: a bearer token or a client certificate."""
    creds = {"token": token} if token else {"client-certificate": str(cert), "client-key": str(key)}
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": context,
        "clusters": [{"name": context, "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": creds}],
        "contexts": [{"name": context, "context": {"cluster": context, "user": user}}],
    }, indent=1)
