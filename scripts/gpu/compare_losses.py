#!/usr/bin/env python3
"""Holds training runs' losses to each other: the GPU scripts' parity check.

    compare_losses.py DIR [--falls RUN:DROP] CHECK...

DIR holds one metrics file per run, DIR/RUN.jsonl (`hybridcp train --metrics`). Each CHECK is
RUN:FIRST-LAST:BASE:BOUND: at every step FIRST..LAST, |loss(RUN) - loss(BASE)| / |loss(BASE)|
must be at most BOUND. --falls RUN:DROP asks that RUN's last loss be DROP below its first.
Prints the losses side by side, then one line per check; exits 1 if any check fails (a missing
run or step fails its check).
"""
import argparse
import json
import math
import os
import sys


def load(directory, run):
    path = os.path.join(directory, run + ".jsonl")
    losses = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                record = json.loads(line)
                losses[record["step"]] = record["loss"]
    return losses


def parse_check(text):
    try:
        run, steps, base, bound = text.split(":")
        first, last = (int(s) for s in steps.split("-"))
        return run, range(first, last + 1), base, float(bound)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not RUN:FIRST-LAST:BASE:BOUND")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--falls", help="RUN:DROP, the least fall of RUN's loss")
    parser.add_argument("checks", nargs="+", type=parse_check)
    args = parser.parse_args()

    names = []
    for run, _, base, _ in args.checks:
        names += [n for n in (base, run) if n not in names]
    runs = {}
    failures = []
    for name in names:
        try:
            runs[name] = load(args.directory, name)
        except (OSError, ValueError, KeyError) as error:
            print(f"{name}: cannot read its metrics: {error}")
            runs[name] = {}

    steps = sorted(set().union(*runs.values()))
    print("step  " + "  ".join(f"{n[:12]:>12}" for n in names))
    for step in steps:
        cells = (f"{runs[n].get(step, math.nan):12.5f}" for n in names)
        print(f"{step:4d}  " + "  ".join(cells))

    if args.falls:
        run, drop = args.falls.split(":")
        losses = runs.get(run) or load(args.directory, run)
        fell = losses[min(losses)] - losses[max(losses)] if losses else math.nan
        print(f"{run}: the loss fell by {fell:.3f} (at least {float(drop)})")
        if not fell >= float(drop):
            failures.append(f"{run} did not learn")

    for run, step_range, base, bound in args.checks:
        worst = 0.0
        for step in step_range:
            a, b = runs[run].get(step), runs[base].get(step)
            worst = max(worst, math.inf if a is None or b is None else abs(a - b) / abs(b))
        print(f"worst {run} vs {base}, steps {step_range.start}-{step_range.stop - 1}: "
              f"{worst:.2e} (bound {bound:.0e})")
        if not worst <= bound:
            failures.append(run)
    print("FAIL: " + ", ".join(failures) if failures else "PASS")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
