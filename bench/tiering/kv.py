#!/usr/bin/python3
"""A key-value store (LS) beside a best-effort GUPS (BE) sharing a small fast tier
(MaxMem §5.2, "Static workload", scaled): MaxMem vs a hand-sized static partition vs
no QoS.

Scale: the paper's sizes divided by 2560, so its proportions hold. FlexKVS's 320 GB
(Table 1) is ``target/release/kvstore`` with 32768 values of 4 KiB (128 MiB); 23 % of
the keys are hot and take 90 % of the requests, 10 % of the requests are SETs (Table
1: "9:1 read:update, 23 % hot"); one closed-loop client. GUPS's 256 GB is a 100 MiB
table updated uniformly by one thread. MaxMem's 128 GB of DRAM is 52 MiB of fast
memory (the slow tier, LZ4 in the agent or in the process, holds the rest), and its
cap of 4 GB of migrations per 1 s epoch (§3.1) is 1.625 MiB per epoch. Each system
gets the paper's warm-up of 100 s to find the hot set (§5.2 "Dynamic workload");
then 30 s are measured. GUPS starts 5 s before the store.

Configurations:

- ``maxmem``    both processes hand their memory to the agent (libmemcolo's tier.c),
                which shares the 52 MiB between them: the store with t_miss = 0.1, GUPS
                with t_miss = 1 (§5.2). The store's fast memory is read once a second
                from ``memcolo tier status``.
- ``static``    HeMem's approach, a fixed partition per process, each process managing
                its own memory in-process (``--manage maxmem --fast-mib N``). How N was
                chosen: as the paper sized HeMem's partition for FlexKVS ("a fast memory
                partition of 128GB, fitting FlexKVS's entire hot set"): all of the fast
                memory goes to the store, which fits its hot set (29.4 MiB) with room to
                spare, less 1 MiB for GUPS (a partition holds at least a page). This is
                what sizing by hand without MaxMem gives: the hot set is not known
                exactly, and may grow, so the partition is sized for the worst case the
                operator can afford.
- ``static-N``  the same with N MiB for the store (``--static-sweep``): the curve of the
                store's throughput against its fast memory, on which the hand-sized
                partition and MaxMem's choice are two points.
- ``maxmem-v0`` ``maxmem`` as it was before the access estimator and the LS fault
                priority (``tier.slots_per_window = 1``, ``tier.lc_fault_priority =
                false``), for a paired A/B.
- ``maxmem-v1`` ``maxmem`` with GUPS's tier threads at nice 0 (``tier.be_thread_nice =
                0``), as before they ran at nice 19, for a paired A/B.
- ``maxmem-idle`` ``maxmem`` with GUPS's tier threads ``SCHED_IDLE`` instead of
                nice 19 (``tier.be_thread_idle = true``), for a paired A/B
                (``RESULTS.md``, earlier/kv-idle-dev, where ``maxmem`` had it on and
                ``maxmem-nice19`` off).
- ``maxmem-refault`` ``maxmem`` with short-distance refaults counted as hotness samples
                (``tier.refault_samples = true``), for a paired A/B (in
                earlier/kv-refault-dev it was the default: its ``maxmem`` had it
                on and ``maxmem-norefault`` off).
- ``maxmem-change`` ``maxmem`` with the store's t_miss changed live to ``--change-t-miss``
                ``--change-at-s`` after it started: the epochs until its a_miss <= the new
                target (the issue's "within 10 epochs of each change").
- ``kernel``    no QoS: both processes unmanaged in a memory cgroup limited to the fast
                memory (plus 24 MiB for code, stacks and heaps) with zram swap: the
                kernel's LRU. The store's fast memory is its resident set.

Targets (issue 6): the store under MaxMem within 5 % of the static partition's
throughput while using at least 30 % less fast memory; p90/p99 latency and throughput
for all three. Results in ``--out`` (default bench/out/tiering/kv, ignored by git):
``runs.jsonl`` (one JSON object per run, the store's summary, once-a-second samples of
the store's and GUPS's memory), ``timelines/`` (the store's and GUPS's per-second
CSVs), ``logs/``, ``report.md``, ``plots/``. A run already in ``runs.jsonl`` is not
run again, so the plan is worked through in locked slices (exit status 3 while runs
are left):

    cargo build --release -p memcolo -p memcolo-tiering-bench
    flock /tmp/memcolo-bench.lock /usr/bin/python3 bench/tiering/kv.py --reps 2   # until "all runs done"
    flock /tmp/memcolo-bench.lock /usr/bin/python3 bench/tiering/kv.py --reps 1 --configs '' --static-sweep 30,36,44
    /usr/bin/python3 bench/tiering/kv.py --report-only

zram (``/dev/zram0``) is set up for ``kernel`` runs only, and swapped off and reset
after each, Ctrl-C included. Everything runs in a scratch memory cgroup below the
caller's own, removed afterwards.
"""

import argparse
import csv
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import benchlib  # noqa: E402
from benchlib import zram_off, zram_on  # noqa: E402
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import faultpath  # noqa: E402

VALUE_BYTES = 4096
BE_START_S = 5


def sh(*a, check=True):
    return subprocess.run(list(a), check=check, capture_output=True, text=True)


def rss_kib(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def static_mib(config, args):
    """The store's fast memory of a static configuration: ``static`` (the hand-sized
    partition) or ``static-<MiB>``."""
    return int(config.split("-", 1)[1]) if "-" in config else args.static_kv_mib


def parse_variants(specs, ap):
    """``--variant NAME:KEY=VALUE[,KEY=VALUE]`` options as ``{NAME: [(KEY, VALUE)]}``;
    a malformed one ends the program with a usage error (nothing has run yet)."""
    out = {}
    for spec in specs:
        name, sep, rest = spec.partition(":")
        if not sep or not name.startswith("maxmem-") or name == "maxmem-change":
            ap.error("--variant %r: want NAME:KEY=VALUE[,KEY=VALUE] with NAME maxmem-<something>" % spec)
        pairs = []
        for kv in rest.split(","):
            key, eq, value = kv.partition("=")
            if not eq or not key.strip() or not value.strip():
                ap.error("--variant %r: %r is not KEY=VALUE" % (spec, kv))
            pairs.append((key.strip(), value.strip()))
        out[name] = pairs
    return out


def read_csv(p):
    try:
        with open(p) as f:
            return list(csv.DictReader(f))
    except OSError:
        return []


def one(config, rep, args, bins, cg):
    memcolo, gups, kvstore, lib = bins
    out = args.out
    tmp = tempfile.mkdtemp(prefix="memcolo-kv-")
    inc = benchlib.in_cgroup(cg, [])
    procs = []
    env = dict(os.environ)
    name = "%s-r%d" % (config, rep)
    kv_tl = os.path.join(out, "timelines", name + "-kv.csv")
    be_tl = os.path.join(out, "timelines", name + "-be.csv")
    items = args.store_mib * (1 << 20) // VALUE_BYTES
    kv_args = ["--items", str(items), "--value-bytes", str(VALUE_BYTES), "--hot-items-pct", str(args.hot_items_pct),
               "--hot-pct", str(args.hot_pct), "--set-pct", "10", "--warmup-s", str(args.warmup_s),
               "--measure-s", str(args.measure_s), "--seed", str(rep + 1), "--label", config, "--timeline", kv_tl]
    # GUPS outlives the store's run (it is stopped after it).
    be_args = ["--footprint-mib", str(args.be_mib), "--hot-size-pct", "100", "--warm-size-pct", "0",
               "--hot-pct", "100", "--warm-pct", "0", "--warmup-s", "0",
               "--measure-s", str(args.warmup_s + args.measure_s + 60), "--seed", str(rep + 1),
               "--timeline", be_tl]
    samples = []
    sock = None
    try:
        if config == "kernel":
            benchlib.cg_write(cg, "memory.limit_in_bytes", (args.fast_mib + 24) << 20)
            zram_on(1024)
        else:
            benchlib.cg_write(cg, "memory.limit_in_bytes", 3 << 30)
        if config.startswith("maxmem"):
            cfg = os.path.join(tmp, "agent.toml")
            with open(cfg, "w") as f:
                f.write('metrics_addr = "off"\n[tier]\nenabled = true\nfast_bytes = %d\n'
                        'migration_cap_bytes = %d\nsample_fmmr_error = %g\n' % (
                            args.fast_mib << 20, args.cap_kib << 10, args.sample_fmmr_error))
                if config == "maxmem-v0":
                    # Before the access estimator and the LS fault priority.
                    f.write('slots_per_window = 1\nlc_fault_priority = false\nbe_thread_nice = 0\n')
                elif config == "maxmem-v1":
                    # Before the BE tier threads' nice value.
                    f.write('be_thread_nice = 0\nbe_thread_idle = false\n')
                elif config == "maxmem-nice19":
                    # kv-idle-dev's name for nice 19 (the default since).
                    f.write('be_thread_idle = false\n')
                elif config == "maxmem-idle":
                    f.write('be_thread_idle = true\n')
                elif config == "maxmem-refault":
                    # Short-distance refaults counted as hotness samples.
                    f.write('refault_samples = true\n')
                for key, value in args.variants.get(config, []):
                    f.write('%s = %s\n' % (key, value))
            sock = os.path.join(tmp, "agent.sock")
            agent = subprocess.Popen(inc + [memcolo, "agent", "--config", cfg, "--socket", sock,
                                            "--state-dir", os.path.join(tmp, "state")],
                                     env=dict(env, MEMCOLO_LOG="warn"),
                                     stderr=open(os.path.join(out, "logs", name + "-agent.err"), "w"))
            procs.append(agent)
            for _ in range(300):
                if os.path.exists(os.path.join(tmp, "tier.sock")):
                    break
                time.sleep(0.1)
            env = dict(env, MEMCOLO_SOCKET=sock, MEMCOLO_TIER="1", MEMCOLO_TIER_THRESHOLD="64m",
                       LD_PRELOAD=lib)
            be_env, kv_env = dict(env, MEMCOLO_T_MISS="1"), dict(env, MEMCOLO_T_MISS=str(args.t_miss))
        else:
            be_env = kv_env = env
        if config.startswith("static"):
            kv_mib = static_mib(config, args)
            cap = ["--migration-cap-kib", str(args.cap_kib), "--sample-fmmr-error", str(args.sample_fmmr_error)]
            be_args += ["--manage", "maxmem", "--fast-mib", str(max(1, args.fast_mib - kv_mib)), "--t-miss", "1",
                        "--sample-fmmr-error", str(args.sample_fmmr_error)]
            kv_args += ["--manage", "maxmem", "--fast-mib", str(kv_mib)] + cap
        t_be = time.monotonic()
        if args.be_mib > 0:
            be = subprocess.Popen(inc + [gups] + be_args, env=be_env, stdout=subprocess.DEVNULL,
                                  stderr=open(os.path.join(out, "logs", name + "-be.err"), "w"))
            procs.append(be)
            time.sleep(BE_START_S)
        else:
            # The store alone (a diagnostic): a stand-in that has no memory of its own.
            be = subprocess.Popen(["sleep", "100000"])
            procs.append(be)
        t_kv = time.monotonic()
        kv = subprocess.Popen(inc + [kvstore] + kv_args, env=kv_env, stdout=subprocess.PIPE,
                              stderr=open(os.path.join(out, "logs", name + "-kv.err"), "w"), text=True)
        procs.append(kv)
        stop = threading.Event()

        def sampler():
            while not stop.wait(1.0):
                row = {"t": round(time.monotonic() - t_kv, 1), "kv_rss_kib": rss_kib(kv.pid),
                       "be_rss_kib": rss_kib(be.pid)}
                if config.startswith("maxmem"):
                    o = sh(memcolo, "tier", "status", "--json", "--socket", sock, check=False)
                    if o.returncode == 0:
                        for p in json.loads(o.stdout)["processes"]:
                            who = "kv" if p["pid"] == kv.pid else "be" if p["pid"] == be.pid else None
                            if who:
                                row[who + "_slow_faults"] = sum(r["slow_faults"] for r in p["regions"])
                                row[who + "_probation_hits"] = sum(r.get("probation_hits", 0) for r in p["regions"])
                                row[who + "_sample_hits"] = sum(r.get("sample_hits", 0) for r in p["regions"])
                                row[who + "_probation_pages"] = sum(r.get("probation_pages", 0) for r in p["regions"])
                                row[who + "_slow_fault_ns"] = sum(r.get("slow_fault_ns", 0) for r in p["regions"])
                                row[who + "_fault_wait_ns"] = sum(r.get("fault_thread_wait_ns", 0)
                                                                  for r in p["regions"])
                                for k in ("fault_thread_cpu_ns", "slow_load_ns", "slow_map_ns", "slow_drop_ns",
                                          "evict_threads_cpu_ns", "evict_threads_wait_ns", "evictions",
                                          "zero_faults"):
                                    row[who + "_" + k] = sum(r.get(k, 0) for r in p["regions"])
                                row[who + "_placement_ns"] = sum(r.get("placement_ns", 0) for r in p["regions"])
                                row[who + "_placement_max_ns"] = max([r.get("placement_max_ns", 0)
                                                                      for r in p["regions"]] or [0])
                                row[who + "_alloc_bytes"] = p["alloc_bytes"]
                                row[who + "_fast_bytes"] = p["fast_bytes"]
                                row[who + "_a_miss"] = p["a_miss"]
                                row[who + "_infeasible"] = p["infeasible"]
                samples.append(row)

        th = threading.Thread(target=sampler)
        th.start()
        change = {}
        if config == "maxmem-change":
            def changer():
                if stop.wait(args.change_at_s) or kv.poll() is not None:
                    return
                o = sh(memcolo, "tier", "target", "--pid", str(kv.pid), "--t-miss", str(args.change_t_miss),
                       "--socket", sock, check=False)
                change.update(t=round(time.monotonic() - t_kv, 1), t_miss=args.change_t_miss, rc=o.returncode)
            chg = threading.Thread(target=changer)
            chg.start()
        tracer = None
        if args.trace_s > 0:
            tracer = threading.Thread(target=trace_faults, args=(args, out, name, kv, stop))
            tracer.start()
        kv_out, _ = kv.communicate(timeout=args.warmup_s + args.measure_s + 120)
        stop.set()
        th.join()
        if tracer:
            tracer.join()
        if config == "maxmem-change":
            chg.join()
        rec = {"run": name, "config": config, "rep": rep, "rc": kv.returncode,
               "loadavg": open("/proc/loadavg").read().split()[:3], "samples": samples,
               "setup": {"fast_mib": args.fast_mib, "store_mib": args.store_mib, "be_mib": args.be_mib,
                         "hot_items_pct": args.hot_items_pct, "hot_pct": args.hot_pct, "t_miss": args.t_miss,
                         "cap_kib": args.cap_kib, "warmup_s": args.warmup_s, "measure_s": args.measure_s,
                         "sample_fmmr_error": args.sample_fmmr_error}}
        if config in args.variants:
            rec["variant"] = dict(args.variants[config])
        if change:
            rec["t_miss_change"] = change
        if kv.returncode == 0:
            rec.update(json.loads(kv_out.strip().splitlines()[-1]))
        # The measure phase, in seconds from the store's start: after init and warm-up.
        m0 = rec.get("init_s", 0) + args.warmup_s
        m1 = m0 + args.measure_s
        meas = [x for x in samples if m0 <= x["t"] <= m1 + 1] or samples[-int(args.measure_s):]
        if config.startswith("maxmem"):
            vals = [s["kv_fast_bytes"] for s in meas if "kv_fast_bytes" in s]
            rec["kv_fast_mib"] = statistics.mean(vals) / 2**20 if vals else None
            vals = [s["kv_a_miss"] for s in meas if "kv_a_miss" in s]
            rec["kv_a_miss"] = statistics.mean(vals) if vals else None
            # (Not the sample after the store exited: its region and counters are gone.)
            sf = [s for s in meas if s.get("kv_fast_bytes")]
            if len(sf) >= 2 and rec.get("ops_per_s"):
                rec["slow_faults_per_op"] = ((sf[-1]["kv_slow_faults"] - sf[0]["kv_slow_faults"]) /
                                             (rec["ops_per_s"] * (sf[-1]["t"] - sf[0]["t"])))
                if "kv_probation_hits" in sf[0]:
                    rec["probation_hits_per_op"] = ((sf[-1]["kv_probation_hits"] - sf[0]["kv_probation_hits"]) /
                                                    (rec["ops_per_s"] * (sf[-1]["t"] - sf[0]["t"])))
            # The agent's fault threads per slow fault over the measure phase: time
            # serving it, and the thread's wait for a CPU (all its events, per slow fault).
            for who in ("kv", "be"):
                sw = [s for s in meas if s.get(who + "_slow_fault_ns") is not None and s.get(who + "_fast_bytes")]
                if len(sw) >= 2:
                    n = sw[-1][who + "_slow_faults"] - sw[0][who + "_slow_faults"]
                    if n > 0:
                        rec[who + "_fault_serve_us"] = (sw[-1][who + "_slow_fault_ns"] -
                                                        sw[0][who + "_slow_fault_ns"]) / n / 1e3
                        rec[who + "_fault_wait_us"] = (sw[-1][who + "_fault_wait_ns"] -
                                                       sw[0][who + "_fault_wait_ns"]) / n / 1e3
                        rec[who + "_slow_faults_per_s"] = n / (sw[-1]["t"] - sw[0]["t"])
                        # Per-step wall time of a slow fault, and the threads' CPU time
                        # (schedstat run time) per slow fault and per eviction.
                        if who + "_fault_thread_cpu_ns" in sw[0]:
                            d = {k: sw[-1][who + "_" + k] - sw[0][who + "_" + k]
                                 for k in ("fault_thread_cpu_ns", "slow_load_ns", "slow_map_ns", "slow_drop_ns",
                                           "evict_threads_cpu_ns", "evict_threads_wait_ns", "evictions",
                                           "zero_faults")}
                            rec[who + "_fault_steps_us"] = {
                                "load": d["slow_load_ns"] / n / 1e3, "map": d["slow_map_ns"] / n / 1e3,
                                "drop": d["slow_drop_ns"] / n / 1e3,
                                "fault_thread_cpu": d["fault_thread_cpu_ns"] / n / 1e3,
                                "evictions_per_s": d["evictions"] / (sw[-1]["t"] - sw[0]["t"]),
                                "evict_cpu_per_eviction": d["evict_threads_cpu_ns"] / max(1, d["evictions"]) / 1e3,
                                "evict_wait_per_eviction": d["evict_threads_wait_ns"] / max(1, d["evictions"]) / 1e3,
                                "fault_thread_cpu_share": d["fault_thread_cpu_ns"] / 1e9 / (sw[-1]["t"] - sw[0]["t"]),
                                "evict_threads_cpu_share": d["evict_threads_cpu_ns"] / 1e9 / (sw[-1]["t"] - sw[0]["t"]),
                            }
                        if "kv_placement_ns" in sw[0] or "be_placement_ns" in sw[0]:
                            # Reporting faults to the placement (its lock, the policy's answer).
                            rec[who + "_placement_us"] = (sw[-1].get(who + "_placement_ns", 0) -
                                                          sw[0].get(who + "_placement_ns", 0)) / n / 1e3
                # The longest single report to the placement over the whole run.
                mx = [s.get(who + "_placement_max_ns", 0) for s in samples]
                if any(mx):
                    rec[who + "_placement_max_us"] = max(mx) / 1e3
            # When the store first met its target, and its fast memory then.
            met = next((s for s in samples if s.get("kv_a_miss", 1) <= args.t_miss and s["t"] > 2), None)
            rec["kv_first_met_s"] = met["t"] if met else None
            rec["kv_first_met_epochs"] = epochs_to_target(samples, 0, args.t_miss, first_epoch_after=2)
            if change:
                rec["t_miss_change"]["epochs_to_target"] = epochs_to_target(samples, change["t"], change["t_miss"])
        elif config.startswith("static"):
            rec["kv_fast_mib"] = static_mib(config, args)
        else:
            vals = [s["kv_rss_kib"] for s in meas]
            rec["kv_fast_mib"] = statistics.mean(vals) / 1024 if vals else None
        # GUPS over the store's measure phase (its timeline is timed from its start).
        off = t_kv - t_be
        be_rows = [r for r in read_csv(be_tl) if off + m0 <= float(r["t_s"]) <= off + m1]
        rec["be_mups"] = statistics.mean(float(r["mups"]) for r in be_rows) if be_rows else None
        return rec
    finally:
        # The workload first, reaped, so that the agent sees its connections close and
        # drops the regions of exited processes; then the agent.
        for p in reversed(procs):
            if sock and p is procs[0]:
                for _ in range(50):
                    o = sh(memcolo, "tier", "status", "--json", "--socket", sock, check=False)
                    if o.returncode != 0 or not json.loads(o.stdout)["processes"]:
                        break
                    time.sleep(0.1)
            try:
                p.send_signal(signal.SIGTERM if sock and p is procs[0] else signal.SIGKILL)
                p.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if config == "kernel":
            zram_off()
        shutil.rmtree(tmp, ignore_errors=True)


def trace_faults(args, out, name, kv, stop):
    """``--trace-s``: a system-wide perf trace of the scheduler and fault events for
    ``--trace-s`` seconds, ``--trace-at-s`` after the store started (in its measure
    phase), then ``faultpath.py``'s breakdown of the store's faults into
    ``traces/<run>.json`` (the trace itself is removed: it is large)."""
    if stop.wait(args.trace_at_s) or kv.poll() is not None:
        return
    os.makedirs(os.path.join(out, "traces"), exist_ok=True)
    data = os.path.join(out, "traces", name + ".data")
    subprocess.run(["perf", "record", "-q", "-a", "-o", data] + sum((["-e", e] for e in faultpath.EVENTS), []) +
                   ["--", "sleep", str(args.trace_s)], capture_output=True)
    res = faultpath.analyse(data, kv.pid)
    res["run"] = name
    with open(os.path.join(out, "traces", name + ".json"), "w") as f:
        json.dump(res, f, indent=1)
    if not os.environ.get("KEEP_TRACE"):
        os.unlink(data)


def epochs_to_target(samples, t0, t_miss, first_epoch_after=0):
    """Policy epochs (1 s) from time ``t0`` (s since the store started) until the
    store's a_miss, read once a second from the agent, is first <= ``t_miss``
    (``first_epoch_after``: ignore readings this close to ``t0``, before the store's
    first epoch); ``None`` if never. The agent's a_miss is the EWMA the policy acts
    on (MaxMem §3.1), so this is the issue's "a_miss <= t_miss within 10 epochs of
    each change", to within the 1 s of the reading."""
    for s in samples:
        if s["t"] > t0 + first_epoch_after and s.get("kv_a_miss") is not None and s["kv_a_miss"] <= t_miss:
            return round(s["t"] - t0)
    return None


def arrival_lower_bound(store_pages, hot_items_pct, hot_pct, cap_pages, t_miss, hold=True, most=80):
    """The fewest policy epochs in which a store arriving with no fast memory can reach
    a_miss <= t_miss under MaxMem, whatever the placement: an oracle that always has
    the store's hottest pages in fast memory. Its allotment grows by at most the
    migration cap per epoch (T3a gives at most the whole cap, §3.1 half of it), the
    allotment of epoch k is what the k - 1 epochs before it granted, and a_miss is the
    EWMA of T1 (λ = 0.5, the first epoch's ratio taken as is). The measured ratio of an
    epoch is at least the store's miss ratio of *accesses* with its hottest pages
    resident (the page-touch estimator only reads higher):
    ``x(A) = hot_pct·(H − A)⁺/H + (1 − hot_pct)·(N − H − (A − H)⁺)/(N − H)``.
    ``hold``: growth stops at the first epoch whose x meets t_miss (T3a's hold, the
    least memory); otherwise it goes on at the cap (the fewest epochs). Returns
    ``(epochs, allotment pages)``, or ``(None, pages)`` after ``most`` epochs.

    The KV bench's store (32768 pages, 23 % hot taking 90 %, t_miss 0.1) at the cap
    of 1024 pages (4 MiB): 12 epochs growing on (to 44 MiB), 15 holding at 32 MiB;
    the target is 10.

    >>> arrival_lower_bound(32768, 23, 90, 1024, 0.1, hold=False)
    (12, 11264)
    >>> arrival_lower_bound(32768, 23, 90, 1024, 0.1)
    (15, 8192)
    """
    n, h = store_pages, round(store_pages * hot_items_pct / 100)
    share = hot_pct / 100

    def x(a):
        return share * max(0, h - a) / h + (1 - share) * (n - h - min(max(0, a - h), n - h)) / (n - h)

    a_miss, alloc, held = None, 0, False
    for k in range(1, most + 1):
        r = x(alloc)
        a_miss = r if a_miss is None else (a_miss + r) / 2
        if a_miss <= t_miss:
            return k, alloc
        held = held or (hold and r <= t_miss)
        if not held:
            alloc = min(n, alloc + cap_pages)
    return None, alloc


def agent_rates(rec):
    """The store's slow faults and probation hits per request over the measure phase,
    from the agent's once-a-second counters (not the sample after the store exited:
    its region and counters are gone)."""
    st = rec["setup"]
    m0 = rec.get("init_s", 0) + st["warmup_s"]
    sf = [s for s in rec["samples"] if m0 <= s["t"] <= m0 + st["measure_s"] + 1 and s.get("kv_fast_bytes")]
    if len(sf) < 2 or not rec.get("ops_per_s"):
        return
    dt = rec["ops_per_s"] * (sf[-1]["t"] - sf[0]["t"])
    rec["slow_faults_per_op"] = (sf[-1]["kv_slow_faults"] - sf[0]["kv_slow_faults"]) / dt
    if "kv_probation_hits" in sf[0]:
        rec["probation_hits_per_op"] = (sf[-1]["kv_probation_hits"] - sf[0]["kv_probation_hits"]) / dt


def convergence_rows(by):
    """The targets table's rows for "every LS process reaches a_miss <= t_miss within
    10 epochs of each change": the store's arrival (every maxmem run) and a live
    t_miss change (``maxmem-change`` runs)."""
    rows = []
    arr = [r["kv_first_met_epochs"] for r in by.get("maxmem", []) + by.get("maxmem-change", [])
           if "kv_first_met_epochs" in r]
    if arr:
        worst = None if None in arr else max(arr)
        rows.append("| store's a_miss <= t_miss within 10 epochs of its arrival | %s (worst) | %s | %s |" % (
            "never" if worst is None else "%d epochs" % worst, ", ".join("never" if a is None else str(a) for a in arr),
            "missed" if worst is None else "met" if worst <= 10 else "missed by %d epochs" % (worst - 10)))
        st = (by.get("maxmem") or by.get("maxmem-change"))[0]["setup"]
        pages, cap = st["store_mib"] * 256, st["cap_kib"] // 4
        fast, grown = arrival_lower_bound(pages, st["hot_items_pct"], st["hot_pct"], cap, st["t_miss"], hold=False)
        held, at = arrival_lower_bound(pages, st["hot_items_pct"], st["hot_pct"], cap, st["t_miss"])
        rows.append("| ... the least any placement allows at this cap (an oracle with the hot set always "
                    "placed, `arrival_lower_bound`) | %s epochs growing at the cap (to %.0f MiB); %s holding "
                    "once the measured ratio meets t_miss (at %.0f MiB) | — | %s |" % (
                        fast, grown / 256, held, at / 256,
                        "the target is out of reach at this cap" if fast is None or fast > 10 else "within reach"))
    chg = [r["t_miss_change"] for r in by.get("maxmem-change", []) if r.get("t_miss_change")]
    if chg:
        ep = [c.get("epochs_to_target") for c in chg]
        worst = None if None in ep else max(ep)
        rows.append("| ... within 10 epochs of a t_miss change (0.1 -> %g at %g s) | %s (worst) | %s | %s |" % (
            chg[0]["t_miss"], chg[0]["t"], "never" if worst is None else "%d epochs" % worst,
            ", ".join("never" if e is None else str(e) for e in ep),
            "missed" if worst is None else "met" if worst <= 10 else "missed by %d epochs" % (worst - 10)))
    return rows


def overhead_row(d):
    """The targets table's row for "single-process management overhead <= 3 %" from a
    ``run.py`` GUPS overhead directory ``d`` (``off`` and ``maxmem`` runs): overhead by
    the means (1 - mean maxmem / mean off) and the paired median over rounds, as
    ``report.py`` computes them; the verdict is by the means and says where the
    paired median differs."""
    import report as gups_report
    try:
        runs = gups_report.load(d)
    except OSError:
        return []
    off = {gups_report.rnd(r): r["mups"] for r in runs if r["config"] == "off"}
    mm = {gups_report.rnd(r): r["mups"] for r in runs if r["config"] == "maxmem"}
    if not off or not mm:
        return []
    by_mean = 1 - statistics.mean(mm.values()) / statistics.mean(off.values())
    paired = statistics.median(1 - mm[k] / off[k] for k in mm if k in off)
    verdict = "met" if by_mean <= 0.03 else "missed by %.1f points" % (100 * (by_mean - 0.03))
    verdict += " (paired median: %s)" % ("met" if paired <= 0.03 else "missed by %.1f points" % (
        100 * (paired - 0.03)))
    return ["| single-process management overhead <= 3 %% (GUPS 1 GiB, fits; `%s`) | %.1f %% by the means "
            "(%d rounds), %.1f %% paired median | %s | %s |" % (
                os.path.relpath(d, ROOT), 100 * by_mean, len(mm), 100 * paired,
                ", ".join("%.1f %%" % (100 * (1 - mm[k] / off[k])) for k in sorted(mm) if k in off), verdict)]


def mean(rs, k):
    v = [r[k] for r in rs if r.get(k) is not None]
    return statistics.mean(v) if v else float("nan")


def report(out, overhead=None):
    runs = [json.loads(line) for line in open(os.path.join(out, "runs.jsonl"))]
    bad = [r for r in runs if r.get("rc") != 0]
    runs = [r for r in runs if r.get("rc") == 0]
    for r in runs:
        if r["config"].startswith("maxmem"):
            agent_rates(r)
    if not runs:
        print("no completed runs")
        return
    st = runs[0]["setup"]
    by = {}
    for r in runs:
        by.setdefault(r["config"], []).append(r)
    order = ["maxmem", "maxmem-refault", "maxmem-norefault", "maxmem-nice19", "maxmem-idle", "maxmem-v0", "maxmem-v1", "maxmem-change", "static", "kernel"]
    order += sorted(c for c in by if c.startswith("maxmem-") and c not in order)
    order += sorted((c for c in by if c.startswith("static-")), key=lambda c: int(c.split("-")[1]))
    hot_mib = st["store_mib"] * st["hot_items_pct"] / 100
    lines = ["# KV store (LS) beside GUPS (BE), MaxMem §5.2 scaled: %s" % os.path.relpath(out, ROOT), "",
             "TARGETS", "",
             "Fast memory %d MiB shared; the store %d MiB of 4 KiB values, %g %% of the keys (%.1f MiB) take "
             "%g %% of the requests, 10 %% SETs, one closed-loop client; GUPS %d MiB uniform, one thread. "
             "MaxMem: store t_miss = %g, GUPS t_miss = 1, migration cap %d KiB per 1 s epoch. "
             "Warm-up %g s, %g s measured. The static partition (`static`) gives the store %d MiB: all of the "
             "fast memory less 1 MiB for GUPS, as the paper sized HeMem's partition for FlexKVS (its hot set "
             "fits with room to spare). `static-N` are other sizes of the store's partition."
             % (st["fast_mib"], st["store_mib"], st["hot_items_pct"], hot_mib, st["hot_pct"], st["be_mib"],
                st["t_miss"], st["cap_kib"], st["warmup_s"], st["measure_s"],
                by["static"][0]["kv_fast_mib"] if by.get("static") else st["fast_mib"] - 1), "",
             "| config | runs | ops/s | p50 µs | p90 µs | p99 µs | p99.9 µs | store's fast MiB | store a_miss "
             "| slow faults / op | GUPS MUPS | errors |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in order:
        rs = by.get(c, [])
        if not rs:
            continue
        lines.append("| %s | %d | %.0f | %.1f | %.1f | %.1f | %.0f | %.1f | %s | %s | %.2f | %d |" % (
            c, len(rs), mean(rs, "ops_per_s"), mean(rs, "p50_us"), mean(rs, "p90_us"), mean(rs, "p99_us"),
            mean(rs, "p999_us"), mean(rs, "kv_fast_mib"),
            "%.3f" % mean(rs, "kv_a_miss") if c.startswith("maxmem") else "—",
            "%.4f" % mean(rs, "slow_faults_per_op") if c != "kernel" else "—",
            mean(rs, "be_mups"), sum(r.get("errors", 0) for r in rs)))
    targets = []
    if by.get("maxmem") and by.get("static"):
        # Paired by repetition (the runs of a repetition ran back to back), then the mean.
        reps = sorted({r["rep"] for r in by["maxmem"]} & {r["rep"] for r in by["static"]})
        pairs = []
        for k in reps:
            a = next(r for r in by["maxmem"] if r["rep"] == k)
            b = next(r for r in by["static"] if r["rep"] == k)
            pairs.append((a["ops_per_s"] / b["ops_per_s"], a["kv_fast_mib"] / b["kv_fast_mib"],
                          a["p90_us"] / b["p90_us"], a["p99_us"] / b["p99_us"]))
        tput = statistics.mean(p[0] for p in pairs)
        mem = statistics.mean(p[1] for p in pairs)
        p90 = statistics.mean(p[2] for p in pairs)
        p99 = statistics.mean(p[3] for p in pairs)
        targets = [
            "| target (issue 6: the store under MaxMem vs the hand-sized static partition) | measured "
            "(mean of %d paired repetitions) | per repetition | verdict |" % len(pairs),
            "|---|---|---|---|",
            "| throughput within 5 %% of static (>= 95 %%) | %.1f %% | %s | %s |" % (
                100 * tput, ", ".join("%.1f %%" % (100 * p[0]) for p in pairs),
                "met" if tput >= 0.95 else "missed by %.1f points" % (100 * (0.95 - tput))),
            "| fast memory >= 30 %% less than static (<= 70 %%) | %.1f %% (%.1f %% less) | %s | %s |" % (
                100 * mem, 100 * (1 - mem), ", ".join("%.1f %%" % (100 * p[1]) for p in pairs),
                "met" if mem <= 0.70 else "missed by %.1f points" % (100 * (mem - 0.70))),
            ] + convergence_rows(by) + (overhead_row(overhead) if overhead else []) + [
            "| p90 / p99 latency (reported, no target) | %.2fx / %.2fx of static's | %s | — |" % (
                p90, p99, ", ".join("%.2fx / %.2fx" % (p[2], p[3]) for p in pairs)),
            ""]
        lines += ["", "**Target** (MaxMem vs the hand-sized static partition, mean of %d paired repetitions): "
                  "throughput **%.1f %%** of static (target >= 95 %%: %s), store's fast memory **%.1f %%** of "
                  "static, i.e. %.1f %% less (target >= 30 %% less: %s); p90 %.2fx, p99 %.2fx of static's." % (
                      len(pairs), 100 * tput, "met" if tput >= 0.95 else "missed",
                      100 * mem, 100 * (1 - mem), "met" if mem <= 0.70 else "missed",
                      statistics.mean(p[2] for p in pairs), statistics.mean(p[3] for p in pairs)),
                  "Per repetition (throughput ratio, memory ratio): " +
                  ", ".join("r%d %.3f / %.3f" % (k, p[0], p[1]) for k, p in zip(reps, pairs))]
        met = [r["kv_first_met_s"] for r in by["maxmem"] if r.get("kv_first_met_s") is not None]
        if met:
            lines.append("Under MaxMem the store first reached a_miss <= t_miss %s s after it started." %
                         " / ".join("%.0f" % m for m in met))
    k = lines.index("TARGETS")
    lines[k:k + 2] = targets
    lines += ["", "Every run (load average when it ended):", ""]
    for r in runs:
        lines.append("- `%s`: %.0f ops/s, p90 %d µs, p99 %d µs, store fast %.1f MiB, GUPS %.2f MUPS, load %s" % (
            r["run"], r["ops_per_s"], r["p90_us"], r["p99_us"], r.get("kv_fast_mib") or float("nan"),
            r.get("be_mups") or float("nan"), " ".join(r["loadavg"])))
        if r.get("kv_fault_serve_us") is not None:
            lines[-1] += ("; agent per slow fault: store %.1f µs served + %.1f µs fault thread waiting "
                          "(%.0f/s), GUPS %.1f + %.1f µs (%.0f/s)" % (
                              r["kv_fault_serve_us"], r["kv_fault_wait_us"], r["kv_slow_faults_per_s"],
                              r.get("be_fault_serve_us", float("nan")), r.get("be_fault_wait_us", float("nan")),
                              r.get("be_slow_faults_per_s", float("nan"))))
        steps = r.get("fault_steps_us")
        if steps:
            # The store's own in-process manager (a static partition).
            lines[-1] += ("; store in-process per slow fault: %.1f µs served (load %.1f, map %.1f, drop %.1f) + "
                          "%.1f µs fault thread waiting, fault thread CPU %.1f µs (%.0f %% of a CPU), eviction "
                          "workers %.1f µs CPU + %.1f µs waiting per eviction (%.0f/s, %.0f %% of a CPU)" % (
                              steps["serve"], steps["load"], steps["map"], steps["drop"], steps["fault_thread_wait"],
                              steps["fault_thread_cpu"], 100 * steps["fault_thread_cpu_share"],
                              steps["evict_cpu_per_eviction"], steps["evict_wait_per_eviction"], steps["evictions_per_s"],
                              100 * steps["evict_threads_cpu_share"]))
        for who, label in (("kv", "store"), ("be", "GUPS")):
            steps = r.get(who + "_fault_steps_us")
            if steps:
                lines[-1] += ("; %s per slow fault: load %.1f, map %.1f, drop %.1f µs wall, fault thread CPU %.1f µs "
                              "(%.0f %% of a CPU), eviction workers %.1f µs CPU + %.1f µs waiting per eviction "
                              "(%.0f/s, %.0f %% of a CPU)" % (
                                  label, steps["load"], steps["map"], steps["drop"], steps["fault_thread_cpu"],
                                  100 * steps["fault_thread_cpu_share"], steps["evict_cpu_per_eviction"],
                                  steps["evict_wait_per_eviction"], steps["evictions_per_s"],
                                  100 * steps["evict_threads_cpu_share"]))
        if r.get("kv_placement_max_us") is not None:
            lines[-1] += ("; fault reports to the placement: store %.2f µs per slow fault (longest %.0f µs), "
                          "GUPS %.2f µs (longest %.0f µs)" % (
                              r.get("kv_placement_us", float("nan")), r["kv_placement_max_us"],
                              r.get("be_placement_us", float("nan")), r.get("be_placement_max_us", float("nan"))))
    for r in bad:
        lines.append("- `%s`: failed (exit %s), see logs/" % (r["run"], r.get("rc")))
    lines += ["", "![throughput and latency against fast memory](plots/kv-vs-fast.png)", "",
              "![per second](plots/kv-timeline.png)"]
    plots(out, by, order, st)
    open(os.path.join(out, "report.md"), "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))
    benchlib.publish(HERE, "kv", out, command="/usr/bin/python3 bench/tiering/kv.py --report-only",
                     figures=["plots/kv-vs-fast.png"])


def plots(out, by, order, st):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plots")
        return
    os.makedirs(os.path.join(out, "plots"), exist_ok=True)
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    statics = [c for c in order if c.startswith("static") and by.get(c)]
    statics.sort(key=lambda c: mean(by[c], "kv_fast_mib"))
    style = {"maxmem": ("tab:red", "o"), "kernel": ("tab:grey", "s")}
    for i, (key, label) in enumerate([("ops_per_s", "store ops/s"), ("p99_us", "store p99 µs")]):
        a = ax[i]
        a.plot([mean(by[c], "kv_fast_mib") for c in statics], [mean(by[c], key) for c in statics],
               "-^", color="tab:blue", label="static partition")
        for c in statics:
            for r in by[c]:
                a.plot(r["kv_fast_mib"], r[key], ".", color="tab:blue", alpha=0.4)
        for c in ("maxmem", "kernel"):
            for r in by.get(c, []):
                a.plot(r["kv_fast_mib"], r[key], style[c][1], color=style[c][0],
                       label=c if r is by[c][0] else None)
        a.axvline(st["store_mib"] * st["hot_items_pct"] / 100, color="k", ls=":", lw=1)
        a.set_xlabel("store's fast memory, MiB (dotted: hot set)")
        a.set_ylabel(label)
        a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "plots", "kv-vs-fast.png"), dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    for c in [c for c in ("maxmem", "static", "kernel") if by.get(c)]:
        r = by[c][0]
        rows = read_csv(os.path.join(out, "timelines", r["run"] + "-kv.csv"))
        ax[0].plot([float(x["t_s"]) for x in rows], [float(x["ops_per_s"]) for x in rows], lw=1, label=c)
    ax[0].set_ylabel("store ops/s")
    ax[0].legend(fontsize=8)
    if by.get("maxmem"):
        r = by["maxmem"][0]
        s = [x for x in r["samples"] if "kv_alloc_bytes" in x]
        ax[1].plot([x["t"] for x in s], [x["kv_alloc_bytes"] / 2**20 for x in s], label="store (maxmem)")
        ax[1].plot([x["t"] for x in s], [x.get("be_alloc_bytes", 0) / 2**20 for x in s], label="GUPS (maxmem)")
        ax[1].axhline(mean(by["static"], "kv_fast_mib") if by.get("static") else 0, color="tab:blue", ls="--",
                      lw=1, label="store (static)")
        ax[2].plot([x["t"] for x in s], [x["kv_a_miss"] for x in s], label="store a_miss")
        ax[2].axhline(st["t_miss"], color="k", ls=":", lw=1)
    ax[1].set_ylabel("fast memory allotted, MiB")
    ax[1].legend(fontsize=8)
    ax[2].set_ylabel("a_miss (t_miss dotted)")
    ax[2].set_xlabel("s since the store started (first repetition)")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "plots", "kv-timeline.png"), dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "out", "tiering", "kv"))
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--configs", default="maxmem,static,kernel")
    ap.add_argument("--static-sweep", default="", help="store partitions to add, MiB (e.g. 30,36,44)")
    ap.add_argument("--fast-mib", type=int, default=52, help="fast memory for both (MaxMem's 128 GB / 2560)")
    ap.add_argument("--static-kv-mib", type=int, default=51,
                    help="the hand-sized partition of the store (all fast memory but 1 MiB, as in §5.2)")
    ap.add_argument("--store-mib", type=int, default=128, help="the store's footprint (FlexKVS's 320 GB / 2560)")
    ap.add_argument("--hot-items-pct", type=float, default=23)
    ap.add_argument("--hot-pct", type=float, default=90)
    ap.add_argument("--be-mib", type=int, default=100, help="GUPS's table (256 GB / 2560); 0: no BE")
    ap.add_argument("--t-miss", type=float, default=0.1)
    ap.add_argument("--cap-kib", type=int, default=4096,
                    help="migrations per epoch: MaxMem §5.4's 10 GB/s / 2560 (§3.1's 4 GB / 2560 is 1664)")
    ap.add_argument("--sample-fmmr-error", type=float, default=0.01,
                    help="the sampler's FMMR error target, agent and in-process alike (0: 16 hits per window)")
    ap.add_argument("--warmup-s", type=float, default=100)
    ap.add_argument("--measure-s", type=float, default=30)
    ap.add_argument("--budget-s", type=float, default=300, help="start no run after this many seconds")
    ap.add_argument("--trace-s", type=float, default=0,
                    help="trace the store's faults for this many seconds (faultpath.py; a diagnostic, off)")
    ap.add_argument("--trace-at-s", type=float, default=115, help="when, in seconds after the store started")
    ap.add_argument("--change-t-miss", type=float, default=0.07,
                    help="maxmem-change runs: set the store's t_miss to this, live, --change-at-s after it started")
    ap.add_argument("--change-at-s", type=float, default=60)
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=VALUE[,KEY=VALUE]",
                    help="a further maxmem configuration NAME (it must start with 'maxmem-') with these "
                         "agent [tier] settings, e.g. maxmem-p1024:probation_pages=1024; list NAME in --configs")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--overhead", default=None,
                    help="a run.py GUPS overhead result directory: its target joins the report's first table")
    args = ap.parse_args()
    args.variants = parse_variants(args.variant, ap)
    out = args.out
    if args.report_only:
        report(out, args.overhead)
        return
    if os.geteuid() != 0:
        raise SystemExit("needs root")
    for d in ("timelines", "logs"):
        os.makedirs(os.path.join(out, d), exist_ok=True)
    benchlib.record_machine(out, " ".join(sys.argv))
    rel = os.path.join(ROOT, "target", "release")
    tmp = tempfile.mkdtemp(prefix="memcolo-kvbin-")
    lib = os.path.join(tmp, "libtier.so")
    subprocess.run(["cc", "-std=gnu11", "-O2", "-fPIC", "-shared", "-fvisibility=hidden", "-pthread",
                    os.path.join(ROOT, "alloc", "src", "tier.c"), "-o", lib], check=True)
    # Copies: the target directory is shared, and a rebuild must not swap a binary out
    # from under a run.
    bins = []
    for b in ("memcolo", "gups", "kvstore"):
        shutil.copy2(os.path.join(rel, b), os.path.join(tmp, b))
        bins.append(os.path.join(tmp, b))
    bins = tuple(bins) + (lib,)
    log = benchlib.RunLog(out)
    cg = os.path.join(benchlib.CG_ROOT + benchlib.own_memory_cgroup(), "memcolo-tiering-kv-%d" % os.getpid())

    def cleanup(*_):
        zram_off()
        benchlib.cg_remove(cg)
        shutil.rmtree(tmp, ignore_errors=True)
        sys.exit(130)

    signal.signal(signal.SIGTERM, cleanup)
    signal.signal(signal.SIGINT, cleanup)
    budget = benchlib.Budget(args.budget_s)
    configs = [c for c in args.configs.split(",") if c]
    configs += ["static-%d" % int(m) for m in args.static_sweep.split(",") if m]
    runs, left = benchlib.pending(configs, args.reps, log, budget)
    try:
        for c, rep, rid in runs:
            os.makedirs(cg, exist_ok=True)
            print("run", rid, flush=True)
            rec = one(c, rep, args, bins, cg)
            log.append(rec)
            print("  -> %s ops/s p99 %s us, store fast %s MiB" % (
                rec.get("ops_per_s"), rec.get("p99_us"), rec.get("kv_fast_mib")), flush=True)
            benchlib.cg_remove(cg)
    finally:
        benchlib.cg_remove(cg)
        shutil.rmtree(tmp, ignore_errors=True)
    report(out, args.overhead)
    if left():
        print("%d runs left: run again" % left())
        sys.exit(3)
    print("all runs done")


if __name__ == "__main__":
    main()
