"""Tests of report.py, the report of `memcolo bench colocation`, on synthetic output
directories written by `make_out` (no root, no benchmark run).

Run: python3 -m unittest bench/colocation/test_report.py
The plot test needs matplotlib (python3-matplotlib); without it the test fails unless
MEMCOLO_TEST_ALLOW_SKIP=1.
"""

import contextlib
import csv
import importlib.util
import io
import json
import os
import subprocess
import sys
import tempfile
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "report.py")
_spec = importlib.util.spec_from_file_location("colocation_report", SCRIPT)
report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report)

RUN_COLUMNS = [
    "level_pct", "mode", "rep", "attempt", "accepted", "reject_reason", "status", "node_bytes",
    "requests", "requests_ok", "errors", "dropped", "p50_us", "p90_us", "p99_us", "p999_us", "max_us",
    "mean_us", "slo_us", "slo_violation_ratio", "throughput_rps", "be_file_mib_per_min",
    "be_anon_ops_per_min", "elastic_gets_per_min", "be_file_hit_ratio", "node_util",
    "node_usage_max_bytes", "swap_used_max_bytes", "redis_major_faults", "redis_rss_bytes", "oom_kills",
    "lc_kills", "be_kills", "loadavg_1m", "steal_pct", "cpu_busy_pct", "lc_cpus_foreign_pct",
    "lc_cpus_steal_ms", "lc_service", "some_future_column",
]

MODES = [
    {"name": "kernel", "kind": "baseline", "label": "kernel alone", "settings": "cgroup limit", "source": ""},
    {"name": "watermarks", "kind": "baseline", "label": "raised watermarks", "settings": "wsf=500", "source": ""},
    {"name": "senpai", "kind": "peer", "label": "Senpai-style", "settings": "psi 0.1 %",
     "source": "TMO, ASPLOS'22"},
    {"name": "koordinator", "kind": "peer", "label": "Koordinator-style", "settings": "70 %",
     "source": "koordinator.sh"},
    {"name": "agent", "kind": "ablation", "label": "Hermes advice", "settings": "", "source": ""},
    {"name": "full", "kind": "memcolo", "label": "the whole of memcolo", "settings": "defaults", "source": ""},
]

# Median p99 (µs) per (mode, level) in the passing fixture; repeats r = 1, 2, 3 get
# 0.9, 1.0, 1.1 × this, so min/median/max are exact.
P99 = {
    "kernel": {0: 200, 50: 250, 100: 20000, 125: 25000, 150: 500},
    "watermarks": {0: 200, 50: 250, 100: 5000, 125: 6000, 150: 3000},
    "senpai": {0: 200, 50: 250, 100: 1000, 125: 1200, 150: 1500},
    "koordinator": {0: 200, 50: 250, 100: 800, 125: 900, 150: 900},
    "agent": {0: 200, 50: 250, 100: 500, 125: 600, 150: 2000},
    "full": {0: 100, 50: 110, 100: 150, 125: 180, 150: 190},
}
UTIL = {"kernel": 0.95, "watermarks": 0.9, "senpai": 0.8, "koordinator": 0.7, "agent": 0.75, "full": 0.85}
# BE work as a share of kernel alone's.
PROGRESS = {"kernel": 1.0, "watermarks": 0.95, "senpai": 0.7, "koordinator": 0.5, "agent": 1.0, "full": 0.95}


def run_row(level, mode, rep, attempt=1, **over):
    f = 0.9 + 0.1 * (rep - 1)
    p99 = P99[mode][level] * f
    prog = PROGRESS[mode]
    row = {c: "" for c in RUN_COLUMNS}
    row.update(
        level_pct=level, mode=mode, rep=rep, attempt=attempt, accepted="true", status="ok",
        node_bytes=2 * 2**30, requests=12000, requests_ok=12000, errors=0, dropped=0,
        p50_us=60 * f, p90_us=80 * f, p99_us=p99, p999_us=p99 * 3, max_us=p99 * 4, mean_us=70,
        slo_us=80, slo_violation_ratio=0.1 * f, throughput_rps=2000,
        be_file_mib_per_min=(600 * prog if level else 0.0), be_anon_ops_per_min=(300 * prog if level else ""),
        node_util=UTIL[mode] * (level / 125 if level else 0.05), oom_kills=0, lc_kills=0, be_kills=0,
        loadavg_1m=1.5, steal_pct=0.0, cpu_busy_pct=50, lc_cpus_foreign_pct=1.0, lc_cpus_steal_ms=0,
        lc_service="redis", some_future_column="x",
    )
    row.update(over)
    return row


def make_out(d, modes=MODES, levels=(0, 100, 125), repeats=3, extra_rows=(), tweak=None, meta_over=None,
             columns=RUN_COLUMNS, timelines=True):
    """Writes a synthetic runner output directory into `d`; `tweak(row)` may edit or
    drop (return None) each generated row."""
    meta = {
        "date": "2026-11-28 10:02 UTC", "commit": "f19b8f1", "host": "vm", "kernel": "6.18.0",
        "cpus_online": 2, "mem_total_bytes": 24 * 2**30, "command": "memcolo bench colocation --quick",
        "lc_service": "redis", "elapsed_s": 754.0, "parameters": [["node memory", "2 GiB"], ["rate", "2000 req/s"]],
        "modes": modes, "levels": list(levels), "repeats": repeats, "slo_us": 80,
        "slo_source": "median p90 of the 0 % kernel-alone runs",
        "reject": {"foreign_pct_max": 5.0, "steal_pct_max": 2.0, "max_attempts": 3},
        "p999_min_requests": 10000,
        "lc_alloc": {"checked": True, "libmemcolo_mapped": True, "allocations_through_libmemcolo": "97 %"},
        "notes": ["senpai's stall target was reached only at 150 %"],
    }
    meta.update(meta_over or {})
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f)
    rows = []
    for rep in range(1, repeats + 1):
        for level in levels:
            for m in modes:
                r = run_row(level, m["name"], rep)
                if tweak:
                    r = tweak(r)
                if r is not None:
                    rows.append(r)
    rows += list(extra_rows)
    with open(os.path.join(d, "runs.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    with open(os.path.join(d, "percentiles.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["level_pct", "mode", "rep", "percentile", "latency_us", "count_le"])
        for r in rows:
            if r["accepted"] != "true" or r["status"] != "ok":
                continue
            p99 = float(r["p99_us"])
            for pct, lat, cnt in ((50, 60, 6000), (90, 80, 10800), (99, p99, 11880), (99.9, p99 * 3, 11988),
                                  (100, p99 * 4, 12000)):
                w.writerow([r["level_pct"], r["mode"], r["rep"], pct, lat, cnt])
    if timelines:
        for r in rows:
            if r["accepted"] != "true" or r["level_pct"] != 100 or r["mode"] not in P99:
                continue
            name = f"{r['level_pct']}-{r['mode']}-{r['rep']}.csv"
            with open(os.path.join(d, "timeline-" + name), "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(["t_s", "usage_bytes", "headroom_bytes", "swap_bytes", "workers_desired", "workers_active",
                            "low_mark_bytes", "high_mark_bytes", "reclaim_state", "zone", "m3_low_bytes",
                            "m3_high_bytes", "m3_top_bytes", "be_limit_bytes", "node_limit_hits", "lc_major_faults"])
                for i in range(24):
                    zone = ("green", "yellow", "red")[i // 8] if r["mode"] == "full" else ""
                    be_lim = 2**30 if r["mode"] == "senpai" else ""
                    w.writerow([i * 0.25, 1.5 * 2**30 + i * 2**20, 2**28, 0, i % 3, i % 2, "", "", "", zone,
                                1.6 * 2**30, 1.8 * 2**30, 1.9 * 2**30, be_lim, i, 0])
            with open(os.path.join(d, "latency-" + name), "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(["second", "requests", "p50_us", "p99_us", "p999_us", "max_us"])
                for s in range(6):
                    w.writerow([s, 2000, 60, float(r["p99_us"]) * (1 + s / 10), 0, 0])
    return d


def run_main(d, no_plots=True):
    """Runs report.main in-process; returns (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    patch = mock.patch.object(report, "load_pyplot", side_effect=ImportError("no module")) if no_plots \
        else contextlib.nullcontext()
    with patch, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = report.main(["report.py", d])
    return rc, out.getvalue(), err.getvalue()


def summary(d):
    with open(os.path.join(d, "summary.csv"), newline="") as f:
        return {(int(r["level"]), r["mode"], r["metric"]): r for r in csv.DictReader(f)}


def report_md(d):
    with open(os.path.join(d, "report.md"), encoding="utf-8") as f:
        return f.read()


def table_row(md, metric, level):
    """Cells of the summary-table row (metric, level), after those two columns."""
    for line in md.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) > 2 and cells[0] == metric and cells[1] == f"{level} %":
            return cells[2:]
    raise AssertionError(f"no row {metric} {level} in report.md")


def target_line(md, letter):
    for line in md.splitlines():
        if line.startswith("- ") and f"({letter})" in line:
            return line
    raise AssertionError(f"no target ({letter})")


class Base(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.d = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()


class Statistics(Base):
    def test_median_min_max_over_repeats(self):
        make_out(self.d)
        rc, out, err = run_main(self.d)
        self.assertEqual(rc, 0, err)
        s = summary(self.d)[(100, "full", "p99_us")]
        self.assertAlmostEqual(float(s["median"]), 150)
        self.assertAlmostEqual(float(s["min"]), 135)
        self.assertAlmostEqual(float(s["max"]), 165)
        self.assertEqual(s["n"], "3")
        self.assertIn("150 [135–165]", table_row(report_md(self.d), "p99 (µs)", 100)[5])

    def test_best_marked_bold_per_row(self):
        make_out(self.d)
        run_main(self.d)
        md = report_md(self.d)
        cells = table_row(md, "p99 (µs)", 100)  # kernel, watermarks, senpai, koordinator, agent, full
        self.assertTrue(cells[5].startswith("**"), cells)
        self.assertEqual([c for c in cells if c.startswith("**")], [cells[5]])
        util = table_row(md, "node utilisation (%)", 100)
        self.assertTrue(util[0].startswith("**"), util)  # kernel fills the node most
        self.assertEqual(sum(c.startswith("**") for c in util), 1)
        prog = table_row(md, "BE progress (% of kernel alone)", 100)
        self.assertEqual([i for i, c in enumerate(prog) if c.startswith("**")], [0, 4])  # tie at 100 %

    def test_p999_only_with_enough_requests(self):
        def tweak(r):
            if r["mode"] == "senpai" and r["level_pct"] == 100 and r["rep"] == 2:
                r["requests"] = 5000
            return r

        make_out(self.d, tweak=tweak)
        run_main(self.d)
        cells = table_row(report_md(self.d), "p99.9 (µs)", 100)
        self.assertEqual(cells[2], "n/a (5000 req)")
        self.assertNotIn((100, "senpai", "p999_us"), summary(self.d))
        self.assertIn((100, "senpai", "p99_us"), summary(self.d))
        self.assertIn("[", cells[3])  # koordinator's runs all have 12000 requests

    def test_rejected_runs_excluded(self):
        outlier = run_row(100, "full", 2, attempt=1, accepted="false", reject_reason="LC CPUs foreign load 11 %",
                          p99_us=10**6, p50_us=10**5, oom_kills=0)
        outlier2 = run_row(125, "kernel", 1, attempt=1, accepted="false", reject_reason="LC CPUs foreign load 11 %")
        outlier3 = run_row(0, "full", 3, attempt=1, accepted="false", reject_reason="steal 3 %")
        make_out(self.d, extra_rows=[outlier, outlier2, outlier3])
        run_main(self.d)
        s = summary(self.d)[(100, "full", "p99_us")]
        self.assertAlmostEqual(float(s["max"]), 165)
        self.assertEqual(s["n"], "3")
        md = report_md(self.d)
        self.assertIn("3 rejected and repeated", md)
        self.assertIn("2 × LC CPUs foreign load 11 %", md)
        self.assertIn("1 × steal 3 %", md)
        self.assertIn("| 100 | full | 2 | 1 | false | LC CPUs foreign load 11 % |", md)

    def test_failed_run_excluded_and_short_cell_shown(self):
        def tweak(r):
            if r["mode"] == "agent" and r["level_pct"] == 125 and r["rep"] == 3:
                r["status"] = "failed: redis did not start"
                r["p99_us"] = ""
            return r

        make_out(self.d, tweak=tweak)
        run_main(self.d)
        self.assertEqual(summary(self.d)[(125, "agent", "p99_us")]["n"], "2")
        md = report_md(self.d)
        self.assertIn("(n=2)", table_row(md, "p99 (µs)", 125)[4])
        self.assertIn("125 % agent (2)", md)

    def test_be_progress_relative_to_kernel_alone(self):
        def tweak(r):
            if r["mode"] == "koordinator" and r["level_pct"] == 125:
                r["be_anon_ops_per_min"] = ""  # its holder was killed: no work
            return r

        make_out(self.d, tweak=tweak)
        run_main(self.d)
        s = summary(self.d)
        self.assertAlmostEqual(float(s[(100, "kernel", "be_progress_pct")]["median"]), 100)
        self.assertAlmostEqual(float(s[(100, "full", "be_progress_pct")]["median"]), 95)
        self.assertAlmostEqual(float(s[(125, "koordinator", "be_progress_pct")]["median"]), 25)
        self.assertNotIn((0, "kernel", "be_progress_pct"), s)  # no BE work at 0 %
        self.assertEqual(table_row(report_md(self.d), "BE progress (% of kernel alone)", 0)[0], "n/a")


    def test_a_job_the_kernel_starved_is_no_reference(self):
        # The kernel alone read almost nothing at 100 %: the streamer is left out of
        # that level's progress instead of every other mode reading 10^6 %.
        def tweak(r):
            if r["level_pct"] == 100:
                r["be_file_mib_per_min"] = 0.001 if r["mode"] == "kernel" else 600
            return r

        make_out(self.d, tweak=tweak)
        run_main(self.d)
        s = summary(self.d)
        self.assertAlmostEqual(float(s[(100, "kernel", "be_progress_pct")]["median"]), 100)
        self.assertLess(float(s[(100, "full", "be_progress_pct")]["median"]), 1000)


class Targets(Base):
    def test_all_targets_pass(self):
        make_out(self.d)
        rc, _, err = run_main(self.d)
        self.assertEqual(rc, 0, err)
        md = report_md(self.d)
        for t in "abcde":
            self.assertTrue(target_line(md, t).startswith("- ✅"), target_line(md, t))
        self.assertNotIn("missed by", md)
        self.assertIn("senpai's stall target was reached only at 150 %", md)
        self.assertIn("libmemcolo mapped in its address space; allocations through libmemcolo: 97 %.", md)

    def test_all_targets_fail_with_amounts(self):
        def tweak(r):
            if r["mode"] == "full" and r["level_pct"] == 125:
                r["p99_us"] = 1300  # > 2 × 100 and > senpai's 1200 (median over reps: all 1300)
            if r["mode"] == "full" and r["level_pct"] > 0:
                r["be_file_mib_per_min"] = 600 * 0.8
                r["be_anon_ops_per_min"] = 300 * 0.8
            if r["mode"] == "full" and r["level_pct"] == 100:
                r["node_util"] = 0.5 * 100 / 125
            if r["mode"] == "kernel" and r["level_pct"] == 125 and r["rep"] == 2:
                r["oom_kills"] = 2
            return r

        lc_kill = run_row(100, "senpai", 1, attempt=1, accepted="false", reject_reason="steal 3 %", lc_kills=1)
        make_out(self.d, tweak=tweak, extra_rows=[lc_kill])
        run_main(self.d)
        md = report_md(self.d)
        for t in "abcde":
            self.assertTrue(target_line(md, t).startswith("- ❌"), target_line(md, t))
        self.assertIn("at 125 % by 1100 µs (1300 µs vs 2 × 100 = 200 µs)", target_line(md, "a"))
        self.assertIn("100 % 150 µs (1.50×)", target_line(md, "a"))
        self.assertIn("at 125 % by 100 µs (full 1300 µs vs senpai 1200 µs)", target_line(md, "b"))
        self.assertNotIn("at 100 % by", target_line(md, "b"))
        self.assertIn("at 125 % by 400 µs (full 1300 µs vs koordinator 900 µs)", target_line(md, "b"))
        self.assertIn("at 100 % by 10 points (80 % vs 90 %)", target_line(md, "c"))
        self.assertIn("at 100 % by 16.0 points (full 40.0 % vs koordinator 56.0 %)", target_line(md, "d"))
        self.assertIn("in 2 of ", target_line(md, "e"))
        self.assertIn("125 % kernel rep 2 attempt 1 (accepted): 2 OOM, 0 LC", md)
        self.assertIn("100 % senpai rep 1 attempt 1 (rejected): 0 OOM, 1 LC", md)

    def test_verdicts_function(self):
        make_out(self.d)
        data = report.Data(self.d)
        stats, _, _ = report.compute(data)
        self.assertEqual([t.verdict for t in report.targets(data, stats)], ["pass"] * 5)

    def test_missing_modes_not_run(self):
        make_out(self.d, modes=[MODES[0], MODES[4]])  # kernel and agent only
        rc, _, err = run_main(self.d)
        self.assertEqual(rc, 0, err)
        md = report_md(self.d)
        for t in "abcd":
            self.assertTrue(target_line(md, t).startswith("- ➖"), target_line(md, t))
        self.assertTrue(target_line(md, "e").startswith("- ✅"))
        self.assertIn("Not run: `full`.", target_line(md, "a"))

    def test_koordinator_absent(self):
        make_out(self.d, modes=[m for m in MODES if m["name"] != "koordinator"])
        run_main(self.d)
        md = report_md(self.d)
        self.assertTrue(target_line(md, "d").startswith("- ➖"), target_line(md, "d"))
        self.assertIn("Not run: koordinator.", target_line(md, "d"))
        self.assertTrue(target_line(md, "b").startswith("- ✅"))


class Input(Base):
    def run_script(self):
        return subprocess.run([sys.executable, SCRIPT, self.d], capture_output=True, text=True, timeout=120)

    def test_malformed_runs_csv_fails_with_message(self):
        make_out(self.d, columns=[c for c in RUN_COLUMNS if c != "accepted"])
        p = self.run_script()
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("runs.csv: missing column(s) accepted", p.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.d, "report.md")))

    def test_bad_values_fail_with_message(self):
        for field, value, msg in (
            ("level_pct", "lots", "must be integers"),
            ("accepted", "yes", "accepted must be 'true' or 'false'"),
        ):
            with self.subTest(field=field):
                make_out(self.d, extra_rows=[run_row(100, "full", 1, attempt=2, **{field: value})])
                p = self.run_script()
                self.assertEqual(p.returncode, 2)
                self.assertIn(msg, p.stderr)

    def test_ragged_row_fails(self):
        make_out(self.d)
        with open(os.path.join(self.d, "runs.csv"), "a") as f:
            f.write("100,full,1\n")
        rc, _, err = run_main(self.d)
        self.assertEqual(rc, 2)
        self.assertIn("wrong number of fields", err)

    def test_missing_or_bad_meta_fails(self):
        make_out(self.d)
        with open(os.path.join(self.d, "meta.json"), "w") as f:
            f.write("{not json")
        rc, _, err = run_main(self.d)
        self.assertEqual(rc, 2)
        self.assertIn("meta.json: not valid JSON", err)
        os.remove(os.path.join(self.d, "meta.json"))
        rc, _, err = run_main(self.d)
        self.assertIn("meta.json: missing", err)
        make_out(self.d, meta_over={"modes": "kernel"})
        rc, _, err = run_main(self.d)
        self.assertEqual(rc, 2)
        self.assertIn("'modes' must be a list", err)

    def test_empty_runs_and_no_directory(self):
        make_out(self.d, tweak=lambda r: None)
        rc, _, err = run_main(self.d)
        self.assertEqual(rc, 2)
        self.assertIn("no runs", err)
        rc, _, err = run_main(os.path.join(self.d, "nope"))
        self.assertEqual(rc, 2)
        self.assertIn("not a directory", err)

    def test_optional_columns_and_files_missing(self):
        keep = ["level_pct", "mode", "rep", "attempt", "accepted", "status", "p99_us"]
        make_out(self.d, columns=keep, timelines=False,
                 meta_over={"slo_us": None, "lc_alloc": None, "notes": [], "parameters": []})
        os.remove(os.path.join(self.d, "percentiles.csv"))
        rc, out, err = run_main(self.d, no_plots=False)
        self.assertEqual(rc, 0, err)
        md = report_md(self.d)
        self.assertIn("SLO: none", md)
        self.assertNotIn("libmemcolo", md)
        self.assertIn("150 [135–165]", table_row(md, "p99 (µs)", 100)[5])
        self.assertTrue(target_line(md, "e").startswith("- ✅"))
        self.assertTrue(target_line(md, "c").startswith("- ➖"), target_line(md, "c"))

    def test_mode_missing_from_meta_and_odd_names(self):
        odd, extra = run_row(100, "full", 1, p99_us=1), run_row(100, "full", 1)
        odd["mode"], extra["mode"] = "../x|y", "extra"
        make_out(self.d, extra_rows=[odd, extra])
        rc, _, err = run_main(self.d, no_plots=False)
        self.assertEqual(rc, 0, err)
        md = report_md(self.d)
        self.assertIn("| `../x\\|y` | ../x\\|y | ? |", md)
        self.assertEqual(len(table_row(md, "p99 (µs)", 100)), len(MODES) + 2)

    def test_failing_plot_leaves_report_whole(self):
        make_out(self.d)
        with mock.patch.object(report, "load_pyplot", return_value=mock.MagicMock()), \
                mock.patch.object(report, "plot_cdf", side_effect=ValueError("bad data")), \
                mock.patch.object(report, "plot_vs_level", side_effect=lambda *a, **k: a[5]), \
                mock.patch.object(report, "plot_timeline", return_value="timeline_100.png"):
            rc, out, err = run_main(self.d, no_plots=False)
        self.assertEqual(rc, 0, err)
        self.assertEqual(out.split(), ["report.md", "summary.csv", "p99_vs_level.png", "be_progress.png",
                                       "utilisation.png", "timeline_100.png"])
        self.assertIn("cdf.png not drawn: ValueError: bad data.", report_md(self.d))

    def test_without_matplotlib_writes_report_and_says_why(self):
        make_out(self.d)
        rc, out, err = run_main(self.d, no_plots=True)
        self.assertEqual(rc, 0, err)
        self.assertEqual(out.split(), ["report.md", "summary.csv"])
        self.assertIn("Plots not drawn: matplotlib cannot be imported", report_md(self.d))
        self.assertFalse([f for f in os.listdir(self.d) if f.endswith(".png")])


class Plots(Base):
    def test_plots_written_and_referenced(self):
        try:
            report.load_pyplot()
        except ImportError as e:
            if os.environ.get("MEMCOLO_TEST_ALLOW_SKIP") == "1":
                self.skipTest(f"matplotlib: {e}")
            self.fail(f"{sys.executable} cannot import matplotlib ({e}); install python3-matplotlib "
                      "or set MEMCOLO_TEST_ALLOW_SKIP=1")
        make_out(self.d, levels=(0, 50, 100, 125, 150))
        p = subprocess.run([sys.executable, SCRIPT, self.d], capture_output=True, text=True, timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr)
        names = p.stdout.split()
        expected = ["cdf.png", "p99_vs_level.png", "be_progress.png", "utilisation.png", "timeline_100.png"]
        self.assertEqual(names, ["report.md", "summary.csv"] + expected)
        md = report_md(self.d)
        for name in expected:
            with open(os.path.join(self.d, name), "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
            self.assertIn(f"![{name}]({name})", md)

    def test_merged_tail(self):
        xs, ys = report.merged_tail([[(10, 5), (20, 10)], [(10, 5), (30, 10)]])
        self.assertEqual(xs, [10, 20])
        self.assertEqual(ys, [0.5, 0.25])


if __name__ == "__main__":
    unittest.main()
