#!/usr/bin/env python3
"""Report of `memcolo bench colocation`: turns the runner's output directory into
`report.md`, `summary.csv` and PNG plots.

Usage: report.py OUT

Input (written by the runner, crates/memcolo-bench/src/colocation.rs, into OUT):
  meta.json          the run's description: date, commit, machine, command, modes
                     (name, kind baseline|peer|memcolo|ablation, label, settings,
                     source), levels (% BE memory demand / node memory, Hermes
                     §5.1), repeats, SLO (µs) and its source, the run-rejection
                     thresholds, p999_min_requests, notes;
  runs.csv           one row per run attempt (level_pct, mode, rep, attempt,
                     accepted, reject_reason, status, latencies in µs, BE work,
                     node_util 0..1, kills, noise gauges; unknown columns ignored);
  percentiles.csv    HDR percentile iteration per accepted run (level_pct, mode,
                     rep, percentile 0..100, latency_us, count_le cumulative);
  timeline-<level>-<mode>-<rep>.csv   250 ms samples of the measured phase;
  latency-<level>-<mode>-<rep>.csv    per-second latency of the measured phase.

Output (in OUT; their names are printed on stdout, one per line):
  report.md          what ran, summary table (median [min–max] over the accepted
                     repeats, best per row in bold), the targets of issue 22 with
                     verdicts, plots, per-attempt detail;
  summary.csv        level, mode, metric, median, min, max, n (machine-readable);
                     metrics p50_us, p99_us, p999_us (µs), slo_violation_pct,
                     be_progress_pct, node_util_pct (%), oom_lc_kills, be_kills;
  cdf.png, p99_vs_level.png, be_progress.png, utilisation.png, timeline_100.png
                     (only if matplotlib imports; report.md says why not otherwise).

Statistics: only accepted runs (accepted == "true" and status == "ok") enter the
summary; rejected attempts are listed with their reason. BE progress of a run =
mean over the BE jobs with a positive kernel-alone figure at that level (file
MiB/min, anon ops/min, elastic gets/min) of the run's work / the median work of the
kernel-alone runs at that level, in % (kernel alone ≈ 100 %); a job without a figure
in a run counts as no work. p99.9 is shown only where every accepted run of the
cell has at least p999_min_requests requests. Kills (OOM, LC) are counted over every
attempt, rejected ones included. Targets compare medians.

Exit status: 0 on success; 2 with a message on stderr if OUT's input is missing or
malformed. Standard library only, plus matplotlib for the plots.
"""

import csv
import json
import math
import os
import re
import statistics
import sys

# Columns runs.csv must have; every other column is optional.
REQUIRED_COLUMNS = ("level_pct", "mode", "rep", "attempt", "accepted", "status")

# BE jobs whose work makes up BE progress: (runs.csv column, job name).
BE_JOBS = (
    ("be_file_mib_per_min", "file streamer"),
    ("be_anon_ops_per_min", "anonymous holder"),
    ("elastic_gets_per_min", "elastic cache"),
)

# Fixed colours for the modes named in issue 22; others take the rest in order.
KNOWN_COLOURS = {
    "kernel": "tab:red",
    "watermarks": "tab:orange",
    "senpai": "tab:purple",
    "koordinator": "tab:brown",
    "full": "tab:blue",
    "agent": "tab:green",
}
SPARE_COLOURS = ("tab:cyan", "tab:olive", "tab:pink", "tab:gray", "gold", "navy", "lime", "teal")

# Kinds whose modes are the comparison points of target (b).
PEER_KINDS = ("baseline", "peer")

# Mode names that may appear in a file name (timeline-<level>-<mode>-<rep>.csv).
SAFE_NAME = re.compile(r"[A-Za-z0-9_.+]+")

# Attempts with a kill listed under target (e); the rest are counted.
MAX_OFFENDERS = 20

# Key modes of the timeline figure, when present.
TIMELINE_MODES = ("kernel", "senpai", "koordinator", "full")


class InputError(Exception):
    """OUT's input is missing or malformed; the message says which file and why."""


# ---------------------------------------------------------------- input


def fnum(v):
    """`v` as a float, or None if empty or not a finite number."""
    if v is None:
        return None
    if isinstance(v, (int, float)):
        return float(v) if math.isfinite(v) else None
    v = str(v).strip()
    if not v:
        return None
    try:
        x = float(v)
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def load_meta(out):
    path = os.path.join(out, "meta.json")
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise InputError(f"{path}: missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(meta, dict):
        raise InputError(f"{path}: expected a JSON object")
    modes = meta.get("modes", [])
    if not isinstance(modes, list) or not all(
        isinstance(m, dict) and isinstance(m.get("name"), str) for m in modes
    ):
        raise InputError(f"{path}: 'modes' must be a list of objects with a 'name'")
    levels = meta.get("levels", [])
    if not isinstance(levels, list) or not all(
        isinstance(x, (int, float)) and not isinstance(x, bool) for x in levels
    ):
        raise InputError(f"{path}: 'levels' must be a list of numbers")
    params = meta.get("parameters", [])
    if not isinstance(params, list) or not all(
        isinstance(p, (list, tuple)) and len(p) == 2 for p in params
    ):
        raise InputError(f"{path}: 'parameters' must be a list of [name, value] pairs")
    notes = meta.get("notes", [])
    if not isinstance(notes, list):
        raise InputError(f"{path}: 'notes' must be a list of strings")
    for key in ("reject", "lc_alloc"):
        if meta.get(key) is not None and not isinstance(meta[key], dict):
            raise InputError(f"{path}: '{key}' must be an object")
    return meta


def load_runs(out):
    """Rows of runs.csv, with level_pct/rep/attempt as ints and `ok` (accepted and
    status ok) as a bool."""
    path = os.path.join(out, "runs.csv")
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            header = reader.fieldnames or []
            missing = [c for c in REQUIRED_COLUMNS if c not in header]
            if missing:
                raise InputError(f"{path}: missing column(s) {', '.join(missing)}")
            rows = []
            for i, r in enumerate(reader, start=2):
                if None in r or any(v is None for v in r.values()):
                    raise InputError(f"{path}:{i}: wrong number of fields")
                try:
                    r["level_pct"] = int(r["level_pct"])
                    r["rep"] = int(r["rep"])
                    r["attempt"] = int(r["attempt"])
                except ValueError:
                    raise InputError(f"{path}:{i}: level_pct, rep and attempt must be integers") from None
                if r["accepted"] not in ("true", "false"):
                    raise InputError(f"{path}:{i}: accepted must be 'true' or 'false', not {r['accepted']!r}")
                if not r["mode"]:
                    raise InputError(f"{path}:{i}: empty mode")
                r["ok"] = r["accepted"] == "true" and r["status"] == "ok"
                rows.append(r)
    except FileNotFoundError:
        raise InputError(f"{path}: missing") from None
    except (csv.Error, UnicodeDecodeError) as e:
        raise InputError(f"{path}: {e}") from None
    if not rows:
        raise InputError(f"{path}: no runs")
    return rows


def read_csv(path):
    """Rows of an optional CSV file as dicts; [] if absent or unreadable."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
    except (OSError, csv.Error, UnicodeDecodeError):
        return []


def load_percentiles(out):
    """{(level, mode, rep): [(latency_us, count_le), ...]} from percentiles.csv."""
    dist = {}
    for r in read_csv(os.path.join(out, "percentiles.csv")):
        try:
            key = (int(r["level_pct"]), r["mode"], int(r.get("rep") or 1))
            lat, cnt = float(r["latency_us"]), float(r["count_le"])
        except (KeyError, TypeError, ValueError):
            continue
        dist.setdefault(key, []).append((lat, cnt))
    return dist


class Data:
    """Everything read from OUT, with the modes and levels to show."""

    def __init__(self, out):
        self.out = out
        self.meta = load_meta(out)
        self.runs = load_runs(out)
        self.accepted = [r for r in self.runs if r["ok"]]
        seen = [m["name"] for m in self.meta.get("modes", [])]
        for r in self.runs:
            if r["mode"] not in seen:
                seen.append(r["mode"])
        self.modes = seen
        self.mode_info = {m["name"]: m for m in self.meta.get("modes", [])}
        levels = {int(x) for x in self.meta.get("levels", [])} | {r["level_pct"] for r in self.runs}
        self.levels = sorted(levels)
        self.p999_min = int(fnum(self.meta.get("p999_min_requests")) or 0)
        self.colours = {}
        spare = iter(SPARE_COLOURS)
        for m in self.modes:
            self.colours[m] = KNOWN_COLOURS.get(m) or next(spare, "black")

    def kind(self, mode):
        return self.mode_info.get(mode, {}).get("kind", "")

    def label(self, mode):
        return self.mode_info.get(mode, {}).get("label") or mode

    def cell_runs(self, level, mode):
        return [r for r in self.accepted if r["level_pct"] == level and r["mode"] == mode]


# ---------------------------------------------------------------- statistics


class Stat:
    """Median, min and max of a cell's values over its accepted runs."""

    def __init__(self, values):
        self.values = sorted(values)
        self.n = len(values)
        self.median = statistics.median(values) if values else None
        self.min = self.values[0] if values else None
        self.max = self.values[-1] if values else None


def be_references(data):
    """{level: {column: median kernel-alone work}} for the jobs whose kernel-alone work
    at that level is a usable reference: positive, and at least REF_FLOOR of the
    largest median any mode reached for that job there (a job the kernel alone starved
    to almost nothing would make every other mode's ratio explode; it is left out of
    the level's BE progress, and the report says so)."""
    refs = {}
    for level in data.levels:
        kruns = data.cell_runs(level, "kernel")
        ref = {}
        for col, _ in BE_JOBS:
            vals = [fnum(r.get(col)) for r in kruns]
            vals = [v for v in vals if v is not None]
            if not vals or statistics.median(vals) <= 0:
                continue
            best = 0.0
            for mode in data.modes:
                mv = [fnum(r.get(col)) for r in data.cell_runs(level, mode)]
                mv = [v for v in mv if v is not None]
                if mv:
                    best = max(best, statistics.median(mv))
            if statistics.median(vals) >= REF_FLOOR * best:
                ref[col] = statistics.median(vals)
        refs[level] = ref
    return refs


# A kernel-alone median below this share of the best mode's is no reference.
REF_FLOOR = 0.01


def be_progress(run, ref):
    """The run's BE progress in % of kernel alone, or None without references."""
    if not ref:
        return None
    return 100.0 * statistics.mean((fnum(run.get(col)) or 0.0) / base for col, base in ref.items())


def kills(run, col):
    return int(fnum(run.get(col)) or 0)


# Summary metrics: (key, row title, value of a run or None, better: "low"|"high"|None,
# number format).
def _pct(col):
    return lambda r, ctx: None if fnum(r.get(col)) is None else 100.0 * fnum(r.get(col))


METRICS = (
    ("p50_us", "p50 (µs)", lambda r, ctx: fnum(r.get("p50_us")), "low", "{:.0f}"),
    ("p99_us", "p99 (µs)", lambda r, ctx: fnum(r.get("p99_us")), "low", "{:.0f}"),
    ("p999_us", "p99.9 (µs)", lambda r, ctx: fnum(r.get("p999_us")), "low", "{:.0f}"),
    ("slo_violation_pct", "SLO violations (%)", _pct("slo_violation_ratio"), "low", "{:.1f}"),
    ("be_progress_pct", "BE progress (% of kernel alone)",
     lambda r, ctx: be_progress(r, ctx["refs"].get(r["level_pct"])), "high", "{:.0f}"),
    ("node_util_pct", "node utilisation (%)", _pct("node_util"), "high", "{:.1f}"),
    ("oom_lc_kills", "OOM + LC kills",
     lambda r, ctx: float(kills(r, "oom_kills") + kills(r, "lc_kills")), "low", "{:.0f}"),
    ("be_kills", "BE kills",
     lambda r, ctx: None if fnum(r.get("be_kills")) is None else fnum(r.get("be_kills")), None, "{:.0f}"),
)


def compute(data):
    """{(metric, level, mode): Stat} over accepted runs, plus p99.9 gating:
    {(level, mode): min requests} where some run lacks p999_min_requests."""
    ctx = {"refs": be_references(data)}
    stats, gated = {}, {}
    for key, _, fn, _, _ in METRICS:
        for level in data.levels:
            for mode in data.modes:
                runs = data.cell_runs(level, mode)
                vals = [v for v in (fn(r, ctx) for r in runs) if v is not None]
                stats[(key, level, mode)] = Stat(vals)
                if key == "p999_us" and runs:
                    reqs = [int(fnum(r.get("requests")) or 0) for r in runs]
                    if min(reqs) < data.p999_min:
                        gated[(level, mode)] = min(reqs)
    return stats, gated, ctx["refs"]


def fmt_num(fmt, v):
    return fmt.format(v)


def fmt_cell(stat, fmt, repeats):
    if stat.n == 0:
        return "–"
    med = fmt_num(fmt, stat.median)
    if stat.n == 1:
        text = med
    else:
        text = f"{med} [{fmt_num(fmt, stat.min)}–{fmt_num(fmt, stat.max)}]"
    if repeats and stat.n < repeats:
        text += f" (n={stat.n})"
    return text


def best_modes(stats, metric, level, modes, better, gated, fmt):
    """Modes whose median is the best of the row (ties all best, as shown)."""
    if better is None:
        return set()
    cand = {}
    for m in modes:
        s = stats[(metric, level, m)]
        if s.n and not (metric == "p999_us" and (level, m) in gated):
            cand[m] = fmt_num(fmt, s.median)
    if len(cand) < 2:
        return set()
    pick = min if better == "low" else max
    best = pick(float(v) for v in cand.values())
    winners = {m for m, v in cand.items() if float(v) == best}
    return set() if len(winners) == len(cand) else winners


# ---------------------------------------------------------------- targets


def med(stats, metric, level, mode):
    s = stats.get((metric, level, mode))
    return s.median if s and s.n else None


def ratio_text(a, b):
    return f"{a / b:.2f}×" if b else "∞"


class Target:
    """One target of issue 22 ("Done when"): `verdict` is "pass", "fail" or "not
    run"; `figures` are the numbers compared, `missed` one sentence per miss,
    `absent` what was not run, `offenders` the attempts that broke it."""

    def __init__(self, name):
        self.name = name
        self.figures, self.missed, self.absent, self.offenders = [], [], [], []

    @property
    def verdict(self):
        if self.missed:
            return "fail"
        return "not run" if self.absent or not self.figures else "pass"


def targets(data, stats):
    """The five targets of issue 22 evaluated on the medians of the accepted runs."""
    res = []
    has_full = "full" in data.modes

    t = Target("(a) `full` p99 at 100 % and 125 % ≤ 2× its 0 % p99")
    base = med(stats, "p99_us", 0, "full") if has_full else None
    if base is None:
        t.absent.append("`full` at 0 %" if has_full else "`full`")
    else:
        t.figures.append(f"0 % {base:.0f} µs")
        for level in (100, 125):
            v = med(stats, "p99_us", level, "full")
            if v is None:
                t.absent.append(f"`full` at {level} %")
                continue
            t.figures.append(f"{level} % {v:.0f} µs ({ratio_text(v, base)})")
            if v > 2 * base:
                t.missed.append(
                    f"at {level} % by {v - 2 * base:.0f} µs ({v:.0f} µs vs 2 × {base:.0f} = {2 * base:.0f} µs)"
                )
    res.append(t)

    peers = [m for m in data.modes if data.kind(m) in PEER_KINDS and m != "full"]
    t = Target("(b) `full` p99 at 100 % and 125 % below every peer's")
    if not has_full:
        t.absent.append("`full`")
    elif not peers:
        t.absent.append("every peer and baseline")
    else:
        for level in (100, 125):
            v = med(stats, "p99_us", level, "full")
            if v is None:
                t.absent.append(f"`full` at {level} %")
                continue
            others = []
            for p in peers:
                pv = med(stats, "p99_us", level, p)
                if pv is None:
                    t.absent.append(f"{p} at {level} %")
                    continue
                others.append(f"{p} {pv:.0f}")
                if v >= pv:
                    t.missed.append(f"at {level} % by {v - pv:.0f} µs (full {v:.0f} µs vs {p} {pv:.0f} µs)")
            if others:
                t.figures.append(f"{level} % full {v:.0f} µs vs " + ", ".join(others) + " µs")
    res.append(t)

    t = Target("(c) `full` BE progress ≥ 90 % of kernel alone at every level > 0")
    if not has_full:
        t.absent.append("`full`")
    elif "kernel" not in data.modes:
        t.absent.append("kernel alone (the reference)")
    else:
        for level in [x for x in data.levels if x > 0]:
            v = med(stats, "be_progress_pct", level, "full")
            if v is None:
                t.absent.append(f"{level} % (no figure: full or kernel alone not run, or no BE work)")
                continue
            t.figures.append(f"{level} % {v:.0f} %")
            if v < 90:
                t.missed.append(f"at {level} % by {90 - v:.0f} points ({v:.0f} % vs 90 %)")
    res.append(t)

    t = Target("(d) `full` node utilisation ≥ koordinator's at every level")
    if not has_full:
        t.absent.append("`full`")
    elif "koordinator" not in data.modes:
        t.absent.append("koordinator")
    else:
        for level in data.levels:
            v = med(stats, "node_util_pct", level, "full")
            k = med(stats, "node_util_pct", level, "koordinator")
            if v is None or k is None:
                t.absent.append(f"{'full' if v is None else 'koordinator'} at {level} %")
                continue
            t.figures.append(f"{level} % {v:.1f} vs {k:.1f} %")
            if v < k:
                t.missed.append(f"at {level} % by {k - v:.1f} points (full {v:.1f} % vs koordinator {k:.1f} %)")
    res.append(t)

    t = Target("(e) zero OOM kills and zero LC kills in every run of every mode")
    for r in data.runs:
        o, lc = kills(r, "oom_kills"), kills(r, "lc_kills")
        if o or lc:
            state = "accepted" if r["ok"] else "rejected"
            t.offenders.append(
                f"{r['level_pct']} % {r['mode']} rep {r['rep']} attempt {r['attempt']} ({state}): {o} OOM, {lc} LC"
            )
    t.figures.append(f"{len(data.runs)} attempts, {len(t.offenders)} with a kill")
    if t.offenders:
        t.missed.append(f"in {len(t.offenders)} of {len(data.runs)} attempts")
    res.append(t)
    return res


# ---------------------------------------------------------------- report.md


def md_escape(s):
    return str(s).replace("|", "\\|").replace("\n", " ")


def gib(b):
    b = fnum(b)
    return f"{b / 2**30:.1f} GiB" if b is not None else "?"


def duration(s):
    s = fnum(s)
    if s is None:
        return "?"
    s = int(round(s))
    return f"{s // 3600} h {s % 3600 // 60:02d} min" if s >= 3600 else f"{s // 60} min {s % 60:02d} s"


def table(header, rows, align=None):
    align = align or ["---"] * len(header)
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    out += ["| " + " | ".join(md_escape(c) for c in row) + " |" for row in rows]
    return out


def write_report(data, stats, gated, refs, verdicts, plots, plot_note):
    meta = data.meta
    L = []
    lc = meta.get("lc_service") or next((r.get("lc_service") for r in data.runs if r.get("lc_service")), "LC service")
    L.append(f"# Colocation: {lc} (LC) beside batch jobs (BE)")
    L.append("")
    L.append(
        f"{meta.get('date', '?')}, commit `{meta.get('commit') or 'unknown'}`, host `{meta.get('host', '?')}`, "
        f"Linux {meta.get('kernel', '?')}, {meta.get('cpus_online', '?')} CPUs online, "
        f"{gib(meta.get('mem_total_bytes'))} RAM, total time {duration(meta.get('elapsed_s'))}."
    )
    L.append("")
    if meta.get("command"):
        L.append(f"Command: `{meta['command']}`")
        L.append("")

    # What ran.
    L.append("## What ran")
    L.append("")
    rows = []
    for m in data.modes:
        info = data.mode_info.get(m, {})
        kind = info.get("kind", "")
        label = info.get("label") or m
        if kind == "peer":
            label = f"{label} (re-implementation of {info.get('source') or 'a published algorithm'})"
        rows.append([f"`{m}`", label, kind or "?", info.get("settings", ""), info.get("source", "") or "–"])
    L += table(["mode", "what", "kind", "settings", "source"], rows)
    L.append("")
    params = meta.get("parameters", [])
    if params:
        L += table(["parameter", "value"], [[str(a), str(b)] for a, b in params])
        L.append("")
    slo = meta.get("slo_us")
    if slo is None:
        L.append("SLO: none (no SLO violations computed).")
    else:
        L.append(f"SLO: **{slo} µs** ({meta.get('slo_source') or 'source not given'}).")
    repeats = int(fnum(meta.get("repeats")) or 0)
    rej = [r for r in data.runs if r["accepted"] == "false"]
    failed = [r for r in data.runs if r["accepted"] == "true" and r["status"] != "ok"]
    reasons = {}
    for r in rej:
        reason = r.get("reject_reason") or "no reason given"
        reasons[reason] = reasons.get(reason, 0) + 1
    reject = meta.get("reject") or {}
    rule = ""
    if reject:
        rule = (
            f" (rule: LC CPUs foreign load > {reject.get('foreign_pct_max', '?')} % or steal > "
            f"{reject.get('steal_pct_max', '?')} %, at most {reject.get('max_attempts', '?')} attempts per run)"
        )
    L.append("")
    L.append(
        f"Repeats: {repeats or '?'} per (level, mode); {len(data.runs)} attempts, {len(data.accepted)} accepted, "
        f"{len(rej)} rejected and repeated{rule}."
    )
    if reasons:
        L.append("")
        by_count = sorted(reasons.items(), key=lambda kv: -kv[1])
        L.append("Rejections: " + "; ".join(f"{n} × {md_escape(k)}" for k, n in by_count) + ".")
    if failed:
        L.append("")
        L.append(f"{len(failed)} accepted attempt(s) failed and are left out of the summary (see the detail table).")
    attempted = {(r["level_pct"], r["mode"]) for r in data.runs}
    short = [
        (lv, m, len(data.cell_runs(lv, m)))
        for lv, m in sorted(attempted, key=lambda k: (k[0], mode_order(data, k[1])))
        if repeats and len(data.cell_runs(lv, m)) < repeats
    ]
    if short:
        L.append("")
        L.append(
            "Cells with fewer accepted repeats than asked: "
            + ", ".join(f"{lv} % {m} ({n})" for lv, m, n in short)
            + "."
        )
    la = meta.get("lc_alloc")
    if la:
        if not la.get("checked"):
            L.append("")
            L.append("LC allocations through libmemcolo: not checked.")
        else:
            mapped = "mapped" if la.get("libmemcolo_mapped") else "**not mapped**"
            L.append("")
            L.append(
                f"LC service under `full`: libmemcolo {mapped} in its address space; allocations through "
                f"libmemcolo: {la.get('allocations_through_libmemcolo') or '?'}."
            )
    L.append("")

    # Summary.
    L.append("## Summary")
    L.append("")
    L.append(
        "Median [min–max] over the accepted repeats (n shown when fewer than asked); best per row in **bold** "
        "(lowest latency, violations and kills; highest BE progress and utilisation; no mark where all are equal)."
    )
    L.append("")
    rows = []
    for key, title, _, better, fmt in METRICS:
        for level in data.levels:
            best = best_modes(stats, key, level, data.modes, better, gated, fmt)
            row = [title, f"{level} %"]
            for m in data.modes:
                s = stats[(key, level, m)]
                if key == "p999_us" and (level, m) in gated:
                    cell = f"n/a ({gated[(level, m)]} req)"
                elif key == "be_progress_pct" and s.n == 0 and data.cell_runs(level, m):
                    cell = "n/a"
                else:
                    cell = fmt_cell(s, fmt, repeats)
                if m in best:
                    cell = f"**{cell}**"
                row.append(cell)
            rows.append(row)
    L += table(["metric", "level"] + [f"`{m}`" for m in data.modes], rows, ["---", "---:"] + ["---:"] * len(data.modes))
    L.append("")
    notes = [f"p99.9 needs at least {data.p999_min} requests in every run of a cell."]
    if refs:
        jobs = sorted({c for ref in refs.values() for c in ref})
        names = [n for c, n in BE_JOBS if c in jobs]
        notes.append(
            "BE progress = mean over the BE jobs ("
            + (", ".join(names) or "none")
            + ") of a run's work / the median kernel-alone work at the same level;"
            " n/a where kernel alone had no BE work."
        )
    L.append(" ".join(notes))
    L.append("")

    # Targets.
    L.append("## Targets")
    L.append("")
    mark = {"pass": "✅", "fail": "❌", "not run": "➖"}
    for t in verdicts:
        line = f"- {mark[t.verdict]} {t.name}: " + ("; ".join(t.figures) or "no figures") + "."
        if t.missed:
            line += " **Missed** " + "; ".join(t.missed) + "."
        if t.absent:
            line += " Not run: " + ", ".join(t.absent) + "."
        L.append(line)
        for o in t.offenders[:MAX_OFFENDERS]:
            L.append(f"  - {o}")
        if len(t.offenders) > MAX_OFFENDERS:
            L.append(f"  - … and {len(t.offenders) - MAX_OFFENDERS} more (see the table of every attempt)")
    if meta.get("notes"):
        L.append("")
        L.append("Notes from the runner:")
        L.append("")
        for n in meta["notes"]:
            L.append(f"- {n}")
    L.append("")

    # Plots.
    L.append("## Plots")
    L.append("")
    if plot_note:
        L.append(plot_note)
        L.append("")
    for p in plots:
        L.append(f"![{p}]({p})")
        L.append("")

    # Detail.
    L.append("## Every attempt")
    L.append("")
    L.append("<details><summary>Every run attempt with its verdict and noise gauges</summary>")
    L.append("")
    cols = [
        ("level_pct", "level", None), ("mode", "mode", None), ("rep", "rep", None), ("attempt", "attempt", None),
        ("accepted", "accepted", None), ("reject_reason", "reason", None), ("status", "status", None),
        ("requests", "requests", "{:.0f}"), ("p99_us", "p99 µs", "{:.0f}"),
        ("lc_cpus_foreign_pct", "LC CPUs foreign %", "{:.1f}"), ("lc_cpus_steal_ms", "LC CPUs steal ms", "{:.0f}"),
        ("steal_pct", "steal %", "{:.1f}"), ("cpu_busy_pct", "CPU busy %", "{:.0f}"),
        ("loadavg_1m", "load 1m", "{:.2f}"),
        ("oom_kills", "OOM kills", "{:.0f}"), ("lc_kills", "LC kills", "{:.0f}"), ("be_kills", "BE kills", "{:.0f}"),
    ]
    rows = []
    for r in sorted(data.runs, key=lambda r: (r["level_pct"], mode_order(data, r["mode"]), r["rep"], r["attempt"])):
        row = []
        for c, _, fmt in cols:
            v = r.get(c)
            x = fnum(v) if fmt else None
            row.append(fmt.format(x) if x is not None else ("" if v is None else str(v)))
        rows.append(row)
    L += table([h for _, h, _ in cols], rows)
    L.append("")
    L.append("</details>")
    L.append("")
    L.append(
        "Raw data beside this file: `meta.json`, `runs.csv`, `percentiles.csv`, `timeline-*.csv`, `latency-*.csv`; "
        "machine-readable summary: `summary.csv`."
    )
    L.append("")
    with open(os.path.join(data.out, "report.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(L))
    return "report.md"


def mode_order(data, mode):
    return data.modes.index(mode) if mode in data.modes else len(data.modes)


def write_summary_csv(data, stats, gated):
    """summary.csv: one row per (level, mode, metric) with accepted runs; p99.9 only
    where the report shows it (enough requests)."""
    with open(os.path.join(data.out, "summary.csv"), "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["level", "mode", "metric", "median", "min", "max", "n"])
        for level in data.levels:
            for m in data.modes:
                for key, *_ in METRICS:
                    s = stats[(key, level, m)]
                    if s.n and not (key == "p999_us" and (level, m) in gated):
                        w.writerow([level, m, key, repr(s.median), repr(s.min), repr(s.max), s.n])
    return "summary.csv"


# ---------------------------------------------------------------- plots


def load_pyplot():
    """matplotlib.pyplot with the Agg backend, or raises ImportError."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def merged_tail(points_by_run):
    """Merges HDR iterations [(latency_us, count_le)] of runs into one distribution;
    returns ([latency_us], [fraction of requests slower])."""
    counts = {}
    for pts in points_by_run:
        prev = 0.0
        for lat, cnt in sorted(pts):
            if cnt > prev:
                counts[lat] = counts.get(lat, 0.0) + cnt - prev
                prev = cnt
    total = sum(counts.values())
    xs, ys, cum = [], [], 0.0
    for lat, c in sorted(counts.items()):
        cum += c
        tail = 1.0 - cum / total
        if tail <= 0:
            break
        xs.append(lat)
        ys.append(tail)
    return xs, ys


def plot_cdf(plt, data, dist):
    levels = [lv for lv in data.levels if any(k[0] == lv for k in dist)]
    if not levels:
        return None
    n = len(levels)
    cols = min(3, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.8 * rows), squeeze=False)
    accepted = {(r["level_pct"], r["mode"], r["rep"]) for r in data.accepted}
    for ax, level in zip(axes.flat, levels):
        for m in data.modes:
            runs = [pts for k, pts in dist.items() if k[0] == level and k[1] == m and k in accepted]
            if not runs:
                continue
            xs, ys = merged_tail(runs)
            if xs:
                ax.plot(xs, ys, color=data.colours[m], label=f"{m} ({len(runs)} runs)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"{level} % pressure")
        ax.set_xlabel("latency from intended send time (µs)")
        ax.set_ylabel("fraction slower (1 − CDF)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    fig.suptitle("LC latency tail per pressure level, accepted runs merged")
    fig.tight_layout()
    fig.savefig(os.path.join(data.out, "cdf.png"), dpi=100)
    plt.close(fig)
    return "cdf.png"


def plot_vs_level(plt, data, stats, metric, ylabel, title, name, log=False, hline=None):
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    drawn = False
    for m in data.modes:
        pts = [(lv, stats[(metric, lv, m)]) for lv in data.levels if stats[(metric, lv, m)].n]
        if not pts:
            continue
        xs = [p[0] for p in pts]
        ys = [p[1].median for p in pts]
        err = [[p[1].median - p[1].min for p in pts], [p[1].max - p[1].median for p in pts]]
        ax.errorbar(xs, ys, yerr=err, color=data.colours[m], marker="o", capsize=3, label=m)
        drawn = True
    if not drawn:
        plt.close(fig)
        return None
    if hline:
        ax.axhline(hline[0], color="gray", linestyle="--", label=hline[1])
    if log:
        ax.set_yscale("log")
    ax.set_xlabel("memory pressure (BE demand, % of node memory)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.set_xticks(data.levels)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(data.out, name), dpi=100)
    plt.close(fig)
    return name


ZONE_COLOURS = {"green": "#d8f0d8", "yellow": "#fff3c0", "red": "#f8d0d0"}


def zone_spans(ts, zones):
    """[(start, end, zone)] of consecutive equal non-empty zones."""
    spans = []
    for i, (t, z) in enumerate(zip(ts, zones)):
        end = ts[i + 1] if i + 1 < len(ts) else t + 0.25
        if z and spans and spans[-1][2] == z and spans[-1][1] == t:
            spans[-1] = (spans[-1][0], end, z)
        elif z:
            spans.append((t, end, z))
    return spans


def col_series(rows, col, scale=1.0):
    ts, ys = [], []
    for r in rows:
        t, v = fnum(r.get("t_s")), fnum(r.get(col))
        if t is not None and v is not None:
            ts.append(t)
            ys.append(v * scale)
    return ts, ys


def plot_timeline(plt, data, level=100):
    if level not in data.levels:
        return None
    present = [m for m in TIMELINE_MODES if m in data.modes]
    modes = present if len(present) >= 2 else data.modes[:4]
    cols = []
    for m in modes:
        if not SAFE_NAME.fullmatch(m):
            continue  # never a path component
        reps = sorted(r["rep"] for r in data.cell_runs(level, m))
        for rep in reps:
            tl = read_csv(os.path.join(data.out, f"timeline-{level}-{m}-{rep}.csv"))
            lat = read_csv(os.path.join(data.out, f"latency-{level}-{m}-{rep}.csv"))
            if tl or lat:
                cols.append((m, rep, tl, lat))
                break
    if not cols:
        return None
    gi = 1.0 / 2**30
    fig, axes = plt.subplots(3, len(cols), figsize=(4.6 * len(cols), 9), squeeze=False, sharex="col")
    node_gib = None
    for r in data.runs:
        nb = fnum(r.get("node_bytes"))
        if nb:
            node_gib = nb * gi
            break
    for j, (m, rep, tl, lat) in enumerate(cols):
        ax = axes[0][j]
        ts = [fnum(r.get("t_s")) for r in tl]
        zones = [(r.get("zone") or "").strip() for r in tl]
        if all(t is not None for t in ts):
            for a, b, z in zone_spans(ts, zones):
                ax.axvspan(a, b, color=ZONE_COLOURS.get(z, "#eeeeee"), lw=0)
        for col, lab, style in (
            ("usage_bytes", "node usage", "-"),
            ("m3_low_bytes", "M3 low", ":"),
            ("m3_high_bytes", "M3 high", "--"),
            ("m3_top_bytes", "M3 top", "-."),
            ("be_limit_bytes", "senpai BE limit", "-"),
            ("swap_bytes", "swap", "-"),
        ):
            x, y = col_series(tl, col, gi)
            if x:
                colour = {"usage_bytes": data.colours[m], "be_limit_bytes": "darkgoldenrod", "swap_bytes": "gray"}
                colour = colour.get(col, "black")
                ax.plot(x, y, style, color=colour, lw=1.2, label=lab)
        if node_gib:
            ax.axhline(node_gib, color="black", lw=0.8, alpha=0.5, label="node limit")
        ax.set_title(f"{m} ({level} %, rep {rep})")
        ax.set_ylabel("GiB")
        ax.legend(fontsize=6, loc="lower right")
        ax.grid(True, alpha=0.3)
        ax = axes[1][j]
        for col, lab, style in (
            ("workers_desired", "reclaim workers desired", "--"),
            ("workers_active", "reclaim workers active", "-"),
        ):
            x, y = col_series(tl, col)
            if x:
                ax.step(x, y, style, where="post", label=lab, color=data.colours[m])
        ax.set_ylabel("reclaim workers")
        ax.grid(True, alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=6)
        else:
            ax.text(0.5, 0.5, "no reclaim workers", ha="center", va="center", transform=ax.transAxes, color="gray")
        ax = axes[2][j]
        xs, ys = [], []
        for r in lat:
            s, v = fnum(r.get("second")), fnum(r.get("p99_us"))
            if s is not None and v is not None and v > 0:
                xs.append(s)
                ys.append(v)
        if xs:
            ax.plot(xs, ys, marker=".", color=data.colours[m], label="p99 per second")
            ax.set_yscale("log")
            slo = fnum(data.meta.get("slo_us"))
            if slo:
                ax.axhline(slo, color="gray", linestyle="--", label=f"SLO {slo:.0f} µs")
            ax.legend(fontsize=6)
        ax.set_ylabel("p99 (µs)")
        ax.set_xlabel("time in measured phase (s)")
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(f"{level} % pressure: node memory, M3 thresholds and zone (shading), reclaim workers, LC p99")
    fig.tight_layout()
    fig.savefig(os.path.join(data.out, f"timeline_{level}.png"), dpi=100)
    plt.close(fig)
    return f"timeline_{level}.png"


def draw_plots(data, stats):
    """Draws every plot; returns ([file names], note for report.md or "")."""
    try:
        plt = load_pyplot()
    except ImportError as e:
        why = f"matplotlib cannot be imported by {sys.executable} ({e})"
        return [], f"Plots not drawn: {why}; install python3-matplotlib."
    dist = load_percentiles(data.out)
    slo = fnum(data.meta.get("slo_us"))
    jobs = [
        ("cdf.png", lambda: plot_cdf(plt, data, dist)),
        ("p99_vs_level.png", lambda: plot_vs_level(
            plt, data, stats, "p99_us", "p99 latency (µs), median and min–max", "LC p99 latency vs memory pressure",
            "p99_vs_level.png", log=True, hline=(slo, f"SLO {slo:.0f} µs") if slo else None)),
        ("be_progress.png", lambda: plot_vs_level(
            plt, data, stats, "be_progress_pct", "BE progress (% of kernel alone)", "BE progress vs memory pressure",
            "be_progress.png", hline=(90, "90 % target"))),
        ("utilisation.png", lambda: plot_vs_level(
            plt, data, stats, "node_util_pct", "node memory utilisation (%)", "Node utilisation vs memory pressure",
            "utilisation.png")),
        ("timeline_100.png", lambda: plot_timeline(plt, data, 100)),
    ]
    made, notes = [], []
    for name, draw in jobs:
        try:
            if draw():
                made.append(name)
            elif name == "timeline_100.png":
                notes.append("No timeline plot: no 100 % level with timeline data.")
        except Exception as e:  # a plot that fails leaves the report whole
            plt.close("all")
            notes.append(f"{name} not drawn: {type(e).__name__}: {e}.")
    return made, " ".join(notes)


# ---------------------------------------------------------------- main


def main(argv):
    if len(argv) != 2:
        print("usage: report.py OUT", file=sys.stderr)
        return 2
    out = argv[1]
    try:
        if not os.path.isdir(out):
            raise InputError(f"{out}: not a directory")
        data = Data(out)
        stats, gated, refs = compute(data)
        verdicts = targets(data, stats)
        plots, note = draw_plots(data, stats)
        written = [write_report(data, stats, gated, refs, verdicts, plots, note), write_summary_csv(data, stats, gated)]
    except InputError as e:
        print(f"report.py: {e}", file=sys.stderr)
        return 2
    for name in written + plots:
        print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
