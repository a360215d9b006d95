"""The cluster tiers' selection with no cluster: tier.select, the pytest plugin both tiers load (a word that
matches no case, or a run of zero cases, fails), and each tier's cases collected in order. Run by .ci/run:

    python3 -m unittest discover -s scripts/lib -p 'test_*.py'
"""
import importlib.util
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts/lib"))
import tier  # noqa: E402


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, REPO / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


CASES_FILE = """
import pytest
import tier_pytest

CASES = [("alpha-one", None), ("beta-two", None)]


@pytest.mark.parametrize("case", tier_pytest.case_params(CASES))
def test_case(case):
    print("RAN", case[0])
"""


def pytest(test_file, *args, path=(), env=None):
    """pytest with the tiers' plugin, as run.sh runs it, on `test_file` (`path`: more import directories):
    (exit status, stdout, stdout and stderr)."""
    env = {**os.environ, **(env or {}), "PYTHONPATH": ":".join(str(p) for p in [REPO / "scripts/lib", *path])}
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "tier_pytest", "-p", "no:cacheprovider", str(test_file),
                        *args], capture_output=True, text=True, env=env, timeout=60, cwd=REPO)
    return p.returncode, p.stdout, p.stdout + p.stderr


def run_pytest(tmp, *args):
    """The plugin over a two-case tier: (exit status, output)."""
    (tmp / "test_tier.py").write_text(CASES_FILE)
    rc, _, out = pytest(tmp / "test_tier.py", "-v", "-s", *args)
    return rc, out


class Plugin(unittest.TestCase):
    """scripts/lib/tier_pytest.py, as the e2e and node tiers load it."""

    def setUp(self):
        d = tempfile.TemporaryDirectory()
        self.addCleanup(d.cleanup)
        self.tmp = Path(d.name)

    def test_every_case_runs_without_words(self):
        rc, out = run_pytest(self.tmp)
        self.assertEqual(rc, 0, out)
        self.assertIn("RAN alpha-one", out)
        self.assertIn("RAN beta-two", out)

    def test_a_word_selects_the_cases_it_matches(self):
        rc, out = run_pytest(self.tmp, "--case", "two")
        self.assertEqual(rc, 0, out)
        self.assertIn("RAN beta-two", out)
        self.assertNotIn("RAN alpha-one", out)

    def test_a_word_that_matches_no_case_fails_before_any_runs(self):
        rc, out = run_pytest(self.tmp, "--case", "one", "--case", "tpyo")
        self.assertNotEqual(rc, 0, out)
        self.assertIn("FAIL selection: no case matches tpyo", out)
        self.assertNotIn("RAN", out)

    def test_a_run_in_which_no_case_ran_fails(self):
        rc, out = run_pytest(self.tmp, "-k", "nothing-is-called-this")
        self.assertEqual(rc, 1, out)
        self.assertIn("FAIL no-case-ran", out)


class Tiers(unittest.TestCase):
    """The two tiers collect their cases, in their order, under their names."""

    def collect(self, tier_dir, test_file, *args):
        rc, out, both = pytest(REPO / tier_dir / test_file, "-q", "--collect-only", *args, path=[REPO / tier_dir])
        self.assertEqual(rc, 0, both)
        return [line.split("[", 1)[1].rstrip("]") for line in out.splitlines() if "::test_case[" in line]

    def test_e2e_collects_every_case_in_order(self):
        e2e = load("e2e_under_test", "scripts/e2e/e2e.py")
        got = self.collect("scripts/e2e", "test_e2e.py", "--pdp-injector", "/x", "--kube-apiserver", "/y")
        self.assertEqual(got, [c[0] for c in e2e.CASES])

    def test_node_collects_every_case_in_order(self):
        node = load("node_cases_under_test", "scripts/node/cases.py")
        got = self.collect("scripts/node", "test_node.py", "--kubeconfig", "/x")
        self.assertEqual(got, [c[0] for c in node.CASES])

    def test_node_refuses_known_failures_under_ci(self):
        rc, _, both = pytest(REPO / "scripts/node/test_node.py", "-q", "--collect-only", "--kubeconfig", "/x",
                             path=[REPO / "scripts/node"], env={"CI": "true", "NODE_KNOWN_FAILURES": "some-case"})
        self.assertNotEqual(rc, 0, both)
        self.assertIn("FAIL known-failures-refused", both)


if __name__ == "__main__":
    unittest.main()
