"""Per-tensor records of a training step (``measure.tensors``, ``memfit validate --tensors``).

``TensorLogTracker`` is the live-tensor tracker of tracker.py plus, while ``logging`` is on, one
row per storage an ATen op creates: the op, the shape and dtype of the tensor that created it, its
bytes, the phase and the decoder layer that was running at its birth, and the same for its death.
`memfit validate --tensors` compares the rows of each layer with the core's tensor lists
(core/src/layer_ops.cpp), entry by entry.

Phases: "f" forward, "r" the recomputation of a checkpointed layer (ops run with grad mode on
inside the backward), "b" backward, "o" optimizer, "x" anything else (zero_grad, the next step).
Layers: -1 before the first decoder layer (embedding, rotary tables, masks), 0..L-1 the decoder
layers, L after the last (final norm, lm_head, loss). In the forward the layer is set by
forward pre/post hooks on the decoder layers; in the backward by gradient hooks on each layer's
input and output (a hook on a tensor fires when autograd has its gradient, so the output's
marks the start of that layer's backward and the input's the end). Whether autograd saved a
tensor is read from when it died: in the forward (not saved) or in the backward (saved).

Only births while ``logging`` is on are recorded (workload.py turns it on for the first
micro-batch's forward and backward of step 1); deaths of recorded tensors are recorded whenever
they happen. Without ``measure.tensors`` the workload uses the plain tracker: its path and
overhead do not change.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Dict, List

import torch
from torch.utils._pytree import tree_flatten

from tracker import LiveTensorTracker, storages_of

# one row per recorded storage: born_* when the op ran, died_* when the storage died, died_after =
# the row born last before the death (-1: still alive at the end)
COLUMNS = ["op", "shape", "dtype", "bytes", "born_phase", "born_layer", "died_phase", "died_layer", "died_after"]
_PHASE = {"activation": "f", "backward_temp": "b", "optimizer_temp": "o"}


def _first_tensor(x: Any):
    flat, _ = tree_flatten(x)
    return next((t for t in flat if isinstance(t, torch.Tensor)), None)


class TensorLogTracker(LiveTensorTracker):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.logging = False
        self.rows: List[list] = []
        self._row_of: Dict[int, int] = {}  # storage key -> row
        self.layer = -1
        self.layers = 0
        self._hooks: list = []
        self._fresh: set = set()

    # --------------------------------------------------------------- context
    def _phase_code(self) -> str:
        # the autograd engine runs backward functions with grad mode off; torch.utils.checkpoint
        # re-runs a layer's forward with it on (Transformers wraps the layer's forward, so the
        # layer's own hooks do not fire again)
        p = _PHASE.get(self.alloc_category, "x")
        return "r" if p == "b" and torch.is_grad_enabled() and 0 <= self.layer < self.layers else p

    def watch_layers(self, layers: List[torch.nn.Module]) -> None:
        """Forward hooks on each decoder layer; gradient hooks on its input and output."""
        self.layers = len(layers)
        for k, m in enumerate(layers):
            self._hooks.append(m.register_forward_pre_hook(partial(self._pre, k), with_kwargs=True))
            self._hooks.append(m.register_forward_hook(partial(self._post, k), with_kwargs=True))

    def _set_layer(self, k: int, _grad=None) -> None:
        self.layer = k

    def _pre(self, k, _m, args, kwargs):
        self.layer = k
        x = args[0] if args else kwargs.get("hidden_states")
        if self.alloc_category == "activation" and isinstance(x, torch.Tensor) and x.requires_grad:
            x.register_hook(partial(self._set_layer, k - 1))  # layer k's backward is over

    def _post(self, k, _m, _args, _kwargs, out):
        if self.alloc_category != "activation":
            self.layer = k  # a re-run inside layer k's backward
            return
        self.layer = k + 1
        y = _first_tensor(out)
        if isinstance(y, torch.Tensor) and y.requires_grad:
            y.register_hook(partial(self._set_layer, k))  # layer k's backward starts

    def start(self, layer: int) -> None:
        """Called at the start of a forward (layer -1) or a backward (layer L)."""
        self.layer = layer

    def remove_hooks(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()

    # ------------------------------------------------------------- recording
    def _on_dead(self, key: int, ref) -> None:
        row = self._row_of.pop(key, None)
        if row is not None:
            r = self.rows[row]
            r[6], r[7], r[8] = self._phase_code(), self.layer, len(self.rows) - 1
        super()._on_dead(key, ref)

    def _register(self, st, cat: str, retag: bool) -> None:
        fresh = self.logging and id(st) not in self._entries
        super()._register(st, cat, retag)
        if fresh:
            self._fresh.add(id(st))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.logging:
            return super().__torch_dispatch__(func, types, args, kwargs)
        self._fresh = set()
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if out is NotImplemented or not self._fresh:
            return out
        flat, _ = tree_flatten(out)
        for t in flat:
            if not isinstance(t, torch.Tensor):
                continue
            for st in storages_of(t):
                key = id(st)
                e = self._entries.get(key)
                if key not in self._fresh or e is None or not e.nbytes:
                    continue
                self._fresh.discard(key)
                self._row_of[key] = len(self.rows)
                self.rows.append([func.overloadpacket.__name__, list(t.shape), str(t.dtype).replace("torch.", ""),
                                  e.nbytes, self._phase_code(), self.layer, None, None, -1])
        return out

    def as_record(self) -> Dict[str, Any]:
        return {"columns": COLUMNS, "layers": self.layers, "rows": self.rows}
