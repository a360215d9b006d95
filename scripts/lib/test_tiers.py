"""The case runners of scripts/e2e and scripts/node, called as functions with no cluster: a filter that matches
no case, or a run of zero cases, fails. Run by .ci/run:

    python3 -m unittest discover -s scripts/lib -p 'test_*.py'
"""
import contextlib
import importlib.util
import io
import sys
import unittest
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts/lib"))
import tier  # noqa: E402


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, REPO / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_main(module, argv):
    """`module.main()` with `argv`: (exit status, stdout)."""
    out = io.StringIO()
    with mock.patch.object(sys, "argv", ["runner", *argv]), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(io.StringIO()):
        rc = module.main()
    return rc, out.getvalue()


class Select(unittest.TestCase):
    cases = [("alpha-one", None), ("beta-two", None)]

    def test_no_filter_selects_every_case(self):
        self.assertEqual(tier.select(self.cases, []), self.cases)

    def test_a_filter_selects_the_cases_it_matches(self):
        self.assertEqual(tier.select(self.cases, ["two"]), [("beta-two", None)])

    def test_a_filter_that_matches_nothing_fails_even_beside_one_that_does(self):
        with self.assertRaisesRegex(tier.Fail, "no case matches tpyo"):
            tier.select(self.cases, ["one", "tpyo"])

    def test_no_case_at_all_fails(self):
        with self.assertRaisesRegex(tier.Fail, "no case to run"):
            tier.select([], [])

    def test_zero_cases_ran_is_a_failure_line(self):
        self.assertIn("FAIL no-case-ran", tier.none_ran(0))
        self.assertIsNone(tier.none_ran(1))


class FakeHarness:
    """The e2e harness without a cluster: setup and teardown do nothing."""

    def __init__(self, args):
        self.procs = {}

    def setup(self):
        pass

    def teardown(self, failed):
        pass


class E2eRunner(unittest.TestCase):
    def setUp(self):
        self.e2e = load("e2e_under_test", "scripts/e2e/e2e.py")
        self.args = ["--pdp-injector", "/nonexistent", "--kube-apiserver", "/nonexistent"]
        self.ran = []
        self.e2e.CASES[:] = [("one-case", lambda h: self.ran.append("one-case"), None)]
        self.e2e.Harness = FakeHarness

    def test_a_filter_that_matches_no_case_fails_before_setup(self):
        rc, out = run_main(self.e2e, [*self.args, "no-such-case"])
        self.assertEqual(rc, 1, out)
        self.assertIn("FAIL selection: no case matches no-such-case", out)
        self.assertEqual(self.ran, [])

    def test_no_case_defined_fails(self):
        self.e2e.CASES[:] = []
        rc, out = run_main(self.e2e, self.args)
        self.assertEqual(rc, 1, out)
        self.assertIn("0 passed, 1 failed", out)

    def test_a_selected_case_runs_and_passes(self):
        rc, out = run_main(self.e2e, [*self.args, "one"])
        self.assertEqual((rc, self.ran), (0, ["one-case"]), out)
        self.assertIn("1 passed, 0 failed", out)


class NodeRunner(unittest.TestCase):
    def setUp(self):
        self.node = load("node_cases_under_test", "scripts/node/cases.py")
        self.ran = []
        self.node.CASES[:] = [("one-case", lambda shared: self.ran.append("one-case"))]
        self.node.install = lambda skip: None
        self.node.cleanup = lambda: None

    def test_a_filter_that_matches_no_case_fails_before_install(self):
        self.node.install = lambda skip: self.fail("installed with nothing to run")
        rc, out = run_main(self.node, ["--kubeconfig", "/nonexistent", "no-such-case"])
        self.assertEqual(rc, 1, out)
        self.assertIn("FAIL selection: no case matches no-such-case", out)

    def test_no_case_defined_fails(self):
        self.node.CASES[:] = []
        rc, out = run_main(self.node, ["--kubeconfig", "/nonexistent"])
        self.assertEqual(rc, 1, out)

    def test_a_selected_case_runs_and_passes(self):
        rc, out = run_main(self.node, ["--kubeconfig", "/nonexistent", "one"])
        self.assertEqual((rc, self.ran), (0, ["one-case"]), out)
        self.assertIn("1 passed, 0 failed", out)


if __name__ == "__main__":
    unittest.main()
