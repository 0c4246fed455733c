"""Allocation traces (measure.trace): the workload's trace agrees with its own tracker, and the
CUDA snapshot converter (not yet run on a GPU) turns a hand-written snapshot into the trace."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "validate"))
from workload import snapshot_trace  # noqa: E402


def live_peak(trace):
    sizes, live, peak = [], 0, 0
    for v in trace:
        if v > 0:
            sizes.append(v)
            live += v
            peak = max(peak, live)
        else:
            live -= sizes[-v - 1]
    return peak, live


def test_snapshot_trace_by_hand():
    snap = {"device_traces": [[
        {"action": "segment_alloc", "addr": 0, "size": 2097152},
        {"action": "alloc", "addr": 0, "size": 1000},
        {"action": "alloc", "addr": 1024, "size": 3000},
        {"action": "free_requested", "addr": 0, "size": 1000},
        {"action": "free_completed", "addr": 0, "size": 1000},
        {"action": "alloc", "addr": 0, "size": 500},
        {"action": "free_completed", "addr": 4096, "size": 64},   # allocated before recording began
        {"action": "free_completed", "addr": 1024, "size": 3000},
    ]]}
    assert snapshot_trace(snap, 0) == [1000, 3000, -1, 500, -2]
    assert snapshot_trace(snap, 1) == []


def test_workload_trace_matches_its_tracker():
    case = {"name": "trace", "model": {"config_path": "data/validation/tiny_configs/llama-tiny.json"},
            "task": "full", "precision": "fp32", "micro_batch_size": 2, "sequence_length": 32,
            "attention": "sdpa", "measure": {"trace": True}}
    p = subprocess.run([sys.executable, os.path.join(ROOT, "validate", "workload.py"), "-", "--threads", "1"],
                       input=json.dumps([case]), capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    m = json.loads(p.stdout.splitlines()[-1])["measured"]
    peak, _ = live_peak(m["allocation_trace"])
    assert peak == m["peak_allocated_bytes"]
