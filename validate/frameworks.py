"""The frameworks' own training steps, measured by the live-tensor tracker (issue 8, item 3).

workload.py calls a runner when a case names `runtime.framework` explicitly ("transformers"
/ "hf": HF Trainer; "trl": TRL SFTTrainer; "torchtune": the LoRA/full recipe's step; "litgpt":
finetune/full.py's or finetune/lora.py's step, see run_litgpt). A case without
it runs workload.py's plain loop (model(input_ids, labels) -> loss.backward() -> step), which is what
Transformers + PEFT do underneath a user's loop.

The framework's code runs unchanged; the measurement hooks only delimit phases:
- Trainer / SFTTrainer: `compute_loss` and `accelerator.backward` are wrapped on the instance to
  mark the forward and backward phases, and a TrainerCallback marks the step and optimizer phases.
- LitGPT: its fit() loop is replayed from its source (the Fabric, model, loss and optimizer are
  LitGPT's and Lightning's own), from LITGPT_DIR (it cannot share the venv).
- torchtune: the recipe's step is replayed from its source (recipes/lora_finetune_single_device.py,
  full_finetune_single_device.py 0.6.1): the torchtune model builder, CEWithChunkedOutputLoss with
  `model.set_num_output_chunks`, the model's dtype, optimizer.step / zero_grad(set_to_none=True).
"""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from typing import Any, Dict

import torch

TRAINER_OPTIM = {  # memfit optimizer -> TrainingArguments.optim
    "adamw_fused": "adamw_torch_fused",  # Trainer's default with torch >= 2.8
    "adamw": "adamw_torch",
    "adamw_loop": "adamw_torch",
    "sgd": "sgd",
    "adafactor": "adafactor",
    "adamw_8bit": "adamw_bnb_8bit",
    "lion": "lion_32bit",
}


class _Phases:
    """Opens and closes tracker phases from callbacks (not nested `with` blocks)."""

    def __init__(self, meter):
        self.meter = meter
        self.stack: list = []

    def open(self, name, cat):
        cm = self.meter.phase(name, cat)
        cm.__enter__()
        self.stack.append((name, cm))

    def close(self, name):
        while self.stack:
            n, cm = self.stack.pop()
            cm.__exit__(None, None, None)
            if n == name:
                return


class _RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n, seq, vocab, seed):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab, (n, seq), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i].clone(), "attention_mask": torch.ones_like(self.ids[i])}


def _word_tokenizer(vocab: int):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="t0", eos_token=f"t{vocab - 1}")


def run_trainer(req, model, device, precision, meter, setup, sft: bool):
    """One HF Trainer (or TRL SFTTrainer) run of `steps` optimizer steps on random tokens."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    tr = meter.tracker
    mbs = int(req.get("micro_batch_size", 1))
    seq = int(req.get("sequence_length", 128))
    gas = int(req.get("gradient_accumulation_steps", 1))
    steps = int(req.get("steps", 2))
    gc_on = bool(req.get("gradient_checkpointing", False))
    opt = req.get("optimizer", "adamw_fused")
    if opt not in TRAINER_OPTIM:
        from workload import Unsupported
        raise Unsupported(f"optimizer {opt!r} has no TrainingArguments.optim equivalent here")
    vocab = int(model.config.vocab_size)
    data = _RandomTokens(mbs * gas * steps, seq, vocab, int(req.get("seed", 1234)))
    common = dict(output_dir=tempfile.mkdtemp(prefix="memfit-trainer-"), per_device_train_batch_size=mbs,
                  gradient_accumulation_steps=gas, max_steps=steps, learning_rate=1e-5, optim=TRAINER_OPTIM[opt],
                  bf16=precision == "amp_bf16", fp16=precision == "amp_fp16", use_cpu=device.type == "cpu",
                  gradient_checkpointing=gc_on, gradient_checkpointing_kwargs={"use_reentrant": False},
                  report_to="none", save_strategy="no", logging_strategy="no", dataloader_num_workers=0,
                  remove_unused_columns=False, seed=int(req.get("seed", 1234)), disable_tqdm=True)
    extra = {}
    if sft:
        from trl import SFTConfig, SFTTrainer
        args = SFTConfig(**common, max_length=seq, packing=False)
        trainer_cls = SFTTrainer
        # pre-tokenized rows ("input_ids" present: SFTTrainer skips tokenization) and a word-level
        # tokenizer over the model's vocabulary (SFTTrainer needs a processing_class for padding)
        import datasets
        data = datasets.Dataset.from_dict({"input_ids": data.ids.tolist()})
        extra["processing_class"] = _word_tokenizer(vocab)
        setup["framework_impl"] = f"trl.SFTTrainer {__import__('trl').__version__}"
    else:
        args = TrainingArguments(**common)
        trainer_cls = Trainer
        setup["framework_impl"] = f"transformers.Trainer {__import__('transformers').__version__}"
    ph = _Phases(meter)
    count = {"step": 0}

    class Marks(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            count["step"] += 1
            ph.open(f"step{count['step']}", "other")

        def on_pre_optimizer_step(self, args, state, control, **kw):
            ph.open(f"step{count['step']}.optimizer", "optimizer_temp")

        def on_optimizer_step(self, args, state, control, optimizer=None, **kw):
            if tr is not None and optimizer is not None:
                tr.track_optimizer(optimizer)
            ph.close(f"step{count['step']}.optimizer")

        def on_step_end(self, args, state, control, **kw):
            ph.close(f"step{count['step']}")

    kwargs = dict(model=model, args=args, train_dataset=data, callbacks=[Marks()], **extra)
    trainer = trainer_cls(**kwargs)
    setup["trainer_optim"] = args.optim if isinstance(args.optim, str) else args.optim.value
    orig_loss, orig_backward = trainer.compute_loss, trainer.accelerator.backward

    def compute_loss(*a, **k):
        with meter.phase(f"step{count['step']}.forward", "activation"):
            return orig_loss(*a, **k)

    def backward(loss, **k):
        with meter.phase(f"step{count['step']}.backward", "backward_temp"):
            orig_backward(loss, **k)
            if tr is not None:
                tr.track_grads(trainer.model)

    trainer.compute_loss = compute_loss
    trainer.accelerator.backward = backward
    trainer.train()
    ph.close("__all__")
    setup["trainable_parameters"] = int(sum(p.numel() for p in trainer.model.parameters() if p.requires_grad))


# ---------------------------------------------------------------------------------- torchtune
TT_ATTN = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "o_proj": "output_proj"}
TT_MLP = ("gate_proj", "up_proj", "down_proj")


def build_torchtune(req, cfg: Dict[str, Any], dtype, device):
    """The torchtune model builder for a Llama-3.2-style config (llama3_2 / lora_llama3_2 component
    builders, 0.6.1), built as the recipes' _setup_model does: under set_default_dtype(dtype) on the
    device, adapters in the same dtype. quantize_base=True for QLoRA (torchao NF4Tensor)."""
    from workload import Unsupported
    try:
        from torchtune import training
        from torchtune.models.llama3_2 import _component_builders as cb
    except Exception as e:  # noqa: BLE001
        raise Unsupported(f"torchtune is not importable: {e}")
    if cfg.get("model_type") != "llama" or (cfg.get("rope_scaling") or {}).get("rope_type") != "llama3":
        raise Unsupported("the torchtune runner builds Llama-3.2-style models only (llama3 rope scaling)")
    task = req.get("task", "full")
    dims = dict(vocab_size=cfg["vocab_size"], num_layers=cfg["num_hidden_layers"], num_heads=cfg["num_attention_heads"],
                num_kv_heads=cfg.get("num_key_value_heads", cfg["num_attention_heads"]), embed_dim=cfg["hidden_size"],
                max_seq_len=int(req.get("sequence_length", 128)), intermediate_dim=cfg["intermediate_size"],
                norm_eps=cfg.get("rms_norm_eps", 1e-5), rope_base=int(cfg.get("rope_theta", 500000)),
                scale_factor=int(cfg["rope_scaling"]["factor"]), tie_word_embeddings=cfg.get("tie_word_embeddings", True))
    with training.set_default_dtype(dtype), device:
        if task == "full":
            return cb.llama3_2(**dims)
        lo = req.get("lora") or {}
        targets = lo.get("targets", ["q_proj", "v_proj"])
        all_linear = targets == "all-linear"
        attn = [TT_ATTN[t] for t in TT_ATTN if all_linear or t in targets]
        mlp = all_linear or any(t in targets for t in TT_MLP)
        if not all_linear and mlp and not all(t in targets for t in TT_MLP):
            raise Unsupported("torchtune's apply_lora_to_mlp adapts all three MLP projections or none")
        rank = int(lo.get("rank", 8))
        return cb.lora_llama3_2(attn, apply_lora_to_mlp=mlp, apply_lora_to_output=False, lora_rank=rank,
                                lora_alpha=float(lo.get("alpha", 2 * rank)), lora_dropout=float(lo.get("dropout", 0.0)),
                                quantize_base=task == "qlora", **dims)


def run_torchtune(req, cfg, device, dtype, meter, setup):
    """The single-device recipe's training loop (lora_finetune_single_device.py /
    full_finetune_single_device.py, torchtune 0.6.1): chunked output + CEWithChunkedOutputLoss,
    labels shifted with an ignore-index column, optimizer.step, zero_grad(set_to_none=True)."""
    from torchtune import modules, training
    from torchtune.modules.loss import CEWithChunkedOutputLoss
    from torchtune.modules.peft import get_adapter_params, set_trainable_params
    from workload import make_optimizer

    tr = meter.tracker
    task = req.get("task", "full")
    mbs, seq = int(req.get("micro_batch_size", 1)), int(req.get("sequence_length", 128))
    steps, gas = int(req.get("steps", 2)), int(req.get("gradient_accumulation_steps", 1))
    with meter.phase("model_load", "other"):
        model = build_torchtune(req, cfg, dtype, device)
        if tr is not None:
            tr.track_module(model, grad_hooks=False)
    with meter.phase("wrap", "other"):
        if task != "full":
            set_trainable_params(model, get_adapter_params(model))
        if req.get("gradient_checkpointing", False):
            training.set_activation_checkpointing(model, auto_wrap_policy={modules.TransformerSelfAttentionLayer})
        loss_fn = CEWithChunkedOutputLoss()
        model.set_num_output_chunks(loss_fn.num_output_chunks)
        if tr is not None:
            tr.track_module(model)
    params = [p for p in model.parameters() if p.requires_grad]
    setup.update(framework_impl=f"torchtune {__import__('torchtune').__version__} recipe step",
                 model_class=type(model).__name__, num_parameters=int(sum(p.numel() for p in model.parameters())),
                 trainable_parameters=int(sum(p.numel() for p in params)), loss="CEWithChunkedOutputLoss",
                 loss_chunks=loss_fn.num_output_chunks)
    with meter.phase("optimizer_create", "optimizer_state"):
        opt, oinfo = make_optimizer(req.get("optimizer", "adamw_fused"), params, device)
    setup["optimizer"] = oinfo
    g = torch.Generator().manual_seed(int(req.get("seed", 1234)))
    ignore = torch.full((mbs, 1), loss_fn.ignore_index, dtype=torch.long, device=device)
    model.train()
    for step in range(1, steps + 1):
        sp = f"step{step}"
        with meter.phase(sp):
            for _ in range(gas):
                with meter.phase(f"{sp}.batch", "input"):
                    tokens = torch.randint(0, cfg["vocab_size"], (mbs, seq), generator=g).to(device)
                    labels = tokens.clone()
                    if tr is not None:
                        tr.track_tensors([tokens, labels, ignore], "input")
                with meter.phase(f"{sp}.forward", "activation"):
                    logits = model(tokens)
                    labels = torch.hstack((labels[..., 1:], ignore))
                    if not isinstance(logits, list):
                        labels = labels.reshape(-1)
                        logits = logits.reshape(-1, logits.size(-1))
                    loss = loss_fn(logits, labels)
                    del logits
                with meter.phase(f"{sp}.backward", "backward_temp"):
                    (loss / gas if gas > 1 else loss).backward()
                    if tr is not None:
                        tr.track_grads(model)
                del loss, tokens, labels
            with meter.phase(f"{sp}.optimizer", "optimizer_temp"):
                opt.step()
                if tr is not None:
                    tr.track_optimizer(opt)
            with meter.phase(f"{sp}.zero_grad", "other"):
                opt.zero_grad(set_to_none=True)
    return model


# ---------------------------------------------------------------------------------- LitGPT
# LitGPT pins huggingface-hub<1.4 while transformers 5.23 needs a newer one, so it cannot live in
# the validation venv: scripts/setup_python.sh installs it and the pieces of Lightning it imports
# without their dependencies into this folder (validate/requirements-litgpt.txt), which only the
# LitGPT runner puts on sys.path.
LITGPT_DIR = os.environ.get("MEMFIT_LITGPT", os.path.join(os.path.expanduser("~"), ".cache", "memfit", "litgpt"))
# memfit precision -> Lightning Fabric precision (LitGPT's --precision); LitGPT's default on a
# bf16-capable device is "bf16-mixed" (utils.get_default_supported_precision(training=True))
LITGPT_PRECISION = {"fp32": "32-true", "amp_bf16": "bf16-mixed", "bf16": "bf16-true"}
# memfit optimizer -> the class LitGPT's instantiate_torch_optimizer builds from its --optimizer
# string ("AdamW", the default: torch.optim.AdamW with torch's defaults, i.e. foreach on CUDA and
# the per-tensor loop on CPU)
LITGPT_OPTIMIZER = {"adamw": "AdamW", "adamw_loop": "AdamW", "sgd": "SGD"}
LITGPT_LORA = {"q_proj": "lora_query", "k_proj": "lora_key", "v_proj": "lora_value", "o_proj": "lora_projection"}


def import_litgpt():
    """litgpt from LITGPT_DIR; a missing install is an error (not a skip): CI must measure it."""
    if not os.path.isdir(os.path.join(LITGPT_DIR, "litgpt")):
        raise RuntimeError(f"litgpt is not installed in {LITGPT_DIR}: run `scripts/setup.sh python` "
                           f"(or set MEMFIT_LITGPT to where validate/requirements-litgpt.txt was installed)")
    if LITGPT_DIR not in sys.path:
        sys.path.insert(0, LITGPT_DIR)
    import litgpt  # noqa: F401
    return litgpt


def litgpt_config(req, cfg: Dict[str, Any]):
    """A litgpt.lora.Config with the HF llama config's shapes (what litgpt's own "Llama-3.2-1B"
    entry sets: RMSNorm, LLaMAMLP, no biases, full rotary, sequential residual), the LoRA fields of
    finetune/lora.py's setup(): r 8, alpha 16, dropout 0.05, query and value unless the case names
    its targets. No checkpoint is read: the weights are LitGPT's random init."""
    from workload import Unsupported
    from litgpt.lora import Config
    if cfg.get("model_type") != "llama":
        raise Unsupported("the LitGPT runner maps llama-style configs only")
    if cfg.get("tie_word_embeddings", False):
        raise Unsupported("LitGPT's llama GPT does not tie the LM head to the embedding: give tie_word_embeddings false")
    task = req.get("task", "full")
    heads = cfg["num_attention_heads"]
    kw = dict(name="memfit-tiny", block_size=int(cfg.get("max_position_embeddings", 4096)),
              vocab_size=cfg["vocab_size"], padded_vocab_size=cfg["vocab_size"], n_layer=cfg["num_hidden_layers"],
              n_head=heads, n_embd=cfg["hidden_size"], n_query_groups=cfg.get("num_key_value_heads", heads),
              head_size=cfg.get("head_dim", cfg["hidden_size"] // heads), rotary_percentage=1.0,
              parallel_residual=False, bias=False, norm_class_name="RMSNorm", norm_eps=cfg.get("rms_norm_eps", 1e-5),
              mlp_class_name="LLaMAMLP", intermediate_size=cfg["intermediate_size"],
              rope_base=int(cfg.get("rope_theta", 10000)))
    if task != "full":
        lo = req.get("lora") or {}
        rank = int(lo.get("rank", 8))
        kw.update(lora_r=rank, lora_alpha=int(lo.get("alpha", 16)), lora_dropout=float(lo.get("dropout", 0.05)))
        targets = lo.get("targets", ["q_proj", "v_proj"])
        mlp = ("gate_proj", "up_proj", "down_proj")
        if targets == "all-linear":
            targets = list(LITGPT_LORA) + list(mlp)
        unknown = [t for t in targets if t not in LITGPT_LORA and t not in mlp]
        if unknown or (any(t in targets for t in mlp) and not all(t in targets for t in mlp)):
            raise Unsupported(f"LitGPT's lora_* flags cannot express targets {targets} (lora_mlp adapts all three MLP Linears)")
        kw.update({flag: t in targets for t, flag in LITGPT_LORA.items()})
        kw["lora_mlp"] = all(t in targets for t in mlp)
    return Config(**kw)


def run_litgpt(req, cfg, device, meter, setup):
    """LitGPT 0.5.13's finetune step (finetune/full.py and finetune/lora.py, single device): a
    Fabric with the case's precision, GPT built under fabric.init_module, LoRA frozen by
    mark_only_lora_as_trainable, fabric.setup_module, instantiate_torch_optimizer + setup_optimizers;
    each micro-batch: full.py `model(input_ids)` and chunked_cross_entropy(logits[..., :-1, :],
    targets[..., 1:]); lora.py `model(input_ids, lm_head_chunk_size=128)`, the last chunk sliced,
    chunked_cross_entropy over the chunks; fabric.backward(loss / accumulation); then
    optimizer.step() and optimizer.zero_grad() (set_to_none). fit() first sets model.max_seq_length
    to the longest sequence. Not run: the sanity validation before training and the sample
    generation (no_grad, before the first optimizer state / after training)."""
    from workload import Unsupported
    task = req.get("task", "full")
    precision = req.get("precision", "amp_bf16")
    if task == "qlora":
        raise Unsupported("LitGPT's QLoRA goes through Lightning's BitsandbytesPrecision, which quantizes on CUDA "
                          "only (lightning 2.6 fabric/plugins/precision/bitsandbytes.py: 'Unexpected device type')")
    if precision not in LITGPT_PRECISION:
        raise Unsupported(f"precision {precision!r}: LitGPT's CPU runs here are 32-true, bf16-mixed, bf16-true")
    if req.get("gradient_checkpointing", False):
        raise Unsupported("LitGPT's single-device finetune scripts have no activation checkpointing "
                          "(only FSDPStrategy(activation_checkpointing_policy=...) with devices > 1)")
    opt_name = req.get("optimizer", "adamw")
    if opt_name not in LITGPT_OPTIMIZER:
        raise Unsupported(f"optimizer {opt_name!r}: LitGPT's CPU default is torch.optim.AdamW (memfit 'adamw_loop')")
    litgpt = import_litgpt()
    import lightning as L
    from litgpt.lora import GPT, mark_only_lora_as_trainable
    from litgpt.utils import chunked_cross_entropy, instantiate_torch_optimizer

    tr = meter.tracker
    mbs, seq = int(req.get("micro_batch_size", 1)), int(req.get("sequence_length", 128))
    steps, gas = int(req.get("steps", 2)), int(req.get("gradient_accumulation_steps", 1))
    fabric = L.Fabric(accelerator=device.type, devices=1, strategy="auto", precision=LITGPT_PRECISION[precision])
    config = litgpt_config(req, cfg)
    with meter.phase("model_load", "other"):
        with fabric.init_module(empty_init=False):
            model = GPT(config)
        if task != "full":
            mark_only_lora_as_trainable(model)
        model = fabric.setup_module(model)
        model.max_seq_length = seq  # fit(): min(longest sequence, train.max_seq_length)
        if tr is not None:
            tr.track_module(model, grad_hooks=False)
    meter.forget_build_peak()
    with meter.phase("optimizer_create", "optimizer_state"):
        optimizer = fabric.setup_optimizers(instantiate_torch_optimizer(LITGPT_OPTIMIZER[opt_name], model.parameters()))
    if tr is not None:
        tr.track_module(model)
    params = [p for p in model.parameters() if p.requires_grad]
    setup.update(framework_impl=f"litgpt {litgpt.__version__ if hasattr(litgpt, '__version__') else '0.5.13'} "
                                f"finetune/{'full' if task == 'full' else 'lora'}.py step, lightning {L.__version__}",
                 model_class="litgpt.lora.GPT", fabric_precision=LITGPT_PRECISION[precision],
                 num_parameters=int(sum(p.numel() for p in model.parameters())),
                 trainable_parameters=int(sum(p.numel() for p in params)), loss="litgpt.utils.chunked_cross_entropy",
                 lm_head_chunk_size=0 if task == "full" else 128, peak_excludes_model_build=True,
                 optimizer={"name": opt_name, "impl": f"instantiate_torch_optimizer({LITGPT_OPTIMIZER[opt_name]!r})"})
    g = torch.Generator().manual_seed(int(req.get("seed", 1234)))
    model.train()
    for step in range(1, steps + 1):
        sp = f"step{step}"
        with meter.phase(sp):
            for _ in range(gas):
                with meter.phase(f"{sp}.batch", "input"):
                    input_ids = torch.randint(0, config.vocab_size, (mbs, seq), generator=g).to(device)
                    targets = input_ids.clone()
                    if tr is not None:
                        tr.track_tensors([input_ids, targets], "input")
                with meter.phase(f"{sp}.forward", "activation"):
                    if task == "full":
                        logits = model(input_ids)
                        loss = chunked_cross_entropy(logits[..., :-1, :], targets[..., 1:])
                    else:
                        logits = model(input_ids, lm_head_chunk_size=128)
                        logits[-1] = logits[-1][..., :-1, :]
                        loss = chunked_cross_entropy(logits, targets[..., 1:])
                with meter.phase(f"{sp}.backward", "backward_temp"):
                    fabric.backward(loss / gas)
                    if tr is not None:
                        tr.track_grads(model)
                # no `del`: like fit()'s loop variables, this micro-batch's logits, loss and batch stay
                # alive through the optimizer step until the next forward has returned
            with meter.phase(f"{sp}.optimizer", "optimizer_temp"):
                optimizer.step()
                if tr is not None:
                    tr.track_optimizer(optimizer)
            with meter.phase(f"{sp}.zero_grad", "other"):
                optimizer.zero_grad()
    return model
