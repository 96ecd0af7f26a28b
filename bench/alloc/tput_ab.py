#!/usr/bin/env python3
"""tput_ab.py — repeated, interleaved runs of tput.c (throughput and peak RSS) for the
peers and one or more libmemcolo builds, with medians, spread and paired ratios.

Each repetition of a benchmark runs every allocator once, in an order rotated from one
repetition to the next (no allocator always runs first or right after another), and
holds the shared benchmark lock (/tmp/memcolo-bench.lock, flock(2)) only for that one
repetition, so that a run of many repetitions lets others in between. Per run it
records wall time (ms, as tput.c prints it), CPU time of the process (user + system,
ms, from wait4) and peak RSS (VmHWM, KiB).

The summary gives per benchmark and allocator the median, min and max of wall time,
the median CPU time and peak RSS, and for each libmemcolo build the *paired* ratio to
the best peer: in every repetition, its wall time over the fastest peer's wall time in
the same repetition (median and quartiles of these ratios), the same for CPU time (less
disturbed than wall time by other work on the machine: a preempted thread's wait is
not counted), and peak RSS over glibc's (median, quartiles, min and max: glibc's own
peak moves by about +-170 KiB from run to run with where libc loads, so one pair says
little).
A gap is taken as real when the lower quartile of the paired ratios is above 1.10 (or
the upper one below 1.0 for a lead). The spread of a figure is the larger distance of
its min and max from its median, in % of the median ("within +-15 %").

--scale N multiplies each run's work (tput.c's SCALE: at 1 a run is ~0.1 s of CPU time,
which a busy machine's scheduling disturbs as much as it measures; 20 gives seconds).
--pin runs thread i on CPU i (TPUT_PIN=1). --callgrind adds, per benchmark and
allocator, one run at scale 1 under valgrind's callgrind (threads serialized; the count of
instructions does not depend on the machine's load): the instructions executed inside
malloc and free, with what they call, per malloc/free pair of the benchmark (larson:
THREADS x 400,000 x 10 pairs; prodcons: THREADS x 2,000,000; small: THREADS x
4,000,000), a machine-independent figure for the fast path (not for
its cycles: an atomic read-modify-write counts as one instruction, a cache miss as
none).

usage: tput_ab.py [--reps 9] [--modes prodcons,small,realloc,larson] [--threads 2]
                  [--scale N] [--pin] [--callgrind]
                  [--lib NAME=PATH[:ENV=VAL,...]] ... [--peers glibc,...|--no-peers] [--no-lock] [--out DIR]
                  [--section NAME]
run_bench.py's throughput part runs the same repetitions through run_interleaved().
With no --lib, the tree's alloc/build/libmemcolo.so runs as memcolo-norsv
(MEMCOLO_CLASS=be, as run_bench.py does). Writes DIR/tput_ab.csv (raw) and
DIR/summary.md (and DIR/report.md, the same); prints the summary. DIR defaults to
bench/out/alloc/tput_ab-<UTC stamp>/ (ignored by git). With --section NAME the summary,
with DIR/notes.md when present, becomes section NAME of bench/alloc/RESULTS.md
(benchlib.publish; only for runs under bench/out/).
"""
import argparse
import fcntl
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import benchlib  # noqa: E402
from benchlib import cpu_times  # noqa: E402
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
BIN = os.path.join(ROOT, "alloc", "build", "bench", "tput")
LIB = os.path.join(ROOT, "alloc", "build", "libmemcolo.so")
SYS = "/usr/lib/x86_64-linux-gnu"
PEERS = [
    ("glibc", None, {}),
    ("jemalloc", f"{SYS}/libjemalloc.so.2", {}),
    ("tcmalloc", f"{SYS}/libtcmalloc_minimal.so.4", {}),
    ("mimalloc", f"{SYS}/libmimalloc.so.2", {}),
]
LOCK = "/tmp/memcolo-bench.lock"


def env_for(lib, extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMCOLO_") and k != "LD_PRELOAD"}
    if lib:
        env["LD_PRELOAD"] = lib
    env.update(extra)
    return env


SCALE = 1
PIN = False
# malloc/free pairs of one tput run at scale 1, per thread (callgrind's per-pair figure)
PAIRS = {"larson": 400000 * 10, "prodcons": 2000000, "small": 4000000, "realloc": None}


def run_one(mode, threads, lib, extra):
    """one tput run: (wall_ms, cpu_ms, peak_rss_kib) or None on failure"""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.dup2(w, 1)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        try:
            env = env_for(lib, extra)
            if PIN:
                env["TPUT_PIN"] = "1"
            os.execve(BIN, [BIN, mode, str(threads), str(SCALE)], env)
        finally:
            os._exit(127)
    os.close(w)
    out = b""
    while True:
        chunk = os.read(r, 4096)
        if not chunk:
            break
        out += chunk
    os.close(r)
    _, status, ru = os.wait4(pid, 0)
    if status != 0:
        return None
    try:
        _, _, wall, rss = out.decode().strip().split(",")
    except ValueError:
        return None
    return float(wall), (ru.ru_utime + ru.ru_stime) * 1000.0, int(rss)


def callgrind_ir(mode, threads, lib, extra):
    """instructions executed inside malloc and free (with what they call) in one run
    under callgrind (collection toggled on at their entry), or None when valgrind is
    missing or the run failed"""
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", "--collect-atstart=no",
           "--toggle-collect=malloc", "--toggle-collect=free", BIN, mode, str(threads), "1"]
    try:
        r = subprocess.run(cmd, env=env_for(lib, extra), capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"Collected\s*:\s*(\d+)", r.stderr)
    return int(m.group(1)) if r.returncode == 0 and m else None


def parse_lib(spec):
    name, _, rest = spec.partition("=")
    path, _, envs = rest.partition(":")
    extra = {"MEMCOLO_CLASS": "be"}
    for kv in filter(None, envs.split(",")):
        k, _, v = kv.partition("=")
        extra[k] = v
    return name, os.path.abspath(path), extra


def quartiles(xs):
    xs = sorted(xs)
    if len(xs) < 2:
        return xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


def run_interleaved(modes, threads, allocs, reps, lock=True, log=None):
    """reps repetitions; in each, every benchmark of `modes` runs every allocator of
    `allocs` ((name, lib path or None, extra env)) once, in an order rotated from one
    repetition and benchmark to the next. lock: hold /tmp/memcolo-bench.lock for each
    repetition of a benchmark (False when the caller holds it already: flock(2) locks of
    two open files exclude each other even in one process tree). Returns one dict per
    run: rep, benchmark, allocator, wall_ms, cpu_ms (user + system of the process),
    peak_rss_kib (VmHWM), busy (the machine's busy share during the run, 1 - idle share
    of /proc/stat over all CPUs; the benchmark's own 2 threads count) and load1."""
    rows = []
    lockf = open(LOCK, "a") if lock else None
    for rep in range(reps):
        for mode in modes:
            k = (rep * 3 + modes.index(mode)) % len(allocs)
            order = allocs[k:] + allocs[:k]
            if lockf:
                fcntl.flock(lockf, fcntl.LOCK_EX)
            for name, lib, extra in order:
                with open("/proc/loadavg") as f:
                    load = f.read().split()[0]
                idle0, all0 = cpu_times()
                res = run_one(mode, threads, lib, extra)
                idle1, all1 = cpu_times()
                if res is None:
                    print(f"  {mode} {name} rep {rep}: failed", file=sys.stderr)
                    continue
                rows.append({"rep": rep, "benchmark": mode, "allocator": name, "wall_ms": res[0],
                             "cpu_ms": res[1], "peak_rss_kib": res[2],
                             "busy": 1 - (idle1 - idle0) / max(1, all1 - all0), "load1": load})
            if lockf:
                fcntl.flock(lockf, fcntl.LOCK_UN)
        if log:
            log(f"rep {rep + 1}/{reps} done (load {load})")
    if lockf:
        lockf.close()
    return rows


def paired(rows, mode, name, peer_names, reps):
    """per repetition of `mode`: name's wall / the fastest peer's wall, name's CPU time /
    the least peer CPU time, and name's peak RSS / glibc's; three lists"""
    ratios, cpus, rss = [], [], []
    for rep in range(reps):
        rr = {r["allocator"]: r for r in rows if r["benchmark"] == mode and r["rep"] == rep}
        pw = [rr[p]["wall_ms"] for p in peer_names if p in rr]
        if name in rr and pw:
            ratios.append(rr[name]["wall_ms"] / min(pw))
            pc = [rr[p]["cpu_ms"] for p in peer_names if p in rr]
            cpus.append(rr[name]["cpu_ms"] / max(min(pc), 1.0))
        if name in rr and "glibc" in rr:
            rss.append(rr[name]["peak_rss_kib"] / rr["glibc"]["peak_rss_kib"])
    return ratios, cpus, rss


def verdict(ratios):
    """a gap is real when the lower quartile of the paired ratios is above 1.10, a lead
    when the upper one is below 1.0"""
    q1, q3 = quartiles(ratios)
    med = statistics.median(ratios)
    if q1 > 1.10:
        return "gap (>1.10)"
    if q3 < 1.0:
        return "ahead"
    return "within 10 %" if med <= 1.10 else "unclear"


def spread_pct(xs):
    """the larger distance of min and max from the median, in % of the median"""
    med = statistics.median(xs)
    return 100.0 * max(med - min(xs), max(xs) - med) / med if med else 0.0


def main():
    global SCALE, PIN
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--modes", default="prodcons,small,realloc,larson")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lib", action="append", default=[])
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--peers", default="glibc,jemalloc,tcmalloc,mimalloc",
                    help="peers to run (the paired ratios compare with these only)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--scale", type=int, default=1, help="tput.c's SCALE: work per run x N")
    ap.add_argument("--pin", action="store_true", help="thread i on CPU i (TPUT_PIN=1)")
    ap.add_argument("--callgrind", action="store_true",
                    help="also one run per benchmark and allocator under callgrind (instructions per pair)")
    ap.add_argument("--section", help="publish the summary as this section of bench/alloc/RESULTS.md")
    ap.add_argument("--no-lock", action="store_true",
                    help="do not take the benchmark lock (the caller holds it, e.g. flock(1) around this)")
    a = ap.parse_args()
    SCALE, PIN = max(1, a.scale), a.pin
    src = os.path.join(HERE, "tput.c")
    if not os.path.exists(BIN) or os.path.getmtime(BIN) < os.path.getmtime(src):
        os.makedirs(os.path.dirname(BIN), exist_ok=True)
        subprocess.run(["gcc", "-O2", "-pthread", "-o", BIN, src], check=True)
    libs = [parse_lib(s) for s in a.lib] or [("memcolo-norsv", LIB, {"MEMCOLO_CLASS": "be"})]
    peers = [p for p in PEERS if p[0] in a.peers.split(",")]
    allocs = ([] if a.no_peers else peers) + libs
    out = a.out or os.path.join(ROOT, "bench", "out", "alloc", "tput_ab-" + time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
    os.makedirs(out, exist_ok=True)
    command = " ".join(["python3", "bench/alloc/tput_ab.py"] + sys.argv[1:])
    benchlib.record_machine(out, command)
    modes = a.modes.split(",")
    rows = run_interleaved(modes, a.threads, allocs, a.reps, lock=not a.no_lock,
                           log=lambda m: print(m, file=sys.stderr, flush=True))
    with open(os.path.join(out, "tput_ab.csv"), "w") as f:
        f.write("rep,benchmark,allocator,wall_ms,cpu_ms,peak_rss_kib,busy,load1\n")
        for r in rows:
            f.write(f"{r['rep']},{r['benchmark']},{r['allocator']},{r['wall_ms']:.1f},{r['cpu_ms']:.0f},"
                    f"{r['peak_rss_kib']},{r['busy']:.2f},{r['load1']}\n")
    lines = [f"# tput interleaved: {a.reps} repetitions, {a.threads} threads, scale {SCALE}"
             + (", threads pinned" if PIN else ""), "",
             "| benchmark | allocator | wall ms median | min | max | spread +-% | cpu ms median | min | max | spread +-% | peak RSS KiB median | min | max | busy median |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    peer_names = [p[0] for p in allocs if p not in libs]
    for mode in modes:
        for name, _, _ in allocs:
            rs = [r for r in rows if r["benchmark"] == mode and r["allocator"] == name]
            if not rs:
                continue
            w = [r["wall_ms"] for r in rs]
            c = [r["cpu_ms"] for r in rs]
            m = [r["peak_rss_kib"] for r in rs]
            lines.append(f"| {mode} | {name} | {statistics.median(w):.1f} | {min(w):.1f} | {max(w):.1f} | "
                         f"{spread_pct(w):.0f} | {statistics.median(c):.0f} | {min(c):.0f} | {max(c):.0f} | "
                         f"{spread_pct(c):.0f} | {statistics.median(m):.0f} | {min(m)} | {max(m)} | "
                         f"{statistics.median(r['busy'] for r in rs):.2f} |")
    if peer_names:
        lines += ["", "Paired per repetition: wall / fastest peer's wall in the same repetition, "
                  "peak RSS / glibc's.", "",
                  "| benchmark | allocator | best peer (median) | wall ratio median | q1 | q3 | verdict | CPU ratio median | q1 | q3 | RSS ratio median | q1 | q3 | min | max |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for mode in modes:
            med = {}
            for p in peer_names:
                w = [r["wall_ms"] for r in rows if r["benchmark"] == mode and r["allocator"] == p]
                if w:
                    med[p] = statistics.median(w)
            best = min(med, key=med.get) if med else "-"
            for name, _, _ in libs:
                ratios, cpus, rss = paired(rows, mode, name, peer_names, a.reps)
                if not ratios:
                    continue
                q1, q3 = quartiles(ratios)
                med_r = statistics.median(ratios)
                rss_s = (f"{statistics.median(rss):.3f} | {quartiles(rss)[0]:.3f} | {quartiles(rss)[1]:.3f} | "
                         f"{min(rss):.3f} | {max(rss):.3f}") if rss else "- | - | - | - | -"
                cq1, cq3 = quartiles(cpus)
                lines.append(f"| {mode} | {name} | {best} ({med.get(best, 0):.1f}) | {med_r:.3f} | {q1:.3f} | {q3:.3f} | "
                             f"{verdict(ratios)} | {statistics.median(cpus):.3f} | {cq1:.3f} | {cq3:.3f} | {rss_s} |")
    if a.callgrind:
        lines += ["", "Instructions (callgrind, one run each, threads serialized) inside malloc and free, "
                  "per malloc/free pair.", "",
                  "| benchmark | allocator | instructions per pair | in all (M) |",
                  "|---|---|---|---|"]
        for mode in modes:
            pairs = PAIRS.get(mode)
            for name, lib, extra in allocs:
                ir = callgrind_ir(mode, a.threads, lib, extra)
                if ir is None:
                    lines.append(f"| {mode} | {name} | - | - |")
                    continue
                per = f"{ir / (pairs * a.threads):.1f}" if pairs else "-"
                lines.append(f"| {mode} | {name} | {per} | {ir / 1e6:.0f} |")
    text = "\n".join(lines) + "\n"
    for fname in ("summary.md", "report.md"):
        with open(os.path.join(out, fname), "w") as f:
            f.write(text)
    print(text)
    print(f"raw: {out}/tput_ab.csv", file=sys.stderr)
    if a.section:
        benchlib.publish(HERE, a.section, out, command=command)


if __name__ == "__main__":
    main()
