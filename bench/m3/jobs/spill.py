"""The spilling analytics job of the M3 benchmark (bench/m3), in Python.

A shuffle-style job in rounds: each of ``--rounds`` rounds maps ``--partitions``
partitions of ``--partition-mib`` MiB, keeps in memory those it has room for and
spills the others (a modelled write of ``--io-ms-per-mib`` per MiB: the disk of this
shared VM sits in the host's page cache, so real file I/O would cost nothing here),
then runs ``--passes`` reduce passes over all partitions, reading spilled ones back
(the same modelled cost per MiB). Every partition of every phase also takes
``--task-ms`` of task time that memory does not change (modelled as a wait, so that
three jobs fit on this 2-core VM beside its other users). At the end of a round everything is dropped, so the
job's memory need rises and falls once per round (M3 §3, "changing needs"). Its run
time falls with the share of partitions it holds in memory.

- static (``--budget-mib N > 0``): at most N MiB of partitions in memory, the job's own
  setting (what M3's Oracle tunes); no agent.
- elastic (``--budget-mib 0``): no budget; the job registers with ``memcolo agent``
  (sdk/python) and reclaims in layers (M3 §4.2, Table 1): ``low``: call down to the
  Python runtime only (young collection + ``malloc_trim``); ``high``/``top``: spill
  1/8 of the in-memory partitions (paying their write), then the runtime (full
  collection + ``malloc_trim``). After a high signal the allow-rate gate (M3 §4.2;
  NUM_epochs ``--num-epochs``, default 1 as M3's Spark) admits only every
  floor(1/r)-th new partition into memory; the others are spilled.

Every ``--report-ms`` it prints one JSON line ``{"t_s", "useful_bytes", "rss_bytes",
"done_frac", ...}``; at the end ``{"done": true, "elapsed_s", ...}``.
"""

import argparse
import json
import os
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "sdk", "python"))
import memcolo  # noqa: E402
from memcolo import runtime  # noqa: E402

MIB = 1 << 20


def wait_until(t):
    left = t - time.monotonic()
    if left > 0:
        time.sleep(left)


class SpillJob:
    def __init__(self, args):
        self.args = args
        self.part_bytes = args.partition_mib * MIB
        self.io_s = args.io_ms_per_mib * args.partition_mib / 1000.0
        self.task_s = args.task_ms / 1000.0
        self.budget = args.budget_mib * MIB
        self.lock = threading.Lock()
        self.mem = {}  # partition -> bytes, in insertion order (oldest first)
        self.spilled = set()
        self.steps = 0
        self.total_steps = args.rounds * args.partitions * (1 + args.passes)
        self.spills = 0
        self.reads = 0
        self.spilled_by_signal = 0
        self.checksum = 0
        self.client = None

    def in_memory_bytes(self):
        with self.lock:
            return len(self.mem) * self.part_bytes

    def spill_eighth(self, note=None):
        """Upper layer on high/top: spill 1/8 of the in-memory partitions (M3 §6)."""
        with self.lock:
            n = (len(self.mem) + 7) // 8
            victims = list(self.mem)[:n]
            for p in victims:
                del self.mem[p]
                self.spilled.add(p)
            self.spilled_by_signal += n
        time.sleep(n * self.io_s)  # writing them out
        return n * self.part_bytes

    def keep(self):
        if self.budget > 0:
            return len(self.mem) * self.part_bytes + self.part_bytes <= self.budget
        return self.client is None or self.client.gate.admit()

    def run_round(self, r):
        fill = bytes([r % 251 + 1])
        for p in range(self.args.partitions):
            task_end = time.monotonic() + self.task_s
            data = fill * self.part_bytes  # allocated and written
            with self.lock:
                keep = self.keep()
                if keep:
                    self.mem[p] = data
                else:
                    self.spilled.add(p)
                    self.spills += 1
            del data
            if not keep:
                time.sleep(self.io_s)
                task_end += self.io_s  # the task time adds to the write
            wait_until(task_end)
            self.steps += 1
        for _ in range(self.args.passes):
            for p in range(self.args.partitions):
                task_end = time.monotonic() + self.task_s
                with self.lock:
                    data = self.mem.get(p)
                if data is None:
                    data = fill * self.part_bytes  # read back and deserialised
                    time.sleep(self.io_s)
                    task_end += self.io_s
                    self.reads += 1
                self.checksum += data[len(data) // 2] + len(memoryview(data)[:: 1 << 16])
                del data
                wait_until(task_end)
                self.steps += 1
        with self.lock:
            self.mem.clear()
            self.spilled.clear()

    def report(self, start, done=False):
        v = {
            "t_s": round(time.monotonic() - start, 3),
            "useful_bytes": self.in_memory_bytes(),
            "rss_bytes": runtime.rss_bytes() or 0,
            "done_frac": round(self.steps / self.total_steps, 5),
            "spills": self.spills,
            "reads": self.reads,
            "spilled_by_signal": self.spilled_by_signal,
        }
        if self.client is not None:
            v["allow_rate"] = round(self.client.gate.allow_rate(), 3)
            v["notifications"] = self.client.notifications
            v["registered"] = self.client.registered
        if done:
            v["done"] = True
            v["elapsed_s"] = round(time.monotonic() - start, 3)
        return v


def main():
    start = time.monotonic()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partitions", type=int, default=160)
    ap.add_argument("--partition-mib", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--io-ms-per-mib", type=float, default=8.0)
    ap.add_argument("--task-ms", type=float, default=15.0)
    ap.add_argument("--budget-mib", type=int, default=0, help="static budget; 0: elastic")
    ap.add_argument("--name", default="spill")
    ap.add_argument("--num-epochs", type=int, default=1, help="NUM_epochs of the allow-rate gate (M3 §4.2)")
    ap.add_argument("--report-ms", type=int, default=500)
    args = ap.parse_args()
    job = SpillJob(args)
    if args.budget_mib == 0:
        job.client = memcolo.Client(
            name=args.name, expected_reclaim_bytes=64 * MIB, gate=memcolo.AllowRateGate(num_epochs=args.num_epochs)
        )
        job.client.on_high(job.spill_eighth)
        job.client.on_top(job.spill_eighth)
        job.client.add_python_runtime()  # low: young gc + malloc_trim; high: full gc + malloc_trim
        job.client.start()
    stop = threading.Event()

    def reporter():
        while not stop.wait(args.report_ms / 1000.0):
            print(json.dumps(job.report(start)), flush=True)

    t = threading.Thread(target=reporter, daemon=True)
    t.start()
    for r in range(args.rounds):
        job.run_round(r)
    stop.set()
    t.join()
    print(json.dumps(job.report(start, done=True)), flush=True)
    if job.client is not None:
        job.client.close()


if __name__ == "__main__":
    main()
