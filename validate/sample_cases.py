#!/usr/bin/env python3
"""Write a random sample of a case file's cases (the check-set sample CI runs).

    python3 validate/sample_cases.py data/validation/cpu_check.json --seed 12345 --count 40 > sample.json
    python3 validate/sample_cases.py data/validation/cpu_suite.json --shaped no > one-shape.json

The same file, seed and count always give the same cases (random.Random(seed).sample over the
file's order), so a failing CI sample is rerun exactly with the seed it printed.
"""
import argparse
import json
import random
import re
import sys

# the shape segment make_suite.py puts in the names of its shape-randomised and pattern cases
SHAPED = re.compile(r"/h\d+-L\d+-V\d+/")


def sample(suite, seed, count):
    cases = suite["cases"]
    picked = sorted(random.Random(seed).sample(range(len(cases)), min(count, len(cases))))
    out = dict(suite)
    out["cases"] = [cases[i] for i in picked]
    out["description"] = f"{len(picked)} of the {len(cases)} cases, seed {seed}: " + suite.get("description", "")
    return out


def select(suite, shaped):
    """The cases at other shapes (shaped=True) or the rest (the fixed and framework cases)."""
    out = dict(suite)
    out["cases"] = [c for c in suite["cases"] if bool(SHAPED.search(c["name"])) == shaped]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("suite")
    ap.add_argument("--seed", type=int, help="with --count: a random sample")
    ap.add_argument("--count", type=int)
    ap.add_argument("--shaped", choices=["yes", "no"],
                    help="yes: only the cases named with a shape (/h256-L3-V8192/); no: only the others")
    a = ap.parse_args()
    with open(a.suite) as f:
        suite = json.load(f)
    if a.shaped is not None:
        out = select(suite, a.shaped == "yes")
    elif a.seed is not None and a.count is not None and a.count >= 1:
        out = sample(suite, a.seed, a.count)
    else:
        sys.exit("sample_cases: give --seed S --count N (N >= 1), or --shaped yes|no")
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
