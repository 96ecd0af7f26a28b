#!/usr/bin/env python3
"""run_patterns.py — the allocation patterns of libmemcolo issue 27 that tput.c and
hermes_bench.c do not cover, run against the four peers and libmemcolo, interleaved.

Patterns (each its own program in this directory, built into alloc/build/bench/):
  largebuf   largebuf.c: 20 slots, 2000 iterations, each replacing a random slot with a
             new calloc'ed buffer of 5..25 MiB ("largebuf-memset": malloc + memset).
  mstress, loop, xthread
             bursty.c: the bursty small-object patterns on which the LC reservation's
             footprint is judged (multi-threaded bursts, a single-threaded malloc/free
             loop, cross-thread producer/consumer); their own sizes (--iters is not
             passed). Besides peak RSS, the peak of RSS outside libmemcolo's declared
             reservation (reserved_bytes), sampled every ms, and the largest reservation.

Each repetition runs every allocator once, in an order rotated from one repetition to
the next, holding the shared benchmark lock (/tmp/memcolo-bench.lock) for that one
repetition only. Raw rows go to DIR/patterns.csv (default bench/out/alloc/patterns-<UTC
stamp>/, ignored by git); the summary (median [min-max] of wall time, CPU time = user +
system, and peak RSS, and the ratio of medians to the best peer) to DIR/summary.md and
stdout.

The libmemcolo entries by default: `memcolo` (no class) and `memcolo-lc` (MEMCOLO_CLASS=lc,
MEMCOLO_AGENT=0: the Hermes reservation, standalone).

With --section NAME the summary (report.md), with DIR/notes.md when present, becomes
section NAME of bench/alloc/RESULTS.md (benchlib.publish; only for runs under bench/out/).

usage: run_patterns.py [--reps 5] [--patterns largebuf,mstress,loop,xthread] [--iters 2000]
                       [--lib NAME=PATH[:ENV=VAL,...]] ... [--skip NAME,...] [--out DIR]
                       [--section NAME]
(--skip jemalloc: jemalloc takes 10-20x the others' time on largebuf, 90 s a run on a
loaded machine)
"""
import argparse
import datetime
import fcntl
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import benchlib  # noqa: E402
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
BIN = os.path.join(ROOT, "alloc", "build", "bench")
LIB = os.path.join(ROOT, "alloc", "build", "libmemcolo.so")
SYS = "/usr/lib/x86_64-linux-gnu"
PEERS = [
    ("glibc", None, {}),
    ("jemalloc", f"{SYS}/libjemalloc.so.2", {}),
    ("tcmalloc", f"{SYS}/libtcmalloc_minimal.so.4", {}),
    ("mimalloc", f"{SYS}/libmimalloc.so.2", {}),
]
LOCK = "/tmp/memcolo-bench.lock"
PATTERNS = {
    "largebuf": ("largebuf", []),
    "largebuf-memset": ("largebuf", ["memset"]),
    "mstress": ("bursty", ["mstress"]),
    "loop": ("bursty", ["loop"]),
    "xthread": ("bursty", ["xthread"]),
}
BURSTY = {"mstress", "loop", "xthread"}


def build():
    os.makedirs(BIN, exist_ok=True)
    for prog in sorted({p for p, _ in PATTERNS.values()}):
        subprocess.run(["gcc", "-O2", "-Wall", "-pthread", "-o", os.path.join(BIN, prog),
                        os.path.join(HERE, prog + ".c"), "-ldl"], check=True)


def env_for(lib, extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMCOLO_") and k != "LD_PRELOAD"}
    if lib:
        env["LD_PRELOAD"] = lib
    env.update(extra)
    return env


def run_one(pattern, iters, lib, extra):
    """(wall_s, cpu_s, peak_rss_kib, outside_kib, max_reserved_kib) from the program's CSV
    line (the last two are the peak RSS and 0 for largebuf), or None on failure"""
    prog, args = PATTERNS[pattern]
    argv = [os.path.join(BIN, prog)] + (args if pattern in BURSTY else [str(iters)] + args)
    r = subprocess.run(argv, env=env_for(lib, extra), capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(f"{pattern}: exit {r.returncode}: {r.stderr[-300:]}\n")
        return None
    f = r.stdout.strip().split("\n")[-1].split(",")
    if pattern in BURSTY:
        return float(f[2]), float(f[3]) + float(f[4]), int(f[5]), int(f[6]), int(f[8])
    return float(f[2]), float(f[3]) + float(f[4]), int(f[5]), int(f[5]), 0


def parse_lib(spec):
    name, rest = spec.split("=", 1)
    path, _, envs = rest.partition(":")
    extra = dict(kv.split("=", 1) for kv in envs.split(",") if kv)
    return name, os.path.abspath(path), extra


def fmt(xs, f="{:.2f}"):
    return f"{f.format(statistics.median(xs))} [{f.format(min(xs))}-{f.format(max(xs))}]"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--patterns", default="largebuf")
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--lib", action="append", default=[])
    ap.add_argument("--skip", default="", help="allocators left out")
    ap.add_argument("--out")
    ap.add_argument("--section", help="publish the summary as this section of RESULTS.md")
    a = ap.parse_args()
    build()
    allocs = PEERS + ([parse_lib(s) for s in a.lib] or
                      [("memcolo", LIB, {}), ("memcolo-lc", LIB, {"MEMCOLO_CLASS": "lc", "MEMCOLO_AGENT": "0"})])
    allocs = [x for x in allocs if x[0] not in a.skip.split(",")]
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = a.out or os.path.join(ROOT, "bench", "out", "alloc", f"patterns-{stamp}")
    os.makedirs(out, exist_ok=True)
    benchlib.record_machine(out, " ".join(["python3", "bench/alloc/run_patterns.py"] + sys.argv[1:]))
    rows = []
    pats = a.patterns.split(",")
    with open(os.path.join(out, "patterns.csv"), "w") as raw:
        raw.write("pattern,allocator,rep,wall_s,cpu_s,peak_rss_kib,outside_rsv_kib,max_reserved_kib\n")
        for rep in range(a.reps):
            for pat in pats:
                order = allocs[rep % len(allocs):] + allocs[:rep % len(allocs)]
                with open(LOCK, "w") as lk:
                    fcntl.flock(lk, fcntl.LOCK_EX)
                    for name, lib, extra in order:
                        res = run_one(pat, a.iters, lib, extra)
                        if res is None:
                            continue
                        rows.append((pat, name, rep) + res)
                        raw.write(f"{pat},{name},{rep},{res[0]:.3f},{res[1]:.3f},{res[2]},{res[3]},{res[4]}\n")
                        raw.flush()
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    load = open("/proc/loadavg").read().split()[0]
    lines = [f"# patterns: {a.reps} interleaved repetitions, {a.iters} iterations ({stamp}, commit {commit}, "
             f"{os.cpu_count()} CPUs, load {load} at the end)", "",
             "| pattern | allocator | wall s median [min-max] | CPU s median [min-max] | peak RSS MiB median [min-max] "
             "| outside the reservation MiB median [min-max] | / glibc's peak RSS | largest reservation MiB | wall / best peer |",
             "|---|---|---|---|---|---|---|---|---|"]
    peer_names = [p[0] for p in PEERS]
    for pat in pats:
        med = {}
        for name, _, _ in allocs:
            xs = [r for r in rows if r[0] == pat and r[1] == name]
            if xs:
                med[name] = statistics.median(r[3] for r in xs)
        best = min((med[n] for n in peer_names if n in med), default=None)
        g = [r[5] for r in rows if r[0] == pat and r[1] == "glibc"]
        glibc_rss = statistics.median(g) if g else None
        for name, _, _ in allocs:
            xs = [r for r in rows if r[0] == pat and r[1] == name]
            if not xs:
                continue
            ratio = f"{med[name] / best:.2f}" if best else "-"
            out_med = statistics.median(r[6] for r in xs)
            vs_glibc = f"{out_med / glibc_rss:.2f}" if glibc_rss else "-"
            lines.append(f"| {pat} | {name} | {fmt([r[3] for r in xs])} | {fmt([r[4] for r in xs])} | "
                         f"{fmt([r[5] / 1024 for r in xs], '{:.1f}')} | {fmt([r[6] / 1024 for r in xs], '{:.1f}')} | "
                         f"{vs_glibc} | {max(r[7] for r in xs) / 1024:.1f} | {ratio} |")
    text = "\n".join(lines) + "\n"
    open(os.path.join(out, "summary.md"), "w").write(text)
    open(os.path.join(out, "report.md"), "w").write(text)
    print(text)
    if a.section:
        benchlib.publish(HERE, a.section, out, command=" ".join(["python3", "bench/alloc/run_patterns.py"] + sys.argv[1:]))
    print(f"raw: {out}/patterns.csv")


if __name__ == "__main__":
    main()
