#!/usr/bin/env python3
"""memfit measurement workload: run a real PyTorch + transformers step, report memory.

Input: one memfit request (JSON object), a JSON list of them, or JSON lines; from a
file path or "-" (stdin).  Output: one JSON line per case (per rank when launched
by torchrun) on stdout, or appended to --output.  Progress/logs go to stderr.

    python validate/workload.py case.json
    python validate/workload.py - < case.json
    python -m torch.distributed.run --nproc-per-node 2 validate/workload.py ddp_case.json

Request schema (see validate/README in NOTES.md):
  model: {"config": {...}} | {"id": "org/name"} (-> data/configs/org--name.json)
         | {"config_path": "relative/or/absolute.json"}
         (+ "head" for encoders, ENCODER_MODEL_TYPES: "lm" -> AutoModelForMaskedLM with MLM labels,
         "classification" -> AutoModelForSequenceClassification, "auto" -> the config's architectures;
         fed a BERT tokenizer's columns, training_batch; decoders: AutoModelForCausalLM, labels = ids)
  task: full | lora | qlora | inference   (qlora: from_pretrained + BitsAndBytesConfig on a random-weight
        checkpoint, bitsandbytes' CPU backend on CPU; quantization nf4 | nf4_double | fp4 | int8;
        runtime.prepare_kbit (default true): PEFT prepare_model_for_kbit_training)
  runtime.framework: transformers | hf | trl | torchtune | litgpt -> the framework's own step (frameworks.py);
        absent -> the plain loop below
  lora: {rank, alpha, targets: [..] | "all-linear", dropout}
  precision: fp32 | amp_bf16 | amp_fp16 | bf16 | fp16
  optimizer: adamw | adamw_fused | adamw_loop | sgd | sgd_momentum | adafactor | lion (bitsandbytes Lion)
             | adamw_8bit | lion_8bit (bitsandbytes, CPU backend on CPU) | paged_adamw_8bit (CUDA only)
  micro_batch_size, sequence_length, gradient_accumulation_steps, gradient_checkpointing,
  attention: eager | sdpa | flash_attention_2
  inference: {batch_size, context_length, new_tokens}
  parallelism: {method: single|ddp|fsdp_full_shard|fsdp_shard_grad_op|tp, dp, tp}
  name
Extensions: "steps" (training steps, default 2), "seed", "device" ("cpu"/"cuda", default:
cuda if available), "measure": {"tracker": bool, "allocator_profile": bool, "trace": bool, "tensors": bool}.
"measure.tensors" adds one row per tensor of the first micro-batch (validate/tensor_log.py) as
measured.tensors (plain training loop only).
"measure.trace" adds the allocation trace (tracker.py's signed-integer form) as
measured.allocation_trace; on CUDA also measured.cuda_allocation_trace, from
torch.cuda.memory._record_memory_history (untested: no GPU has run it yet).

CPU: exact live-tensor accounting (validate/tracker.py, categories params/grads/optimizer
state/activations/...).  CUDA: torch.cuda max_memory_allocated/reserved per phase, NVML
device-used, CUDA-context baseline; the tracker also runs (category breakdown) unless
measure.tracker=false.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import platform
import re
import sys
import time
import traceback
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SCHEMA_VERSION = 1


def log(*a):
    print("[workload]", *a, file=sys.stderr, flush=True)


def _missing_dependency(name: str, exc: Exception):
    msg = (f"memfit validate: the Python package '{name}' is missing or broken ({exc}). "
           f"Create the venv with scripts/setup_python.sh (pins in validate/requirements.txt) "
           f"and run workload.py with that venv's python.")
    print(json.dumps({"error": msg, "missing_dependency": name}), flush=True)
    print(msg, file=sys.stderr)
    sys.exit(3)


try:
    import torch
except Exception as e:  # noqa: BLE001
    _missing_dependency("torch", e)

sys.path.insert(0, HERE)
from tracker import LiveTensorTracker  # noqa: E402
from tensor_log import TensorLogTracker  # noqa: E402


class _Done(Exception):
    """A framework runner measured the whole case itself."""


class Unsupported(Exception):
    """The request asks for something this environment cannot run (reported, not a crash)."""


# ----------------------------------------------------------------------------- input
def load_cases(src: str) -> List[Dict[str, Any]]:
    text = sys.stdin.read() if src == "-" else open(src).read()
    text = text.strip()
    if not text:
        return []
    try:
        obj = json.loads(text)
        if isinstance(obj, dict) and isinstance(obj.get("cases"), list):
            return obj["cases"]
        return obj if isinstance(obj, list) else [obj]
    except json.JSONDecodeError:
        return [json.loads(line) for line in text.splitlines() if line.strip()]


def resolve_config(model: Dict[str, Any]) -> Dict[str, Any]:
    if "config" in model:
        return dict(model["config"])
    if "config_path" in model:
        p = model["config_path"]
        p = p if os.path.isabs(p) else os.path.join(ROOT, p)
        with open(p) as f:
            return json.load(f)
    if "id" in model:
        name = model["id"].replace("/", "--")
        for d in ("data/configs", "data/configs/partial", "data/validation/tiny_configs"):
            p = os.path.join(ROOT, d, name + ".json")
            if os.path.exists(p):
                with open(p) as f:
                    return json.load(f)
        raise Unsupported(f"no config file for model id {model['id']!r} (looked for data/configs/{name}.json)")
    raise Unsupported("request.model needs 'config', 'config_path' or 'id'")


# ----------------------------------------------------------------------- environment
def env_info(device: torch.device) -> Dict[str, Any]:
    info: Dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "device": device.type,
        "cpu_threads": torch.get_num_threads(),
    }
    for mod in ("transformers", "peft", "accelerate"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            info[mod] = None
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update(gpu_name=p.name, gpu_total_bytes=int(p.total_memory), cuda=torch.version.cuda,
                    cudnn=torch.backends.cudnn.version(), capability=f"{p.major}.{p.minor}")
    return info


class Nvml:
    """Device-wide used memory via NVML (nvidia-ml-py), if importable."""

    def __init__(self, index: int):
        self.h = None
        try:
            import pynvml  # type: ignore
            pynvml.nvmlInit()
            self.pynvml = pynvml
            self.h = pynvml.nvmlDeviceGetHandleByIndex(index)
            self.driver = pynvml.nvmlSystemGetDriverVersion()
        except Exception:  # noqa: BLE001
            self.h = None

    def used(self) -> Optional[int]:
        if self.h is None:
            return None
        return int(self.pynvml.nvmlDeviceGetMemoryInfo(self.h).used)


# --------------------------------------------------------------------- measurement
class Meter:
    """Per-phase memory: live-tensor tracker (any device) + torch.cuda stats on CUDA."""

    def __init__(self, device: torch.device, use_tracker: bool, nvml: Optional[Nvml], trace: bool = False,
                 tensors: bool = False):
        self.device = device
        self.cuda = device.type == "cuda"
        kind = TensorLogTracker if tensors else LiveTensorTracker
        self.tracker = kind(device_filter=device.type, record_trace=trace) if use_tracker or tensors else None
        self.nvml = nvml
        self.phases: Dict[str, Dict[str, Any]] = {}
        self.order: List[str] = []
        self.cuda_peak_alloc = 0
        self.cuda_peak_reserved = 0
        self.nvml_peak = None
        self.marks: List[tuple] = []  # (name, t_start_ns, t_end_ns) for the allocator profile
        self._stack: List[Dict[str, Any]] = []

    def _fold_cuda_peaks(self):
        if not self._stack:
            return
        a = int(torch.cuda.max_memory_allocated(self.device))
        r = int(torch.cuda.max_memory_reserved(self.device))
        for rec in self._stack:
            rec["_run_alloc"] = max(rec.get("_run_alloc", 0), a)
            rec["_run_reserved"] = max(rec.get("_run_reserved", 0), r)

    def __enter__(self):
        if self.tracker is not None:
            self.tracker.__enter__()
        return self

    def forget_build_peak(self):
        """Drops the run's peak back to what is live now. Building a random-weight model
        (from_config, then init and casting) makes transients a run that loads a checkpoint does not
        have; the model_load phase keeps its own peak in the record."""
        if self.tracker is not None:
            self.tracker.reset_peak()
        if self.cuda:
            torch.cuda.synchronize(self.device)
            self.cuda_peak_alloc = int(torch.cuda.memory_allocated(self.device))
            self.cuda_peak_reserved = int(torch.cuda.memory_reserved(self.device))

    def __exit__(self, *a):
        if self.tracker is not None:
            self.tracker.__exit__(*a)

    @contextlib.contextmanager
    def phase(self, name: str, alloc_category: Optional[str] = None):
        rec: Dict[str, Any] = {}
        t0 = time.perf_counter()
        t0ns = time.time_ns()
        if self.cuda:
            torch.cuda.synchronize(self.device)
            # reset_peak_memory_stats is global: fold the peak so far into every open (outer) phase
            self._fold_cuda_peaks()
            torch.cuda.reset_peak_memory_stats(self.device)
            rec["cuda_allocated_start"] = int(torch.cuda.memory_allocated(self.device))
            rec["_run_alloc"] = 0
            rec["_run_reserved"] = 0
        self._stack.append(rec)
        ctx = self.tracker.phase(name, alloc_category) if self.tracker is not None else contextlib.nullcontext()
        try:
            with ctx as ph:
                yield rec
        finally:
            self._stack.pop()
            if self.cuda:
                torch.cuda.synchronize(self.device)
                pa = max(int(torch.cuda.max_memory_allocated(self.device)), rec.pop("_run_alloc"))
                pr = max(int(torch.cuda.max_memory_reserved(self.device)), rec.pop("_run_reserved"))
                rec.update(cuda_peak_allocated=pa, cuda_peak_reserved=pr,
                           cuda_allocated_end=int(torch.cuda.memory_allocated(self.device)),
                           cuda_reserved_end=int(torch.cuda.memory_reserved(self.device)))
                self.cuda_peak_alloc = max(self.cuda_peak_alloc, pa)
                self.cuda_peak_reserved = max(self.cuda_peak_reserved, pr)
                if self.nvml is not None and self.nvml.used() is not None:
                    u = self.nvml.used()
                    rec["nvml_used_end"] = u
                    self.nvml_peak = max(self.nvml_peak or 0, u)
            if self.tracker is not None and ph is not None:
                rec.update(ph.as_dict())
            rec["seconds"] = round(time.perf_counter() - t0, 4)
            self.marks.append((name, t0ns, time.time_ns()))
            self.phases[name] = rec
            if name not in self.order:
                self.order.append(name)


def snapshot_trace(snap: Dict[str, Any], index: int) -> List[int]:
    """A torch.cuda.memory._snapshot() -> the tracker's signed-integer trace for one device:
    "alloc" -> +size (the size the program asked for) in order, "free_completed" of a traced
    address -> -(its allocation number) - 1; segment and free_requested events are the
    allocator's own business and are left out (the replay re-creates them)."""
    traces = snap.get("device_traces") or []
    events = traces[index] if len(traces) > index else []
    out: List[int] = []
    live: Dict[int, int] = {}
    allocs = 0
    for ev in events:
        action, addr, size = ev.get("action"), ev.get("addr"), int(ev.get("size", 0))
        if action == "alloc" and size > 0:
            live[addr] = allocs
            allocs += 1
            out.append(size)
        elif action == "free_completed" and addr in live:
            out.append(-live.pop(addr) - 1)
    return out


def cuda_history(device: torch.device, start: bool):
    """CUDA only, untested (no GPU has run it yet): start=True begins recording the caching
    allocator's history; start=False takes the snapshot, stops recording and returns the
    device's trace (snapshot_trace), which `memfit validate` replays like a CPU trace and
    compares with max_memory_reserved."""
    if start:
        torch.cuda.memory._record_memory_history(max_entries=10_000_000)
        return None
    snap = torch.cuda.memory._snapshot(device)
    torch.cuda.memory._record_memory_history(enabled=None)
    return snapshot_trace(snap, device.index or 0)


def allocator_profile_peaks(prof, marks, base_bytes: int) -> Dict[str, Any]:
    """CPU allocator view from profiler memory events: every c10 CPU allocation and free,
    including kernels' internal scratch the live-tensor tracker cannot see."""
    try:
        evs = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"
               and e.device_type() == torch.autograd.DeviceType.CPU]
    except Exception as e:  # noqa: BLE001
        return {"error": f"profiler memory events unavailable: {e}"}
    evs.sort(key=lambda e: e.start_ns())
    import bisect
    times = [e.start_ns() for e in evs]
    prefix = []
    cur, peak = 0, 0
    for e in evs:
        cur += e.nbytes()
        prefix.append(cur)
        peak = max(peak, cur)
    per = {}
    for name, a, b in marks:
        i = bisect.bisect_left(times, a)
        j = bisect.bisect_right(times, b)
        start = prefix[i - 1] if i > 0 else 0
        per[name] = max([start] + prefix[i:j])
    return {"peak_bytes": base_bytes + peak, "relative_peak_bytes": peak, "events": len(evs),
            "per_phase_peak_bytes": {k: base_bytes + v for k, v in per.items()},
            "note": "baseline = tracker live bytes when profiling started; clock-matched phase windows"}


# ------------------------------------------------------------------------ building
DTYPES = {"fp32": "float32", "amp_bf16": "float32", "amp_fp16": "float32",
          "bf16": "bfloat16", "fp16": "float16"}


def build_config(cfg_dict: Dict[str, Any]):
    from transformers import AutoConfig
    d = dict(cfg_dict)
    mt = d.pop("model_type", None)
    if mt is None:
        raise Unsupported("config has no model_type")
    if "auto_map" in d:
        d.pop("auto_map")  # remote code is never fetched; use the in-library class for model_type
    d.pop("quantization_config", None)
    try:
        return AutoConfig.for_model(mt, **d)
    except ValueError as e:
        raise Unsupported(f"transformers {__import__('transformers').__version__} has no model_type {mt!r}: {e}")


def decoder_layer_classes(model) -> set:
    names = set(getattr(model, "_no_split_modules", None) or [])
    inner = getattr(model, "base_model", model)
    names |= set(getattr(inner, "_no_split_modules", None) or [])
    return names


def find_decoder_layers(model) -> List[torch.nn.Module]:
    names = decoder_layer_classes(model)
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if layers:
        return layers
    # fallback: the largest ModuleList
    best = None
    for m in model.modules():
        if isinstance(m, torch.nn.ModuleList) and (best is None or len(m) > len(best)):
            best = m
    return list(best) if best is not None else []


# Encoder-only model types: the head is a masked-LM or a sequence-classification head, chosen as
# memfit's estimator chooses it (core/src/model_config.cpp build_bert): the request's model.head
# ("classification" | "lm"), or with "auto" the config's architectures entry. Decoders: causal LM.
ENCODER_MODEL_TYPES = {"bert"}
AUTO_CLASS = {"causal_lm": "AutoModelForCausalLM", "masked_lm": "AutoModelForMaskedLM",
              "classification": "AutoModelForSequenceClassification"}
# PEFT task type per head (classification: PEFT's SEQ_CLS also trains a copy of the classifier;
# PEFT has no masked-LM task type, so the LoRA model is a plain PeftModel)
LORA_TASK_TYPE = {"causal_lm": "CAUSAL_LM", "masked_lm": None, "classification": "SEQ_CLS"}


def model_head(req) -> str:
    model = req.get("model") or {}
    cfg = model.get("config") or (resolve_config(model) if model else {})
    if cfg.get("model_type") not in ENCODER_MODEL_TYPES:
        return "causal_lm"
    head = model.get("head", "auto")
    arch = (cfg.get("architectures") or [""])[0]
    classify = head == "classification" or (head == "auto" and arch.endswith("ForSequenceClassification"))
    return "classification" if classify else "masked_lm"


def build_model(req, cfg_dict, device, dtype, attn):
    import transformers
    auto_class = getattr(transformers, AUTO_CLASS[model_head(req)])
    config = build_config(cfg_dict)
    kwargs = {"dtype": dtype}
    if attn:
        kwargs["attn_implementation"] = attn
    try:
        with torch.device(device):
            model = auto_class.from_config(config, **kwargs)
    except ValueError as e:
        if "does not support an attention implementation" in str(e) or "attn_implementation" in str(e):
            raise Unsupported(f"attention {attn!r} not supported by {config.model_type} in transformers "
                              f"{__import__('transformers').__version__}: {str(e)[:200]}")
        raise
    return model


# bitsandbytes 4-bit types memfit names (request "quantization") -> BitsAndBytesConfig fields
BNB_4BIT = {"nf4": ("nf4", False), "nf4_double": ("nf4", True), "fp4": ("fp4", False), "fp4_double": ("fp4", True)}


def quantized_checkpoint(config, dtype) -> str:
    """A random-weight checkpoint of `config` in `dtype`, saved once per (config, dtype) outside the
    measurement: QLoRA's real load path (from_pretrained with a BitsAndBytesConfig) quantizes the
    Linear weights while loading, and from_config has no quantization path."""
    import hashlib
    import tempfile
    from transformers import AutoModelForCausalLM
    key = hashlib.sha256((config.to_json_string() + str(dtype)).encode()).hexdigest()[:16]
    d = os.path.join(tempfile.gettempdir(), "memfit-random-checkpoints", key)
    if not os.path.exists(os.path.join(d, "config.json")):
        torch.manual_seed(0)
        m = AutoModelForCausalLM.from_config(config, dtype=dtype)
        m.save_pretrained(d + ".part")
        del m
        os.replace(d + ".part", d) if not os.path.exists(d) else None
    return d


def build_quantized_model(req, cfg_dict, device, dtype, attn):
    """What a QLoRA recipe does: from_pretrained(..., quantization_config=BitsAndBytesConfig(load_in_4bit,
    bnb_4bit_quant_type, bnb_4bit_use_double_quant, bnb_4bit_compute_dtype=the model dtype)) or
    load_in_8bit for LLM.int8. Runs on CPU through bitsandbytes' CPU backend (>= 0.46)."""
    try:
        import bitsandbytes  # noqa: F401
        from transformers import AutoModelForCausalLM, BitsAndBytesConfig
    except Exception as e:  # noqa: BLE001
        raise Unsupported(f"qlora needs bitsandbytes (validate/requirements.txt): {e}")
    quant = req.get("quantization") or "nf4"
    if quant in BNB_4BIT:
        qt, dq = BNB_4BIT[quant]
        qcfg = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=qt, bnb_4bit_use_double_quant=dq,
                                  bnb_4bit_compute_dtype=dtype)
    elif quant == "int8":
        qcfg = BitsAndBytesConfig(load_in_8bit=True)
    else:
        raise Unsupported(f"qlora over quantization {quant!r} is not measured here (bitsandbytes nf4/fp4/int8 only)")
    config = build_config(cfg_dict)
    path = quantized_checkpoint(config, dtype)
    kwargs = {"dtype": dtype, "quantization_config": qcfg, "device_map": device.type}
    if attn:
        kwargs["attn_implementation"] = attn
    try:
        return AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except ValueError as e:
        if "attn_implementation" in str(e) or "does not support an attention implementation" in str(e):
            raise Unsupported(f"attention {attn!r} not supported by {config.model_type}: {str(e)[:200]}")
        raise


def quant_state_tensors(model) -> list:
    """bitsandbytes' quantization constants (absmax, the nested absmax of double quantization, the
    code table, LLM.int8's row scales): tensors on the weights, not parameters or buffers."""
    out = []
    for p in model.parameters():
        qs = getattr(p, "quant_state", None)
        if qs is not None:
            out += [t for t in (qs.absmax, qs.code, getattr(qs, "offset", None)) if isinstance(t, torch.Tensor)]
            st2 = getattr(qs, "state2", None)
            if st2 is not None:
                out += [t for t in (st2.absmax, st2.code) if isinstance(t, torch.Tensor)]
        scb = getattr(p, "SCB", None)
        if isinstance(scb, torch.Tensor):
            out.append(scb)
    return out


def peft_without_torchao():
    """PEFT 0.21's LoRA dispatcher asks is_torchao_available() for every Linear it wraps, and that
    raises ImportError when torchao < 0.16 is installed; torchtune 0.6.1 (measured here too) needs
    torchao 0.13. No model this workload builds has torchao-quantized weights, so PEFT's torchao
    dispatcher is told torchao is absent: the LoRA layers PEFT creates are the same."""
    import importlib
    for mod in ("peft.import_utils", "peft.tuners.lora.torchao", "peft.utils.quantization_utils"):
        try:
            importlib.import_module(mod).is_torchao_available = lambda: False
        except Exception:  # noqa: BLE001
            pass


def lora_dropout(req) -> float:
    """lora.dropout, else the framework's default: TRL's ModelConfig.lora_dropout = 0.05 (trl 1.16
    trainer/model_config.py); PEFT's LoraConfig (Transformers) and torchtune's builders: 0.0."""
    lo = req.get("lora") or {}
    if "dropout" in lo:
        return float(lo["dropout"])
    return 0.05 if (req.get("runtime") or {}).get("framework") == "trl" else 0.0


def apply_lora(model, req):
    try:
        from peft import LoraConfig, get_peft_model
    except Exception as e:  # noqa: BLE001
        raise Unsupported(f"peft is not importable ({e}); install validate/requirements.txt")
    peft_without_torchao()
    lo = req.get("lora") or {}
    targets = lo.get("targets", ["q_proj", "v_proj"])
    cfg = LoraConfig(r=int(lo.get("rank", 16)), lora_alpha=float(lo.get("alpha", 2 * int(lo.get("rank", 16)))),
                     target_modules=targets, lora_dropout=lora_dropout(req),
                     bias="none", task_type=LORA_TASK_TYPE[model_head(req)])
    return get_peft_model(model, cfg)


def make_optimizer(name: str, params, device):
    info: Dict[str, Any] = {"name": name}
    lr = 1e-5
    if name == "adamw":
        opt = torch.optim.AdamW(params, lr=lr, foreach=True)
        info["impl"] = "torch.optim.AdamW(foreach=True)"
    elif name == "adamw_fused":
        opt = torch.optim.AdamW(params, lr=lr, fused=True)
        info["impl"] = "torch.optim.AdamW(fused=True)"
    elif name in ("adamw_loop", "adamw_single"):  # memfit's name: the per-tensor loop
        opt = torch.optim.AdamW(params, lr=lr, foreach=False)
        info["impl"] = "torch.optim.AdamW(foreach=False)"
    elif name == "sgd":
        opt = torch.optim.SGD(params, lr=lr, foreach=True)
        info["impl"] = "torch.optim.SGD(momentum=0, foreach=True)"
    elif name == "sgd_momentum":
        opt = torch.optim.SGD(params, lr=lr, momentum=0.9, foreach=True)
        info["impl"] = "torch.optim.SGD(momentum=0.9, foreach=True)"
    elif name == "adafactor":
        from transformers.optimization import Adafactor
        opt = Adafactor(params, lr=lr, scale_parameter=False, relative_step=False, warmup_init=False)
        info["impl"] = ("transformers.optimization.Adafactor(scale_parameter=False, relative_step=False) "
                        "(what HF Trainer's optim='adafactor' builds)")
    elif name in ("adamw_8bit", "paged_adamw_8bit", "lion", "lion_8bit"):
        try:
            import bitsandbytes as bnb  # type: ignore
        except Exception:  # noqa: BLE001
            bnb = None
        if bnb is None:
            raise Unsupported(f"optimizer {name!r} unsupported here: torch and transformers have no "
                              f"implementation of it and bitsandbytes is not installed")
        if name.startswith("paged") and device.type != "cuda":
            # bitsandbytes' CPU backend falls back to ordinary tensors: nothing paged to measure
            raise Unsupported(f"optimizer {name!r}: paged (unified-memory) states exist only on CUDA")
        cls = {"adamw_8bit": bnb.optim.AdamW8bit, "paged_adamw_8bit": bnb.optim.PagedAdamW8bit,
               "lion": bnb.optim.Lion, "lion_8bit": bnb.optim.Lion8bit}[name]
        opt = cls(params, lr=lr)
        # CPU: bitsandbytes' pure-torch optimizer_update_8bit_blockwise dequantizes the states of one
        # tensor inside its custom op (fp32 copies the tracker cannot see); the CUDA kernel works in
        # registers. The states themselves (uint8 + fp32 absmax per 256, fp32 below 4096 elements)
        # are the same on both.
        info["impl"] = f"bitsandbytes.optim.{cls.__name__} ({device.type} backend)"
    else:
        raise Unsupported(f"unknown optimizer {name!r}")
    return opt, info


# Optimizers written for plain tensors: transformers' Adafactor builds its factored states as plain
# tensors and fails when it meets a DTensor gradient ("got mixed torch.Tensor and DTensor").
PLAIN_TENSOR_OPTIMIZERS = ("adafactor",)


def local_shard_pairs(params):
    """(parameter, the tensor the optimizer steps): a DTensor's local shard, else the parameter."""
    from torch.distributed.tensor import DTensor
    return [(p, p._local_tensor if isinstance(p, DTensor) else p) for p in params]


def step_local_shards(opt, pairs):
    """Megatron's optimizers step each rank's shard as a plain tensor. An optimizer built over the
    local shards gets, before each step, the local shards of the DTensor gradients; after it both
    are dropped (zero_grad(set_to_none=True) would only reach the shards)."""
    sharded = [(p, t) for p, t in pairs if t is not p]

    def before(*_):
        for p, t in sharded:
            t.grad = None if p.grad is None else p.grad._local_tensor

    def after(*_):
        for p, t in sharded:
            t.grad = None
            p.grad = None
    opt.register_step_pre_hook(before)
    opt.register_step_post_hook(after)


def is_oom(e: BaseException) -> bool:
    if isinstance(e, getattr(torch, "OutOfMemoryError", ())) or \
            isinstance(e, getattr(torch.cuda, "OutOfMemoryError", ())):
        return True
    s = str(e)
    return ("out of memory" in s.lower()) or ("can't allocate memory" in s) or ("not enough memory" in s.lower())


# ----------------------------------------------------------------- distributed
class Dist:
    def __init__(self):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.initialized = False
        self.backend = None

    def init(self, device_type: str):
        if self.world <= 1 or self.initialized:
            return
        import torch.distributed as dist
        self.backend = "nccl" if device_type == "cuda" else "gloo"
        if device_type == "cuda":
            torch.cuda.set_device(self.local_rank)
        dist.init_process_group(backend=self.backend)
        self.initialized = True

    def barrier(self):
        if self.initialized:
            import torch.distributed as dist
            dist.barrier()

    def gather(self, obj):
        if not self.initialized:
            return [obj]
        import torch.distributed as dist
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def close(self):
        if self.initialized:
            import torch.distributed as dist
            dist.destroy_process_group()
            self.initialized = False


TP_COLWISE = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
TP_ROWWISE = ("o_proj", "down_proj")


def apply_tp(model, mesh):
    """Megatron-style TP of the llama-style projections. A PEFT LoRA layer around one is split the
    way PEFT's LoraParallelLinear does (peft/tuners/lora/tp_layer.py): its base layer like a plain
    one, lora_B by columns under a column-parallel base, lora_A by rows under a row-parallel one;
    the other adapter matrix stays whole on every rank."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    plan = {}
    for name, mod in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf not in TP_COLWISE + TP_ROWWISE or "lora_" in name:
            continue
        style = ColwiseParallel if leaf in TP_COLWISE else RowwiseParallel
        if isinstance(mod, torch.nn.Linear):
            plan[name] = style()
        elif isinstance(getattr(mod, "base_layer", None), torch.nn.Linear) and hasattr(mod, "lora_A"):
            plan[f"{name}.base_layer"] = style()
            adapter_side = "lora_B" if style is ColwiseParallel else "lora_A"
            for adapter in getattr(mod, adapter_side):
                plan[f"{name}.{adapter_side}.{adapter}"] = style()
    if not plan:
        raise Unsupported("tp: no q/k/v/gate/up/o/down_proj nn.Linear modules in this model (llama-style names needed)")
    parallelize_module(model, mesh, plan)
    # one entry per module kind: "q_proj:ColwiseParallel", "q_proj.lora_B.default:ColwiseParallel"
    return sorted({re.sub(r"^.*?\.\d+\.(self_attn|mlp)\.", "", k) + ":" + type(v).__name__ for k, v in plan.items()})


# --------------------------------------------------------------------- the case
def run_case(req: Dict[str, Any], dist_ctx: Dist, opts) -> Dict[str, Any]:
    task = req.get("task", "full")
    precision = req.get("precision", "fp32")
    par = req.get("parallelism") or {}
    method = par.get("method", "single")
    want = req.get("device") or opts.device
    if want in (None, "auto"):
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want == "cuda" and not torch.cuda.is_available():
        raise Unsupported("device 'cuda' requested but torch.cuda.is_available() is False")
    device = torch.device("cuda", dist_ctx.local_rank) if want == "cuda" else torch.device("cpu")
    measure = req.get("measure") or {}
    use_tracker = bool(measure.get("tracker", not opts.no_tracker))
    use_prof = bool(measure.get("allocator_profile", opts.allocator_profile)) and device.type == "cpu"
    use_trace = bool(measure.get("trace", False))
    use_tensors = bool(measure.get("tensors", False))

    result: Dict[str, Any] = {"schema": SCHEMA_VERSION, "name": req.get("name"),
                              "environment": env_info(device)}
    setup: Dict[str, Any] = {}
    result["setup"] = setup
    if method != "single" or dist_ctx.world > 1:
        setup.update(world_size=dist_ctx.world, rank=dist_ctx.rank, method=method)
        result["rank"] = dist_ctx.rank

    if precision not in DTYPES:
        raise Unsupported(f"unknown precision {precision!r}")
    if task not in ("full", "lora", "qlora", "inference"):
        raise Unsupported(f"unknown task {task!r}")
    attn = req.get("attention", "sdpa")
    if attn == "flash_attention_2" and device.type != "cuda":
        raise Unsupported("attention 'flash_attention_2' needs CUDA and the flash-attn package")
    if method not in ("single", "ddp", "fsdp_full_shard", "fsdp_shard_grad_op", "tp"):
        raise Unsupported(f"unknown parallelism method {method!r}")
    if method != "single" and dist_ctx.world <= 1:
        raise Unsupported(f"parallelism {method!r} needs torchrun with WORLD_SIZE > 1 "
                          f"(python -m torch.distributed.run --nproc-per-node N validate/workload.py ...)")

    dtype = getattr(torch, DTYPES[precision])
    seed = int(req.get("seed", 1234))
    cfg_dict = resolve_config(req.get("model") or {})
    setup.update(task=task, precision=precision, param_dtype=str(dtype).replace("torch.", ""),
                 attention=attn, model_type=cfg_dict.get("model_type"))

    dist_ctx.init(device.type)
    nvml = None
    if device.type == "cuda":
        nvml = Nvml(device.index or 0)
        nvml_before = nvml.used()
        torch.cuda.init()
        torch.zeros(1, device=device)  # creates the context
        torch.cuda.synchronize(device)
        free, total = torch.cuda.mem_get_info(device)
        base = {"mem_get_info_used_bytes": int(total - free), "nvml_used_before_init": nvml_before,
                "nvml_used_after_init": nvml.used(), "torch_allocated": int(torch.cuda.memory_allocated(device)),
                "torch_reserved": int(torch.cuda.memory_reserved(device)),
                "nvml_driver": getattr(nvml, "driver", None)}
        if base["nvml_used_before_init"] is not None and base["nvml_used_after_init"] is not None:
            base["cuda_context_bytes"] = base["nvml_used_after_init"] - base["nvml_used_before_init"]
        result["cuda_baseline"] = base

    torch.manual_seed(seed)
    meter = Meter(device, use_tracker, nvml, use_trace, use_tensors)
    if use_trace and device.type == "cuda":
        cuda_history(device, True)
    measured: Dict[str, Any] = {}
    result["measured"] = measured
    prof = None
    if use_prof:
        from torch.profiler import ProfilerActivity, profile
        prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    oom_err = None
    try:
        with meter:
            tr = meter.tracker
            if prof is not None:
                prof.__enter__()
            if (req.get("runtime") or {}).get("framework") == "torchtune" and task != "inference":
                from frameworks import run_torchtune
                setup["framework"] = "torchtune"
                run_torchtune(req, cfg_dict, device, dtype, meter, setup)
                raise _Done()
            if (req.get("runtime") or {}).get("framework") == "litgpt" and task != "inference":
                from frameworks import run_litgpt
                setup["framework"] = "litgpt"
                run_litgpt(req, cfg_dict, device, meter, setup)
                raise _Done()
            with meter.phase("model_load", "other"):
                if task == "qlora":
                    model = build_quantized_model(req, cfg_dict, device, dtype, attn)
                    setup["quantization"] = req.get("quantization") or "nf4"
                else:
                    model = build_model(req, cfg_dict, device, dtype, attn)
                if tr is not None:
                    tr.track_module(model, grad_hooks=False)
                    tr.track_tensors(quant_state_tensors(model), "parameter")
            if task != "qlora":
                # qlora loads a checkpoint (its load transients are real); the others build one
                meter.forget_build_peak()
                setup["peak_excludes_model_build"] = True
            setup["model_class"] = type(model).__name__
            setup["num_parameters"] = int(sum(p.numel() for p in model.parameters()))
            setup["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
            exp = getattr(model.config, "_experts_implementation", None)
            if exp is not None:
                setup["experts_implementation"] = exp
            if task == "inference":
                run_inference(req, model, device, dtype, precision, meter, setup)
            else:
                run_training(req, model, device, dtype, precision, meter, setup, dist_ctx, method, par)
    except Unsupported:
        raise
    except _Done:
        pass
    except Exception as e:  # noqa: BLE001
        if not is_oom(e):
            raise
        oom_err = e
    finally:
        if prof is not None:
            try:
                prof.__exit__(None, None, None)
            except Exception:  # noqa: BLE001
                prof = None
    # ---- assemble
    tr = meter.tracker
    measured["phases"] = {k: meter.phases[k] for k in meter.order}
    if tr is not None:
        measured["peak_allocated_bytes"] = tr.peak_bytes
        measured["peak_breakdown"] = {k: v for k, v in tr.peak_breakdown.items() if v}
        measured["tracker"] = {"kind": "live_tensor_storages", "exact_nbytes": True, "ops_seen": tr.n_ops}
    if device.type == "cuda":
        measured["cuda_peak_allocated_bytes"] = meter.cuda_peak_alloc
        measured["cuda_peak_reserved_bytes"] = meter.cuda_peak_reserved
        measured["nvml_peak_used_bytes"] = meter.nvml_peak
        measured["peak_allocated_bytes"] = meter.cuda_peak_alloc
        if tr is not None:
            measured["tracker_peak_bytes"] = tr.peak_bytes
    if use_trace and tr is not None and tr.trace is not None:
        measured["allocation_trace"] = list(tr.trace)
    if use_trace and device.type == "cuda":
        measured["cuda_allocation_trace"] = cuda_history(device, False)
    if isinstance(tr, TensorLogTracker):
        tr.remove_hooks()
        measured["tensors"] = tr.as_record()
    if prof is not None:
        base = meter.phases.get("model_load", {}).get("start_bytes", 0) or 0
        measured["allocator_profile"] = allocator_profile_peaks(prof, meter.marks, base)
    # summary: step-level peaks
    steps = {}
    for k, v in measured["phases"].items():
        if k.startswith("step") and "." not in k:
            steps[k] = v.get("cuda_peak_allocated" if device.type == "cuda" else "peak_bytes")
    if steps:
        measured["step_peaks"] = steps
    if oom_err is not None:
        measured["oom"] = True
        result["oom"] = True
        result["error"] = f"{type(oom_err).__name__}: {str(oom_err)[:500]}"
    return result


def _autocast(device, precision):
    if precision == "amp_bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    if precision == "amp_fp16":
        return torch.autocast(device_type=device.type, dtype=torch.float16)
    return contextlib.nullcontext()


def prepare_kbit(req) -> bool:
    """runtime.prepare_kbit: PEFT's prepare_model_for_kbit_training (what QLoRA recipes call; default on)."""
    return bool((req.get("runtime") or {}).get("prepare_kbit", True))


def run_training(req, model, device, dtype, precision, meter, setup, dist_ctx, method, par):
    tr = meter.tracker
    task = req.get("task", "full")
    mbs = int(req.get("micro_batch_size", 1))
    seq = int(req.get("sequence_length", 128))
    gas = int(req.get("gradient_accumulation_steps", 1))
    n_steps = int(req.get("steps", 2))
    gc_on = bool(req.get("gradient_checkpointing", False))
    setup.update(micro_batch_size=mbs, sequence_length=seq, gradient_accumulation_steps=gas,
                 gradient_checkpointing=gc_on, steps=n_steps)
    model.train()
    model.config.use_cache = False
    with meter.phase("wrap", "other"):
        if gc_on:
            enable = getattr(model, "activation_checkpointing_enable", None)
            if enable is not None:
                enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            setup["checkpointing"] = "torch.utils.checkpoint(use_reentrant=False) per decoder layer (HF default)"
        if task == "qlora" and prepare_kbit(req):
            # PEFT's prepare_model_for_kbit_training: freezes everything, upcasts every non-4-bit
            # half parameter (embeddings, norms, lm_head, biases) to fp32, and enables checkpointing
            # when asked (here with the same use_reentrant=False as the plain runs)
            from peft import prepare_model_for_kbit_training
            model = prepare_model_for_kbit_training(
                model, use_gradient_checkpointing=gc_on, gradient_checkpointing_kwargs={"use_reentrant": False})
            setup["prepare_model_for_kbit_training"] = True
        if task in ("lora", "qlora"):
            model = apply_lora(model, req)
            lo = req.get("lora") or {}
            setup["lora"] = {"rank": int(lo.get("rank", 16)), "alpha": lo.get("alpha", 2 * int(lo.get("rank", 16))),
                             "targets": lo.get("targets", ["q_proj", "v_proj"]),
                             "dropout": lora_dropout(req)}
        if method == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
            setup["ddp"] = {"bucket_cap_mb": 25, "gradient_as_bucket_view": False,
                            "backend": dist_ctx.backend}
        elif method in ("fsdp_full_shard", "fsdp_shard_grad_op"):
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
            reshard = method == "fsdp_full_shard"
            kw = {"reshard_after_forward": reshard}
            if precision in ("amp_bf16", "amp_fp16"):
                kw["mp_policy"] = MixedPrecisionPolicy(
                    param_dtype=torch.bfloat16 if precision == "amp_bf16" else torch.float16,
                    reduce_dtype=torch.float32)
            layers = find_decoder_layers(model)
            for layer in layers:
                fully_shard(layer, **kw)
            fully_shard(model, **kw)
            setup["fsdp"] = {"api": "torch.distributed.fsdp.fully_shard (FSDP2)", "units": len(layers) + 1,
                             "reshard_after_forward": reshard, "backend": dist_ctx.backend,
                             "mixed_precision": "MixedPrecisionPolicy" if "mp_policy" in kw else None}
        elif method == "tp":
            from torch.distributed.device_mesh import init_device_mesh
            tp = int(par.get("tp", dist_ctx.world))
            if tp != dist_ctx.world:
                raise Unsupported(f"tp={tp} must equal WORLD_SIZE={dist_ctx.world} (no 2-D meshes here)")
            mesh = init_device_mesh(device.type, (tp,))
            setup["tp"] = {"size": tp, "plan": apply_tp(model, mesh), "backend": dist_ctx.backend}
        if tr is not None:
            tr.track_module(model)
        if isinstance(tr, TensorLogTracker):
            tr.watch_layers(find_decoder_layers(model))
    framework = (req.get("runtime") or {}).get("framework")
    if framework is not None:
        setup["framework"] = framework
    if framework in ("transformers", "hf", "trl"):
        from frameworks import run_trainer
        run_trainer(req, model, device, precision, meter, setup, sft=framework == "trl")
        return
    if framework not in (None, "torchtune"):
        raise Unsupported(f"runtime.framework {framework!r}: its own step is not run by this workload")
    params = [p for p in model.parameters() if p.requires_grad]
    setup["trainable_parameters"] = int(sum(p.numel() for p in params))
    optimizer = req.get("optimizer", "adamw")
    shard_pairs = None
    if method == "tp":
        from torch.distributed.tensor import DTensor
        setup["tp"]["local_parameters"] = int(sum(
            (p.to_local() if isinstance(p, DTensor) else p).numel() for p in model.parameters()))
        if optimizer in PLAIN_TENSOR_OPTIMIZERS:
            # one group of plain tensors in the model's order, as Megatron's optimizer sees them
            shard_pairs = local_shard_pairs(params)
            params = [t for _, t in shard_pairs]
            setup["tp"]["optimizer_param_groups"] = "the local shards, in the model's order"
        else:
            # foreach kernels refuse lists mixing DTensor (sharded q/k/v/o/gate/up/down) and plain
            # tensors (embeddings, norms, lm_head: replicated by not being parallelized); param
            # groups are stepped separately, so one group per kind keeps foreach semantics.
            dt = [p for p in params if isinstance(p, DTensor)]
            pl = [p for p in params if not isinstance(p, DTensor)]
            params = [g for g in ({"params": dt}, {"params": pl}) if g["params"]]
            setup["tp"]["optimizer_param_groups"] = "DTensor params / plain params"
    with meter.phase("optimizer_create", "optimizer_state"):
        opt, oinfo = make_optimizer(optimizer, params, device)
    if shard_pairs is not None:
        step_local_shards(opt, shard_pairs)
        oinfo["steps"] = "the local shards of DTensor parameters (as Megatron's optimizers step each rank's own)"
    setup["optimizer"] = oinfo
    scaler = None
    if precision == "amp_fp16":
        scaler = torch.amp.GradScaler(device.type)
        setup["grad_scaler"] = True
    model_config = model.config if hasattr(model, "config") else model.module.config
    vocab = int(getattr(model_config, "vocab_size", 1000))
    head, num_labels = model_head(req), int(getattr(model_config, "num_labels", 2))
    if head != "causal_lm":
        setup["batch"] = ENCODER_BATCH[head]
    g = torch.Generator(device="cpu").manual_seed(int(req.get("seed", 1234)))
    for step in range(1, n_steps + 1):
        sp = f"step{step}"
        with meter.phase(sp):
            for micro in range(gas):
                with meter.phase(f"{sp}.batch", "input"):
                    ids = torch.randint(0, vocab, (mbs, seq), generator=g).to(device)
                    batch = training_batch(head, ids, g, num_labels)
                    if tr is not None:
                        tr.track_tensors(list(batch.values()), "input")
                logged = isinstance(tr, TensorLogTracker) and step == 1 and micro == 0
                if logged:
                    tr.start(-1)
                    tr.logging = True
                with meter.phase(f"{sp}.forward", "activation"):
                    with _autocast(device, precision):
                        out = model(**batch)
                    loss = out.loss / gas if gas > 1 else out.loss
                    del out  # drop logits reference held by the output object (Trainer keeps only loss)
                if logged:
                    tr.start(tr.layers)
                with meter.phase(f"{sp}.backward", "backward_temp"):
                    if scaler is not None:
                        scaler.scale(loss).backward()
                    else:
                        loss.backward()
                    if tr is not None:
                        tr.track_grads(model)
                if logged:
                    tr.logging = False
                del loss, ids, batch
            with meter.phase(f"{sp}.optimizer", "optimizer_temp"):
                if scaler is not None:
                    scaler.step(opt)
                    scaler.update()
                else:
                    opt.step()
                if tr is not None:
                    tr.track_optimizer(opt)
            with meter.phase(f"{sp}.zero_grad", "other"):
                opt.zero_grad(set_to_none=True)
        if dist_ctx.initialized:
            dist_ctx.barrier()
    del opt


# What HF Trainer feeds an encoder: a BERT tokenizer's columns for unpadded sequences (attention_mask
# all ones, token_type_ids all zeros) and the labels of the head's usual collator.
ENCODER_BATCH = {
    "masked_lm": "input_ids, token_type_ids (zeros), attention_mask (ones), labels: a copy of input_ids with -100 "
                 "outside a random 15 % of positions (DataCollatorForLanguageModeling, mlm_probability 0.15)",
    "classification": "input_ids, token_type_ids (zeros), attention_mask (ones), labels: one class id per sequence",
}
MLM_PROBABILITY = 0.15


def training_batch(head, ids, g, num_labels):
    """The forward's keyword arguments for one micro-batch of random token ids."""
    if head == "causal_lm":
        return {"input_ids": ids, "labels": ids, "use_cache": False}
    batch = {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": torch.ones_like(ids)}
    if head == "masked_lm":
        chosen = torch.rand(ids.shape, generator=g) < MLM_PROBABILITY
        batch["labels"] = ids.masked_fill(~chosen.to(ids.device), -100)
    else:
        batch["labels"] = torch.randint(0, num_labels, (ids.shape[0],), generator=g).to(ids.device)
    return batch


def run_inference(req, model, device, dtype, precision, meter, setup):
    inf = req.get("inference") or {}
    bs = int(inf.get("batch_size", 1))
    ctx = int(inf.get("context_length", 128))
    new = int(inf.get("new_tokens", 4))
    setup.update(inference={"batch_size": bs, "context_length": ctx, "new_tokens": new})
    model.eval()
    vocab = int(getattr(model.config, "vocab_size", 1000))
    g = torch.Generator(device="cpu").manual_seed(int(req.get("seed", 1234)))
    import inspect
    fwd_params = inspect.signature(model.forward).parameters
    extra = {"logits_to_keep": 1} if "logits_to_keep" in fwd_params else {}
    setup["inference"]["logits_to_keep"] = bool(extra)
    with torch.inference_mode(), _autocast(device, precision):
        with meter.phase("batch", "input"):
            ids = torch.randint(0, vocab, (bs, ctx), generator=g).to(device)
        with meter.phase("prefill", "activation"):
            out = model(input_ids=ids, use_cache=True, **extra)
            pkv = out.past_key_values
            nxt = out.logits[:, -1:].argmax(-1)
            del out
        if meter.tracker is not None:
            meter.tracker.track_tensors([t for t in _cache_tensors(pkv)], "kv_cache")
        with meter.phase("decode", "activation"):
            for _ in range(new):
                out = model(input_ids=nxt, past_key_values=pkv, use_cache=True)
                pkv = out.past_key_values
                nxt = out.logits[:, -1:].argmax(-1)
                del out
                if meter.tracker is not None:
                    meter.tracker.track_tensors(list(_cache_tensors(pkv)), "kv_cache")
        setup["kv_cache_class"] = type(pkv).__name__
        kv = sum(t.numel() * t.element_size() for t in _cache_tensors(pkv))
        setup["kv_cache_bytes_final"] = int(kv)


def _cache_tensors(pkv):
    if pkv is None:
        return []
    out = []
    layers = getattr(pkv, "layers", None)
    if layers is not None:
        for layer in layers:
            for attr in ("keys", "values"):
                t = getattr(layer, attr, None)
                if isinstance(t, torch.Tensor):
                    out.append(t)
        return out
    from torch.utils._pytree import tree_flatten
    return [t for t in tree_flatten(pkv)[0] if isinstance(t, torch.Tensor)]


def strip_request(req):
    """Echo of the request for the output line (inline config summarised, not repeated)."""
    r = json.loads(json.dumps(req))
    m = r.get("model") or {}
    if "config" in m:
        c = m["config"]
        m["config"] = {k: c.get(k) for k in ("model_type", "hidden_size", "n_embd", "num_hidden_layers", "n_layer",
                                             "vocab_size") if k in c}
        m["config_inline"] = True
    return r


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("input", help="request JSON file (object, list, or JSON lines), or - for stdin")
    ap.add_argument("--output", "-o", help="append JSON lines here instead of stdout")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument("--no-tracker", action="store_true", help="skip the live-tensor tracker (CUDA only)")
    ap.add_argument("--allocator-profile", action="store_true",
                    help="CPU: also replay profiler memory events (allocator-level peak incl. kernel scratch)")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave)")
    ap.add_argument("--all-ranks-print", action="store_true", help="every rank prints its own line (default: rank 0 gathers)")
    opts = ap.parse_args(argv)
    if opts.threads:
        torch.set_num_threads(opts.threads)
    try:
        import transformers  # noqa: F401
    except Exception as e:  # noqa: BLE001
        _missing_dependency("transformers", e)
    try:
        from transformers.utils import logging as hf_logging
        hf_logging.set_verbosity_error()
    except Exception:  # noqa: BLE001
        pass
    cases = load_cases(opts.input)
    d = Dist()
    out_f = open(opts.output, "a") if opts.output else sys.stdout
    rc = 0
    for i, req in enumerate(cases):
        name = req.get("name") or f"case{i}"
        t0 = time.perf_counter()
        try:
            res = run_case(req, d, opts)
        except Unsupported as e:
            res = {"schema": SCHEMA_VERSION, "name": name, "unsupported": True, "error": str(e)}
        except Exception as e:  # noqa: BLE001
            res = {"schema": SCHEMA_VERSION, "name": name, "error": f"{type(e).__name__}: {e}",
                   "traceback": traceback.format_exc()[-4000:]}
            rc = 1
        res["case"] = strip_request(req)
        res["wall_seconds"] = round(time.perf_counter() - t0, 3)
        if d.world > 1:
            res.setdefault("rank", d.rank)
        gc.collect()
        if d.world > 1 and d.initialized and not opts.all_ranks_print:
            allres = d.gather(res)
            if d.rank == 0:
                for r in allres:
                    out_f.write(json.dumps(r, sort_keys=False) + "\n")
        else:
            out_f.write(json.dumps(res) + "\n")
        out_f.flush()
        log(f"{name}: " + ("ERROR " + res["error"][:200] if "error" in res and not res.get("oom")
                           else f"peak={res.get('measured', {}).get('peak_allocated_bytes')} B"
                           f" ({res['wall_seconds']} s)"))
    d.close()
    if opts.output:
        out_f.close()
    return rc


if __name__ == "__main__":
    sys.exit(main())
