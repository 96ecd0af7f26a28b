"""Tests of report.py, the report of bench/sim, on synthetic run directories (rows as
`memcolo sim m3-paper|hermes-paper|maxmem-timeline|fleet --out` and `--validate
--out` write them; no simulator run).

Run: python3 -m unittest bench/sim/test_report.py
The plot test needs matplotlib (python3-matplotlib); without it the test fails unless
MEMCOLO_TEST_ALLOW_SKIP=1.
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "report.py")


def m3_row(name, mean):
    return {"workload": name, "best_static_gib": "20.7-20.7-20.7", "partitions_searched": 10,
            "static_run_s": "900/900/900", "m3_run_s": "800/800/800", "speedups": "1.10/1.20/1.30",
            "mean_speedup": mean, "static_used_gib": 40.0, "m3_used_gib": 50.0,
            "m3_notifications": 5, "m3_kills": 0, "oom_kills": 0}


def hermes_row(level, k, m):
    return {"level": level, "slo_us": 125.0, "kernel_slo_violation_pct": k,
            "memcolo_slo_violation_pct": m, "reduction_pct": None if k == 0 else 100 * (k - m) / k,
            "kernel_p99_us": 1000.0, "memcolo_p99_us": 900.0, "kernel_utilisation_pct": 99.0,
            "memcolo_utilisation_pct": 80.0, "hermes_dropped_gib": 1.0,
            "lc_direct_reclaim_s_kernel": 1.0, "lc_direct_reclaim_s_memcolo": 0.0}


def maxmem_row(change, proc, fast, saved):
    return {"change": change, "process": proc, "epochs_to_target": 3, "settled_a_miss": 0.05,
            "infeasible_share": 0.0, "fast_mib_at_end": fast, "hot_mib": 16384.0,
            "saved_vs_table_pct": saved}


def make_run(d, fleet=True, validation=True):
    def write(sub, name, obj):
        os.makedirs(os.path.join(d, sub), exist_ok=True)
        with open(os.path.join(d, sub, name), "w") as f:
            json.dump(obj, f)

    write("m3-paper", "report.json", {"rows": [m3_row("MMW-180", 1.5), m3_row("CMW-180", 1.3),
                                               m3_row("MMM-0", 0.9), m3_row("WWW-0", None)]})
    write("hermes-paper", "report.json", {"rows": [hermes_row(0, 10.0, 10.0), hermes_row(100, 20.0, 15.0),
                                                   hermes_row(150, 40.0, 10.0)]})
    write("maxmem-paper", "report.json", {"rows": [maxmem_row("start p1 @0s", "p1", 32768.0, None),
                                                   maxmem_row("start p6 @100s", "p6", 20000.0, 38.9)]})
    if fleet:
        rows = [{"mode": m, "nodes": 3, "utilisation": 0.5, "lc_stall_s": s, "oom_kills": o, "m3_kills": k,
                 "peak_swap_ratio": p} for m, s, o, k, p in [("kernel", 10.0, 2, 0, 1.0), ("memcolo", 0.0, 0, 1, 0.1)]]
        write("fleet-ab", "report.json", {"rows": rows})
    if validation:
        cells = [{"level": lv, "sim_mode": "kernel", "bench_mode": "kernel", "metric": "p99_us", "sim": s,
                  "sim_min": s, "sim_max": s, "measured": m, "measured_min": m * 0.9, "measured_max": m * 1.1,
                  "error_pct": 100 * (s - m) / m, "within_measured_range": False}
                 for lv, s, m in [(0, 200.0, 220.0), (100, 1000.0, 1400.0)]]
        metrics = [{"metric": "p99_us", "cells": 2, "mean_abs_error_pct": 19.0, "max_abs_error_pct": 29.0,
                    "within_measured_range": 0, "pass": True}]
        write("validate", "validation.json", {"source": "synthetic", "bound_pct": 25.0, "seeds": 1,
                                              "metrics": metrics, "cells": cells, "pass": True})


def run(d):
    return subprocess.run([sys.executable, SCRIPT, d], capture_output=True, text=True)


def have_matplotlib():
    try:
        import matplotlib  # noqa: F401
        return True
    except ImportError:
        return False


class Report(unittest.TestCase):
    def test_tables_set_the_sim_beside_the_papers(self):
        with tempfile.TemporaryDirectory() as d:
            make_run(d)
            r = run(d)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(os.path.join(d, "report.md")) as f:
                md = f.read()
            # Fig. 5 shape: the mean of 1.5 and 1.3; Fig. 8: only the finished one.
            self.assertIn("| Fig. 5 shape, mean speedup over the Oracle | 1.40 | 1.86", md)
            self.assertIn("| Fig. 8 worst cases, mean | 0.90 | 0.962 |", md)
            self.assertIn("| WWW-0 | 20.7-20.7-20.7 | 900/900/900 | 800/800/800 | 1.10/1.20/1.30 | - |", md)
            # Hermes: the largest reduction at levels >= 100 %: (40 - 10) / 40.
            self.assertIn("Largest reduction at levels >= 100 %: sim 75.0 %, paper 83.6 %", md)
            self.assertIn("| start p6 @100s | p6 | 3 | 20000 | 16384 | 38.9 |", md)
            self.assertIn("| p99_us | 2 | 19 | 29 | 0 | True |", md)

    def test_plots_are_written(self):
        if not have_matplotlib():
            if os.environ.get("MEMCOLO_TEST_ALLOW_SKIP") == "1":
                self.skipTest("matplotlib does not import")
            self.fail("matplotlib does not import (python3-matplotlib; MEMCOLO_TEST_ALLOW_SKIP=1 to skip)")
        with tempfile.TemporaryDirectory() as d:
            make_run(d)
            r = run(d)
            self.assertEqual(r.returncode, 0, r.stderr)
            for name in ("papers.png", "fleet.png", "validation.png"):
                p = os.path.join(d, "plots", name)
                self.assertTrue(os.path.getsize(p) > 1000, p)
                self.assertIn(p, r.stdout)

    def test_optional_inputs_may_be_missing_and_required_ones_not(self):
        with tempfile.TemporaryDirectory() as d:
            make_run(d, fleet=False, validation=False)
            r = run(d)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertFalse(os.path.exists(os.path.join(d, "plots", "fleet.png")))
            os.remove(os.path.join(d, "hermes-paper", "report.json"))
            r = run(d)
            self.assertEqual(r.returncode, 2)
            self.assertIn("hermes-paper", r.stderr)
            with open(os.path.join(d, "hermes-paper", "report.json"), "w") as f:
                f.write("{not json")
            self.assertEqual(run(d).returncode, 2)
            with open(os.path.join(d, "hermes-paper", "report.json"), "w") as f:
                json.dump({"rows": "none"}, f)
            self.assertEqual(run(d).returncode, 2)


if __name__ == "__main__":
    unittest.main()
