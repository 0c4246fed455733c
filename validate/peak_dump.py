#!/usr/bin/env python3
"""What is alive at a case's measured peak?  Runs one case of a suite file through
validate/workload.py with the live-tensor tracker, and prints the storages alive at the peak
(grouped by category, creating op, shape and dtype) and the op that reached it.

    python validate/peak_dump.py SUITE.json NAME-SUBSTRING [--top 40]
"""
import argparse
import collections
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import tracker  # noqa: E402
import workload  # noqa: E402

T = tracker.LiveTensorTracker
_orig_dispatch, _orig_register, _orig_bump, _orig_reset = T.__torch_dispatch__, T._register, T._bump, T.reset_peak
_orig_dead = T._on_dead
STATE = {"op": None, "what": None, "dirty": False, "snap": None, "peak_op": None}


def _register(self, st, cat, retag):
    known = id(st) in self._entries
    _orig_register(self, st, cat, retag)
    e = self._entries.get(id(st))
    if e is not None and not known:
        self._desc = getattr(self, "_desc", {})
        self._desc[id(st)] = (STATE["op"], STATE["what"])


def _snapshot(self):
    desc = getattr(self, "_desc", {})
    rows = collections.Counter()
    for key, e in self._entries.items():
        if e.nbytes:
            op, what = desc.get(key, ("?", "?"))
            rows[(e.cat, op, what)] += e.nbytes
    return rows


def _on_dead(self, key, ref):
    # snapshot the peak's set before the first storage that dies after it leaves the table
    if STATE["dirty"] and key in self._entries:
        STATE["snap"], STATE["dirty"] = _snapshot(self), False
    _orig_dead(self, key, ref)


def _bump(self, cat, delta):
    if delta < 0 and STATE["dirty"]:
        STATE["snap"], STATE["dirty"] = _snapshot(self), False
    before = self.peak_bytes
    _orig_bump(self, cat, delta)
    if self.peak_bytes > before:
        STATE["dirty"], STATE["peak_op"] = True, STATE["op"]


def _reset(self):
    _orig_reset(self)
    STATE["dirty"], STATE["snap"] = False, None


def _dispatch(self, func, types, args=(), kwargs=None):
    STATE["op"] = str(func.overloadpacket.__name__) if hasattr(func, "overloadpacket") else str(func)
    out = func(*args, **(kwargs or {}))
    first = out[0] if isinstance(out, (tuple, list)) and out else out
    STATE["what"] = (f"{tuple(first.shape)} {str(first.dtype).replace('torch.', '')}"
                     if hasattr(first, "shape") else "")
    return _orig_dispatch.__get__(self)(lambda *a, **k: out, types, (), {})


T.__torch_dispatch__, T._register, T._bump, T.reset_peak = _dispatch, _register, _bump, _reset
T._on_dead = _on_dead


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("suite")
    ap.add_argument("name")
    ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args()
    cases = json.load(open(a.suite))["cases"]
    req = next(c for c in cases if a.name in c["name"])
    opts = argparse.Namespace(device="cpu", no_tracker=False, allocator_profile=False, threads=0, all_ranks_print=False)
    res = workload.run_case(req, workload.Dist(), opts)
    print(req["name"], "measured peak", res["measured"]["peak_allocated_bytes"], "B at op", STATE["peak_op"])
    snap = STATE["snap"] or {}
    total = sum(snap.values())
    print(f"alive at the peak: {total} B ({total / 2**20:.3f} MiB)")
    for (cat, op, what), nb in sorted(snap.items(), key=lambda kv: -kv[1])[:a.top]:
        print(f"{nb / 2**20:10.3f} MiB  {cat:14s} {op:28s} {what}")


if __name__ == "__main__":
    main()
