"""Exact live-tensor-storage accounting for CPU (and any device) runs.

``LiveTensorTracker`` is a ``TorchDispatchMode``: every ATen op that runs while it
is active passes through ``__torch_dispatch__``; we look at the op's outputs, take
their untyped storages (unwrapping tensor subclasses such as DTensor into their
local tensors) and count each storage's ``nbytes()`` once.  A weakref callback on
the storage object fires when the underlying ``StorageImpl`` dies (PyTorch keeps a
storage's Python object alive for as long as the C++ storage lives -- "PyObject
preservation"), which decrements the live total.  ``UntypedStorage.resize_`` is
not an ATen op (FSDP2 uses it to free/re-allocate unsharded parameters), so it is
wrapped while the tracker is active.

What is seen: every tensor produced by an op dispatched while the mode is on,
including ops the autograd engine runs during backward (the mode stack is part of
the thread-local state the engine propagates), AccumulateGrad clones, the
optimizer's foreach/fused kernels' outputs, DDP reducer buckets, FSDP2 all-gather
outputs.  What is NOT seen: scratch memory that a kernel allocates internally and
frees before returning (e.g. oneDNN/MKL packing buffers, per-thread scratch of the
CPU flash-attention kernel), and memory of non-torch allocators (gloo buffers).
Those are invisible to the live-tensor view by construction; ``allocator_peak``
in workload.py (CPU profiler memory events) sees them.

Bytes are counted exactly (``storage.nbytes()``), with no allocator rounding.

``record_trace=True`` also keeps the allocation trace in ``trace``: the storages' births and
deaths in the order they happened, as signed integers (n > 0: a storage of n bytes is born,
it is allocation k if it is the k-th such entry; -k - 1: allocation k dies). A resize is a
death and a birth. ``memfit validate`` replays it through its simulation of the CUDA caching
allocator (core/src/allocator.cpp) to get the reserved peak CUDA would reach for it.
On CUDA the caching allocator rounds each block up to 512 B; ``round_to`` lets a
caller mimic that, but workload.py uses torch.cuda's own statistics on CUDA.

Categories (running sums, re-tagged as tensors change role):
  parameter, buffer      model state (``track_module``)
  gradient               ``param.grad`` (post-accumulate-grad hooks)
  optimizer_state        tensors in ``optimizer.state`` (``track_optimizer``)
  input                  batches (``track_tensors(..., "input")``)
  anything else          the *allocation category* active when it was created;
                         workload.py sets it per phase: "activation" in forward,
                         "backward_temp" in backward (includes GC recomputation),
                         "optimizer_temp" in the optimizer step, "other" elsewhere.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Dict, Iterable, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten

try:  # DTensor is optional (torch.distributed may be unavailable on some builds)
    from torch.distributed.tensor import DTensor  # type: ignore
except Exception:  # pragma: no cover
    DTensor = None  # type: ignore


def storages_of(t: torch.Tensor) -> list:
    """Untyped storages backing ``t``; tensor subclasses are flattened recursively."""
    out = []
    stack = [t]
    while stack:
        obj = stack.pop()
        if is_traceable_wrapper_subclass(obj):
            attrs, _ = obj.__tensor_flatten__()
            for a in attrs:
                v = getattr(obj, a)
                if isinstance(v, torch.Tensor):
                    stack.append(v)
            continue
        if not isinstance(obj, torch.Tensor):
            continue
        if obj.device.type == "meta":
            continue
        try:
            out.append(obj.untyped_storage())
        except (RuntimeError, NotImplementedError):  # e.g. sparse / functional wrappers
            pass
    return out


class _Entry:
    __slots__ = ("nbytes", "cat", "device", "ref", "tid")

    def __init__(self, nbytes: int, cat: str, device: str):
        self.nbytes = nbytes
        self.cat = cat
        self.device = device
        self.ref = None
        self.tid = -1  # allocation number in the trace (-1: none)


class PhaseStats:
    __slots__ = ("name", "start", "peak", "peak_breakdown", "end", "end_breakdown")

    def __init__(self, name: str, start: int, breakdown: Dict[str, int]):
        self.name = name
        self.start = start
        self.peak = start
        self.peak_breakdown = dict(breakdown)
        self.end = None
        self.end_breakdown = None

    def as_dict(self) -> Dict[str, Any]:
        return {
            "start_bytes": self.start,
            "peak_bytes": self.peak,
            "end_bytes": self.end,
            "peak_breakdown": {k: v for k, v in self.peak_breakdown.items() if v},
            "end_breakdown": {k: v for k, v in (self.end_breakdown or {}).items() if v},
        }


class LiveTensorTracker(TorchDispatchMode):
    """Counts live tensor-storage bytes (per category), current and peak.

    Usage::

        tr = LiveTensorTracker()
        with tr:
            model = build()            # everything created here is seen
            tr.track_module(model)     # tag params/buffers
            with tr.phase("forward", alloc_category="activation"):
                loss = model(x)
        tr.peak_bytes, tr.phases["forward"].as_dict()
    """

    def __init__(self, device_filter: Optional[str] = None, round_to: int = 1, record_trace: bool = False):
        super().__init__()
        self.trace: Optional[list] = [] if record_trace else None
        self._allocs = 0
        self.device_filter = device_filter  # e.g. "cpu": ignore storages elsewhere
        self.round_to = max(1, int(round_to))
        self._entries: Dict[int, _Entry] = {}
        self.current = 0
        self.by_cat: Dict[str, int] = {}
        self.peak_bytes = 0
        self.peak_breakdown: Dict[str, int] = {}
        self.alloc_category = "other"
        self._phase: Optional[PhaseStats] = None
        self.phases: Dict[str, PhaseStats] = {}
        self.n_ops = 0
        self._grad_hooks: list = []
        self._orig_resize = None
        self._depth = 0

    # ---------------------------------------------------------------- internals
    def _size(self, nbytes: int) -> int:
        r = self.round_to
        return nbytes if r == 1 else -(-nbytes // r) * r

    def _bump(self, cat: str, delta: int) -> None:
        self.current += delta
        self.by_cat[cat] = self.by_cat.get(cat, 0) + delta
        if delta > 0:
            if self.current > self.peak_bytes:
                self.peak_bytes = self.current
                self.peak_breakdown = dict(self.by_cat)
            ph = self._phase
            if ph is not None and self.current > ph.peak:
                ph.peak = self.current
                ph.peak_breakdown = dict(self.by_cat)

    def _trace_birth(self, e: _Entry) -> None:
        if self.trace is not None and e.nbytes:
            e.tid = self._allocs
            self._allocs += 1
            self.trace.append(e.nbytes)

    def _trace_death(self, e: _Entry) -> None:
        if self.trace is not None and e.tid >= 0:
            self.trace.append(-e.tid - 1)
            e.tid = -1

    def _resized(self, e: _Entry, nb: int) -> None:
        self._bump(e.cat, nb - e.nbytes)
        self._trace_death(e)
        e.nbytes = nb
        self._trace_birth(e)

    def _on_dead(self, key: int, _ref) -> None:
        e = self._entries.pop(key, None)
        if e is not None and e.nbytes:
            self._bump(e.cat, -e.nbytes)
            self._trace_death(e)

    def _register(self, st, cat: str, retag: bool) -> None:
        key = id(st)
        e = self._entries.get(key)
        if e is not None:
            # known storage: maybe its size changed (resize_ via ATen op) or its role
            nb = self._size(st.nbytes())
            if nb != e.nbytes:
                self._resized(e, nb)
            if retag and e.cat != cat:
                self.by_cat[e.cat] -= e.nbytes
                self.by_cat[cat] = self.by_cat.get(cat, 0) + e.nbytes
                e.cat = cat
            return
        dev = st.device.type
        if self.device_filter is not None and dev != self.device_filter:
            return
        nb = self._size(st.nbytes())
        e = _Entry(nb, cat, dev)
        e.ref = weakref.ref(st, lambda r, k=key: self._on_dead(k, r))
        self._entries[key] = e
        if nb:
            self._bump(cat, nb)
            self._trace_birth(e)

    # ------------------------------------------------------------------ tagging
    def track_tensors(self, tensors: Iterable[Any], category: str, retag: bool = True) -> None:
        flat, _ = tree_flatten(list(tensors))
        for t in flat:
            if isinstance(t, torch.Tensor):
                for st in storages_of(t):
                    self._register(st, category, retag)

    def track_module(self, module: torch.nn.Module, grad_hooks: bool = True) -> None:
        """Tag params/buffers (and existing grads); install post-accumulate-grad hooks
        that tag ``param.grad`` as "gradient" as soon as the engine accumulates it."""
        for p in module.parameters():
            self.track_tensors([p], "parameter")
            if p.grad is not None:
                self.track_tensors([p.grad], "gradient")
            if grad_hooks and p.requires_grad and hasattr(p, "register_post_accumulate_grad_hook"):
                try:
                    h = p.register_post_accumulate_grad_hook(
                        lambda q: self.track_tensors([q.grad], "gradient") if q.grad is not None else None
                    )
                    self._grad_hooks.append(h)
                except RuntimeError:
                    pass
        for b in module.buffers():
            self.track_tensors([b], "buffer")

    def track_optimizer(self, optimizer) -> None:
        for st in optimizer.state.values():
            for v in st.values():
                if isinstance(v, torch.Tensor):
                    self.track_tensors([v], "optimizer_state")

    def track_grads(self, module: torch.nn.Module) -> None:
        for p in module.parameters():
            if p.grad is not None:
                self.track_tensors([p.grad], "gradient")

    # ------------------------------------------------------------------- phases
    @contextlib.contextmanager
    def phase(self, name: str, alloc_category: Optional[str] = None):
        prev_phase, prev_cat = self._phase, self.alloc_category
        ph = PhaseStats(name, self.current, self.by_cat)
        self._phase = ph
        if alloc_category is not None:
            self.alloc_category = alloc_category
        try:
            yield ph
        finally:
            ph.end = self.current
            ph.end_breakdown = dict(self.by_cat)
            self.phases[name] = ph
            self._phase = prev_phase
            self.alloc_category = prev_cat
            if prev_phase is not None and ph.peak > prev_phase.peak:
                prev_phase.peak = ph.peak
                prev_phase.peak_breakdown = dict(ph.peak_breakdown)

    def reset_peak(self) -> None:
        self.peak_bytes = self.current
        self.peak_breakdown = dict(self.by_cat)

    def breakdown(self) -> Dict[str, int]:
        return {k: v for k, v in self.by_cat.items() if v}

    def live_storages(self) -> int:
        return sum(1 for e in self._entries.values() if e.nbytes)

    # ------------------------------------------------------------ mode plumbing
    def __enter__(self):
        if self._depth == 0:
            self._orig_resize = torch.UntypedStorage.resize_
            orig = self._orig_resize
            tracker = self

            def resize_(st, size):  # noqa: ANN001
                r = orig(st, size)
                e = tracker._entries.get(id(st))
                if e is not None:
                    nb = tracker._size(st.nbytes())
                    if nb != e.nbytes:
                        tracker._resized(e, nb)
                return r

            torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]
        self._depth += 1
        return super().__enter__()

    def __exit__(self, *args):
        self._depth -= 1
        if self._depth == 0:
            if self._orig_resize is not None:
                torch.UntypedStorage.resize_ = self._orig_resize  # type: ignore[method-assign]
            for h in self._grad_hooks:
                h.remove()
            self._grad_hooks.clear()
        return super().__exit__(*args)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # Let DTensor (and other wrapper subclasses that desugar to plain ops) run
        # first: the local ops they issue come back through this mode.
        if DTensor is not None and any(t is DTensor for t in types):
            return NotImplemented
        out = func(*args, **(kwargs or {}))
        self.n_ops += 1
        cat = self.alloc_category
        flat, _ = tree_flatten(out)
        for t in flat:
            if isinstance(t, torch.Tensor):
                for st in storages_of(t):
                    self._register(st, cat, False)
        return out
