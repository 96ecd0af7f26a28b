#!/usr/bin/python3
"""Tiered-memory (MaxMem) benchmarks on this machine: GUPS (MaxMem §5.1.1).

Plans (``--plan``):

- ``overhead``  single-process management overhead: the same GUPS run unmanaged
                (``off``), under the userfaultfd tier manager with everything fitting
                in fast memory and t_miss = 0.1 (``maxmem``), and with t_miss = 1
                (``maxmem-nonqos``, MaxMem's "non-QoS": the policy has nothing to do
                in a single process, so this isolates its cost), and t_miss = 0.1
                with the sample sized for 16 hits per window whatever the precision
                needed (``maxmem-16hits``, the sampler before it was sized by the
                FMMR's error). Repetitions are interleaved, the order rotated each
                round, so drift of the shared machine falls on every configuration
                alike.
- ``overhead-probation``  ``off`` and ``maxmem`` only, after probation (the
                next victims tested before they go) was added: it never engages when
                the table fits, so ``maxmem`` should cost what it did (``--reps 9``).
- ``overhead-short``  ``off`` and ``maxmem`` in short interleaved rounds (8 s
                warm-up, 8 s measured, ~18 s a run) for the final overhead figure: the
                spread of overhead-final4's 9 rounds of 36 s runs (-6.9..+13.8 %) was the
                host's speed, which holds one level for several seconds to tens of
                seconds (per-second MUPS of one run at 28 for half its seconds and 40
                for the rest, at 99.9 % CPU and no wait for a CPU): pairs closer in time
                fall more often in the same level, and more rounds average the rest.
                ``--reps 16`` and more, in locked chunks.
- ``ablation``  which mechanism of sampling costs what (``--reps 4``): no
                sampling, 19 pages write-protected and unprotected per window but
                never dropped, 19 pages dropped, the sampler of the time.
- ``small``     fast memory smaller than the footprint: the same GUPS with 1/2, 3/7
                (hot + warm exactly) and 1/4 of the table in fast memory, the rest in
                the LZ4 slow tier; throughput, a_miss and the manager's counters.
- ``small-16hits``  the same with the sample sized for 16 hits per window whatever
                the precision needed (the sampler before it was sized by the FMMR's
                error), for comparison.

Every run is ``target/release/gups`` in a scratch memory cgroup
``<own group>/memcolo-tiering-<pid>`` (limit ``--cg-limit-mib``, a safety net: the
runs do not press on memory), removed afterwards. Results accumulate in ``--out``
(default ``bench/out/tiering/<plan>``, ignored by git): ``runs.jsonl`` (one JSON object per run:
the program's summary plus the cgroup's peak), ``timelines/<run>.csv`` (per second).
A run already in ``runs.jsonl`` is not run again, so a plan is worked through in
locked slices::

    flock /tmp/memcolo-bench.lock /usr/bin/python3 bench/tiering/run.py --plan overhead --budget-s 450
    /usr/bin/python3 bench/tiering/report.py bench/out/tiering/overhead

Exit status 3 while runs of the plan are left.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import benchlib  # noqa: E402
from benchlib import CG_ROOT, cg_int, cg_remove, cg_write, in_cgroup, own_memory_cgroup  # noqa: E402
ROOT = os.path.dirname(os.path.dirname(HERE))


def plan_runs(plan, reps):
    """(run_id, config, gups args) in the order to run them."""
    base = ["--footprint-mib", "1024", "--threads", "1", "--warmup-s", "15", "--measure-s", "20"]
    if plan == "overhead":
        configs = [
            ("off", ["--manage", "off"]),
            ("maxmem", ["--manage", "maxmem", "--t-miss", "0.1"]),
            ("maxmem-nonqos", ["--manage", "maxmem", "--t-miss", "1"]),
            ("maxmem-16hits", ["--manage", "maxmem", "--t-miss", "0.1", "--sample-fmmr-error", "0"]),
        ]
    elif plan == "overhead-probation":
        # The overhead after probation was added (the next victims tested before they
        # go): it never engages when the table fits, so `maxmem` must cost what it
        # did; only the two configurations the target names, 9 rounds and more.
        configs = [
            ("off", ["--manage", "off"]),
            ("maxmem", ["--manage", "maxmem", "--t-miss", "0.1"]),
        ]
    elif plan == "overhead-short":
        configs = [
            ("off", ["--manage", "off"]),
            ("maxmem", ["--manage", "maxmem", "--t-miss", "0.1"]),
        ]
        base = ["--footprint-mib", "1024", "--threads", "1", "--warmup-s", "8", "--measure-s", "8"]
    elif plan in ("small", "small-16hits"):
        configs = [
            ("fast-512", ["--manage", "maxmem", "--fast-mib", "512"]),
            ("fast-439", ["--manage", "maxmem", "--fast-mib", "439"]),
            ("fast-256", ["--manage", "maxmem", "--fast-mib", "256"]),
        ]
        if plan == "small-16hits":
            configs = [(n + "-16hits", a + ["--sample-fmmr-error", "0"]) for n, a in configs]
        base = ["--footprint-mib", "1024", "--threads", "1", "--warmup-s", "30", "--measure-s", "20"]
    elif plan == "diag":
        # Where the overhead comes from: always 64 sampled pages (the sampler before it
        # sized its samples), none at all, always 16.
        configs = [
            ("off", ["--manage", "off"]),
            ("maxmem", ["--manage", "maxmem", "--sample-target-hits", "0"]),
            ("maxmem-k0", ["--manage", "maxmem", "--sample-pages", "0"]),
            ("maxmem-k16", ["--manage", "maxmem", "--sample-pages", "16", "--sample-target-hits", "0"]),
        ]
        base = ["--footprint-mib", "1024", "--threads", "1", "--warmup-s", "10", "--measure-s", "15"]
    elif plan == "ablation":
        # Which mechanism of sampling costs GUPS what: none at all, 19 pages per
        # window write-protected and unprotected but never dropped (the shootdowns
        # without the faults), the same 19 pages dropped (shootdowns and faults), and
        # pages sized for 16 hits per window.
        configs = [
            ("off", ["--manage", "off"]),
            ("k0", ["--manage", "maxmem", "--sample-pages", "0"]),
            ("wp-only-19", ["--manage", "maxmem", "--sample-pages", "19", "--sample-target-hits", "0",
                            "--sample-no-drop"]),
            ("fixed-19", ["--manage", "maxmem", "--sample-pages", "19", "--sample-target-hits", "0"]),
            # 16 hits per window, as the sampler was when the plan was run (before
            # it was sized by the FMMR error).
            ("maxmem", ["--manage", "maxmem", "--sample-fmmr-error", "0"]),
        ]
        base = ["--footprint-mib", "1024", "--threads", "1", "--warmup-s", "10", "--measure-s", "15"]
    else:
        raise SystemExit("unknown plan %r" % plan)
    return [("%s-r%d" % (name, r), name, base + a + ["--seed", str(r + 1)])
            for (name, a), r in benchlib.interleaved(configs, reps)]


def host_probe():
    """The machine's busy and total CPU jiffies (``/proc/stat``), kdamond.0's CPU
    jiffies (the host's DAMON pageout scheme) and the KiB reported free to the host
    (``page_reporting``): deltas over a run attribute its speed to the machine, not to
    the manager."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
    total = busy + v[3] + v[4]
    kd = 0
    try:
        pid = subprocess.run(["pgrep", "-x", "kdamond.0"], capture_output=True, text=True).stdout.split()
        if pid:
            with open("/proc/%s/stat" % pid[0]) as f:
                st = f.read().rsplit(")", 1)[1].split()
            kd = int(st[11]) + int(st[12])
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open("/sys/module/page_reporting/parameters/reported_kib") as f:
            rep_kib = int(f.read())
    except (OSError, ValueError):
        rep_kib = 0
    return busy, total, kd, rep_kib


def host_delta(a, b):
    hz = os.sysconf("SC_CLK_TCK")
    return {"busy_share": (b[0] - a[0]) / max(1, b[1] - a[1]), "kdamond_cpu_s": (b[2] - a[2]) / hz,
            "reported_mib": (b[3] - a[3]) / 1024}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plan", default="overhead", choices=["overhead", "overhead-probation", "overhead-short", "small", "small-16hits", "diag",
                                                      "ablation"])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=None)
    ap.add_argument("--budget-s", type=float, default=450.0, help="stop starting runs after this long")
    ap.add_argument("--cg-limit-mib", type=int, default=3072)
    ap.add_argument("--gups", default=os.path.join(ROOT, "target", "release", "gups"))
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    out = args.out or os.path.join(os.path.dirname(HERE), "out", "tiering", args.plan)
    os.makedirs(os.path.join(out, "timelines"), exist_ok=True)
    log = benchlib.RunLog(out)
    todo = [r for r in plan_runs(args.plan, args.reps) if r[0] not in log]
    if args.dry_run:
        for r in todo:
            print(r[0], " ".join(r[2]))
        print("%d runs of the plan left" % len(todo))
        return 3 if todo else 0
    if os.geteuid() != 0:
        raise SystemExit("needs root (cgroups, userfaultfd)")
    benchlib.record_machine(out, " ".join(sys.argv))
    if not os.access(args.gups, os.X_OK):
        raise SystemExit("%s missing: cargo build --release -p memcolo-tiering-bench" % args.gups)
    cg = os.path.join(CG_ROOT + own_memory_cgroup(), "memcolo-tiering-%d" % os.getpid())

    def cleanup(*_):
        cg_remove(cg)
        sys.exit(130)

    signal.signal(signal.SIGTERM, cleanup)
    signal.signal(signal.SIGINT, cleanup)
    commit = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"],
                            capture_output=True, text=True).stdout.strip()
    budget = benchlib.Budget(args.budget_s)
    left = len(todo)
    try:
        for run_id, config, gargs in todo:
            if budget.spent():
                break
            os.makedirs(cg, exist_ok=True)
            cg_write(cg, "memory.limit_in_bytes", args.cg_limit_mib << 20)
            cg_write(cg, "memory.max_usage_in_bytes", 0)
            timeline = os.path.join(out, "timelines", run_id + ".csv")
            cmd = [args.gups] + gargs + ["--timeline", timeline, "--label", config]
            print("run %s: %s" % (run_id, " ".join(gargs)), flush=True)
            t0 = time.monotonic()
            h0 = host_probe()
            p = subprocess.run(
                in_cgroup(cg, cmd),
                capture_output=True, text=True)
            rec = {"run": run_id, "config": config, "args": gargs, "rc": p.returncode,
                   "wall_s": time.monotonic() - t0,
                   "cg_max_usage_bytes": cg_int(cg, "memory.max_usage_in_bytes"),
                   "loadavg": open("/proc/loadavg").read().split()[:3], "commit": commit,
                   "host": host_delta(h0, host_probe())}
            if p.returncode == 0:
                rec.update(json.loads(p.stdout.strip().splitlines()[-1]))
            else:
                rec["stderr"] = p.stderr[-2000:]
            log.append(rec)
            print("  -> rc %d, %s MUPS" % (p.returncode, rec.get("mups")), flush=True)
            cg_remove(cg)
            left -= 1
    finally:
        cg_remove(cg)
    print("%d runs of the plan left" % left)
    return 3 if left else 0


if __name__ == "__main__":
    sys.exit(main())
