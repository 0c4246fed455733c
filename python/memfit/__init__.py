"""memfit: GPU-memory planner for fine-tuning and serving LLMs, over the same C++ core as the CLI.

    import memfit
    memfit.estimate({"model": {"id": "meta-llama/Llama-2-7b-hf"}, "task": "qlora"})  # -> dict
    memfit.check(trainer, gpu="RTX4090-24GB")   # prints the estimate, warns when it will not fit

The request schema is the CLI's (README.md, "The request"; `memfit.defaults()`). Every number
comes from the core: this package only converts between Python objects and the core's JSON.
"""
from ._api import (
    Error,
    Rejected,
    defaults,
    defaults_json,
    estimate,
    estimate_json,
    gpus,
    gpus_json,
    inspect,
    inspect_json,
    models,
    models_json,
    plan,
    plan_json,
)
from .hf import from_model, from_trainer, from_training_args
from .preflight import FitWarning, check, summary

__all__ = [
    "Error", "Rejected", "estimate", "plan", "models", "gpus", "defaults", "inspect",
    "estimate_json", "plan_json", "models_json", "gpus_json", "defaults_json", "inspect_json",
    "from_trainer", "from_model", "from_training_args", "check", "summary", "FitWarning", "MemfitCallback",
]


def __getattr__(name):
    # MemfitCallback subclasses transformers.TrainerCallback: import transformers only when asked.
    if name == "MemfitCallback":
        from .callback import MemfitCallback

        return MemfitCallback
    raise AttributeError(f"module 'memfit' has no attribute {name!r}")
