"""The core's JSON API (core/include/memfit/api.hpp) as Python functions.

The *_json functions take and return the core's exact JSON text (an error comes back as
{"error": ...} text, as from the C API); the others take a dict (or JSON text), return parsed
JSON and raise memfit.Error with the core's message.
"""
import json

from . import _core


class Error(ValueError):
    """A request the core rejects; the message names the field and what to do."""


class Rejected(Error):
    """A run the framework itself would reject (it fails at start or at its first step), which the
    core refuses rather than sizes: {"error": ..., "rejected": true}."""


def _text(request, what):
    if isinstance(request, (bytes, bytearray)):
        return request.decode("utf-8")
    if isinstance(request, str):
        return request
    if isinstance(request, dict):
        try:
            return json.dumps(request, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise Error(f"the {what} must be plain JSON data (dicts, lists, strings, numbers, booleans): {e}") from None
    raise Error(f"the {what} must be a dict or JSON text, not {type(request).__name__}")


def _parsed(text):
    result = json.loads(text)
    if isinstance(result, dict) and "error" in result:
        raise (Rejected if result.get("rejected") else Error)(result["error"])
    return result


def estimate_json(request):
    """estimate(request) as the core's JSON text."""
    return _core.estimate_json(_text(request, "request"))


def plan_json(request):
    """The planner's result as the core's JSON text."""
    return _core.plan_json(_text(request, "request"))


def inspect_json(config):
    """How memfit reads a config.json, as the core's JSON text."""
    return _core.parse_config_json(_text(_config_dict(config), "config"))


def models_json():
    return _core.models_json()


def gpus_json():
    return _core.gpus_json()


def defaults_json():
    return _core.defaults_json()


def estimate(request):
    """Per-GPU peak memory for a request (dict or JSON text): params, per_gpu, peak_phase, fits, ..."""
    return _parsed(estimate_json(request))


def plan(request):
    """Which distributed layouts fit, with their largest micro-batch and throughput, fastest first."""
    return _parsed(plan_json(request))


def inspect(config):
    """A config.json (dict, JSON text or transformers PretrainedConfig) as memfit reads it."""
    return _parsed(inspect_json(config))


def models():
    """The bundled model library: [{"id", "model_type", "params", "partial"}]."""
    return _parsed(models_json())


def gpus():
    """The GPU catalog."""
    return _parsed(gpus_json())


def defaults():
    """Every request field with its default ("request") and the accepted values ("options")."""
    return _parsed(defaults_json())


def _config_dict(config):
    """A transformers PretrainedConfig as the config.json save_pretrained writes; else as is."""
    to_json_string = getattr(config, "to_json_string", None)
    return json.loads(to_json_string(use_diff=False)) if callable(to_json_string) else config
