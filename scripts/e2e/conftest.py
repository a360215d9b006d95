"""pytest set-up of the e2e tier (scripts/e2e/run.sh runs it): the options, and one harness for the session
(etcd, kube-apiserver, the webhooks), stopped by PID at the end, also on failure, timeout or signal."""
import argparse
import os
import signal
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "scripts/lib"))
sys.path.insert(0, str(HERE))
import e2e  # noqa: E402


def pytest_addoption(parser):
    g = parser.getgroup("e2e")
    g.addoption("--pdp-injector", help="the pdp-injector binary")
    g.addoption("--kubectl", default="kubectl")
    g.addoption("--kubeconfig", help="target this existing cluster (no local etcd/kube-apiserver)")
    g.addoption("--kube-apiserver", help="kube-apiserver binary (local mode)")
    g.addoption("--etcd", default="etcd")
    g.addoption("--webhook-host", default="127.0.0.1",
                help="address the webhooks listen on and the API server calls (default 127.0.0.1)")
    g.addoption("--webhook-port", type=int, default=0)
    g.addoption("--keep", action="store_true", help="keep the work directory (logs, certs, kubeconfig)")
    g.addoption("--ns-settle", type=float, default=float(os.environ.get("E2E_NS_SETTLE", "0")),
                help="seconds to wait after creating each namespace")
    g.addoption("--deadline", type=int, default=int(os.environ.get("E2E_TIMEOUT", "900")),
                help="overall deadline of the run in seconds")


def pytest_configure(config):
    if config.getoption("pdp_injector") is None and not config.getoption("help"):
        raise pytest.UsageError("--pdp-injector is required (scripts/e2e/run.sh passes it)")
    if not config.getoption("kubeconfig") and not config.getoption("kube_apiserver") \
            and not config.getoption("help"):
        raise pytest.UsageError("--kube-apiserver is required without --kubeconfig")


@pytest.fixture(scope="session")
def harness(request):
    o = request.config.getoption
    args = argparse.Namespace(
        pdp_injector=o("pdp_injector"), kubectl=o("kubectl"), kubeconfig=o("kubeconfig"),
        kube_apiserver=o("kube_apiserver"), etcd=o("etcd"), webhook_host=o("webhook_host"),
        webhook_port=o("webhook_port"), keep=o("keep"), ns_settle=o("ns_settle"), timeout=o("deadline"))

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    def on_alarm(_signum, _frame):
        raise e2e.Timeout(f"overall deadline of {args.timeout}s exceeded")

    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)
    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(args.timeout)
    h = e2e.Harness(args)
    t0 = time.monotonic()
    try:
        h.setup()
    except BaseException:
        for name in h.procs:
            if tail := h.log_tail(name, 25):
                e2e.log(f"--- last lines of {name}.log ---\n{tail}")
        h.teardown(True)
        signal.alarm(0)
        raise
    e2e.log(f"setup done in {time.monotonic() - t0:.1f}s")
    yield h
    signal.alarm(0)
    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):  # let teardown finish
        signal.signal(s, lambda signum, _f: e2e.log(f"signal {signum} ignored while stopping processes"))
    failed = request.session.testsfailed > 0
    if failed and "pdp-injector" in h.procs:
        e2e.log(f"--- last lines of pdp-injector.log ---\n{h.log_tail('pdp-injector', 30)}")
    h.teardown(failed)
