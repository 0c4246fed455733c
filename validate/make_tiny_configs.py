#!/usr/bin/env python3
"""Derive data/validation/tiny_configs/<family>-tiny.json from the authentic configs.

Each tiny config keeps the source file's keys (structure, model_type, flags such as
tie_word_embeddings, bias flags, activation, rotary fractions, parallel residual ...)
and only overrides the size fields listed in FAMILIES.  Families with no authentic
file in data/configs/ are written from the field names of transformers' config
class (``source`` = "transformers <Class> defaults").  Re-run after editing:

    python validate/make_tiny_configs.py        # writes the JSON files + README.md

Needs no torch; ``--check`` additionally instantiates each config with
transformers and runs one forward/backward on CPU.
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "data", "configs")
DST = os.path.join(ROOT, "data", "validation", "tiny_configs")

VOCAB = 1024
# Drop keys that only make sense for the Hub repo / remote code / quantized checkpoints.
DROP = {"_name_or_path", "auto_map", "quantization_config", "transformers_version",
        "task_specific_params", "torch_dtype", "architectures_note"}

# family: (source file or None, {renames old->new}, {overrides}, note)
FAMILIES = {
    "llama": ("meta-llama--Llama-3.2-1B.json", {}, dict(
        hidden_size=128, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, head_dim=16, vocab_size=VOCAB, max_position_embeddings=512,
        rope_scaling={"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                      "original_max_position_embeddings": 64, "rope_type": "llama3"}),
        "GQA 32:8 -> 8:2; head_dim 16; intermediate/hidden = 4 as the original; tied embeddings as the original; llama3 rope scaling kept, original_max_position_embeddings scaled 8192 -> 64"),
    "mistral": ("mistralai--Mistral-7B-v0.1.json", {}, dict(
        hidden_size=128, intermediate_size=448, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=512, sliding_window=32),
        "GQA 32:8 -> 8:2; intermediate/hidden 3.5 as the original; sliding_window 4096 -> 32 so a 64-128 token sequence crosses it"),
    "qwen2": ("Qwen--Qwen2.5-0.5B.json", {}, dict(
        hidden_size=112, intermediate_size=608, num_hidden_layers=2, num_attention_heads=7,
        num_key_value_heads=1, vocab_size=VOCAB, max_position_embeddings=512, max_window_layers=2,
        sliding_window=512),
        "GQA 14:2 (ratio 7) -> 7:1 with head_dim 16 (hidden 112); intermediate/hidden ~5.4 as the original; tied embeddings; q/k/v bias (implicit in qwen2)"),
    "qwen3": ("Qwen--Qwen3-8B.json", {}, dict(
        hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, head_dim=32, vocab_size=VOCAB, max_position_embeddings=512,
        max_window_layers=2),
        "GQA 32:8 -> 8:2; head_dim 32 explicit, so heads*head_dim (256) != hidden (128), a shape the original avoids but transformers supports; q/k RMSNorm"),
    "gemma": ("google--gemma-2b.json", {}, dict(
        hidden_size=128, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, head_dim=64, vocab_size=VOCAB, max_position_embeddings=512),
        "MQA (8:1 -> 4:1); head_dim 64 (independent of hidden, like the original 256 with hidden 2048); intermediate/hidden 8 as the original"),
    "gemma2": ("google--gemma-2-2b.json", {}, dict(
        hidden_size=128, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=32, vocab_size=VOCAB,
        max_position_embeddings=512, sliding_window=32),
        "GQA 8:4 -> 4:2; 2 layers so one sliding (layer 0) + one global layer; sliding_window 4096 -> 32; softcapping kept"),
    "phi": ("microsoft--phi-2.json", {
        "n_embd": "hidden_size", "n_head": "num_attention_heads", "n_layer": "num_hidden_layers",
        "n_positions": "max_position_embeddings", "layer_norm_epsilon": "layer_norm_eps",
        "activation_function": "hidden_act", "n_head_kv": "num_key_value_heads", "n_inner": "intermediate_size",
    }, dict(
        model_type="phi", architectures=["PhiForCausalLM"], hidden_size=128, intermediate_size=512,
        num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=8, vocab_size=VOCAB,
        max_position_embeddings=512, partial_rotary_factor=0.4, rotary_dim=None,
        flash_attn=None, flash_rotary=None, fused_dense=None, img_processor=None),
        "the stored phi-2 file is the historical remote-code 'phi-msft' format; fields renamed to transformers' PhiConfig (n_embd->hidden_size, n_head->num_attention_heads, n_layer->num_hidden_layers, n_positions->max_position_embeddings, layer_norm_epsilon->layer_norm_eps, activation_function->hidden_act); rotary_dim 32 of head_dim 80 -> partial_rotary_factor 0.4; remote-code-only flags dropped; resid_pdrop 0.1 kept"),
    "phi3": ("microsoft--Phi-3-mini-4k-instruct.json", {}, dict(
        hidden_size=128, intermediate_size=352, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=8, vocab_size=VOCAB, max_position_embeddings=512,
        original_max_position_embeddings=512, sliding_window=31, pad_token_id=VOCAB - 1,
        eos_token_id=VOCAB - 1),
        "MHA 32:32 -> 8:8; fused qkv_proj / gate_up_proj as the original; intermediate/hidden 2.67 -> 2.75; sliding_window 2047 -> 31; pad/eos 32000 -> 1023"),
    "gpt2": ("openai-community--gpt2.json", {}, dict(
        n_embd=128, n_head=4, n_layer=2, n_positions=512, n_ctx=512, vocab_size=VOCAB,
        bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1),
        "12 heads of 64 -> 4 heads of 32; dropouts 0.1 kept (attn/resid/embd); tied lm_head; Conv1D layers"),
    "gpt_neox": ("EleutherAI--pythia-1b.json", {}, dict(
        hidden_size=128, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        vocab_size=VOCAB, max_position_embeddings=512),
        "8 heads of 256 -> 4 heads of 32; rotary_pct 0.25 and parallel residual kept; untied embed_out"),
    "gptj": ("EleutherAI--gpt-j-6b.json", {}, dict(
        n_embd=128, n_head=4, n_layer=2, n_positions=512, rotary_dim=8, vocab_size=VOCAB,
        bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1, gradient_checkpointing=None),
        "16 heads of 256 -> 4 heads of 32; rotary_dim 64/256 -> 8/32 (same fraction); untied lm_head with bias"),
    "opt": ("facebook--opt-125m.json", {}, dict(
        hidden_size=128, ffn_dim=512, num_hidden_layers=2, num_attention_heads=4,
        vocab_size=VOCAB, max_position_embeddings=512, word_embed_proj_dim=128),
        "12 heads of 64 -> 4 heads of 32; dropout 0.1 kept; learned positions (offset 2); tied lm_head"),
    "bloom": ("bigscience--bloom-560m.json", {}, dict(
        n_embed=128, n_layer=2, num_attention_heads=4, vocab_size=VOCAB),
        "16 heads of 64 -> 4 heads of 32; ALiBi; tied lm_head"),
    "falcon": ("tiiuae--falcon-40b.json", {
        "n_head": "num_attention_heads", "n_head_kv": "num_kv_heads", "n_layer": "num_hidden_layers",
    }, dict(
        model_type="falcon", architectures=["FalconForCausalLM"], hidden_size=128,
        num_hidden_layers=2, num_attention_heads=16, num_kv_heads=2, new_decoder_architecture=True,
        vocab_size=VOCAB, max_position_embeddings=512),
        "the stored falcon-40b file is the remote-code 'RefinedWeb' format; renamed to transformers' FalconConfig (n_head->num_attention_heads, n_head_kv->num_kv_heads, n_layer->num_hidden_layers, new_decoder_architecture=true as implied by n_head_kv); GQA 128:8 -> 16:2 with head_dim 8; parallel_attn, no bias"),
    "gpt_bigcode": ("bigcode--gpt_bigcode-santacoder.json", {}, dict(
        n_embd=128, n_head=4, n_layer=2, n_inner=512, n_positions=512, vocab_size=VOCAB,
        bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1),
        "multi-query attention kept; 16 heads -> 4 heads of 32; dropouts 0.1 kept"),
    "mixtral": ("mistralai--Mixtral-8x7B-v0.1.json", {}, dict(
        hidden_size=128, intermediate_size=448, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, vocab_size=VOCAB,
        max_position_embeddings=512),
        "8 experts top-2 -> 4 experts top-2; GQA 32:8 -> 8:2"),
    "qwen2_moe": ("Qwen--Qwen2-57B-A14B.json", {}, dict(
        hidden_size=128, intermediate_size=640, moe_intermediate_size=96, shared_expert_intermediate_size=704,
        num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=1, num_experts=4,
        num_experts_per_tok=2, vocab_size=VOCAB, max_position_embeddings=512, max_window_layers=2,
        sliding_window=512),
        "64 experts top-8 -> 4 experts top-2; shared expert kept (size ratio to hidden ~5.7 as the original); GQA 28:4 -> 8:1 (ratio 7 -> 8)"),
    "qwen3_moe": ("Qwen--Qwen3-30B-A3B.json", {}, dict(
        hidden_size=128, intermediate_size=384, moe_intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=1, head_dim=32, num_experts=4,
        num_experts_per_tok=2, vocab_size=VOCAB, max_position_embeddings=512, max_window_layers=2),
        "128 experts top-8 -> 4 experts top-2; GQA 32:4 (ratio 8) -> 8:1; head_dim 32 explicit"),
    "deepseek_v3": ("deepseek-ai--DeepSeek-V3.json", {}, dict(
        hidden_size=128, intermediate_size=320, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, n_shared_experts=1,
        num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1,
        kv_lora_rank=32, q_lora_rank=48, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
        vocab_size=VOCAB, max_position_embeddings=2560, num_nextn_predict_layers=0,
        rope_scaling={"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                      "original_max_position_embeddings": 64, "type": "yarn"}),
        "MLA kept (q_lora_rank, kv_lora_rank, nope/rope/v head dims scaled /8); layer 0 dense + layer 1 MoE (first_k_dense_replace 3 -> 1); 256 routed experts top-8 in 8 groups -> 4 top-2 in 2 groups; 1 shared expert; fp8 quantization_config and remote-code auto_map dropped; MTP layers not built by transformers"),
    "gpt_oss": ("openai--gpt-oss-20b.json", {}, dict(
        hidden_size=128, intermediate_size=128, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2, experts_per_token=2,
        vocab_size=VOCAB, max_position_embeddings=512, initial_context_length=16, sliding_window=32,
        layer_types=["sliding_attention", "full_attention"],
        rope_scaling={"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 16,
                      "rope_type": "yarn", "truncate": False}),
        "32 experts top-4 -> 4 top-2 (expert width = hidden as the original); GQA 64:8 -> 8:2, head_dim 16; one sliding (window 128 -> 32) + one full layer; attention sinks and all biases kept; yarn original context 4096 -> 16; the mxfp4 quantization_config dropped (bf16/fp32 weights)"),
    "llama4_text": ("RedHatAI--Llama-4-Scout-17B-16E-Instruct-FP8-dynamic.json#text_config", {}, dict(
        hidden_size=128, intermediate_size=96, intermediate_size_mlp=256, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=1,
        interleave_moe_layer_step=2, attention_chunk_size=32, vocab_size=VOCAB, max_position_embeddings=512,
        rope_scaling={"factor": 16.0, "high_freq_factor": 1.0, "low_freq_factor": 1.0,
                      "original_max_position_embeddings": 32, "rope_type": "llama3"},
        _attn_implementation_autoset=None, for_llm_compressor=None),
        "text model of Llama 4 Scout: 4 layers so layer 3 is a NoPE (full-attention) layer and layers 0-2 chunked (chunk 8192 -> 32); MoE every 2nd layer (interleave step 1 -> 2) so dense and MoE layers both occur; 16 experts top-1 + shared expert -> 4 top-1 + shared; GQA 40:8 -> 8:2"),
    "gemma3": ("google--gemma-3-1b-it.json", {}, dict(
        hidden_size=128, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=32, vocab_size=VOCAB,
        max_position_embeddings=512, sliding_window=32, layer_types=["sliding_attention", "full_attention"]),
        "text-only Gemma 3 (1B): MQA 4:1 kept; head_dim 256 -> 32; one sliding (window 512 -> 32) + one full layer (the 5:1 pattern needs 6 layers); q/k norms and 4 norms per layer kept"),
    "smollm3": ("HuggingFaceTB--SmolLM3-3B.json", {}, dict(
        hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=512, max_window_layers=4,
        no_rope_layers=[1, 1, 1, 0], layer_types=["full_attention"] * 4),
        "4 layers so the NoPE layer (every 4th) occurs; GQA 16:4 -> 8:2; tied embeddings as the original"),
    "olmo2": ("allenai--OLMo-2-1124-7B-Instruct.json", {}, dict(
        hidden_size=128, intermediate_size=352, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, vocab_size=VOCAB, max_position_embeddings=512),
        "MHA 32:32 -> 4:4; q/k norms over all heads and post-norms kept; intermediate/hidden ~2.7 as the original"),
    "bert": ("google-bert--bert-large-uncased.json", {}, dict(
        hidden_size=128, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        vocab_size=VOCAB, gradient_checkpointing=None),
        "encoder (BertForMaskedLM as the original; validate/workload.py builds it with AutoModelForMaskedLM); 16 heads of 64 -> 4 heads of 32; intermediate/hidden 4 as the original; hidden and attention dropout 0.1 kept; 512 positions and 2 token types kept; the legacy gradient_checkpointing key dropped (as for gptj)"),
    # ---- families without an authentic file in data/configs: transformers config-class field names
    "starcoder2": (None, {}, dict(
        model_type="starcoder2", architectures=["Starcoder2ForCausalLM"], hidden_size=128,
        intermediate_size=512, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
        hidden_act="gelu_pytorch_tanh", max_position_embeddings=512, norm_epsilon=1e-5,
        rope_theta=10000.0, sliding_window=32, use_bias=True, residual_dropout=0.0,
        embedding_dropout=0.0, attention_dropout=0.0, tie_word_embeddings=True, vocab_size=VOCAB,
        bos_token_id=0, eos_token_id=0, initializer_range=0.018042),
        "transformers Starcoder2Config field names (GQA, biased linear layers, LayerNorm, sliding window as starcoder2 uses)"),
    "stablelm": (None, {}, dict(
        model_type="stablelm", architectures=["StableLmForCausalLM"], hidden_size=128,
        intermediate_size=352, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        hidden_act="silu", max_position_embeddings=512, layer_norm_eps=1e-5, rope_theta=10000.0,
        partial_rotary_factor=0.25, use_qkv_bias=False, qk_layernorm=False,
        use_parallel_residual=False, hidden_dropout=0.0, attention_dropout=0.0,
        tie_word_embeddings=False, vocab_size=VOCAB, bos_token_id=0, eos_token_id=0,
        initializer_range=0.02),
        "transformers StableLmConfig field names (stablelm-3b-4e1t style: partial rotary 0.25, LayerNorm, SwiGLU)"),
    "codegen": (None, {}, dict(
        model_type="codegen", architectures=["CodeGenForCausalLM"], n_embd=128, n_head=4, n_layer=2,
        n_positions=512, n_ctx=512, rotary_dim=8, activation_function="gelu_new", resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5, tie_word_embeddings=False,
        vocab_size=VOCAB, bos_token_id=0, eos_token_id=0, initializer_range=0.02),
        "transformers CodeGenConfig field names (GPT-J-like parallel block, fused qkv, partial rotary)"),
    "biogpt": (None, {}, dict(
        model_type="biogpt", architectures=["BioGptForCausalLM"], hidden_size=128,
        intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, hidden_act="gelu",
        hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, max_position_embeddings=512,
        layer_norm_eps=1e-12, scale_embedding=True, layerdrop=0.0, activation_dropout=0.0,
        vocab_size=VOCAB, pad_token_id=1, bos_token_id=0, eos_token_id=2, initializer_range=0.02),
        "transformers BioGptConfig field names (biogpt base layout: dropout 0.1, scaled embeddings, learned positions)"),
    "gpt_neo": (None, {}, dict(
        model_type="gpt_neo", architectures=["GPTNeoForCausalLM"], hidden_size=128, num_layers=2,
        num_heads=4, attention_types=[[["global", "local"], 1]], window_size=32,
        max_position_embeddings=512, intermediate_size=None, activation_function="gelu_new",
        resid_dropout=0.0, embed_dropout=0.0, attention_dropout=0.0, layer_norm_epsilon=1e-5,
        vocab_size=VOCAB, bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1, initializer_range=0.02),
        "transformers GPTNeoConfig field names (alternating global/local attention, window 256 -> 32)"),
}

TOKEN_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "decoder_start_token_id")


def build(family):
    src, renames, overrides, note = FAMILIES[family]
    cfg = {}
    if src:
        path, _, part = src.partition("#")  # "file.json#text_config": the nested language-model config
        with open(os.path.join(SRC, path)) as f:
            orig = json.load(f)
        if part:
            orig = orig[part]
        for k, v in orig.items():
            if k in DROP:
                continue
            cfg[renames.get(k, k)] = v
    for k, v in overrides.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    vocab = cfg.get("vocab_size", VOCAB)
    for k in TOKEN_KEYS:  # token ids must index the shrunken vocabulary (nn.Embedding padding_idx)
        v = cfg.get(k)
        if isinstance(v, int) and v >= vocab:
            cfg[k] = vocab - 1
        elif isinstance(v, list):
            cfg[k] = [x if x < vocab else vocab - 1 for x in v]
    return cfg, src, note


# ---- shape variants (the generated tuning/check suites of validate/make_suite.py)
# A variant rescales one tiny config: widths by a factor k, the layer count, the vocabulary.
# Heads scale with k so the head size stays the family's (unless the config sets head_dim
# independently of the hidden size, as Gemma, Qwen3 and DeepSeek-V3's MLA do: then the head
# count stays); GQA/MQA ratios are kept.
HIDDEN_KEYS = ("hidden_size", "n_embd", "n_embed", "word_embed_proj_dim")
WIDTH_KEYS = ("intermediate_size", "ffn_dim", "n_inner", "moe_intermediate_size",
              "shared_expert_intermediate_size", "kv_lora_rank", "q_lora_rank")
HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads")
KV_KEYS = ("num_key_value_heads", "num_kv_heads")
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
POSITION_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "original_max_position_embeddings")
MAX_SEQUENCE = 1024
# family constraints: CodeGen splits qkv in 4 model-parallel groups (heads % 4 == 0); GPT-Neo's
# attention_types pairs a global and a local layer (even layer counts).
HEADS_MULTIPLE = {"codegen": 4}
EVEN_LAYERS = {"gpt_neo"}


def _get(cfg, keys):
    return next(((k, cfg[k]) for k in keys if isinstance(cfg.get(k), int)), (None, None))


def _head_dim_fixed_apart(cfg):
    """True when the config's head size is set apart from hidden / heads (keep the head count)."""
    _, hidden = _get(cfg, HIDDEN_KEYS)
    _, heads = _get(cfg, HEAD_KEYS)
    if "qk_nope_head_dim" in cfg:  # MLA
        return True
    hd = cfg.get("head_dim")
    return isinstance(hd, int) and heads is not None and hd * heads != hidden


def variant_scales(family):
    """The width factors k for which the family's heads stay whole (and valid for the family)."""
    cfg, _, _ = build(family)
    _, heads = _get(cfg, HEAD_KEYS)
    _, kv = _get(cfg, KV_KEYS)
    out = []
    for k in (0.5, 1, 1.5, 2, 3, 4):
        if not _head_dim_fixed_apart(cfg):
            if (heads * k) % 1 or (kv is not None and (kv * k) % 1):
                continue
            if (heads * k) % HEADS_MULTIPLE.get(family, 1):
                continue
        out.append(k)
    return out


def variant(family, k, layers, vocab):
    """The tiny config of `family` with widths x k, `layers` layers and vocabulary `vocab`."""
    cfg, src, _ = build(family)
    cfg = dict(cfg)
    fixed_heads = _head_dim_fixed_apart(cfg)
    for key in HIDDEN_KEYS + WIDTH_KEYS:
        if isinstance(cfg.get(key), int):
            cfg[key] = int(round(cfg[key] * k))
    if not fixed_heads:
        for key in HEAD_KEYS + KV_KEYS:
            if isinstance(cfg.get(key), int):
                cfg[key] = int(round(cfg[key] * k))
    for key in LAYER_KEYS:
        if key in cfg:
            cfg[key] = layers
    if family in EVEN_LAYERS:
        assert layers % 2 == 0, f"{family} needs an even layer count"
        cfg["attention_types"] = [[["global", "local"], layers // 2]]
    for key in POSITION_KEYS:
        if isinstance(cfg.get(key), int):
            cfg[key] = max(cfg[key], MAX_SEQUENCE)
    cfg["vocab_size"] = vocab
    return cfg


def shape_of(cfg):
    """(hidden, layers, vocab) of a config, for case names."""
    return _get(cfg, HIDDEN_KEYS)[1], _get(cfg, LAYER_KEYS)[1], cfg["vocab_size"]


def write_all():
    os.makedirs(DST, exist_ok=True)
    rows = []
    for fam in FAMILIES:
        cfg, src, note = build(fam)
        with open(os.path.join(DST, f"{fam}-tiny.json"), "w") as f:
            json.dump(cfg, f, indent=2)
            f.write("\n")
        rows.append((fam, src, note))
    with open(os.path.join(DST, "README.md"), "w") as f:
        f.write("# Tiny validation configs\n\n")
        f.write("Generated by `validate/make_tiny_configs.py` (edit that, then re-run it). Each file keeps the\n"
                "source config's keys, flags and model_type and only shrinks sizes: 2 layers, hidden 112-128,\n"
                f"vocab {VOCAB}, max positions 512, heads scaled keeping the GQA/MQA pattern. Token ids >= vocab are\n"
                "clamped to vocab-1 (nn.Embedding(padding_idx) must index the vocabulary). Keys that only make\n"
                "sense for a Hub checkpoint are dropped: " + ", ".join(sorted(DROP)) + ".\n\n"
                "Used by `data/validation/cpu_suite.json` (random weights, CPU, seconds per case).\n\n")
        f.write("| file | derived from | what changed |\n|---|---|---|\n")
        for fam, src, note in rows:
            s = f"`data/configs/{src}`" if src else "no authentic file: transformers config-class field names"
            f.write(f"| `{fam}-tiny.json` | {s} | {note} |\n")
    print(f"wrote {len(rows)} configs to {DST}")


def check():
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM
    ok = True
    for fam in FAMILIES:
        with open(os.path.join(DST, f"{fam}-tiny.json")) as f:
            d = json.load(f)
        try:
            d = dict(d)
            mt = d.pop("model_type")
            cfg = AutoConfig.for_model(mt, **d)
            m = AutoModelForCausalLM.from_config(cfg)
            x = torch.randint(0, d.get("vocab_size", VOCAB), (2, 64))
            out = m(input_ids=x, labels=x)
            out.loss.backward()
            n = sum(p.numel() for p in m.parameters())
            print(f"OK   {fam:12s} {type(m).__name__:28s} params={n:,} loss={out.loss.item():.3f}")
        except Exception as e:  # noqa: BLE001
            ok = False
            print(f"FAIL {fam:12s} {type(e).__name__}: {e}")
    print("transformers", transformers.__version__)
    return ok


if __name__ == "__main__":
    write_all()
    if "--check" in sys.argv:
        sys.exit(0 if check() else 1)
