"""A memfit request from the objects a training script already has.

from_trainer(trainer) reads a transformers Trainer / TRL SFTTrainer; from_model(model,
peft_config, args) and from_training_args(args) read the pieces. Everything is read from
attributes and configs: no GPU, no weights (a model on the meta device is enough), and nothing
is computed here: the core estimates. Transformers / PEFT / TRL are not imported by this module.

What is read, and where it goes in the request (README.md, "The request"):
  model.config (to_json_string)            model.config; the class name -> model.head
  model.dtype + args.bf16 / fp16           precision (fp32 + bf16 flag -> amp_bf16, bf16 weights -> bf16)
  config.quantization_config               quantization (bitsandbytes 4/8-bit, GPTQ, AWQ)
  peft LoraConfig / the PeftModel          task lora, lora.{rank, alpha, targets, dropout}
  args.per_device_train_batch_size, ...    micro_batch_size, gradient_accumulation_steps
  args / model gradient checkpointing      gradient_checkpointing
  args.optim                               optimizer (_OPTIMIZERS)
  SFTConfig.max_length                     sequence_length (the longest a batch can be; packing fills it)
  args.fsdp + fsdp_config, args.deepspeed  parallelism.method, offload_*
  WORLD_SIZE / LOCAL_WORLD_SIZE / args     num_gpus, parallelism.gpus_per_node
"""
import functools
import json
import os
import warnings

from ._api import Error, defaults

# TrainingArguments.optim (transformers OptimizerNames) -> memfit optimizer. Optimizers memfit
# does not model are absent: from_training_args raises and says how to override.
_OPTIMIZERS = {
    "adamw_torch": "adamw",  # torch.optim.AdamW, foreach on CUDA
    "adamw_torch_fused": "adamw_fused",
    "adamw_hf": "adamw_loop",  # transformers' own per-tensor AdamW (Transformers 4)
    "adamw_bnb_8bit": "adamw_8bit",
    "adamw_8bit": "adamw_8bit",
    "paged_adamw_8bit": "paged_adamw_8bit",
    "paged_adamw_32bit": "paged_adamw",
    "adafactor": "adafactor",
    "sgd": "sgd",  # torch.optim.SGD with TrainingArguments' defaults: no momentum
    "lion_32bit": "lion",
}

# DeepSpeed zero_optimization.stage -> parallelism.method
_ZERO_STAGES = {0: "ddp", 1: "zero1", 2: "zero2", 3: "zero3"}
# FSDP1 sharding strategy names (fsdp_config["reshard_after_forward"] with version 1, or the
# legacy `fsdp` strings) -> parallelism.method
_FSDP_STRATEGIES = {"full_shard": "fsdp_full_shard", "shard_grad_op": "fsdp_shard_grad_op",
                    "hybrid_shard": "fsdp_hybrid", "no_shard": "ddp"}
_DTYPES = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}
_CONFIG_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
_ATTENTION = {"eager": "eager", "sdpa": "sdpa", "flash_attention_2": "flash_attention_2"}
# Class-name endings -> model.head (the rest: the core's "auto", from config.architectures)
_HEADS = {"ForCausalLM": "lm", "LMHeadModel": "lm", "ForSequenceClassification": "classification"}


def from_trainer(trainer, *, gpu=None, **fields):
    """The request for a Trainer / SFTTrainer's run. `gpu`: a catalog name or GiB; `fields`
    override or add request fields (e.g. sequence_length=4096, optimizer="adamw")."""
    return from_model(trainer.model, args=trainer.args, gpu=gpu, framework=_framework_of(trainer), **fields)


def from_model(model, peft_config=None, args=None, *, deepspeed=None, gpu=None, framework=None, **fields):
    """The request for training `model` (a PreTrainedModel or PeftModel, any device including
    meta) with an optional peft LoraConfig and TrainingArguments / SFTConfig. `deepspeed`: a
    DeepSpeed config dict or path when it is not in args; `framework`: runtime.framework (default:
    "trl" for TRL's configs, else "transformers"). Plain TrainingArguments carry no sequence
    length: pass sequence_length=... (else the core's default)."""
    peft_config = peft_config or _active_peft_config(model)
    config = _config_dict(model)
    request = {"model": _model_field(model, config), "task": "lora" if peft_config is not None else "full"}
    quantization = fields.get("quantization") or _quantization(config.get("quantization_config"))
    if quantization != "none":
        request["quantization"] = quantization
        if peft_config is not None and quantization in ("nf4", "nf4_double", "fp4", "int8"):
            request["task"] = "qlora"
    if peft_config is not None:
        request["lora"] = _lora(model, peft_config, config, (fields.get("lora") or {}).get("targets"))
    if args is not None:
        request.update(from_training_args(args, deepspeed=deepspeed, optimizer=fields.get("optimizer")))
    elif deepspeed is not None:
        request["parallelism"] = _deepspeed_parallelism(deepspeed)
    request["precision"] = _precision(_load_dtype(model, config, quantization != "none"), args)
    if getattr(model, "is_activation_checkpointing", None) or getattr(model, "is_gradient_checkpointing", False):
        request["gradient_checkpointing"] = True
    attention = _ATTENTION.get(getattr(getattr(model, "config", None), "_attn_implementation", None))
    if attention:
        request["attention"] = attention
    _framework_fields(request, framework or _framework_of(args), model, quantization)
    if gpu is not None:
        request["gpu"] = {"memory_gib": gpu} if isinstance(gpu, (int, float)) else {"name": str(gpu)}
    return _merged(request, fields)


def from_training_args(args, *, deepspeed=None, optimizer=None):
    """The request fields TrainingArguments / SFTConfig set: batch, accumulation, checkpointing,
    optimizer (`optimizer` names memfit's for an optim it does not map), sequence length
    (SFTConfig), distributed setup. Precision needs the model's dtype too: see from_model."""
    fields = {
        "micro_batch_size": int(args.per_device_train_batch_size),
        "gradient_accumulation_steps": int(args.gradient_accumulation_steps),
        "gradient_checkpointing": _checkpointing(args),
        "optimizer": optimizer or _optimizer(args.optim),
    }
    max_length = getattr(args, "max_length", None)  # SFTConfig; packing or not, no batch is longer
    if isinstance(max_length, int) and max_length > 0:
        fields["sequence_length"] = max_length
    if getattr(args, "torch_compile", False):
        fields["runtime"] = {"compile": True}
    parallelism, num_gpus = _parallelism(args, deepspeed)
    if num_gpus > 1 or parallelism.get("method", "single") != "single":
        fields["parallelism"] = parallelism
        fields["num_gpus"] = num_gpus
    return fields


# ---- the model ---------------------------------------------------------------------------


def _base_model(model):
    """The transformers model under a PeftModel (LoraModel) wrapper, else the model."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def _config_dict(model):
    config = getattr(_base_model(model), "config", None)
    if config is None:
        raise Error("the model has no .config: pass a transformers PreTrainedModel (or PeftModel)")
    # to_json_string is what save_pretrained writes: plain JSON, dtypes as strings.
    return json.loads(config.to_json_string(use_diff=False))


def _model_field(model, config):
    base = _base_model(model)
    field = {"config": config}
    name = getattr(base.config, "name_or_path", "") or getattr(base.config, "_name_or_path", "")
    if name:
        field["id"] = name
    for ending, head in _HEADS.items():
        if type(base).__name__.endswith(ending):
            field["head"] = head
            break
    return field


def _load_dtype(model, config, quantized):
    """The dtype the weights were loaded in: the first floating-point parameter that is not a
    LoRA adapter (PEFT keeps adapters in fp32 over half weights). A quantized model's is the
    config's dtype: prepare_model_for_kbit_training upcasts its other parameters to fp32 later
    (runtime.prepare_kbit says so)."""
    loaded = _CONFIG_DTYPES.get(str(config.get("dtype") or config.get("torch_dtype")))
    if quantized and loaded:
        return loaded
    for name, p in _base_model(model).named_parameters():
        if p.is_floating_point() and "lora_" not in name:
            dtype = _DTYPES.get(str(p.dtype))
            if dtype is None:
                raise Error(f"parameter {name} is {p.dtype}: memfit models fp32, bf16 and fp16 weights")
            return dtype
    return _DTYPES.get(str(getattr(model, "dtype", "torch.float32")), "fp32")


def _quantization(qc):
    """config.quantization_config (as a dict) -> memfit quantization."""
    if not qc:
        return "none"
    method = str(qc.get("quant_method", "")).lower()
    if method == "bitsandbytes":
        if qc.get("load_in_8bit"):
            return "int8"
        if qc.get("load_in_4bit"):
            kind = str(qc.get("bnb_4bit_quant_type", "fp4")).lower()
            if kind == "fp4":
                return _core_option("quantization", "fp4", what="bitsandbytes fp4")
            return "nf4_double" if qc.get("bnb_4bit_use_double_quant") else "nf4"
    if method in ("gptq", "awq") and int(qc.get("bits", 4)) == 4:
        return method + "_int4"
    if method in ("fp8", "fbgemm_fp8", "finegrained_fp8"):
        return "fp8"
    raise Error(f"quantization_config {json.dumps(qc, sort_keys=True, default=str)[:200]} is not modelled: "
                "memfit models bitsandbytes 4-bit/8-bit, 4-bit GPTQ/AWQ and fp8; pass quantization=... to override")


def _precision(load_dtype, args):
    """Loaded weights + the Trainer's autocast flag -> memfit precision (see `memfit defaults`)."""
    if load_dtype != "fp32":
        return load_dtype  # half weights: the Trainer's bf16/fp16 flag adds an autocast that changes nothing
    if args is not None and getattr(args, "bf16", False):
        return "amp_bf16"
    if args is not None and getattr(args, "fp16", False):
        return "amp_fp16"
    return "fp32"


# ---- LoRA ------------------------------------------------------------------------------


def _active_peft_config(model):
    configs = getattr(model, "peft_config", None)
    if isinstance(configs, dict) and configs:
        active = getattr(model, "active_adapter", None)
        active = active if isinstance(active, str) and active in configs else next(iter(configs))
        return configs[active]
    return None


def _lora(model, peft_config, config, targets=None):
    kind = str(getattr(peft_config, "peft_type", "LORA")).split(".")[-1].upper()
    if kind != "LORA":
        raise Error(f"peft {kind} adapters are not modelled: memfit models LoRA (LoraConfig)")
    lora = {"rank": int(peft_config.r), "alpha": float(peft_config.lora_alpha),
            "targets": targets or _lora_targets(model, peft_config, config),
            "dropout": float(getattr(peft_config, "lora_dropout", 0.0))}
    adapter = _adapter_dtype(model)
    if adapter:
        lora["adapter_dtype"] = adapter
    return lora


def _lora_targets(model, peft_config, config):
    """Module names the adapters wrap: the wrapped model's own, else the config's list, else
    PEFT's default for the model type."""
    wrapped = sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules() if hasattr(m, "lora_A")})
    if wrapped:
        return wrapped
    targets = peft_config.target_modules
    if isinstance(targets, str):
        if targets == "all-linear":
            return "all-linear"
        raise Error(f"LoraConfig target_modules={targets!r} is a pattern: wrap the model with get_peft_model "
                    "first (memfit reads the wrapped modules) or pass lora={'targets': [...]} to override")
    if targets:
        return sorted(targets)
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as mapping

    model_type = config.get("model_type")
    if model_type not in mapping:
        raise Error(f"PEFT has no default LoRA targets for model_type {model_type!r}: set target_modules")
    return sorted(mapping[model_type])


def _adapter_dtype(model):
    """The dtype of the adapters a PeftModel holds (None before wrapping: PEFT's default)."""
    for name, p in model.named_parameters():
        if "lora_A" in name:
            return _DTYPES.get(str(p.dtype))
    return None


# ---- training arguments ----------------------------------------------------------------


def _checkpointing(args):
    # Transformers 5 renamed gradient_checkpointing to activation_checkpointing (the old name
    # is a deprecated alias); FSDP's own activation checkpointing is in fsdp_config.
    on = getattr(args, "activation_checkpointing", None)
    if on is None:
        on = getattr(args, "gradient_checkpointing", False)
    fsdp_config = getattr(args, "fsdp_config", None) or {}
    return bool(on) or _truthy(fsdp_config.get("activation_checkpointing", False))


def _optimizer(optim):
    name = str(getattr(optim, "value", optim))
    if name not in _OPTIMIZERS:
        raise Error(f"optim {name!r} is not modelled: memfit knows {', '.join(sorted(_OPTIMIZERS))}; "
                    "pass optimizer=... (see memfit.defaults()['options']['optimizer']) to override")
    return _OPTIMIZERS[name]


def _world_size(args):
    """Processes in the run: torchrun / accelerate launch set WORLD_SIZE; else the args'."""
    if os.environ.get("WORLD_SIZE", "").isdigit():
        return int(os.environ["WORLD_SIZE"])
    try:
        return int(getattr(args, "world_size", 1) or 1)
    except Exception:  # world_size needs accelerate's state; a bare args object may not have it
        return 1


def _parallelism(args, deepspeed):
    """(parallelism fields, num_gpus) from FSDP / DeepSpeed settings and the world size."""
    world = _world_size(args)
    deepspeed = deepspeed if deepspeed is not None else getattr(args, "deepspeed", None)
    if deepspeed:
        parallelism = _deepspeed_parallelism(deepspeed)
    elif getattr(args, "fsdp", None):
        parallelism = _fsdp_parallelism(args.fsdp, getattr(args, "fsdp_config", None) or {})
    else:
        parallelism = {"method": "ddp" if world > 1 else "single"}
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    if local.isdigit() and int(local) < world:
        parallelism["gpus_per_node"] = int(local)
    return parallelism, world


def _fsdp_parallelism(fsdp, fsdp_config):
    """TrainingArguments.fsdp (True, or the legacy "full_shard offload" string / list) and
    fsdp_config (FSDP2: reshard_after_forward bool; FSDP1: a strategy name; cpu_offload)."""
    legacy = fsdp.split() if isinstance(fsdp, str) else [str(getattr(o, "value", o)) for o in fsdp] \
        if isinstance(fsdp, (list, tuple)) else []
    reshard = fsdp_config.get("reshard_after_forward", True)
    strategy = next((o for o in legacy if o in _FSDP_STRATEGIES), None)
    if strategy is None:
        strategy = str(reshard).lower() if str(reshard).lower() in _FSDP_STRATEGIES else \
            "full_shard" if _truthy(reshard) else "shard_grad_op"
    parallelism = {"method": _FSDP_STRATEGIES[strategy]}
    if "offload" in legacy or _truthy(fsdp_config.get("cpu_offload", False)):
        # FSDP's CPUOffload moves parameters, gradients and the optimizer step to the CPU.
        parallelism.update(offload_params=True, offload_optimizer=True)
    return parallelism


def _deepspeed_parallelism(deepspeed):
    """A DeepSpeed config (dict, JSON path, or transformers' HfDeepSpeedConfig) -> parallelism."""
    config = getattr(deepspeed, "config", deepspeed)
    if isinstance(config, (str, os.PathLike)):
        try:
            with open(config, encoding="utf-8") as f:
                config = json.load(f)
        except (OSError, ValueError) as e:
            raise Error(f"cannot read the DeepSpeed config {config}: {e}") from None
    if not isinstance(config, dict):
        raise Error("the DeepSpeed config must be a dict or the path of a JSON file")
    zero = config.get("zero_optimization", {}) or {}
    stage = int(zero.get("stage", 0))
    if stage not in _ZERO_STAGES:
        raise Error(f"DeepSpeed zero_optimization.stage must be 0-3, got {stage}")
    parallelism = {"method": _ZERO_STAGES[stage]}
    if str((zero.get("offload_optimizer") or {}).get("device", "none")).lower() in ("cpu", "nvme"):
        parallelism["offload_optimizer"] = True
    if str((zero.get("offload_param") or {}).get("device", "none")).lower() in ("cpu", "nvme"):
        parallelism["offload_params"] = True
    return parallelism


# ---- fields of newer cores -------------------------------------------------------------


def _framework_fields(request, framework, model, quantization):
    """runtime.framework / framework_version / prepare_kbit, when the bound core knows them."""
    runtime = request.setdefault("runtime", {})
    if framework in _core_option_list("runtime.framework"):
        runtime["framework"] = framework
        version = _package_version(framework)
        if version and "framework_version" in _core_defaults()["request"].get("runtime", {}):
            runtime["framework_version"] = version
    if quantization != "none" and "prepare_kbit" in _core_defaults()["request"].get("runtime", {}):
        runtime["prepare_kbit"] = _prepared_for_kbit(model)
    if not runtime:
        del request["runtime"]


def _prepared_for_kbit(model):
    """peft.prepare_model_for_kbit_training upcasts every non-quantized half parameter to fp32
    (and turns on input gradients): over a half-loaded quantized model, fp32 norms or
    embeddings are its trace."""
    base = _base_model(model)
    return any(str(p.dtype) == "torch.float32" and "lora_" not in n for n, p in base.named_parameters())


def _framework_of(obj):
    """"trl" for TRL's trainers and configs (SFTTrainer, SFTConfig), else "transformers"."""
    return "trl" if type(obj).__module__.split(".")[0] == "trl" else "transformers"


def _package_version(framework):
    try:
        from importlib.metadata import version

        return version(framework)
    except Exception:
        return None


@functools.lru_cache(maxsize=None)
def _core_defaults():
    return defaults()


def _core_option_list(field):
    return tuple(_core_defaults()["options"].get(field, ()))


def _core_option(field, value, what):
    if value not in _core_option_list(field):
        raise Error(f"{what} needs a memfit core that knows {field} {value!r}; pass {field}=... to override")
    return value


# ---- helpers ---------------------------------------------------------------------------


def _truthy(value):
    return value is True or str(value).lower() in ("true", "1", "yes")


def _merged(request, fields):
    """request with `fields` laid over it (dicts merged key by key)."""
    out = dict(request)
    for key, value in fields.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out
