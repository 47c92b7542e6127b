#!/usr/bin/env python3
"""eval_metrics.py: checks of the held-out loss in metrics files (eval.test).

  eval_metrics.py steps FILE STEPS TOKENS   the records with eval_loss are exactly STEPS
                                            (comma-separated), each finite with eval_tokens TOKENS
  eval_metrics.py training A B              every step's loss, lr, grad_norm and skipped are the
                                            same bit for bit (the same steps in both)
  eval_metrics.py eval A B TOL              eval_loss of the steps both evaluated (at least one)
                                            agree within TOL (relative; 0: bit for bit)

Prints one line per compared step; exits 1 on any mismatch. A step logged twice (a resumed run)
counts with its last record, as the metrics reader does."""
import json
import math
import sys


def records(path):
    out = {}
    for line in open(path):
        line = line.strip()
        if line:
            record = json.loads(line)
            out[record["step"]] = record
    return out


def main():
    what = sys.argv[1]
    bad = 0
    if what == "steps":
        r = records(sys.argv[2])
        want = [int(s) for s in sys.argv[3].split(",")]
        tokens = int(sys.argv[4])
        got = sorted(s for s, x in r.items() if "eval_loss" in x)
        print(f"evaluated after steps {got}")
        bad += got != want
        for s in got:
            x = r[s]
            ok = x["eval_tokens"] == tokens and x["eval_loss"] is not None and math.isfinite(x["eval_loss"])
            print(f"step {s}: eval_loss {x['eval_loss']!r} eval_tokens {x['eval_tokens']}{'' if ok else ' BAD'}")
            bad += not ok
    elif what == "training":
        a, b = records(sys.argv[2]), records(sys.argv[3])
        if sorted(a) != sorted(b):
            print(f"steps differ: {sorted(a)} vs {sorted(b)}")
            bad += 1
        for s in sorted(set(a) & set(b)):
            fields = ("loss", "lr", "grad_norm", "skipped")
            same = all(a[s][f] == b[s][f] for f in fields)
            print(f"step {s}: {a[s]['loss']!r} {b[s]['loss']!r} {'equal' if same else 'MISMATCH'}")
            bad += not same
    elif what == "eval":
        a, b = records(sys.argv[2]), records(sys.argv[3])
        tol = float(sys.argv[4])
        steps = sorted(s for s, x in a.items() if "eval_loss" in x and "eval_loss" in b.get(s, {}))
        if not steps:
            print("no step evaluated in both")
            bad += 1
        for s in steps:
            x, y = a[s]["eval_loss"], b[s]["eval_loss"]
            err = abs(x - y) / abs(x)
            ok = x == y if tol == 0 else err <= tol
            print(f"step {s}: {x!r} {y!r} {'equal' if x == y else f'rel {err:.2e}'}{'' if ok else ' MISMATCH'}")
            bad += not ok
    else:
        print(f"unknown check {what}")
        bad += 1
    sys.exit(1 if bad else 0)


main()
