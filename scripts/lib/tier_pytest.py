"""The cluster tiers' pytest plugin (scripts/e2e and scripts/node load it from their conftest.py): each tier's
cases are one parametrized test, `-k` or the `cases` words pick some, and nothing passes by running none.

- `case_params(cases)`: the tier's `(name, fn, ...)` list as `pytest.param`s with the name as id, in order;
- words after the options (`run.sh reinvocation dry-run`) select the cases whose name contains one of them, and
  a word that matches no case fails the run before the cluster is set up (`tier.select`);
- a run in which no case ran fails with `FAIL no-case-ran` (pytest alone would exit 5 and say less).
"""
import pytest

import tier


def case_params(cases, marks=lambda name: ()):
    """`pytest.param(case, id=name)` for each case tuple, with the marks `marks(name)` gives."""
    return [pytest.param(c, id=c[0], marks=marks(c[0])) for c in cases]


def pytest_addoption(parser):
    parser.addoption("--case", action="append", default=[], metavar="WORD",
                     help="only cases whose name contains WORD (repeatable; each must match a case)")


def pytest_collection_modifyitems(session, config, items):
    words = config.getoption("case")
    if not words:
        return
    named = [(item.callspec.id if hasattr(item, "callspec") else item.name, item) for item in items]
    try:
        chosen = tier.select(named, words)
    except tier.Fail as e:
        raise pytest.UsageError(f"FAIL selection: {e}")
    keep = {id(item) for _, item in chosen}
    config.hook.pytest_deselected(items=[i for i in items if id(i) not in keep])
    items[:] = [i for i in items if id(i) in keep]


def pytest_sessionfinish(session, exitstatus):
    # `testscollected` counts what is left after deselection (`-k`, the words above).
    if session.testscollected == 0:
        print("\n" + tier.none_ran(0), flush=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
