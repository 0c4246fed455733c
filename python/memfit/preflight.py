"""Pre-flight: estimate a run before it starts and warn when it will not fit.

    memfit.check(trainer, gpu="RTX4090-24GB")            # or a request dict
    trainer.add_callback(memfit.MemfitCallback(gpu=24))  # the same at on_train_begin (callback.py)
"""
import json
import sys
import warnings

from ._api import _text, estimate
from .hf import from_model, from_trainer

_GIB = 1073741824.0


class FitWarning(UserWarning):
    """memfit estimates that the run will not fit in the GPU's memory."""


def check(trainer_or_request, gpu=None, *, file=None, **fields):
    """Estimates the run (a Trainer / SFTTrainer, a model, or a request dict / JSON text), prints
    a short summary and warns (FitWarning) when it will not fit. `gpu`: a catalog name (see
    memfit.gpus()) or GiB; default: the request's GPU, else the visible CUDA device, else the
    core's default. Returns the estimate (a dict; "fits" says whether it fits)."""
    request = _request_of(trainer_or_request, gpu, fields)
    if "gpu" not in request and "cluster" not in request:
        local = _local_gpu()
        if local:
            request["gpu"] = local
    result = estimate(request)
    print(summary(result), file=file or sys.stdout)
    if not result["fits"]:
        g = result["per_gpu"]
        warnings.warn(f"memfit: this run needs about {g['device_total_bytes'] / _GIB:.1f} GiB per GPU but "
                      f"{result['request']['gpu']['name']} has {g['gpu_memory_bytes'] / _GIB:.1f} GiB: it will not fit "
                      "(see memfit.plan(...) for layouts and batch sizes that do)", FitWarning, stacklevel=2)
    return result


def summary(result):
    """Three lines: what was estimated, the peak figures, and whether it fits."""
    req, g = result["request"], result["per_gpu"]
    model = result["model"].get("id", "inline config")
    return (f"memfit: {model} ({result['params']['total'] / 1e9:.2f}B parameters), {req['task']}, {req['precision']}, "
            f"micro-batch {req['micro_batch_size']} x sequence {req['sequence_length']}, "
            f"{req['parallelism']['method']} on {req['num_gpus']} x {req['gpu']['name']}\n"
            f"memfit: peak allocated {g['allocated_peak_bytes'] / _GIB:.2f} GiB, reserved {g['reserved_peak_bytes'] / _GIB:.2f} GiB, "
            f"device total {g['device_total_bytes'] / _GIB:.2f} GiB of {g['gpu_memory_bytes'] / _GIB:.1f} GiB "
            f"(peak during {result['peak_phase']})\n"
            f"memfit: {'FITS' if result['fits'] else 'DOES NOT FIT'} ({100 * g['utilization']:.1f}% of the GPU)")


def _request_of(obj, gpu, fields):
    if isinstance(obj, (dict, str, bytes)):
        request = json.loads(_text(obj, "request"))
        request.update(fields)
        if gpu is not None:
            request["gpu"] = {"memory_gib": gpu} if isinstance(gpu, (int, float)) else {"name": str(gpu)}
        return request
    if hasattr(obj, "model") and hasattr(obj, "args"):
        return from_trainer(obj, gpu=gpu, **fields)
    return from_model(obj, gpu=gpu, **fields)


def _local_gpu():
    """The visible CUDA device's memory, when torch is already imported and sees one."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return {"name": props.name, "memory_gib": props.total_memory / _GIB}
