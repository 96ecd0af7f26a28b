#!/usr/bin/python3
"""A key-value store (LS) beside a best-effort GUPS (BE) sharing a small fast tier
(MaxMem §5.2, scaled): MaxMem vs a static partition vs no QoS.

- Store: ``target/release/kvstore``, 32768 values of 4 KiB (128 MiB), 15 % of the keys
  take 90 % of the requests (FlexKVS's skew in §5.2), 10 % SETs, one closed-loop
  client; 15 s warm-up, 20 s measured.
- BE: ``gups`` with a 256 MiB table updated uniformly, one thread, started first.
- Fast memory: 160 MiB for both (the slow tier holds the rest).

Configurations:

- ``maxmem``   both processes hand their memory to the agent (libmemcolo's tier.c),
               which has 160 MiB of fast memory: the store with t_miss = 0.1, GUPS with
               t_miss = 1. The store's fast memory is read from ``memcolo tier status``.
- ``static``   HeMem's approach: a fixed partition sized by hand, here the paper's
               equal split (80 MiB each, §5.2 "three equal sections"), each process
               managing its own memory in-process (``--manage maxmem --fast-mib 80``).
- ``kernel``   no QoS: both processes unmanaged in a memory cgroup limited to 160 MiB
               (plus 24 MiB for code and stacks) with zram swap: the kernel's LRU.

Targets (issue 6): the store under MaxMem within 5 % of the static partition's
throughput while using at least 30 % less fast memory. Results: ``--out`` (default
bench/tiering/results/kv): ``runs.jsonl``, timelines, ``report.md``.

    cargo build --release -p memcolo -p memcolo-tiering-bench
    flock /tmp/memcolo-bench.lock /usr/bin/python3 bench/tiering/kv.py --reps 2
    /usr/bin/python3 bench/tiering/kv.py --report-only

zram (``/dev/zram0``) is set up for ``kernel`` runs only, and swapped off and reset
after each, Ctrl-C included.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import run as tiering  # noqa: E402

FAST_MIB = 160
STATIC_KV_MIB = 80
KV = ["--items", "32768", "--value-bytes", "4096", "--hot-items-pct", "15", "--hot-pct", "90",
      "--set-pct", "10", "--warmup-s", "15", "--measure-s", "20"]
BE = ["--footprint-mib", "256", "--hot-size-pct", "100", "--warm-size-pct", "0", "--hot-pct", "100",
      "--warm-pct", "0", "--warmup-s", "0", "--measure-s", "120"]


def sh(*a, check=True):
    return subprocess.run(list(a), check=check, capture_output=True, text=True)


def zram_on(mib):
    sh("swapoff", "/dev/zram0", check=False)
    with open("/sys/block/zram0/reset", "w") as f:
        f.write("1")
    with open("/sys/block/zram0/disksize", "w") as f:
        f.write(str(mib << 20))
    sh("mkswap", "/dev/zram0")
    sh("swapon", "/dev/zram0")


def zram_off():
    for _ in range(5):
        if sh("swapoff", "/dev/zram0", check=False).returncode == 0:
            break
        time.sleep(1)
    try:
        with open("/sys/block/zram0/reset", "w") as f:
            f.write("1")
    except OSError:
        pass


def rss_kib(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def one(config, rep, out, bins, cg):
    memcolo, gups, kvstore, lib = bins
    tmp = tempfile.mkdtemp(prefix="memcolo-kv-")
    inc = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', cg]
    procs = []
    env = dict(os.environ)
    kv_args = KV + ["--seed", str(rep + 1), "--label", config,
                    "--timeline", os.path.join(out, "timelines", "%s-r%d-kv.csv" % (config, rep))]
    be_args = BE + ["--seed", str(rep + 1)]
    samples = []
    try:
        if config == "kernel":
            tiering.cg_write(cg, "memory.limit_in_bytes", (FAST_MIB + 24) << 20)
            zram_on(1024)
        else:
            tiering.cg_write(cg, "memory.limit_in_bytes", 3 << 30)
        if config == "maxmem":
            cfg = os.path.join(tmp, "agent.toml")
            with open(cfg, "w") as f:
                f.write('metrics_addr = "off"\n[tier]\nenabled = true\nfast_bytes = %d\n'
                        'migration_cap_bytes = %d\n' % (FAST_MIB << 20, 32 << 20))
            sock = os.path.join(tmp, "agent.sock")
            agent = subprocess.Popen(inc + [memcolo, "agent", "--config", cfg, "--socket", sock,
                                            "--state-dir", os.path.join(tmp, "state")],
                                     env=dict(env, MEMCOLO_LOG="warn"))
            procs.append(agent)
            for _ in range(300):
                if os.path.exists(os.path.join(tmp, "tier.sock")):
                    break
                time.sleep(0.1)
            env = dict(env, MEMCOLO_SOCKET=sock, MEMCOLO_TIER="1", MEMCOLO_TIER_THRESHOLD="64m",
                       LD_PRELOAD=lib)
            be_env, kv_env = dict(env, MEMCOLO_T_MISS="1"), dict(env, MEMCOLO_T_MISS="0.1")
        else:
            be_env = kv_env = env
        if config == "static":
            be_args += ["--manage", "maxmem", "--fast-mib", str(FAST_MIB - STATIC_KV_MIB), "--t-miss", "1"]
            kv_args += ["--manage", "maxmem", "--fast-mib", str(STATIC_KV_MIB)]
        be = subprocess.Popen(inc + [gups] + be_args, env=be_env, stdout=subprocess.DEVNULL,
                              stderr=open(os.path.join(out, "logs", "%s-r%d-be.err" % (config, rep)), "w"))
        procs.append(be)
        time.sleep(5)
        kv = subprocess.Popen(inc + [kvstore] + kv_args, env=kv_env, stdout=subprocess.PIPE,
                              stderr=open(os.path.join(out, "logs", "%s-r%d-kv.err" % (config, rep)), "w"),
                              text=True)
        procs.append(kv)
        stop = threading.Event()

        def sampler():
            t0 = time.monotonic()
            while not stop.wait(1.0):
                row = {"t": round(time.monotonic() - t0, 1), "kv_rss_kib": rss_kib(kv.pid),
                       "be_rss_kib": rss_kib(be.pid)}
                if config == "maxmem":
                    o = sh(memcolo, "tier", "status", "--json", "--socket", sock, check=False)
                    if o.returncode == 0:
                        for p in json.loads(o.stdout)["processes"]:
                            who = "kv" if p["pid"] == kv.pid else "be" if p["pid"] == be.pid else None
                            if who:
                                row[who + "_alloc_bytes"] = p["alloc_bytes"]
                                row[who + "_fast_bytes"] = p["fast_bytes"]
                                row[who + "_a_miss"] = p["a_miss"]
                samples.append(row)

        th = threading.Thread(target=sampler)
        th.start()
        kv_out, _ = kv.communicate(timeout=300)
        stop.set()
        th.join()
        rec = {"run": "%s-r%d" % (config, rep), "config": config, "rc": kv.returncode,
               "loadavg": open("/proc/loadavg").read().split()[:3], "samples": samples}
        if kv.returncode == 0:
            rec.update(json.loads(kv_out.strip().splitlines()[-1]))
        # The store's fast memory over its measure phase (the last 20 samples).
        meas = samples[-20:]
        if config == "maxmem":
            vals = [s["kv_fast_bytes"] for s in meas if "kv_fast_bytes" in s]
            rec["kv_fast_mib"] = statistics.mean(vals) / 2**20 if vals else None
            vals = [s["kv_a_miss"] for s in meas if "kv_a_miss" in s]
            rec["kv_a_miss"] = statistics.mean(vals) if vals else None
        elif config == "static":
            rec["kv_fast_mib"] = STATIC_KV_MIB
        else:
            vals = [s["kv_rss_kib"] for s in meas]
            rec["kv_fast_mib"] = statistics.mean(vals) / 1024 if vals else None
        return rec
    finally:
        for p in reversed(procs):
            try:
                p.send_signal(signal.SIGTERM if p is procs[0] and config == "maxmem" else signal.SIGKILL)
                p.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if config == "kernel":
            zram_off()


def report(out):
    runs = [json.loads(l) for l in open(os.path.join(out, "runs.jsonl"))]
    runs = [r for r in runs if r.get("rc") == 0]
    by = {}
    for r in runs:
        by.setdefault(r["config"], []).append(r)
    m = lambda rs, k: statistics.mean([r[k] for r in rs if r.get(k) is not None]) if rs else float("nan")  # noqa: E731
    lines = ["# KV store (LS) beside GUPS (BE), MaxMem §5.2 scaled: %s" % out, "",
             "Fast memory %d MiB for both; store 128 MiB (15 %% of keys take 90 %% of requests); "
             "GUPS 256 MiB uniform. Means over runs." % FAST_MIB, "",
             "| config | runs | ops/s | p50 µs | p90 µs | p99 µs | p99.9 µs | store's fast MiB | store a_miss | errors |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for c in ["maxmem", "static", "kernel"]:
        rs = by.get(c, [])
        if not rs:
            continue
        lines.append("| %s | %d | %.0f | %.0f | %.0f | %.0f | %.0f | %.1f | %s | %d |" % (
            c, len(rs), m(rs, "ops_per_s"), m(rs, "p50_us"), m(rs, "p90_us"), m(rs, "p99_us"), m(rs, "p999_us"),
            m(rs, "kv_fast_mib"), "%.3f" % m(rs, "kv_a_miss") if c == "maxmem" else "—",
            sum(r.get("errors", 0) for r in rs)))
    if by.get("maxmem") and by.get("static"):
        tput = m(by["maxmem"], "ops_per_s") / m(by["static"], "ops_per_s")
        mem = m(by["maxmem"], "kv_fast_mib") / m(by["static"], "kv_fast_mib")
        lines += ["", "MaxMem vs static: throughput %.1f %% of static (target >= 95 %%), fast memory %.1f %% "
                  "of static (target <= 70 %%)." % (100 * tput, 100 * mem)]
    for r in runs:
        lines.append("- `%s`: %.0f ops/s, p99 %d µs, store fast %.1f MiB, load %s" % (
            r["run"], r["ops_per_s"], r["p99_us"], r.get("kv_fast_mib") or float("nan"), " ".join(r["loadavg"])))
    open(os.path.join(out, "report.md"), "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "kv"))
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--configs", default="maxmem,static,kernel")
    ap.add_argument("--budget-s", type=float, default=420)
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args()
    out = args.out
    if not args.report_only:
        if os.geteuid() != 0:
            raise SystemExit("needs root")
        for d in ("timelines", "logs"):
            os.makedirs(os.path.join(out, d), exist_ok=True)
        rel = os.path.join(ROOT, "target", "release")
        tmp = tempfile.mkdtemp(prefix="memcolo-kvlib-")
        lib = os.path.join(tmp, "libtier.so")
        subprocess.run(["cc", "-std=gnu11", "-O2", "-fPIC", "-shared", "-fvisibility=hidden", "-pthread",
                        os.path.join(ROOT, "alloc", "src", "tier.c"), "-o", lib], check=True)
        bins = (os.path.join(rel, "memcolo"), os.path.join(rel, "gups"), os.path.join(rel, "kvstore"), lib)
        runs_path = os.path.join(out, "runs.jsonl")
        done = set()
        if os.path.exists(runs_path):
            done = {json.loads(l)["run"] for l in open(runs_path)}
        cg = os.path.join(tiering.CG_ROOT + tiering.own_memory_cgroup(), "memcolo-tiering-kv-%d" % os.getpid())

        def cleanup(*_):
            zram_off()
            tiering.cg_remove(cg)
            sys.exit(130)

        signal.signal(signal.SIGTERM, cleanup)
        signal.signal(signal.SIGINT, cleanup)
        start = time.monotonic()
        configs = args.configs.split(",")
        try:
            for rep in range(args.reps):
                for c in configs[rep % len(configs):] + configs[:rep % len(configs)]:
                    rid = "%s-r%d" % (c, rep)
                    if rid in done:
                        continue
                    if time.monotonic() - start > args.budget_s:
                        raise StopIteration
                    os.makedirs(cg, exist_ok=True)
                    print("run", rid, flush=True)
                    rec = one(c, rep, out, bins, cg)
                    with open(runs_path, "a") as f:
                        f.write(json.dumps(rec) + "\n")
                    print("  -> %s ops/s p99 %s us, store fast %s MiB" % (
                        rec.get("ops_per_s"), rec.get("p99_us"), rec.get("kv_fast_mib")), flush=True)
                    tiering.cg_remove(cg)
        except StopIteration:
            print("budget spent; runs left")
        finally:
            tiering.cg_remove(cg)
    report(out)


if __name__ == "__main__":
    main()
