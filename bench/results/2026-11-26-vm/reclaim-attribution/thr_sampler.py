#!/usr/bin/env python3
"""Every 0.5 s: CPU ticks per (pid, pcomm, tid, tcomm) for memcolo/fio/stress-ng/redis; keeps the last value."""
import os, sys, time, json, signal
out = sys.argv[1]
seen = {}
stop = False
def h(*a):
    global stop; stop = True
signal.signal(signal.SIGTERM, h); signal.signal(signal.SIGINT, h)
KEEP = ('memcolo', 'fio', 'stress-ng', 'redis', 'kworker', 'kswapd', 'kcompact')
while not stop:
    now = time.monotonic()
    for p in os.listdir('/proc'):
        if not p.isdigit(): continue
        try:
            pc = open(f'/proc/{p}/comm').read().strip()
        except OSError: continue
        if not pc.startswith(KEEP): continue
        try: tids = os.listdir(f'/proc/{p}/task')
        except OSError: continue
        for t in tids:
            try: s = open(f'/proc/{p}/task/{t}/stat').read()
            except OSError: continue
            r = s.rfind(')'); tc = s[s.find('(')+1:r]; f = s[r+2:].split()
            ticks = int(f[11]) + int(f[12])
            k = (int(p), pc, int(t), tc)
            if k not in seen: seen[k] = [now, ticks, now, ticks]
            else: seen[k][2:] = [now, ticks]
    time.sleep(0.5)
json.dump([[*k, *v] for k, v in seen.items()], open(out, 'w'))
