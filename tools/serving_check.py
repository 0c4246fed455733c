#!/usr/bin/env python3
"""Serving accuracy against published engine start-up logs (data/calibration/serving_logs.json).

For each log, runs `memfit estimate` with task "serve" and the settings the log's author used,
and prints the signed error of the weights, the KV cache tokens and the max concurrency (and
of the KV cache GiB, the activation peak and non-torch memory where the log prints them).
Medians are over the logs tagged role "check" only: a log a constant was set from ("fit")
is shown but not counted.

  tools/serving_check.py build/native/cli/memfit [--gate-weights 1] [--gate-kv 5] [--gate-concurrency 5]

Exit 1 when a median |error| exceeds its gate, 2 on bad input.
"""
import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

GIB = 1024 ** 3
ROOT = Path(__file__).resolve().parent.parent


def request_for(log):
    serving = {"engine": log["engine"], "engine_version": log["engine_version"]}
    serving.update(log.get("settings", {}))
    req = {"model": {"id": log["model_id"]}, "task": "serve", "gpu": log["gpu"], "serving": serving}
    if "quantization" in log:
        req["quantization"] = log["quantization"]
    return req


def run(memfit, req):
    out = subprocess.run([memfit, "estimate", "-", "--json"], input=json.dumps(req), capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"memfit failed on {req['model']['id']}: {out.stderr.strip()}")
    return json.loads(out.stdout)["serving"]


def pct(est, logged):
    return 100.0 * (est - logged) / logged if logged else float("nan")


FIELDS = [  # (column, logged key, estimate -> comparable value)
    ("weights", "weights_gib", lambda s: s["weights_bytes"] / GIB),
    ("kv_tokens", "kv_cache_tokens", lambda s: s["kv_cache_tokens"]),
    ("concurrency", "max_concurrency", lambda s: s["max_concurrency"]),
    ("kv_gib", "kv_cache_gib", lambda s: s["kv_cache_bytes"] / GIB),
    ("activation", "activation_peak_gib", lambda s: s["activation_peak_bytes"] / GIB),
    ("non_torch", "non_torch_gib", lambda s: s["non_torch_bytes"] / GIB),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("memfit")
    ap.add_argument("--logs", default=str(ROOT / "data/calibration/serving_logs.json"))
    ap.add_argument("--gate-weights", type=float, default=1.0)
    ap.add_argument("--gate-kv", type=float, default=5.0)
    ap.add_argument("--gate-concurrency", type=float, default=5.0)
    args = ap.parse_args()
    logs = json.loads(Path(args.logs).read_text())["logs"]

    errors = {name: [] for name, _, _ in FIELDS}
    print(f"{'log':40} {'role':5} " + " ".join(f"{n:>12}" for n, _, _ in FIELDS))
    for log in logs:
        s = run(args.memfit, request_for(log))
        cells = []
        for name, key, get in FIELDS:
            if key not in log["logged"]:
                cells.append(f"{'-':>12}")
                continue
            e = pct(get(s), log["logged"][key])
            cells.append(f"{e:+11.2f}%")
            if log["role"] == "check":
                errors[name].append(e)
        print(f"{log['id']:40} {log['role']:5} " + " ".join(cells))

    print("\nmedian |error| over role=check logs (n):")
    failed = False
    gates = {"weights": args.gate_weights, "kv_tokens": args.gate_kv, "concurrency": args.gate_concurrency}
    for name, _, _ in FIELDS:
        v = errors[name]
        if not v:
            print(f"  {name:12} no check log prints it")
            continue
        med = statistics.median(abs(x) for x in v)
        gate = gates.get(name)
        verdict = "" if gate is None else ("PASS" if med <= gate else "FAIL") + f" (gate {gate:g} %)"
        failed = failed or verdict.startswith("FAIL")
        print(f"  {name:12} {med:6.2f} %  (n={len(v)}, max {max(abs(x) for x in v):.2f} %)  {verdict}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
