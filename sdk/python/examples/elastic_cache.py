"""An elastic LRU cache beside `memcolo agent` (M3 §4).

It fills itself with 64 KiB values up to --max-mib. On `low` it evicts 1 % of its
entries, on `high`/`top` 4 % (at least the target), then calls down to the Python
runtime (gc + malloc_trim). While the allow-rate gate (M3 §4.2) says so, a put first
evicts the oldest entry, so the cache replaces data instead of growing.

    sudo memcolo agent &
    python3 sdk/python/examples/elastic_cache.py --max-mib 2048
    (set MEMCOLO_SOCKET if the agent listens elsewhere)
"""

import argparse
import collections
import logging
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import memcolo  # noqa: E402
from memcolo import runtime  # noqa: E402

VALUE_BYTES = 64 << 10


class ElasticCache:
    def __init__(self):
        self.items = collections.OrderedDict()
        self.lock = threading.Lock()

    def evict(self, percent, at_least_bytes=0):
        with self.lock:
            n = max(len(self.items) * percent // 100, -(-at_least_bytes // VALUE_BYTES))
            n = min(n, len(self.items))
            for _ in range(n):
                self.items.popitem(last=False)
        return n * VALUE_BYTES

    def put(self, key, value, gate):
        gate.before_alloc(lambda: self.evict(0, VALUE_BYTES))
        with self.lock:
            self.items[key] = value
            self.items.move_to_end(key)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-mib", type=int, default=1024)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO)
    cache = ElasticCache()
    client = memcolo.Client(name="py-elastic-cache", expected_reclaim_bytes=(args.max_mib << 20) // 25)
    client.on_low(lambda note: cache.evict(1))
    client.on_high(lambda note: cache.evict(4, note.target_bytes))
    client.on_top(lambda note: cache.evict(4, note.target_bytes))
    client.add_python_runtime()
    client.start()
    key = 0
    tick = 0
    while True:
        tick += 1
        if len(cache.items) * VALUE_BYTES < args.max_mib << 20:
            cache.put(key, os.urandom(VALUE_BYTES), client.gate)
            key += 1
        if tick % 1000 == 0:
            print(
                "entries %d, rss %d MiB, allow rate %.2f, registered %s, notifications %d"
                % (len(cache.items), (runtime.rss_bytes() or 0) >> 20, client.gate.allow_rate(),
                   client.registered, client.notifications),
                flush=True,
            )
        time.sleep(0.001)


if __name__ == "__main__":
    main()
