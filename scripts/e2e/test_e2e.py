"""The e2e tier's cases (e2e.CASES, in their order: the webhook-down cases come last), one test each.

    scripts/e2e/run.sh [--keep] [WORD...]    # WORD: only cases whose name contains it
"""
import pytest

import e2e
import tier_pytest


@pytest.mark.parametrize("case", tier_pytest.case_params(e2e.CASES))
def test_case(harness, case):
    _, fn, needs = case
    try:
        fn(harness)
    except e2e.Fail as e:
        pytest.fail(f"{e}" + (f" [needs: {needs}]" if needs else ""), pytrace=False)
    except e2e.Timeout as e:
        pytest.exit(f"FAIL timeout: {e}", returncode=1)
