"""pytest set-up of the node tier (scripts/node/run.sh runs it): the options, the install before the first case
(after selection, so a word that matches no case fails before anything is installed), the hand-over between
cases (`Shared`), each case's figures printed under it, and NODE_KNOWN_FAILURES as strict expected failures."""
import os
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "scripts/lib"))
sys.path.insert(0, str(HERE))
import cases  # noqa: E402


def pytest_addoption(parser):
    g = parser.getgroup("node")
    g.addoption("--kubeconfig", help="the tier's cluster (scripts/node/cluster.sh up prints it)")
    g.addoption("--skip-install", action="store_true", help="use the release already installed, if it is there")


def pytest_configure(config):
    if config.getoption("help"):
        return
    if not config.getoption("kubeconfig"):
        raise pytest.UsageError("--kubeconfig is required (scripts/node/run.sh passes it)")
    known = cases.known_failures()
    if known and os.environ.get("CI") == "true":
        # A list of expected failures turns a red tier green: a gate never takes one.
        raise pytest.UsageError(f"FAIL known-failures-refused: NODE_KNOWN_FAILURES={' '.join(sorted(known))} "
                                "is refused under CI=true")
    for name in known - {n for n, _ in cases.CASES}:
        cases.log(f"NODE_KNOWN_FAILURES names no case {name!r}")
    cases.KUBECONFIG = config.getoption("kubeconfig")


@pytest.fixture(scope="session")
def shared(request):
    """The release installed (or found, with --skip-install), then what cases hand on to later ones."""
    t0 = time.monotonic()
    cases.install(request.config.getoption("skip_install"))
    for line in cases.FIGURES:
        print(line, flush=True)
    cases.log(f"installed in {time.monotonic() - t0:.0f}s")
    yield cases.Shared()
    cases.cleanup()


@pytest.fixture(autouse=True)
def figures(request):
    """Each case's figures, printed after it whatever its outcome."""
    cases.FIGURES.clear()
    cases.log(f"--- {request.node.callspec.id if hasattr(request.node, 'callspec') else request.node.name}")
    yield
    for line in cases.FIGURES:
        print(line, flush=True)
    cases.FIGURES.clear()
