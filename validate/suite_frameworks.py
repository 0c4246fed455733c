#!/usr/bin/env python3
"""Generate data/validation/cpu_suite_frameworks.json: QLoRA, bitsandbytes 8-bit optimizers and the
frameworks' own training steps, measured on CPU like the rest of the suite (issue 8, item 3).

- QLoRA: Transformers' real load path (from_pretrained with a BitsAndBytesConfig) over a
  random-weight checkpoint, bitsandbytes 0.50's CPU backend (nf4 / nf4 + double quantization /
  fp4), PEFT's prepare_model_for_kbit_training (on by default, off where the case says so).
- bitsandbytes optimizers (AdamW8bit, Lion 32-bit) through their CPU backend.
- Frameworks (runtime.framework): the framework's own step, see validate/frameworks.py.

`cases()` is the generator make_suite.py (or CI) can include; run as a script it writes the file.

    python validate/suite_frameworks.py
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from make_suite import ROOT, case, cfg  # noqa: E402

OUT = os.path.join(ROOT, "data", "validation", "cpu_suite_frameworks.json")
LORA = {"rank": 8, "alpha": 16, "targets": "all-linear"}


def qlora(fam, name, quant="nf4", **kw):
    kw.setdefault("precision", "bf16")
    return case(fam, name, task="qlora", quantization=quant, lora=dict(LORA), **kw)


def qlora_cases():
    out = []
    for quant in ("nf4", "nf4_double", "fp4"):
        for gc in (False, True):
            out.append(qlora("llama", f"llama/qlora-{quant}/bf16/{'gc' if gc else 'nogc'}/sdpa", quant,
                             gradient_checkpointing=gc))
    out.append(qlora("llama", "llama/qlora-nf4/fp32/nogc/sdpa", precision="fp32"))
    for gc in (False, True):
        out.append(qlora("llama", f"llama/qlora-nf4/bf16/{'gc' if gc else 'nogc'}/sdpa/no-prepare-kbit",
                         gradient_checkpointing=gc, runtime={"prepare_kbit": False}))
    out.append(qlora("llama", "llama/qlora-nf4/bf16/nogc/sdpa/adamw_8bit", optimizer="adamw_8bit"))
    # LLM.int8 (load_in_8bit) with and without checkpointing
    for gc in (False, True):
        out.append(qlora("llama", f"llama/qlora-int8/bf16/{'gc' if gc else 'nogc'}/sdpa", "int8",
                         gradient_checkpointing=gc))
    out.append(qlora("llama", "llama/qlora-int8/fp32/gc/sdpa", "int8", precision="fp32", gradient_checkpointing=True))
    for fam in ("qwen3", "gpt2", "phi3", "mixtral"):
        for gc in (False, True):
            out.append(qlora(fam, f"{fam}/qlora-nf4_double/bf16/{'gc' if gc else 'nogc'}/eager",
                             "nf4_double", gradient_checkpointing=gc, attention="eager"))
    return out


def optimizer_cases():
    out = []
    for opt in ("adamw_8bit", "lion"):
        out.append(case("llama", f"llama/full/fp32/nogc/sdpa/{opt}", optimizer=opt))
        out.append(case("llama", f"llama/full/bf16/gc/sdpa/{opt}", precision="bf16", gradient_checkpointing=True,
                        optimizer=opt))
        out.append(case("llama", f"llama/lora/bf16/nogc/sdpa/{opt}", task="lora", precision="bf16",
                        lora=dict(LORA), optimizer=opt))
    return out


def lora_dropout_cases():
    """LoRA with lora_dropout > 0 under gradient checkpointing (PEFT: lora_A(dropout(x)); the
    recomputed layer's dropouts draw new noise). Without checkpointing: cpu-lora-dropout.jsonl."""
    out = []
    for fam, prec, attn in (("llama", "bf16", "sdpa"), ("llama", "fp32", "eager"), ("gpt2", "fp32", "eager")):
        out.append(case(fam, f"{fam}/lora/{prec}/gc/{attn}/dropout0.1", task="lora", precision=prec,
                        gradient_checkpointing=True, attention=attn,
                        lora={"rank": 8, "alpha": 16, "targets": "all-linear", "dropout": 0.1}))
    return out


def framework_cases():
    """Each framework's own step (validate/frameworks.py) on llama-tiny: full, LoRA and QLoRA where the
    framework runs them on CPU, with the framework's default optimizer (Trainer/SFTConfig:
    adamw_torch_fused; torchtune's recipe configs: torch.optim.AdamW(fused=True))."""
    out = []
    for fw in ("transformers", "trl"):
        rt = {"framework": fw}
        out.append(case("llama", f"llama/{fw}/full/fp32/nogc/sdpa", optimizer="adamw_fused", runtime=dict(rt)))
        out.append(case("llama", f"llama/{fw}/full/bf16/gc/sdpa", precision="bf16", gradient_checkpointing=True,
                        optimizer="adamw_fused", runtime=dict(rt)))
        out.append(case("llama", f"llama/{fw}/lora/bf16/nogc/sdpa", task="lora", precision="bf16", lora=dict(LORA),
                        optimizer="adamw_fused", runtime=dict(rt)))
        out.append(case("llama", f"llama/{fw}/lora/fp32/gc/sdpa", task="lora", lora=dict(LORA),
                        gradient_checkpointing=True, optimizer="adamw_fused", runtime=dict(rt)))
        out.append(qlora("llama", f"llama/{fw}/qlora-nf4/bf16/gc/sdpa", gradient_checkpointing=True,
                         optimizer="adamw_fused", runtime=dict(rt)))
    # torchtune 0.6.1's QLoRA (torchao NF4Tensor) needs every quantized weight's block count to be a
    # multiple of its scaler block (256 blocks of 64): llama-tiny's k/v projections (4,096 elements)
    # are too small, so torchtune runs full and LoRA here
    tt = {"framework": "torchtune", "loss_chunks": 8}
    out.append(case("llama", "llama/torchtune/full/bf16/nogc/sdpa", precision="bf16", optimizer="adamw_fused",
                    runtime=dict(tt)))
    out.append(case("llama", "llama/torchtune/full/fp32/gc/sdpa", gradient_checkpointing=True,
                    optimizer="adamw_fused", runtime=dict(tt)))
    out.append(case("llama", "llama/torchtune/lora/bf16/nogc/sdpa", task="lora", precision="bf16", lora=dict(LORA),
                    optimizer="adamw_fused", runtime=dict(tt)))
    out.append(case("llama", "llama/torchtune/lora/fp32/gc/sdpa", task="lora", lora=dict(LORA),
                    gradient_checkpointing=True, optimizer="adamw_fused", runtime=dict(tt)))
    return out


def litgpt_cases():
    """LitGPT 0.5.13's finetune/full.py and finetune/lora.py steps (validate/frameworks.py run_litgpt)
    on llama-tiny's shapes as a litgpt.Config. LitGPT's llama GPT has its own lm_head (no tying) and
    plain rotary tables, so the config drops tie_word_embeddings and rope_scaling. LoRA with
    LitGPT's defaults (r 8, alpha 16, dropout 0.05 on query and value) unless named; its default
    optimizer "AdamW" is torch.optim.AdamW(), the per-tensor loop on CPU (memfit "adamw_loop").
    Not here: QLoRA (Lightning's BitsandbytesPrecision quantizes on CUDA only) and checkpointing
    (none on one device)."""
    config = cfg("llama")
    config["tie_word_embeddings"] = False
    del config["rope_scaling"]
    source = "data/validation/tiny_configs/llama-tiny.json, untied, no rope_scaling"
    rt = {"framework": "litgpt"}
    lora = {"rank": 8, "alpha": 16}

    def lit(name, **kw):
        kw.setdefault("optimizer", "adamw_loop")
        if kw.get("task") == "lora":
            kw.setdefault("lora", dict(lora))
        return case("llama", f"llama/litgpt/{name}", config=json.loads(json.dumps(config)), source=source,
                    runtime=dict(rt), **kw)

    out = []
    for prec in ("fp32", "amp_bf16", "bf16"):
        out.append(lit(f"full/{prec}/nogc/sdpa", precision=prec))
        out.append(lit(f"lora/{prec}/nogc/sdpa", task="lora", precision=prec))
    # several loss chunks: 5 row chunks of the full head; 3 head chunks (128, 128, 64 positions)
    out.append(lit("full/fp32/nogc/sdpa/s320", sequence_length=320))
    out.append(lit("lora/amp_bf16/nogc/sdpa/s320", task="lora", precision="amp_bf16", sequence_length=320))
    out.append(lit("lora-all/bf16/nogc/sdpa", task="lora", precision="bf16",
                   lora={"rank": 8, "alpha": 16, "targets": "all-linear"}))
    out.append(lit("lora/amp_bf16/nogc/sdpa/gas2", task="lora", precision="amp_bf16", gradient_accumulation_steps=2))
    out.append(lit("full/amp_bf16/nogc/sdpa/sgd", precision="amp_bf16", optimizer="sgd"))
    # other shapes: multi-head (LoRAQKVLinear's grouped conv1d path) at micro-batch 1 with two full
    # head chunks; a larger vocabulary at a sequence that is not a multiple of 128; dropout 0
    mha = json.loads(json.dumps(config))
    mha["num_key_value_heads"] = mha["num_attention_heads"]
    out.append(case("llama", "llama/litgpt/lora/bf16/nogc/sdpa/mha-b1s256", config=mha, source=source + ", MHA",
                    runtime=dict(rt), task="lora", precision="bf16", optimizer="adamw_loop", lora=dict(lora),
                    micro_batch_size=1, sequence_length=256))
    v4k = json.loads(json.dumps(config))
    v4k["vocab_size"] = 4096
    out.append(case("llama", "llama/litgpt/full/amp_bf16/nogc/sdpa/v4096-b3s200", config=v4k, source=source + ", vocab 4096",
                    runtime=dict(rt), precision="amp_bf16", optimizer="adamw_loop", micro_batch_size=3,
                    sequence_length=200))
    out.append(lit("full/fp32/nogc/sdpa/b1s320", micro_batch_size=1, sequence_length=320))  # reshape is a view
    out.append(lit("lora-all/fp32/nogc/sdpa/dropout0", task="lora",
                   lora={"rank": 16, "alpha": 32, "targets": "all-linear", "dropout": 0.0}))
    return out


def pattern_cases():
    """Framework cases of other shapes added when the frameworks holdout missed (never its cases)."""
    import make_suite as ms

    def shaped(fw, k, layers, vocab, name, untie=False, **kw):
        config = ms.tiny.variant("llama", k, layers, vocab)
        if untie:
            config["tie_word_embeddings"] = False
            config.pop("rope_scaling", None)
        source = f"validate/make_tiny_configs.py variant(llama, k={k}, layers={layers}, vocab={vocab})"
        return case("llama", f"llama/{fw}/{name}", config, source + (", untied, no rope_scaling" if untie else ""),
                    runtime={"framework": fw}, **kw)
    return [
        # TRL's fused head over a half compute dtype on CPU: _addmm_fp32's fp32 copies of the tile
        # and of the weight chunk (the holdout's trl LoRA bf16 V32000 case read -13.05 %)
        # (at short sequences, where they outweigh the tile's fold: hidden > ~6 x the rows)
        shaped("trl", 2, 2, 8192, "lora-qv/bf16/nogc/sdpa/h256-V8192-b1s24", task="lora", precision="bf16",
               optimizer="adamw_fused", micro_batch_size=1, sequence_length=24,
               lora={"rank": 8, "alpha": 16, "targets": ["q_proj", "v_proj"], "dropout": 0.0}),
        shaped("trl", 3, 2, 8192, "full/amp_bf16/gc/sdpa/h384-V8192-b1s16", precision="amp_bf16",
               gradient_checkpointing=True, optimizer="sgd", micro_batch_size=1, sequence_length=16),
        # LitGPT's per-tensor AdamW steps lm_head right before wte: lm_head's denom at wte's
        # division (the holdout's litgpt full amp_bf16 V16384 case read -6.92 %)
        shaped("litgpt", 2, 2, 8192, "full/amp_bf16/nogc/sdpa/h256-V8192-b1s128", untie=True, precision="amp_bf16",
               optimizer="adamw_loop", micro_batch_size=1, sequence_length=128),
        shaped("litgpt", 1, 3, 16384, "full/fp32/nogc/sdpa/h128-V16384-b2s64", untie=True, optimizer="adamw_loop",
               micro_batch_size=2, sequence_length=64),
    ]


def cases():
    return (qlora_cases() + optimizer_cases() + lora_dropout_cases() + framework_cases() + litgpt_cases()
            + pattern_cases())


# A holdout of the frameworks' steps (data/validation/README.md "Why a holdout set"): the cases
# above run at one shape, most on llama-tiny, so the frameworks' rules had never been checked on
# other shapes, families and settings. Drawn once with its own seed, measured before any of its
# estimates was read; its first replay is the unseen figure.
FRAMEWORK_HOLDOUT_SEED = 20261212
FRAMEWORK_HOLDOUT = 48
HOLDOUT_OUT = os.path.join(ROOT, "data", "validation", "cpu_holdout_frameworks.json")


def _drawn_shape(rng, fam, config_of):
    """(k, layers, vocab, config, b, s) of a random shape of `fam` within make_suite's step budget."""
    import make_suite as ms
    k = rng.choice(ms.tiny.variant_scales(fam))
    layers = rng.choice((2, 4) if fam in ms.tiny.EVEN_LAYERS else (2, 3, 4))
    vocab = rng.choice(ms.VOCABS)
    config = config_of(ms.tiny.variant(fam, k, layers, vocab))
    for _ in range(50):
        b, s = rng.randint(1, 4), rng.choice(ms.SEQUENCES)
        if ms.step_flops(config, b, s) <= ms.FLOP_BUDGET:
            return k, layers, vocab, config, b, s
    return k, layers, vocab, config, 1, 32


def _holdout_case(rng, fw):
    """One random case of framework `fw` (the settings its runner in validate/frameworks.py takes)."""
    import make_suite as ms
    untie = fw == "litgpt"

    def config_of(c):
        if untie:
            c["tie_word_embeddings"] = False
            c.pop("rope_scaling", None)
        return c
    fam = rng.choice(ms.FAMILIES) if fw in ("transformers", "trl") else "llama"
    k, layers, vocab, config, b, s = _drawn_shape(rng, fam, config_of)
    task = rng.choice(("full", "lora"))
    kw = {"micro_batch_size": b, "sequence_length": s, "task": task, "runtime": {"framework": fw}}
    if fw in ("transformers", "trl"):
        kw["precision"] = rng.choice(("fp32", "bf16", "amp_bf16") if task == "full" else ("fp32", "bf16"))
        kw["gradient_checkpointing"] = rng.random() < 0.5
        kw["attention"] = "eager" if fam in ms.NO_SDPA else rng.choice(("eager", "sdpa"))
        kw["optimizer"] = rng.choice(("adamw_fused", "adamw_fused", "adamw", "sgd", "adafactor"))
        kw["gradient_accumulation_steps"] = 2 if rng.random() < 0.2 else 1
        tag, targets = rng.choice(ms.lora_target_choices(fam))
    elif fw == "torchtune":
        kw["precision"] = rng.choice(("fp32", "bf16"))
        kw["gradient_checkpointing"] = rng.random() < 0.5
        kw["optimizer"] = "adamw_fused"
        kw["runtime"]["loss_chunks"] = 8
        tag, targets = rng.choice([("all", "all-linear"), ("qv", ["q_proj", "v_proj"]),
                                   ("attn", ["q_proj", "k_proj", "v_proj", "o_proj"])])
    else:  # litgpt: no checkpointing on one device, its default optimizer the per-tensor AdamW
        kw["precision"] = rng.choice(("fp32", "amp_bf16", "bf16"))
        kw["optimizer"] = rng.choice(("adamw_loop", "adamw_loop", "sgd"))
        tag, targets = rng.choice([("all", "all-linear"), ("qv", ["q_proj", "v_proj"])])
    if task == "lora":
        rank = rng.choice((4, 8, 16, 32))
        kw["lora"] = {"rank": rank, "alpha": 2 * rank, "targets": targets, "dropout": 0.0}
    name = f"holdout-fw/{fw}/" + ms.training_name(fam, config, layers, kw, tag if task == "lora" else None)
    return case(fam, name, config, f"validate/make_tiny_configs.py variant({fam}, k={k}, layers={layers}, "
                f"vocab={vocab})" + (", untied, no rope_scaling" if untie else ""), **kw)


def holdout_cases():
    """FRAMEWORK_HOLDOUT cases, the four frameworks in turn, drawn with FRAMEWORK_HOLDOUT_SEED."""
    import random
    rng = random.Random(FRAMEWORK_HOLDOUT_SEED)
    frameworks = ("transformers", "trl", "torchtune", "litgpt")
    from make_suite import name_uniquely
    out, names = [], set()
    for i in range(FRAMEWORK_HOLDOUT):
        c = _holdout_case(rng, frameworks[i % len(frameworks)])
        name_uniquely(c, names)
        out.append(c)
    return out


def main():
    cs = cases()
    suite = {"description": "memfit CPU validation suite, issue 8: QLoRA through bitsandbytes' CPU backend, "
                            "bitsandbytes optimizers, and the frameworks' own training steps. Generated by "
                            "validate/suite_frameworks.py.",
             "defaults": {"steps": 2}, "cases": cs}
    with open(OUT, "w") as f:
        json.dump(suite, f, indent=1)
        f.write("\n")
    print(f"wrote {len(cs)} cases to {OUT}")
    hs = holdout_cases()
    with open(HOLDOUT_OUT, "w") as f:
        json.dump({"description": f"memfit CPU validation, frameworks holdout: {FRAMEWORK_HOLDOUT} cases drawn with seed "
                                  f"{FRAMEWORK_HOLDOUT_SEED} over the frameworks' runners (Transformers Trainer, TRL "
                                  "SFTTrainer: every family; torchtune, LitGPT: Llama shapes), measured before any of "
                                  "their estimates was read. Generated by validate/suite_frameworks.py.",
                   "defaults": {"steps": 2}, "cases": hs}, f, indent=1)
        f.write("\n")
    print(f"wrote {len(hs)} cases to {HOLDOUT_OUT}")


if __name__ == "__main__":
    main()
