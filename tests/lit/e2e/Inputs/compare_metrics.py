#!/usr/bin/env python3
"""compare_metrics.py A.jsonl B.jsonl FIRST LAST TOL: the losses of steps FIRST..LAST agree.

TOL 0 means bit for bit. Prints one line per step; exits 1 on a mismatch or a missing step.
A step logged twice (a resumed run) counts with its last record, as the metrics reader does."""
import json
import sys


def losses(path):
    out = {}
    for line in open(path):
        line = line.strip()
        if line:
            record = json.loads(line)
            out[record["step"]] = record["loss"]
    return out


a, b = losses(sys.argv[1]), losses(sys.argv[2])
first, last, tol = int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
bad = 0
for step in range(first, last + 1):
    if step not in a or step not in b:
        print(f"step {step}: missing")
        bad += 1
        continue
    err = abs(a[step] - b[step]) / abs(a[step])
    ok = a[step] == b[step] if tol == 0 else err <= tol
    bad += not ok
    print(f"step {step}: {a[step]!r} {b[step]!r} {'equal' if a[step] == b[step] else f'rel {err:.2e}'}"
          f"{'' if ok else ' MISMATCH'}")
sys.exit(1 if bad else 0)
