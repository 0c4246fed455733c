"""measure.tensors (validate/tensor_log.py): each tensor's op, bytes, phase and layer, on a
two-block model whose tensors are known by hand (Linear 8->8 without bias, then ReLU)."""
import os
import sys

import pytest

torch = pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "validate"))
from tensor_log import COLUMNS, TensorLogTracker  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8, bias=False)

    def forward(self, x):
        return torch.relu(self.lin(x))


def run(recompute: bool):
    torch.manual_seed(0)
    blocks = [Block(), Block()]
    tr = TensorLogTracker()
    with tr:
        x = torch.randn(2, 8, requires_grad=True)
        for b in blocks:
            tr.track_module(b, grad_hooks=False)
        tr.watch_layers(blocks)
        tr.track_tensors([x], "input")
        tr.start(-1)
        tr.logging = True
        with tr.phase("forward", "activation"):
            y = x
            for b in blocks:
                y = checkpoint(b, y, use_reentrant=False) if recompute else b(y)
            loss = y.sum()
        tr.start(tr.layers)
        with tr.phase("backward", "backward_temp"):
            loss.backward()
        tr.logging = False
        del y, loss
    tr.remove_hooks()
    return [dict(zip(COLUMNS, r)) for r in tr.as_record()["rows"]]


def test_forward_rows_by_layer():
    rows = run(recompute=False)
    # the Linear's output dies once ReLU has run (nothing saves it); ReLU keeps its result [D] until
    # its backward (the last block's output: until the caller lets go of it, after the backward)
    for k, relu_dies in ((0, "b"), (1, "x")):
        fwd = [(r["op"], r["shape"], r["bytes"], r["died_phase"]) for r in rows
               if r["born_phase"] == "f" and r["born_layer"] == k]
        assert fwd == [("mm", [2, 8], 64, "f"), ("relu", [2, 8], 64, relu_dies)]
    assert [(r["op"], r["born_layer"]) for r in rows if r["born_phase"] == "f" and r["born_layer"] == 2] == [("sum", 2)]


def test_backward_rows_by_layer():
    rows = run(recompute=False)
    for k in (0, 1):
        bwd = [(r["op"], r["bytes"]) for r in rows if r["born_phase"] == "b" and r["born_layer"] == k]
        # ReLU's input gradient, the weight gradient (8 x 8 fp32) and the input gradient
        assert ("threshold_backward", 64) in bwd and ("mm", 256) in bwd and ("mm", 64) in bwd
        grads = [r for r in rows if r["born_phase"] == "b" and r["born_layer"] == k and r["bytes"] == 256]
        assert all(r["died_phase"] is None for r in grads)  # the weight gradients outlive the backward


def test_recomputation_is_its_own_phase():
    rows = run(recompute=True)
    for k in (0, 1):
        # a checkpointed block's re-run inside the backward is "r": the Linear's output dies in it,
        # ReLU's result in the block's backward
        rerun = [(r["op"], r["died_phase"], r["died_layer"]) for r in rows if r["born_phase"] == "r" and r["born_layer"] == k]
        assert rerun == [("mm", "r", k), ("relu", "b", k)]
