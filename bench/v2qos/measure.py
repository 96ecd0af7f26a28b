"""BE growth in the red zone and LC protection on cgroup v2: `memory.high` on the BE
group and `memory.low` / `memory.min` on the LC group, against what M3 does alone.

Runs inside the cgroup v2 guest of scripts/v2bed (as root, the memory controller
delegated by the root group); see README.md beside this file. Each round makes a
scope group below /sys/fs/cgroup with `memory.max` 512 MiB (the node), an `lc` and a
`be` child, and zram swap; then for ROUND_S seconds

  - an LC process holds a 128 MiB working set and serves: every 10 ms it allocates
    and touches 1 MiB (timed: an allocation), then touches 64 random pages of its
    working set (timed: a request), and frees the MiB;
  - a BE hog allocates and touches 1 MiB every 2 ms and never frees (its progress is
    the MiB it allocated);
  - a controller, polling once a second like the agent (M3 §6), reads the scope's
    working set (memory.current minus inactive_file, as the agent's cgroup scope does)
    against M3's default thresholds for a 512 MiB node (top 62/64 of it, high and low
    55/62 and 50/62 of top) and acts by the variant:

    m3        M3 alone, as the agent is today: the hog ignores its notifications,
              and above top for KILL_AFTER_S it is killed (rule R5). (The agent's
              kill_after is 30 s; here 10 s so that a round stays short.)
    high      as m3, and in the red zone (at or above high) the BE group's
              `memory.high` is set to its memory.current; back at or below low it
              is set to `max` again (Senpai, KEP-2570's memory throttling).
    low       as m3, with the LC group's `memory.low` at its reserved size
              (LC_RESERVE_MIB: the working set and the served MiB, rounded up).
    min       as m3, with the LC group's `memory.min` at that size instead.
    high+low  both.

Each round prints one line:

    V2BED:MEASURE {"variant": ..., "round": ..., ...}

Fields: alloc_ms_max / alloc_ms_p99 / req_ms_max / req_ms_p99 (LC's 1 MiB allocations
and requests), lc_majflt (LC's major faults: working-set pages read back from swap),
lc_refault (the LC group's workingset_refault_anon), lc_served (requests served),
be_mib (MiB the hog allocated), be_killed (by the controller), be_oom_kill,
be_high / be_max (BE group's memory.events deltas), lc_low (LC's memory.events low),
scope_max (scope's memory.events max), red_s / above_top_s (seconds the controller
saw the scope in red / above top), lc_swap_mib (LC memory.swap.current at the end).
"""

import json
import os
import signal
import subprocess
import sys
import time

CG = "/sys/fs/cgroup"
MIB = 1 << 20
SCOPE_MIB = 512
TOP = SCOPE_MIB * MIB * 62 // 64
HIGH = TOP * 55 // 62
LOW = TOP * 50 // 62
LC_WS_MIB = 128
LC_RESERVE_MIB = 144
ROUND_S = 25
KILL_AFTER_S = 10
ROUNDS = int(os.environ.get("V2QOS_ROUNDS", "3"))
VARIANTS = ("m3", "high", "low", "min", "high+low")

LC = r"""
import random, resource, sys, time
ws_mib, run_s = int(sys.argv[1]), float(sys.argv[2])
MB, PG = 1 << 20, 4096
ws = bytearray(ws_mib * MB)
for i in range(0, len(ws), PG):
    ws[i] = 1
print("ready", flush=True)
sys.stdin.readline()
allocs, reqs = [], []
end = time.monotonic() + run_s
rng = random.Random(1)
npages = len(ws) // PG
while time.monotonic() < end:
    t = time.monotonic()
    b = bytearray(MB)
    for i in range(0, MB, PG):
        b[i] = 1
    t1 = time.monotonic()
    for _ in range(64):
        ws[rng.randrange(npages) * PG] += 1
    t2 = time.monotonic()
    allocs.append(t1 - t)
    reqs.append(t2 - t1)
    del b
    time.sleep(0.01)
print(" ".join(["%d" % resource.getrusage(resource.RUSAGE_SELF).ru_majflt,
                ",".join("%.6f" % a for a in allocs), ",".join("%.6f" % r for r in reqs)]),
      flush=True)
"""

BE = r"""
import os, sys, time
MB, PG = 1 << 20, 4096
n = 0
chunks = []
print("ready", flush=True)
sys.stdin.readline()
while True:
    b = bytearray(MB)
    for i in range(0, MB, PG):
        b[i] = 1
    chunks.append(b)
    n += 1
    with open("/tmp/v2qos-be-mib.tmp", "w") as f:
        f.write(str(n))
    os.replace("/tmp/v2qos-be-mib.tmp", "/tmp/v2qos-be-mib")
    time.sleep(0.002)
"""


def read(path):
    with open(path) as f:
        return f.read()


def write(path, value):
    with open(path, "w") as f:
        f.write(str(value))


def events(group):
    return {k: int(v) for k, v in (l.split() for l in read(group + "/memory.events").splitlines())}


def stat(group):
    return {k: int(v) for k, v in (l.split() for l in read(group + "/memory.stat").splitlines())}


def working_set(group):
    return int(read(group + "/memory.current")) - stat(group)["inactive_file"]


def swap_on(mib):
    dev_id = int(read("/sys/class/zram-control/hot_add"))
    write(f"/sys/block/zram{dev_id}/disksize", mib * MIB)
    subprocess.run(["mkswap", f"/dev/zram{dev_id}"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["swapon", f"/dev/zram{dev_id}"], check=True)
    return dev_id


def swap_off(dev_id):
    subprocess.run(["swapoff", f"/dev/zram{dev_id}"], check=True)
    write(f"/sys/block/zram{dev_id}/reset", 1)
    write("/sys/class/zram-control/hot_remove", dev_id)


def pctl(values, q):
    values = sorted(values)
    if not values:
        return None
    return values[min(len(values) - 1, int(q * len(values)))]


def start(code, group, *args):
    return subprocess.Popen(
        [sys.executable, "-c", code, *map(str, args)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        preexec_fn=lambda: write(group + "/cgroup.procs", os.getpid()),
    )


def rmdir(group):
    for _ in range(200):
        try:
            os.rmdir(group)
            return
        except OSError:
            time.sleep(0.05)
    os.rmdir(group)


def one_round(variant, n):
    scope = f"{CG}/v2qos-{n}"
    os.mkdir(scope)
    write(scope + "/memory.max", SCOPE_MIB * MIB)
    write(scope + "/cgroup.subtree_control", "+memory")
    lc, be = scope + "/lc", scope + "/be"
    os.mkdir(lc)
    os.mkdir(be)
    reserve = LC_RESERVE_MIB * MIB
    if "low" in variant:
        write(lc + "/memory.low", reserve)
    if variant == "min":
        write(lc + "/memory.min", reserve)
    try:
        os.unlink("/tmp/v2qos-be-mib")
    except FileNotFoundError:
        pass
    lcp = start(LC, lc, LC_WS_MIB, ROUND_S)
    assert lcp.stdout.readline().strip() == "ready"
    bep = start(BE, be)
    assert bep.stdout.readline().strip() == "ready"
    ev_be0, ev_lc0, ev_sc0 = events(be), events(lc), events(scope)
    refault0 = stat(lc)["workingset_refault_anon"]
    lcp.stdin.write("go\n")
    lcp.stdin.flush()
    bep.stdin.write("go\n")
    bep.stdin.flush()
    t0 = time.monotonic()
    above_since = None
    red_s = above_top_s = 0.0
    killed = False
    throttled = False
    while time.monotonic() - t0 < ROUND_S:
        time.sleep(1.0)
        ws = working_set(scope)
        if ws >= HIGH:
            red_s += 1
        if ws > TOP:
            above_top_s += 1
            above_since = above_since or time.monotonic()
        else:
            above_since = None
        if "high" in variant and not killed:
            if ws >= HIGH and not throttled:
                write(be + "/memory.high", read(be + "/memory.current").strip())
                throttled = True
            elif ws <= LOW and throttled:
                write(be + "/memory.high", "max")
                throttled = False
        if not killed and above_since is not None and time.monotonic() - above_since >= KILL_AFTER_S:
            bep.kill()
            killed = True
    out = lcp.stdout.readline().split()
    lcp.wait()
    majflt = int(out[0])
    allocs = [float(v) * 1000 for v in out[1].split(",") if v] if len(out) > 1 else []
    reqs = [float(v) * 1000 for v in out[2].split(",") if v] if len(out) > 2 else []
    lc_swap = int(read(lc + "/memory.swap.current"))
    refault1 = stat(lc)["workingset_refault_anon"]
    ev_be1, ev_lc1, ev_sc1 = events(be), events(lc), events(scope)
    try:
        be_mib = int(read("/tmp/v2qos-be-mib"))
    except (FileNotFoundError, ValueError):
        be_mib = 0
    if bep.poll() is None:
        bep.send_signal(signal.SIGKILL)
    bep.wait()
    rmdir(lc)
    rmdir(be)
    rmdir(scope)
    return {
        "variant": variant, "round": n, "round_s": ROUND_S,
        "alloc_ms_max": round(max(allocs), 2) if allocs else None,
        "alloc_ms_p99": round(pctl(allocs, 0.99), 2) if allocs else None,
        "req_ms_max": round(max(reqs), 2) if reqs else None,
        "req_ms_p99": round(pctl(reqs, 0.99), 2) if reqs else None,
        "lc_served": len(reqs), "lc_majflt": majflt, "lc_refault": refault1 - refault0,
        "lc_swap_mib": round(lc_swap / MIB, 1),
        "be_mib": be_mib, "be_killed": killed,
        "be_oom_kill": ev_be1["oom_kill"] - ev_be0["oom_kill"],
        "be_high": ev_be1["high"] - ev_be0["high"], "be_max": ev_be1["max"] - ev_be0["max"],
        "lc_low": ev_lc1["low"] - ev_lc0["low"], "lc_oom_kill": ev_lc1["oom_kill"] - ev_lc0["oom_kill"],
        "scope_max": ev_sc1["max"] - ev_sc0["max"],
        "red_s": red_s, "above_top_s": above_top_s,
    }


def main():
    dev = swap_on(1024)
    try:
        for n in range(ROUNDS):
            # Rotate which variant goes first, so none always meets a warmer system.
            order = VARIANTS[n % len(VARIANTS):] + VARIANTS[:n % len(VARIANTS)]
            for variant in order:
                r = one_round(variant, n)
                print("V2BED:MEASURE " + json.dumps(r), flush=True)
    finally:
        swap_off(dev)


if __name__ == "__main__":
    main()
