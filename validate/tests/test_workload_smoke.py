"""Smoke test: workload.py on one tiny case, end to end, with exact invariants."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WORKLOAD = os.path.join(ROOT, "validate", "workload.py")


def run(cases):
    p = subprocess.run([sys.executable, WORKLOAD, "-", "--threads", "1"], input=json.dumps(cases),
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return [json.loads(line) for line in p.stdout.splitlines() if line.strip()]


def test_llama_tiny_full_fp32_adamw():
    case = {"name": "smoke", "model": {"config_path": "data/validation/tiny_configs/llama-tiny.json"},
            "task": "full", "precision": "fp32", "optimizer": "adamw", "micro_batch_size": 2,
            "sequence_length": 32, "gradient_checkpointing": False, "attention": "sdpa"}
    bad = dict(case, name="bad", optimizer="paged_adamw_8bit")  # paged states exist only on CUDA
    r, u = run([case, bad])
    assert r["name"] == "smoke" and "error" not in r, r.get("error")
    env = r["environment"]
    assert env["torch"] and env["transformers"] and env["device"] == "cpu"
    m = r["measured"]
    n = r["setup"]["num_parameters"]
    ph = m["phases"]
    for k in ("model_load", "optimizer_create", "step1.forward", "step1.backward", "step1.optimizer",
              "step2.forward", "step2.backward", "step2.optimizer", "step2.zero_grad"):
        assert k in ph, k
    # parameters: fp32, counted exactly once
    assert ph["model_load"]["end_breakdown"]["parameter"] == 4 * n
    # after step 2: params + AdamW exp_avg/exp_avg_sq (+ one fp32 'step' scalar per param tensor)
    n_tensors = 20  # llama-tiny: embed + 2 x (q,k,v,o,gate,up,down,2 norms) + final norm (lm_head tied)
    end = ph["step2.zero_grad"]["end_breakdown"]
    assert end["optimizer_state"] == 8 * n + 4 * n_tensors
    assert "gradient" not in end  # zero_grad(set_to_none=True)
    # gradients exist at the end of backward (fp32, one per param)
    assert ph["step2.backward"]["end_breakdown"]["gradient"] == 4 * n
    assert m["peak_allocated_bytes"] == max(p["peak_bytes"] for p in ph.values())
    assert m["peak_allocated_bytes"] >= 4 * n * 4  # params + grads + 2 states at least
    # unsupported requests are results, not crashes
    assert u["name"] == "bad" and u.get("unsupported") and "paged_adamw_8bit" in u["error"]
