"""Helpers the Python benchmarks share: the zram swap device, the cgroup v1
memory controller's files and the machine's CPU time (for its busy share).

Every function needs root. A script in ``bench/<name>/`` imports this module after
``sys.path.insert(0, <bench dir>)``.
"""

import os
import subprocess
import sys
import time

ZRAM = "/dev/zram0"


def zram_on(mib):
    """Makes ``/dev/zram0`` a swap device of ``mib`` MiB, reset first.

    Raises ``subprocess.CalledProcessError`` if mkswap or swapon fails and
    ``OSError`` if the zram sysfs files cannot be written."""
    subprocess.run(["swapoff", ZRAM], capture_output=True)
    with open("/sys/block/zram0/reset", "w") as f:
        f.write("1")
    with open("/sys/block/zram0/disksize", "w") as f:
        f.write(str(mib << 20))
    subprocess.run(["mkswap", ZRAM], check=True, capture_output=True)
    subprocess.run(["swapon", ZRAM], check=True, capture_output=True)


def zram_off():
    """Turns ``/dev/zram0`` swap off and resets the device. swapoff can fail while
    swapped pages are being read back; it is retried for up to 10 s. A reset
    that fails is reported on stderr, never raised (this runs in cleanup)."""
    for _ in range(10):
        if subprocess.run(["swapoff", ZRAM], capture_output=True).returncode == 0:
            break
        time.sleep(1)
    try:
        with open("/sys/block/zram0/reset", "w") as f:
            f.write("1")
    except OSError as e:
        print(f"warning: zram reset: {e}", file=sys.stderr)


def own_memory_cgroup():
    """This process's cgroup v1 memory path (relative to the controller's mount),
    from ``/proc/self/cgroup``; exits with a message where there is none."""
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            if "memory" in ctrls.split(","):
                return path
    raise SystemExit("no cgroup v1 memory controller in /proc/self/cgroup")


def cg_write(cg, name, value):
    """Writes ``value`` to the file ``name`` of cgroup directory ``cg``; raises
    ``OSError`` as the kernel answers (e.g. EBUSY for a limit below usage)."""
    with open(os.path.join(cg, name), "w") as f:
        f.write(str(value))


def cg_int(cg, name):
    """The first number in the file ``name`` of ``cg``; 0 where the file is missing
    or holds no number (a group removed under the benchmark)."""
    try:
        with open(os.path.join(cg, name)) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def cpu_times():
    """(idle + iowait, total) jiffies over all CPUs, from the ``cpu`` line of /proc/stat;
    the busy share over an interval is 1 - d(idle) / d(total)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:8]]
    return v[3] + v[4], sum(v)
