#!/usr/bin/env python3
"""Write a random sample of a case file's cases (the check-set sample CI runs).

    python3 validate/sample_cases.py data/validation/cpu_check.json --seed 12345 --count 40 > sample.json

The same file, seed and count always give the same cases (random.Random(seed).sample over the
file's order), so a failing CI sample is rerun exactly with the seed it printed.
"""
import argparse
import json
import random
import sys


def sample(suite, seed, count):
    cases = suite["cases"]
    picked = sorted(random.Random(seed).sample(range(len(cases)), min(count, len(cases))))
    out = dict(suite)
    out["cases"] = [cases[i] for i in picked]
    out["description"] = f"{len(picked)} of the {len(cases)} cases, seed {seed}: " + suite.get("description", "")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("suite")
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--count", type=int, required=True)
    a = ap.parse_args()
    if a.count < 1:
        sys.exit("sample_cases: --count must be at least 1")
    with open(a.suite) as f:
        json.dump(sample(json.load(f), a.seed, a.count), sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
