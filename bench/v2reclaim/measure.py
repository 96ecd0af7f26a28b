"""Group-level reclaim on cgroup v2: `memory.reclaim` against stepping `memory.max`.

Runs inside the cgroup v2 guest of scripts/v2bed (as root, the memory controller
delegated by the root group); see README.md beside this file. For each mechanism and
case it makes a scratch group below /sys/fs/cgroup, starts a python3 holder in it, asks
for 64 MiB back and prints one line per round:

    V2BED:MEASURE {"mechanism": ..., "case": ..., "round": ..., ...}

Mechanisms (Documentation/admin-guide/cgroup-v2.rst, "Memory Interface Files"):
  reclaim  writes 64 MiB to memory.reclaim (Linux 5.19+); EAGAIN when less was found.
  step     writes usage - 64 MiB to memory.max, then puts the previous value back (the
           v1 workaround memcolo uses with memory.limit_in_bytes). On v2 the kernel
           OOM-kills in the group when it cannot get below the new memory.max.
Cases:
  swap     the holder holds 192 MiB of anonymous memory, a zram swap is on.
  grow     as swap, while the holder keeps allocating 1 MiB every 2 ms: the longest
           single 1 MiB allocation during the request is its stall.
  noswap   the holder holds 192 MiB of anonymous memory and there is no swap: nothing
           can be reclaimed.
Fields: seconds (wall time of the request), asked bytes, reclaimed bytes (what the
kernel took from the group meanwhile: the memory.stat `pgsteal` delta in pages of
4 KiB), net bytes (memory.current before minus after), error (errno text or null),
max and oom_kill (memory.events deltas: times the group hit memory.max, processes the
OOM killer took), stall_ms (grow only).
"""

import json
import os
import subprocess
import sys
import time

CG = "/sys/fs/cgroup"
MIB = 1 << 20
ASK = 64 * MIB
ROUNDS = 4

HOLDER = r"""
import sys, time
hold, grow = int(sys.argv[1]), sys.argv[2] == "grow"
MB = 1 << 20
chunks = []
def one():
    b = bytearray(MB)
    for i in range(0, MB, 4096):
        b[i] = 1
    chunks.append(b)
for _ in range(hold):
    one()
print("ready", flush=True)
if not grow:
    sys.stdin.readline()
    sys.exit(0)
# Keep allocating (and freeing the oldest, to stay near `hold`), timing each MiB,
# until told to stop; then print the longest.
import select
worst = 0.0
while True:
    r, _, _ = select.select([sys.stdin], [], [], 0.002)
    if r:
        sys.stdin.readline()
        break
    t = time.monotonic()
    one()
    worst = max(worst, time.monotonic() - t)
    del chunks[0]
print(worst, flush=True)
"""


def read(path):
    with open(path) as f:
        return f.read()


def events(group):
    return {k: int(v) for k, v in (l.split() for l in read(group + "/memory.events").splitlines())}


def pgsteal(group):
    stat = dict(l.split() for l in read(group + "/memory.stat").splitlines())
    return int(stat["pgsteal"])


def usage(group):
    return int(read(group + "/memory.current"))


def swap_on(mib):
    dev_id = int(read("/sys/class/zram-control/hot_add"))
    with open(f"/sys/block/zram{dev_id}/disksize", "w") as f:
        f.write(str(mib * MIB))
    subprocess.run(["mkswap", f"/dev/zram{dev_id}"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["swapon", f"/dev/zram{dev_id}"], check=True)
    return dev_id


def swap_off(dev_id):
    subprocess.run(["swapoff", f"/dev/zram{dev_id}"], check=True)
    with open(f"/sys/block/zram{dev_id}/reset", "w") as f:
        f.write("1")
    with open("/sys/class/zram-control/hot_remove", "w") as f:
        f.write(str(dev_id))


def one_round(mechanism, case, n):
    group = f"{CG}/v2reclaim-{mechanism}-{case}-{n}"
    os.mkdir(group)
    with open(group + "/memory.max", "w") as f:
        f.write(str(512 * MIB))
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, "192", "grow" if case == "grow" else "hold"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        preexec_fn=lambda: open(group + "/cgroup.procs", "w").write(str(os.getpid())),
    )
    assert holder.stdout.readline().strip() == "ready"
    time.sleep(0.5)
    ev0, before, steal0 = events(group), usage(group), pgsteal(group)
    error = None
    t = time.monotonic()
    try:
        if mechanism == "reclaim":
            with open(group + "/memory.reclaim", "w") as f:
                f.write(str(ASK))
        else:
            previous = read(group + "/memory.max").strip()
            try:
                with open(group + "/memory.max", "w") as f:
                    f.write(str(max(before - ASK, 4096)))
            finally:
                with open(group + "/memory.max", "w") as f:
                    f.write(previous)
    except OSError as e:
        error = os.strerror(e.errno) if e.errno else str(e)
    seconds = time.monotonic() - t
    after, ev1, steal1 = usage(group), events(group), pgsteal(group)
    stall_ms = None
    try:
        holder.stdin.write("stop\n")
        holder.stdin.flush()
        out = holder.stdout.readline().strip()
        if case == "grow" and out:
            stall_ms = float(out) * 1000
    except BrokenPipeError:
        pass
    holder.kill()
    holder.wait()
    while True:
        try:
            os.rmdir(group)
            break
        except OSError:
            time.sleep(0.05)
    return {
        "mechanism": mechanism, "case": case, "round": n, "seconds": round(seconds, 4),
        "asked": ASK, "reclaimed": (steal1 - steal0) * 4096, "net": before - after,
        "before": before, "error": error, "max": ev1["max"] - ev0["max"],
        "oom_kill": ev1["oom_kill"] - ev0["oom_kill"],
        "stall_ms": None if stall_ms is None else round(stall_ms, 2),
    }


def main():
    for case in ("swap", "grow", "noswap"):
        dev = swap_on(512) if case != "noswap" else None
        try:
            for n in range(ROUNDS):
                # Alternate which mechanism goes first, so neither always meets a
                # warmer system.
                order = ("reclaim", "step") if n % 2 == 0 else ("step", "reclaim")
                for mechanism in order:
                    r = one_round(mechanism, case, n)
                    print("V2BED:MEASURE " + json.dumps(r), flush=True)
        finally:
            if dev is not None:
                swap_off(dev)


if __name__ == "__main__":
    main()
