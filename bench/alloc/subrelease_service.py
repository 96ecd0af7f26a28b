"""A service whose demand rises and falls (TCMalloc ISMM'21 §5.1, with Python as the
service: its 1 KiB values are malloc'ed): add 200 K entries of 1 KiB, wait 5 s, remove
them, ten times. Samples libmemcolo's telemetry (memcolo_stats via ctypes, the library
being preloaded) and the kernel's view (AnonHugePages / Rss of smaps_rollup) every
0.25 s into a CSV: t_s, phase, used, mapped, free_backed, realized_frag, coverage,
anon_huge_kib, rss_kib, heap_anon_huge_kib, heap_rss_kib (the kernel's view of the
heap's anonymous mappings of >= 2 MiB), skipped, skipped_correct, hg_anon_huge_kib,
hg_rss_kib (the part of those mappings that is MADV_HUGEPAGE: with MEMCOLO_THP=2 the page
heap and the large-block regions; the rest is libmemcolo's metadata and thread stacks).

The interpreter runs with PYTHONMALLOC=malloc (the script re-executes itself with it):
by default CPython's objects of <= 512 bytes (here the keys' tuples and ints) live in its
own 1 MiB arenas, mmapped directly and never seen by malloc. Adjacent arenas merge into
anonymous mappings of >= 2 MiB, so the kernel's view counted them as heap: 5.9 % of the
heap's RSS at a peak (37 of 634 MiB, attributed per mapping with strace -k), most of the
7 % not in THPs. ISMM'21 §5 measures the allocator's heap; with every allocation going
through malloc the whole service's memory is that heap.

After the cycles the service idles TAIL_S seconds (phase "tail", default 0) with its
base entries only: realized fragmentation (ISMM'21 §3.2: the least free-and-mapped memory
over the last T_schedule) is what stays free for a whole T_schedule, and while the
cycles run every peak uses nearly all mapped memory, so only a tail of at least
T_schedule shows what the allocator keeps free once demand stays low.
usage: subrelease_service.py OUT.csv [CYCLES] [ENTRIES] [WAIT_S] [TAIL_S]"""
import csv
import ctypes
import os
import statistics
import sys
import threading
import time

# What run_bench.py runs: the paper's experiment (ISMM'21 §5.1: ten cycles, a 5 s wait,
# T_schedule = 5 min, libmemcolo's default) with a tail long enough that the run covers
# T_schedule: realized fragmentation is then read over windows that hold the whole
# fluctuating part and the low demand after it. A shorter T_schedule (90 s, used before)
# straddles the ~35 s in which Delta = 60 s returns the last trough, so for those seconds
# the Delta = 60 arm's window minimum is the peaks' free memory while the Delta = 0 arm's
# is the tail's (0.11-0.14 against 0.04 MiB): a reading of when the window ends, not of
# what either arm keeps free for a whole T_schedule. It is still recomputed offline (90).
T_SCHEDULE_S = 300
TAIL_S = 250
CYCLES, WAIT_S = 10, "5"
OFFLINE_T_S = (10, 30, 60, 90)  # realized fragmentation recomputed from the samples (summarize)
IN_CYCLES_T_S = 30  # ... and over windows inside the cycles only: the peaks' free memory


class Stats(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("reservation_on", ctypes.c_uint32)] + [
        (n, ctypes.c_uint64) for n in (
            "mapped", "used", "free_backed", "released", "hugepages_total", "hugepages_broken")
    ] + [("coverage", ctypes.c_double)] + [
        (n, ctypes.c_uint64) for n in (
            "released_total", "subreleased", "realized_frag", "average_frag", "skipped",
            "skipped_correct", "skipped_incorrect", "reserve_target", "prefaulted", "pool",
            "reserve_hits", "reserve_misses", "pool_hits", "pool_misses", "slow", "large",
            "mmaps", "threads")
    ]


def smaps():
    vals = {}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and parts[0] in ("Rss:", "AnonHugePages:"):
                vals[parts[0][:-1]] = int(parts[1])
    return vals.get("AnonHugePages", 0), vals.get("Rss", 0)


def parse_heap_smaps(lines):
    """The kernel's view of the heap from /proc/PID/smaps lines: (AnonHugePages, Rss,
    AnonHugePages of MADV_HUGEPAGE mappings, Rss of those) in KiB, summed over anonymous
    mappings of at least 2 MiB (libmemcolo maps its heap in huge-page multiples and its
    metadata in 2 MiB chunks; the libraries are file-backed)."""
    huge = rss = hg_huge = hg_rss = 0
    cur = None  # [huge, rss] of the mapping being read, None if not taken
    for line in lines:
        head = line.split(None, 6)
        if not head:
            continue
        if "-" in head[0] and len(head) >= 5 and ":" in head[3]:
            lo, hi = (int(x, 16) for x in head[0].split("-"))
            cur = [0, 0] if len(head) < 6 and hi - lo >= 2 << 20 else None
        elif cur is not None and head[0] == "Rss:":
            cur[1] = int(head[1])
            rss += cur[1]
        elif cur is not None and head[0] == "AnonHugePages:":
            cur[0] = int(head[1])
            huge += cur[0]
        elif cur is not None and head[0] == "VmFlags:":
            if "hg" in line.split()[1:]:
                hg_huge += cur[0]
                hg_rss += cur[1]
    return huge, rss, hg_huge, hg_rss


def heap_smaps():
    with open("/proc/self/smaps") as f:
        return parse_heap_smaps(f)


def main():
    if os.environ.get("PYTHONMALLOC") != "malloc":
        os.execve(sys.executable, [sys.executable] + sys.argv, dict(os.environ, PYTHONMALLOC="malloc"))
    out = sys.argv[1]
    cycles = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    entries = int(sys.argv[3]) if len(sys.argv) > 3 else 200_000
    wait_s = float(sys.argv[4]) if len(sys.argv) > 4 else 5.0
    tail_s = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
    lib = ctypes.CDLL(None)
    try:
        stats_fn = lib.memcolo_stats
    except AttributeError:
        sys.exit("libmemcolo is not preloaded (memcolo_stats not found)")
    stats_fn.argtypes = [ctypes.POINTER(Stats)]
    rows = []
    phase = ["start"]
    t0 = time.monotonic()
    stop = threading.Event()

    def sampler():
        st = Stats()
        while not stop.is_set():
            stats_fn(ctypes.byref(st))
            ah, rss = smaps()
            hh, hrss, gh, grss = heap_smaps()
            rows.append((time.monotonic() - t0, phase[0], st.used, st.mapped, st.free_backed,
                         st.realized_frag, st.coverage, ah, rss, hh, hrss, st.skipped,
                         st.skipped_correct, gh, grss))
            stop.wait(0.25)

    th = threading.Thread(target=sampler)
    th.start()
    store = {}
    base = b"v" * 1024
    for i in range(entries):  # pre-populate, as the paper does
        store[("base", i)] = bytes(base[:1023]) + bytes([i & 0xFF])
    for c in range(cycles):
        phase[0] = "add"
        for i in range(entries):
            store[(c, i)] = bytes(base[:1023]) + bytes([i & 0xFF])
        phase[0] = "wait"
        time.sleep(wait_s)
        phase[0] = "remove"
        for i in range(entries):
            del store[(c, i)]
        phase[0] = "idle"
        time.sleep(0.5)
    if tail_s > 0:
        phase[0] = "tail"
        time.sleep(tail_s)
    phase[0] = "end"
    time.sleep(0.5)
    stop.set()
    th.join()
    with open(out, "w") as f:
        f.write("t_s,phase,used_bytes,mapped_bytes,free_backed_bytes,realized_frag_bytes,coverage,"
                "anon_huge_kib,rss_kib,heap_anon_huge_kib,heap_rss_kib,skipped_bytes,"
                "skipped_correct_bytes,hg_anon_huge_kib,hg_rss_kib\n")
        for r in rows:
            f.write("%.3f,%s,%d,%d,%d,%d,%.4f,%d,%d,%d,%d,%d,%d,%d,%d\n" % r)


def realized_offline(rows, t_schedule_s, t_from=None, t_to=None):
    """Realized fragmentation recomputed from the samples (ISMM'21 §3.2 closed form):
    for each sample at t >= T_schedule, the least free_backed_bytes over the samples in
    [t - T_schedule, t]; returns (max over t, value at the last sample) in bytes. The
    samples (every 0.25 s) miss dips between them, so this is an upper bound of what the
    library's epochs (every change) give for the same T_schedule. With t_from/t_to (s),
    only windows lying inside [t_from, t_to] count; (0, 0) when none does."""
    t = [float(r["t_s"]) for r in rows]
    f = [int(r["free_backed_bytes"]) for r in rows]
    vals = []
    lo = 0
    for i in range(len(rows)):
        while t[lo] < t[i] - t_schedule_s:
            lo += 1
        inside = (t_from is None or t[i] - t_schedule_s >= t_from) and (t_to is None or t[i] <= t_to)
        if t[i] >= t_schedule_s and inside:
            vals.append(min(f[lo:i + 1]))
    return (max(vals), vals[-1]) if vals else (0, 0)


def summarize(path, delta, t_schedule_s):
    """One arm's summary row from its CSV. Coverage and average fragmentation over the
    fluctuating part (phases before the tail); realized fragmentation (libmemcolo's, over
    its MEMCOLO_T_SCHEDULE_S) at the end and its maximum over the samples at t >=
    T_schedule (earlier the series is shorter than T_schedule and holds the start, where
    nothing is free); the offline recomputation for shorter T_schedule values."""
    with open(path) as fh:
        rows = list(csv.DictReader(fh))
    cyc = [r for r in rows if r["phase"] not in ("tail", "end")]
    tail = [r for r in rows if r["phase"] == "tail"]
    used = [r for r in cyc if int(r["used_bytes"]) > 0]
    cov = [float(r["coverage"]) for r in used]
    kern = [int(r["anon_huge_kib"]) / max(1, int(r["rss_kib"])) for r in cyc]
    heap = [int(r["heap_anon_huge_kib"]) / int(r["heap_rss_kib"]) for r in used if int(r["heap_rss_kib"]) > 0]
    hg = [int(r["hg_anon_huge_kib"]) / int(r["hg_rss_kib"]) for r in used
          if int(r.get("hg_rss_kib") or 0) > 0]
    covered = [int(r["realized_frag_bytes"]) for r in rows if float(r["t_s"]) >= t_schedule_s]
    mib = 2**20
    out = {"delta_s": delta, "coverage_mean": statistics.mean(cov), "coverage_min": min(cov),
           "kernel_anonhuge_share_mean": statistics.mean(kern),
           "kernel_heap_huge_share_mean": statistics.mean(heap),
           "kernel_heap_huge_share_min": min(heap),
           "kernel_hg_huge_share_mean": statistics.mean(hg) if hg else "",
           "other_anon_rss_mib_end": (int(cyc[-1]["heap_rss_kib"]) - int(cyc[-1].get("hg_rss_kib") or 0)) / 1024,
           "avg_fragmentation_mib": statistics.mean(int(r["free_backed_bytes"]) for r in cyc) / mib,
           "t_schedule_s": t_schedule_s,
           "tail_s": (float(tail[-1]["t_s"]) - float(tail[0]["t_s"])) if tail else 0.0,
           "run_s": float(rows[-1]["t_s"]),
           "realized_fragmentation_mib_end": int(rows[-1]["realized_frag_bytes"]) / mib,
           "realized_fragmentation_mib_max": max(covered) / mib if covered else "",
           "skipped_mib": int(rows[-1]["skipped_bytes"]) / mib,
           "skipped_correct_mib": int(rows[-1]["skipped_correct_bytes"]) / mib}
    for ts in OFFLINE_T_S:
        mx, end = realized_offline(rows, ts)
        out[f"realized_offline_t{ts}_mib_max"] = mx / mib
        out[f"realized_offline_t{ts}_mib_end"] = end / mib
    # While demand fluctuates: windows from the first add to the last sample before the tail.
    first_add = next((float(r["t_s"]) for r in rows if r["phase"] == "add"), None)
    last_cyc = float(cyc[-1]["t_s"])
    fits = first_add is not None and last_cyc - first_add >= IN_CYCLES_T_S
    mx, _ = realized_offline(rows, IN_CYCLES_T_S, first_add, last_cyc) if fits else (0, 0)
    out[f"realized_in_cycles_t{IN_CYCLES_T_S}_mib_max"] = mx / mib if fits else ""
    return out


if __name__ == "__main__":
    main()
