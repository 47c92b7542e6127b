#!/usr/bin/env python3
"""summarize_kernels.py CSV: Nsight Compute's --csv output of gpu__time_duration.sum, summed by
kernel name (template arguments dropped) and, for the largest, by name and grid."""
import collections
import csv
import sys


def short(name):
    depth, out = 0, []
    for c in name:
        if c in "<(":
            depth += 1
        elif c in ">)":
            depth -= 1
        elif depth == 0:
            out.append(c)
    return "".join(out).replace("void ", "").strip()[:70]


rows = []
with open(sys.argv[1]) as f:
    lines = [line for line in f if line.startswith('"')]
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    scale = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0,
             "ms": 1.0}[r["Metric Unit"]]
    rows.append((short(r["Kernel Name"]), r["Grid Size"], float(r["Metric Value"].replace(",", "")) * scale))

total = sum(ms for _, _, ms in rows)
print(f"{len(rows)} kernels, {total:.2f} ms")
by_name = collections.defaultdict(lambda: [0, 0.0])
by_grid = collections.defaultdict(lambda: [0, 0.0])
for name, grid, ms in rows:
    by_name[name][0] += 1
    by_name[name][1] += ms
    by_grid[(name, grid)][0] += 1
    by_grid[(name, grid)][1] += ms
print(f"\n{'kernel':70} {'count':>6} {'ms':>9} {'share':>6}")
for name, (count, ms) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:40]:
    print(f"{name:70} {count:6d} {ms:9.3f} {100 * ms / total:5.1f}%")
print(f"\n{'kernel, grid':90} {'count':>6} {'ms':>9}")
for (name, grid), (count, ms) in sorted(by_grid.items(), key=lambda kv: -kv[1][1])[:40]:
    print(f"{name + ' ' + grid:90} {count:6d} {ms:9.3f}")
