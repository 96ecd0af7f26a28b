"""Tests of benchlib's plan helpers (``python3 -m unittest bench/test_benchlib.py``)."""
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402


class PlanTest(unittest.TestCase):
    def test_interleaved_rotates_the_first_config(self):
        self.assertEqual(benchlib.interleaved(["a", "b"], 2),
                         [("a", 0), ("b", 0), ("b", 1), ("a", 1)])

    def test_pending_skips_logged_runs_and_counts_those_past_the_budget(self):
        with tempfile.TemporaryDirectory() as d:
            log = benchlib.RunLog(d)
            log.append({"run": "a-r0"})
            runs, left = benchlib.pending(["a", "b"], 2, log, benchlib.Budget(3600))
            self.assertEqual(list(runs), [("b", 0, "b-r0"), ("b", 1, "b-r1"), ("a", 1, "a-r1")])
            self.assertEqual(left(), 0)
            runs, left = benchlib.pending(["a", "b"], 2, log, benchlib.Budget(-1))
            self.assertEqual(list(runs), [])
            self.assertEqual(left(), 3)


if __name__ == "__main__":
    unittest.main()
