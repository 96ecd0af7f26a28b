#!/usr/bin/python3
"""libmemcolo benchmarks: raw CSV, report.md and PNG plots in bench/out/alloc/<UTC date-time>/ (ignored by git).

1. Hermes micro benchmark (Middleware'21 §5.2): 1 KiB and 256 KiB blocks until 1 GiB
   (256 MiB with --quick), malloc + first write to each 4 KiB page, back to back and
   paced (256 KiB every 250 us, 1 KiB every 1 us: ~1 GB/s) in two ways: "paced", the
   thread sleeping until each deadline as a service waits for its next request
   (the issue's paced targets are checked on it), and "paced-spin", busy-waiting
   between deadlines (the thread never leaves its CPU); and "paced-1ms", the sleeping
   pacer at a second pace, 256 KiB every 1 ms (~0.26 GB/s, a pace the fill sustains under
   anonymous pressure; its own rows, not a target); on a dedicated node, under
   anonymous-page pressure (a scratch memory cgroup of 1.5 GiB held at its limit by a
   memory hog, zram swap: every new page of the benchmark costs a reclaim) and under
   file-cache pressure (the same cgroup with a reader of a 2 GiB file); allocators:
   glibc, jemalloc, tcmalloc, mimalloc, libmemcolo without reservation, libmemcolo (lc).
2. Throughput and peak RSS (tput.c): prodcons, small, realloc, larson; the allocators
   take turns within each repetition (so that load from outside hits all of them
   alike); median of the repetitions.
3. Subrelease (ISMM'21 §5.1): subrelease_service.py with Delta = 60 s and Delta = 0.

Parts and resuming: --only hermes,tput,subrelease picks benchmarks and --conditions
dedicated,anon,file the Hermes conditions, so that a long run can be split into parts
(each under the benchmark lock: flock /tmp/memcolo-bench.lock); --out DIR puts a part
into an earlier part's directory, where its rows replace only those of the same
benchmark/condition, and report.py is rerun over everything there.

Pressure runs need root and cgroup v1's memory controller; the scratch group is made
below this process's own group and removed at the end; the anonymous-pressure part sets
up /dev/zram0 as swap and swaps it off and resets it at the end (run it under the lock).
Run with /usr/bin/python3 (matplotlib).
Repetitions: every Hermes case runs --reps times (default 3), the allocators taking
turns within each repetition (interleaved, so that load from outside hits all of them
alike); hermes.csv keeps one row per repetition with the machine's busy share during the
run (1 - idle share of /proc/stat over both CPUs) and the 1-minute load average, and the
report checks the targets on the median over the repetitions, showing the spread.
--cases 262144-b2b,1024 picks cases (block size, optionally "-mode") so that a condition
can be split into parts of at most ~8 minutes.
usage: run_bench.py [--quick] [--skip-pressure] [--only hermes,tput,subrelease]
                    [--conditions dedicated,anon,file] [--cases SIZE[-MODE],...] [--reps N] [--out DIR]
                    [--variant NAME:MEMCOLO_X=V,...]... [--allocators NAME,...]
"""
import argparse
import csv
import datetime
import os
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import benchlib  # noqa: E402
from benchlib import cpu_times, zram_off, zram_on  # noqa: E402
from tput_ab import env_for  # noqa: E402  (same directory)
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
LIB = os.path.join(ROOT, "alloc", "build", "libmemcolo.so")
BIN = os.path.join(ROOT, "alloc", "build", "bench")
SYS = "/usr/lib/x86_64-linux-gnu"
ALLOCATORS = [
    ("glibc", None, {}),
    ("jemalloc", f"{SYS}/libjemalloc.so.2", {}),
    ("tcmalloc", f"{SYS}/libtcmalloc_minimal.so.4", {}),
    ("mimalloc", f"{SYS}/libmimalloc.so.2", {}),
    ("memcolo-norsv", LIB, {"MEMCOLO_CLASS": "be"}),
    ("memcolo", LIB, {"MEMCOLO_CLASS": "lc"}),
]
GiB = 1 << 30


def build():
    os.makedirs(BIN, exist_ok=True)
    subprocess.run(["make", "-C", os.path.join(ROOT, "alloc"), "all"], check=True, stdout=subprocess.DEVNULL)
    for src, extra in (("hermes_bench.c", []), ("tput.c", ["-pthread"])):
        out = os.path.join(BIN, src[:-2])
        subprocess.run(["gcc", "-O2", "-o", out, os.path.join(HERE, src)] + extra, check=True)


class ScratchCgroup:
    """A memory cgroup (v1) below our own group; removed on exit."""

    def __init__(self, name, limit_bytes):
        self.path = benchlib.scratch_cgroup(name, limit_bytes)
        self.procs = []

    def preexec(self):
        path = self.path

        def join():
            benchlib.cg_add(path, os.getpid())
        return join

    def spawn(self, cmd, **kw):
        p = subprocess.Popen(cmd, preexec_fn=self.preexec(), start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)
        self.procs.append(p)
        return p

    def close(self):
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        benchlib.cg_remove(self.path)


def merge_rows(path, rows, replaced):
    """rows of an earlier part in `path` whose key (replaced(row) is False) stays, then `rows`"""
    old = []
    if os.path.exists(path):
        with open(path) as f:
            old = [r for r in csv.DictReader(f) if not replaced(r)]
    return old + rows


def warm(mb=2048):
    subprocess.run([os.path.join(BIN, "hermes_bench"), "4096", "4096", "b2b", "0", "", str(mb)],
                   stdout=subprocess.DEVNULL, check=False)


CASES = [(262144, "b2b", 0), (262144, "paced", 250_000), (262144, "paced-1ms", 1_000_000),
         (262144, "paced-spin", 250_000), (1024, "b2b", 0), (1024, "paced", 1000), (1024, "paced-spin", 1000)]


def bench_mode(mode):
    """hermes_bench's mode for a case's mode: "paced-1ms" is the sleeping pacer at a
    second pace (256 KiB every 1 ms, ~0.26 GB/s: within what the fill sustains under
    anonymous pressure), reported beside the 250 us rows, never instead of them"""
    return "paced" if mode == "paced-1ms" else mode


def case_selected(size, mode, picks):
    """picks: None (all) or a list of "SIZE" / "SIZE-MODE" strings"""
    return picks is None or str(size) in picks or f"{size}-{mode}" in picks


def hermes(out_dir, quick, conditions, picks=None, reps=3):
    rows = []
    total = GiB // (4 if quick else 1)
    cases = [c for c in CASES if case_selected(c[0], c[1], picks)]
    bigfile = "/var/tmp/memcolo-alloc-bench.dat"
    limit = int(1.5 * GiB)
    for cond in conditions:
        cg = None
        swap = False
        if cond != "dedicated":
            cg = ScratchCgroup(f"mcbench-{cond}", limit)
            if cond == "anon":
                zram_on(4096)
                swap = True
                # the hog alone fills the group to its limit: every page the benchmark
                # touches is taken from it by reclaim (swap-out to zram)
                cg.spawn(["stress-ng", "--vm", "1", "--vm-bytes", str(limit // 2**20) + "M", "--vm-keep",
                          "--timeout", "3600"])
            else:
                if not os.path.exists(bigfile) or os.path.getsize(bigfile) < 2 * GiB:
                    subprocess.run(["dd", "if=/dev/urandom", f"of={bigfile}", "bs=1M", "count=2048"],
                                   check=True, stderr=subprocess.DEVNULL)
                cg.spawn(["sh", "-c", f"while :; do cat {bigfile} > /dev/null; done"])
            time.sleep(6)  # let the hog reach the limit
        try:
            for size, mode, interval in cases:
                for rep in range(reps):
                    for name, lib, extra in ALLOCATORS:
                        # every condition warms (outside the scratch group): without it the
                        # pressure runs took pages the host had been told were free (free page
                        # reporting), ~17 us per 4 KiB page on first touch in phases for every
                        # allocator, and no memcg reclaim at all in the file condition
                        # (diag/file_trace.sh; RESULTS.md, diag-file-b2b-trace)
                        warm()
                        cdf = os.path.join(out_dir, "cdf", f"{cond}-{size}-{mode}-{name}-r{rep}.csv")
                        cmd = [os.path.join(BIN, "hermes_bench"), str(size), str(total), bench_mode(mode), str(interval), cdf,
                               "0" if cg else "1536"]
                        kw = {"preexec_fn": cg.preexec()} if cg else {}
                        idle0, all0 = cpu_times()
                        r = subprocess.run(cmd, env=env_for(lib, extra), capture_output=True, text=True, timeout=600,
                                           **kw)
                        idle1, all1 = cpu_times()
                        if r.returncode != 0:
                            print(f"  {cond} {size} {mode} {name}: failed: {r.stderr.strip()[:200]}", flush=True)
                            continue
                        vals = r.stdout.strip().split(",")
                        busy = 1 - (idle1 - idle0) / max(1, all1 - all0)
                        with open("/proc/loadavg") as f:
                            load1 = f.read().split()[0]
                        row = {"condition": cond, "block_bytes": size, "mode": mode, "interval_ns": interval,
                               "allocator": name, "rep": rep, "n": vals[0], "mean_us": vals[1], "p50_us": vals[2],
                               "p90_us": vals[3], "p99_us": vals[4], "p999_us": vals[5], "max_us": vals[6],
                               "min_us": vals[7], "busy": f"{busy:.2f}", "load1": load1,
                               # the clock steps in 10 ns here: the interquartile mean resolves the
                               # centre of a 1 KiB case (hermes_bench.c); the timer's own cost beside
                               "iqm_us": vals[8] if len(vals) > 8 else "",
                               "timer_p50_us": vals[9] if len(vals) > 9 else "",
                               "timer_iqm_us": vals[10] if len(vals) > 10 else ""}
                        rows.append(row)
                        print(f"  {cond:9} {size:6} {mode:10} r{rep} {name:14} p50 {float(vals[2]):9.3f} "
                              f"p99 {float(vals[4]):9.2f} p99.9 {float(vals[5]):9.2f} max {float(vals[6]):10.1f} us"
                              f"  busy {busy:.2f} load {load1}", flush=True)
        finally:
            if cg:
                cg.close()
            if swap:
                zram_off()
    path = os.path.join(out_dir, "hermes.csv")
    write_csv(path, merge_rows(path, rows, lambda r: r["condition"] in conditions and
                               case_selected(int(r["block_bytes"]), r["mode"], picks)))
    return rows


def tput(out_dir, quick, reps=11):
    """throughput and peak RSS as tput_ab.py measures them: `reps` repetitions, in each
    every allocator once per benchmark in a rotated order (load from outside hits all
    alike), medians and spread, and per repetition libmemcolo's wall over the fastest
    peer's and peak RSS over glibc's (paired ratios: a single run was +14 % where 11
    paired ones gave 0.98x). The caller holds the benchmark lock. tput.csv keeps the
    columns report.py reads (medians, all runs) plus min/max, CPU time, the machine's
    busy share and the paired ratios (median, quartiles, verdict) for libmemcolo."""
    import tput_ab
    allocs = [a for a in ALLOCATORS if a[0] != "memcolo"]  # the reservation is for LC services
    modes = ["prodcons", "small", "realloc", "larson"]
    runs = tput_ab.run_interleaved(modes, 2, allocs, reps, lock=False,
                                   log=lambda m: print("  tput " + m, flush=True))
    write_csv(os.path.join(out_dir, "tput-runs.csv"),
              [dict(r, busy=f"{r['busy']:.2f}") for r in runs])
    peer_names = [a[0] for a in allocs if a[0] != "memcolo-norsv"]
    rows = []
    for mode in modes:
        for name, _, _ in allocs:
            rs = [r for r in runs if r["benchmark"] == mode and r["allocator"] == name]
            if not rs:
                continue
            w = [r["wall_ms"] for r in rs]
            m = [r["peak_rss_kib"] for r in rs]
            row = {"benchmark": mode, "allocator": name, "wall_ms_median": statistics.median(w),
                   "wall_ms_all": " ".join(f"{x:.0f}" for x in w),
                   "peak_rss_kib_median": statistics.median(m),
                   "peak_rss_kib_all": " ".join(str(x) for x in m),
                   "wall_ms_min": min(w), "wall_ms_max": max(w),
                   "cpu_ms_median": statistics.median(r["cpu_ms"] for r in rs),
                   "busy_median": f"{statistics.median(r['busy'] for r in rs):.2f}",
                   "load1_all": " ".join(r["load1"] for r in rs),
                   "paired_wall_ratio_median": "", "paired_wall_ratio_q1": "", "paired_wall_ratio_q3": "",
                   "paired_verdict": "", "paired_cpu_ratio_median": "", "paired_rss_ratio_median": ""}
            if name not in peer_names:
                ratios, cpus, rss = tput_ab.paired(runs, mode, name, peer_names, reps)
                if ratios:
                    q1, q3 = tput_ab.quartiles(ratios)
                    row.update({"paired_wall_ratio_median": f"{statistics.median(ratios):.3f}",
                                "paired_wall_ratio_q1": f"{q1:.3f}", "paired_wall_ratio_q3": f"{q3:.3f}",
                                "paired_verdict": tput_ab.verdict(ratios),
                                "paired_cpu_ratio_median": f"{statistics.median(cpus):.3f}"})
                if rss:
                    row["paired_rss_ratio_median"] = f"{statistics.median(rss):.3f}"
            rows.append(row)
            print(f"  {mode:9} {name:14} {row['wall_ms_median']:9.1f} ms ({min(w):.0f}-{max(w):.0f})  "
                  f"{row['peak_rss_kib_median']:8} KiB  {row['paired_wall_ratio_median']} "
                  f"{row['paired_verdict']}", flush=True)
    path = os.path.join(out_dir, "tput.csv")
    write_csv(path, merge_rows(path, rows, lambda r: True))
    return rows


def subrelease(out_dir, quick):
    """Both arms side by side; subrelease_service.py runs the paper's cycles (ten, a 5 s
    wait, also with --quick: the tail dominates the time), then a tail of TAIL_S with
    demand low, so that the run covers libmemcolo's T_schedule (T_SCHEDULE_S, the paper's
    and the library's 5 min); its summarize() makes the rows. About 5.5 minutes."""
    import subrelease_service
    procs = []
    cycles, wait = subrelease_service.CYCLES, subrelease_service.WAIT_S
    t_sched = subrelease_service.T_SCHEDULE_S
    for delta in ("60", "0"):
        # MEMCOLO_THP=2 (MADV_HUGEPAGE at mmap): an intact huge page is a THP from its first
        # touch, so libmemcolo's coverage and the kernel's AnonHugePages measure the same
        # thing; the default (background collapse) leaves most intact huge pages 4 KiB-mapped.
        env = env_for(LIB, {"MEMCOLO_SKIP_SUBRELEASE_S": delta, "MEMCOLO_RELEASE_RATE": "10m",
                            "MEMCOLO_THP": "2", "MEMCOLO_T_SCHEDULE_S": str(t_sched)})
        out = os.path.join(out_dir, f"subrelease-delta{delta}.csv")
        procs.append(subprocess.Popen(["/usr/bin/python3", os.path.join(HERE, "subrelease_service.py"), out,
                                       str(cycles), "200000", wait, str(subrelease_service.TAIL_S)], env=env))
    for p in procs:
        p.wait()
    summary = []
    for delta in ("60", "0"):
        summary.append(subrelease_service.summarize(os.path.join(out_dir, f"subrelease-delta{delta}.csv"),
                                                    delta, t_sched))
        print(f"  subrelease delta={delta}: {summary[-1]}", flush=True)
    write_csv(os.path.join(out_dir, "subrelease-summary.csv"), summary)
    return summary


def write_csv(path, rows):
    if not rows:
        return
    fields = []
    for r in rows:  # an earlier part's rows may lack newer columns
        fields += [k for k in r if k not in fields]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, restval="")
        w.writeheader()
        w.writerows(rows)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip-pressure", action="store_true")
    ap.add_argument("--only", default="hermes,tput,subrelease")
    ap.add_argument("--conditions", default="dedicated,anon,file")
    ap.add_argument("--out", default=None)
    ap.add_argument("--cases", default=None, help="SIZE or SIZE-MODE, comma-separated (default: all)")
    ap.add_argument("--reps", type=int, default=3, help="interleaved repetitions of each Hermes case")
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME:MEMCOLO_X=V,...: also libmemcolo (class lc) with these options, as allocator "
                         "memcolo-NAME (A/B rows in the tables, never in the targets)")
    ap.add_argument("--allocators", default=None, help="comma-separated subset of the allocators to run")
    a = ap.parse_args()
    for v in a.variant:
        name, _, kvs = v.partition(":")
        extra = {"MEMCOLO_CLASS": "lc"}
        for kv in filter(None, kvs.split(",")):
            k, _, val = kv.partition("=")
            extra[k] = val
        ALLOCATORS.append((f"memcolo-{name}", LIB, extra))
    if a.allocators:
        keep = a.allocators.split(",")
        ALLOCATORS[:] = [x for x in ALLOCATORS if x[0] in keep]
    conditions = ["dedicated"] if a.skip_pressure else [c for c in a.conditions.split(",") if c]
    for c in conditions:
        if c not in ("dedicated", "anon", "file"):
            ap.error(f"unknown condition {c}")
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out_dir = a.out or os.path.join(os.path.dirname(HERE), "out", "alloc", stamp)
    os.makedirs(os.path.join(out_dir, "cdf"), exist_ok=True)
    benchlib.record_machine(out_dir, " ".join(sys.argv))
    build()
    only = a.only.split(",")
    machine = os.path.join(out_dir, "machine.txt")
    first = not os.path.exists(machine)
    with open(machine, "a") as f:
        if first:
            f.write(subprocess.run(["uname", "-a"], capture_output=True, text=True).stdout)
            f.write(subprocess.run(["nproc"], capture_output=True, text=True).stdout)
            f.write(open("/proc/meminfo").read().split("\n")[0] + "\n")
            f.write("THP: " + open("/sys/kernel/mm/transparent_hugepage/enabled").read())
            head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
            f.write("commit: " + head.stdout)
        part = a.only + ("" if "hermes" not in a.only else " (" + ",".join(conditions) +
                         (f"; cases {a.cases}" if a.cases else "") + f"; {a.reps} reps)")
        stamp_now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        f.write(f"part {part}{' quick' if a.quick else ''} at {stamp_now}, load average: " + open("/proc/loadavg").read())
    if "hermes" in only:
        print("hermes micro benchmark", flush=True)
        hermes(out_dir, a.quick, conditions, a.cases.split(",") if a.cases else None, max(1, a.reps))
    if "tput" in only:
        print("throughput", flush=True)
        tput(out_dir, a.quick)
    if "subrelease" in only:
        print("subrelease", flush=True)
        subrelease(out_dir, a.quick)
    subprocess.run(["/usr/bin/python3", os.path.join(HERE, "report.py"), out_dir], check=False)
    print(out_dir)


if __name__ == "__main__":
    main()
