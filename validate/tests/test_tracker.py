"""The live-tensor tracker must be exact: every expected number below is computed by hand.

Run: $(scripts/setup_python.sh) -m pytest validate/tests -q
"""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from tracker import LiveTensorTracker  # noqa: E402

F32 = 4


def test_factory_views_and_frees():
    tr = LiveTensorTracker()
    with tr:
        a = torch.empty(1000)                        # 4000 B
        b = torch.empty(250, dtype=torch.float64)    # 2000 B
        assert tr.current == 6000
        v = a.view(10, 100)                          # a view: no new storage
        w = a[::2]                                   # strided view: no new storage
        assert tr.current == 6000
        del a
        assert tr.current == 6000                    # storage still alive through v, w
        del v, w
        assert tr.current == 2000                    # last view gone -> storage freed
        c = b.to(torch.float32)                      # 250 * 4 = 1000 B (a copy)
        assert tr.current == 3000
        d = b.to(torch.float64)                      # same dtype: no copy
        assert tr.current == 3000
        del b, c, d
        assert tr.current == 0
        assert tr.peak_bytes == 6000


def test_storage_resize_is_tracked():
    # FSDP2 frees/re-allocates unsharded parameters with untyped_storage().resize_()
    tr = LiveTensorTracker()
    with tr:
        t = torch.empty(100)
        assert tr.current == 400
        t.untyped_storage().resize_(0)
        assert tr.current == 0
        t.untyped_storage().resize_(800)
        assert tr.current == 800
        assert tr.peak_bytes == 800
    assert torch.UntypedStorage.resize_ is tr._orig_resize  # patch undone


def test_allocation_trace_in_order():
    # births as +bytes (numbered in order), deaths as -(number + 1); a resize is death + birth
    tr = LiveTensorTracker(record_trace=True)
    with tr:
        a = torch.empty(1000)                        # allocation 0: 4000 B
        b = torch.empty(250, dtype=torch.float64)    # allocation 1: 2000 B
        v = a.view(10, 100)                          # a view: nothing
        del a
        del v                                        # allocation 0 dies
        b.untyped_storage().resize_(0)               # allocation 1 dies
        b.untyped_storage().resize_(80)              # allocation 2: 80 B
        torch.empty(0)                               # empty: not in the trace
        del b                                        # allocation 2 dies
    assert tr.trace == [4000, 2000, -1, -2, 80, -3]
    assert LiveTensorTracker().trace is None         # off by default


def test_linear_forward_backward_by_hand():
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 32)                    # W 32x64, b 32 -> 8320 B
    x = torch.randn(8, 64)                           # 2048 B
    P, X, Y = (64 * 32 + 32) * F32, 8 * 64 * F32, 8 * 32 * F32
    tr = LiveTensorTracker()
    with tr:
        tr.track_module(lin)
        tr.track_tensors([x], "input")
        assert tr.current == P + X
        with tr.phase("forward", "activation") as fw:
            y = lin(x)                               # addmm -> 8x32
            loss = y.sum()                           # scalar
        assert fw.peak == P + X + Y + F32
        assert tr.by_cat["activation"] == Y + F32
        with tr.phase("backward", "backward_temp") as bw:
            loss.backward()
        # backward peak: ones_like(loss) 4 B + dW = mm(dy^T, x) 32x64 + db = sum(dy) 32;
        # dy = expand(ones) is a view; AccumulateGrad steals dW/db (no copies)
        assert bw.peak == P + X + Y + F32 + F32 + 64 * 32 * F32 + 32 * F32
        assert bw.end == P + X + Y + F32 + P          # ones_like freed, grads kept
        assert tr.by_cat["gradient"] == P             # re-tagged by post-accumulate hooks
        del y, loss
        assert tr.current == P + X + P
        opt = torch.optim.AdamW(lin.parameters(), lr=1e-3, foreach=True)
        with tr.phase("step", "optimizer_temp") as st:
            opt.step()
        tr.track_optimizer(opt)
        # exp_avg + exp_avg_sq per param, plus a float32 scalar 'step' tensor per param
        assert tr.by_cat["optimizer_state"] == 2 * P + 2 * F32
        assert st.end == P + X + P + 2 * P + 2 * F32   # foreach temporaries all freed
        opt.zero_grad(set_to_none=True)
        assert tr.current == P + X + 2 * P + 2 * F32
        assert tr.by_cat.get("gradient", 0) == 0


def test_phase_peak_includes_transient():
    tr = LiveTensorTracker()
    with tr:
        keep = torch.ones(10)                        # 40
        with tr.phase("p") as ph:
            tmp = torch.ones(100)                    # 400 (transient)
            out = tmp * 2                            # 400
            del tmp
            out2 = out + 1                           # 400
            del out
        assert ph.start == 40
        assert ph.peak == 40 + 800
        assert ph.end == 40 + 400
        del keep, out2
    assert tr.peak_bytes == 840


def test_matches_torch_memtracker_on_mlp():
    """Independent check: PyTorch's own MemTracker (CPU) reports the same peak."""
    try:
        from torch.distributed._tools.mem_tracker import MemTracker
    except Exception:  # pragma: no cover
        pytest.skip("torch.distributed._tools.mem_tracker unavailable")
    torch.manual_seed(0)

    def run(track, after_iter=lambda: None):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 16))
        opt = torch.optim.AdamW(model.parameters(), foreach=True)
        x = torch.randn(16, 32)
        track(model, opt, x)
        for _ in range(2):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            after_iter()

    ours = LiveTensorTracker()
    with ours:
        run(lambda m, o, x: (ours.track_module(m), ours.track_tensors([x], "input")))
    mt = MemTracker()
    holder = {}

    def reg(m, o, x):
        mt.track_external(m, o, x)
        holder["x"] = x
    with mt:
        run(reg, mt.reset_mod_stats)  # MemTracker needs this between iterations
    theirs = mt.get_tracker_snapshot("peak")
    cpu = [v for d, v in theirs.items() if torch.device(d).type == "cpu"][0]
    assert ours.peak_bytes == cpu["Total"]


def test_matches_allocator_events_for_elementwise_ops():
    """Elementwise kernels allocate nothing internally, so the CPU allocator's
    event stream (profiler) must agree with the tracker to the byte."""
    from torch.profiler import ProfilerActivity, profile
    tr = LiveTensorTracker()
    with tr:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            a = torch.ones(1000)
            b = a * 3
            c = torch.relu(b - 1)
            del a
            d = torch.cat([b, c])
            del b, c, d
    evs = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                 key=lambda e: e.start_ns())
    cur = peak = 0
    for e in evs:
        cur += e.nbytes()
        peak = max(peak, cur)
    # a, b, (b - 1), relu(b - 1): 4 x 4000 B; later b, c + cat output (8000 B): also 16000 B
    assert peak == tr.peak_bytes == 4 * 4000
