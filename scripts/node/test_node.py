"""The node tier's cases (cases.CASES, in their order: the last ones upgrade, test and uninstall the release),
one test each.

    scripts/node/run.sh [--keep] [WORD...]    # WORD: only cases whose name contains it
"""
import pytest

import cases
import tier_pytest


def known_marks(name):
    """A case listed in NODE_KNOWN_FAILURES (refused under CI=true, conftest.py) must fail with a `Fail`; a pass
    fails the run, so that the list stays true."""
    if name in cases.known_failures():
        return [pytest.mark.xfail(raises=cases.Fail, strict=True, reason="NODE_KNOWN_FAILURES")]
    return []


@pytest.mark.parametrize("case", tier_pytest.case_params(cases.CASES, known_marks))
def test_case(shared, case):
    _, fn = case
    try:
        fn(shared)
    except cases.Fail as e:
        head, _, detail = str(e).partition("\n")
        if detail:
            cases.log(detail)
        raise cases.Fail(head) from None
