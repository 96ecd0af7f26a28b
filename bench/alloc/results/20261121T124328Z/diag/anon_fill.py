#!/usr/bin/python3
"""Fill under anonymous pressure: run_bench.py's anon condition (1.5 GiB scratch group held
at its limit by stress-ng, zram swap); paced 256 KiB (250 us and 1 ms) with MEMCOLO_RSV_TRACE=1
for MEMCOLO_RSV_BACKOFF 0/1/2, interleaved reps; per run: latency quantiles, the fill rate the
management thread achieved (pre-faulted bytes / time while the pool was below its target),
demand rate, pool misses, the process's VmLck sampled every 20 ms (mlock holds?), and the
memory.stat pgmajfault of the group. usage: anon_fill.py OUTDIR REPS"""
import os, subprocess, sys, time, threading
sys.path.insert(0, "/work/main/bench/alloc"); sys.path.insert(0, "/work/main/bench")
import run_bench
from benchlib import zram_on, zram_off, cpu_times
out, reps = sys.argv[1], int(sys.argv[2])
os.makedirs(out, exist_ok=True)
HB = "/tmp/alc/hermes_bench"; LIB = "/tmp/alc/libmemcolo.so"
limit = int(1.5 * (1 << 30))
cg = run_bench.ScratchCgroup("mcfill-anon", limit)
zram_on(4096)
try:
    cg.spawn(["stress-ng", "--vm", "1", "--vm-bytes", str(limit // 2**20) + "M", "--vm-keep", "--timeout", "900"])
    time.sleep(6)
    variants = [("jemalloc", {"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"})] + [
        (f"bo{b}", {"LD_PRELOAD": LIB, "MEMCOLO_CLASS": "lc", "MEMCOLO_AGENT": "0", "MEMCOLO_RSV_TRACE": "1",
                    "MEMCOLO_RSV_BACKOFF": str(b)}) for b in (0, 1, 2)]
    for rep in range(reps):
        for pace in (250_000, 1_000_000):
            for name, extra in variants:
                env = {k: v for k, v in os.environ.items() if not k.startswith("MEMCOLO_")}
                env.update(extra)
                tag = f"{name}-{pace // 1000}us-r{rep}"
                env["HERMES_RAW"] = f"{out}/raw-{tag}.csv"
                i0, a0 = cpu_times()
                p = subprocess.Popen([HB, "262144", str(256 << 20), "paced", str(pace), "", "0"], env=env,
                                     preexec_fn=cg.preexec(), stdout=subprocess.PIPE, stderr=open(f"{out}/trace-{tag}.txt", "w"), text=True)
                lck = []
                while p.poll() is None:
                    try:
                        for line in open(f"/proc/{p.pid}/status"):
                            if line.startswith("VmLck"):
                                lck.append(int(line.split()[1]))
                    except OSError:
                        pass
                    time.sleep(0.02)
                o = p.stdout.read().strip().split(",")
                i1, a1 = cpu_times()
                busy = 1 - (i1 - i0) / max(1, a1 - a0)
                # fill rate from the trace
                rows = [l.strip().split(",") for l in open(f"{out}/trace-{tag}.txt") if l.startswith("rsv_trace,") and l[10].isdigit()]
                fill = dem = "-"
                misses = "-"
                if len(rows) > 2:
                    t = [int(r[1]) for r in rows]; pre = [int(r[6]) for r in rows]; d = [int(r[7]) for r in rows]
                    behind_t = behind_b = 0
                    for k in range(1, len(rows)):
                        if int(rows[k - 1][4]) < int(rows[k - 1][5]):  # pool below target at the start of the round
                            behind_t += t[k] - t[k - 1]; behind_b += pre[k] - pre[k - 1]
                    fill = f"{behind_b / max(1, behind_t) / 1000:.2f}"  # GB/s while behind
                    dem = f"{(d[-1] - d[0]) / max(1, t[-1] - t[0]) / 1000:.2f}"
                    misses = rows[-1][8]
                print(f"{tag:22} p50 {float(o[2]):8.1f} p99 {float(o[4]):9.1f} max {float(o[6]):9.1f} us  fill_when_behind {fill} GB/s"
                      f" demand {dem} GB/s misses {misses} VmLck max {max(lck) if lck else '-'} KiB busy {busy:.2f} load {open('/proc/loadavg').read().split()[0]}", flush=True)
finally:
    cg.close()
    zram_off()
