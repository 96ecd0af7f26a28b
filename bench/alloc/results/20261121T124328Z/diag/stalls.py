import sys, re, csv
v = sys.argv[1]
begin = int(open(f"trace-{v}.txt").read().split("hermes_begin_mono_us,")[1].split()[0])
raw = list(csv.DictReader(open(f"raw-{v}.csv")))
slow = sorted(raw, key=lambda r: -int(r["latency_ns"]))[:5]
ev = []
for line in open(f"script-{v}.txt"):
    m = re.match(r"\s*(.+?)\s+(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s+(.*)", line)
    if m:
        ev.append((float(m.group(4)) * 1e6 - begin, m.group(1), int(m.group(2)), int(m.group(3)), m.group(5), m.group(6)))
for r in slow:
    s = float(r["start_us"]); e = s + int(r["latency_ns"]) / 1000
    print(f"alloc {r['i']} at {s:.0f} us lasted {int(r['latency_ns'])/1000:.0f} us")
    for t, comm, tid, cpu, name, rest in ev:
        if s - 500 <= t <= e + 200:
            print(f"   {t:10.0f} cpu{cpu} {comm}/{tid} {name.split(':')[1]} {rest[:150]}")
