#!/usr/bin/env python3
"""Compare memfit with every published measurement in data/calibration/published_measurements.json.

Each record is mapped below to the memfit request that describes its run (model, task,
precision, optimizer, batch, sequence, checkpointing, attention, GPU, parallel method) and to
the estimate figure that matches the record's metric, compared like with like:

    nvidia-smi / NVML used       -> per_gpu.device_total_bytes
    torch max_memory_reserved    -> per_gpu.reserved_peak_bytes
    torch max_memory_allocated   -> per_gpu.allocated_peak_bytes
    torch active_bytes peak      -> per_gpu.allocated_peak_bytes (active == allocated at the peak,
                                    except blocks freed while another stream still uses them:
                                    torchtune's activation offloading calls record_stream)
    torchtune tables (metric not stated: torchtune logs active/alloc/reserved) -> allocated, and
                                    the error against reserved is printed beside the record

Records that cannot be compared say why (unsupported architecture, no authentic config,
features memfit does not model). Records that ran out of memory must come out as "does not fit".

    python3 tools/calibrate.py [--memfit build/native/cli/memfit] [--markdown] [--check]

Every record has a role (data/calibration/published_measurements.json): "fit" records set a
constant or a modelling choice (their role_note says which) and are listed apart; accuracy is
reported on "check" records only, per framework (runtime.framework of the mapped request), and
only where the source gives the run's settings (SETTINGS_NOT_KNOWN lists the others) and the
whole estimate is compared (not one component).

--check exits 1 if the median or the p90 |error| of those check records exceeds the gate below,
or if any OOM record is estimated to fit. Check records in OPEN_MISSES (a known run that misses for a
framework behaviour memfit does not model yet, named there) are printed and summarised apart and
not gated; the gate line says how many.
"""
import argparse
import copy
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 1024 ** 3

# Pieces of requests shared by several records.
# HF Trainer of 2022 on PyTorch 1.x: model.zero_grad() zeroed gradients instead of freeing them.
BERT = {"model": {"id": "google-bert/bert-large-uncased", "head": "classification"}, "task": "full",
        "sequence_length": 512, "attention": "eager", "gpu": {"name": "V100-16GB"},
        "runtime": {"zero_grad_to_none": False}}
TT_32_3B = {"model": {"id": "meta-llama/Llama-3.2-3B"}, "precision": "bf16", "micro_batch_size": 2,
            "sequence_length": 4096, "attention": "sdpa", "gpu": {"name": "A100-80GB"},
            "runtime": {"framework": "torchtune"}}
TT_31 = {"precision": "bf16", "micro_batch_size": 2, "sequence_length": 2048, "attention": "sdpa",
         "gradient_checkpointing": True, "runtime": {"framework": "torchtune", "compile": True}}
# torchtune v0.1 (May 2024, commit 0217d44c2): the llama2 configs' loss is torch.nn.CrossEntropyLoss
# (no chunked loss existed yet), and the recipes (full_finetune_single_device.py,
# lora_finetune_single_device.py train loop) keep `logits` (the shifted fp32 copy) referenced
# through loss.backward(): no `del logits` before backward as in later versions.
TT_L2 = {"model": {"id": "meta-llama/Llama-2-7b-hf"}, "precision": "bf16", "micro_batch_size": 4,
         "sequence_length": 2048, "attention": "sdpa",
         "runtime": {"framework": "torchtune", "framework_version": "0.1", "loss_chunks": 0,
                     "drop_outputs_before_backward": False}}
# The Llama-3.2-3B "Optimization flags" table is cumulative and adds chunked cross-entropy in its
# third row, so its first two rows ran torch.nn.CrossEntropyLoss (the config's default at that
# commit is CEWithChunkedOutputLoss; the README's command names it as an override).
UNCHUNKED = {"runtime": {"loss_chunks": 0}}
PEFT_BLOOM = {"model": {"id": "bigscience/bloom-7b1"}, "precision": "fp32", "micro_batch_size": 8,
              "sequence_length": 64, "attention": "eager", "gpu": {"name": "A100-80GB"}}


def merge(*parts):
    """Deep merge into a new dict (the pieces above are shared by several records)."""
    out = {}
    for p in parts:
        for k, v in p.items():
            out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


# LitGPT resource tables (tutorials/resource-tables.md at 0cc02afa1, runs at lit-gpt 8641822 on an A100-SXM4-40GB,
# --precision bf16-true). finetune/lora.py there: r 8, alpha 16, dropout 0.05 on query + value of the fused qkv,
# torch AdamW (bitsandbytes PagedAdamW when quantized), batch 128 by accumulation, lm_head_chunk_size=128 with
# chunked_cross_entropy; the first micro-batch holds the longest Alpaca sample and is padded to it, so the run
# reaches micro-batch x longest (1304 tokens for Llama 2, 1079 for Falcon: stated in the doc). Multi-GPU runs use
# FSDPStrategy(auto_wrap_policy={Block}, activation_checkpointing_policy={Block}).
# lit-gpt 8641822 is setup.py version 0.1.0; its lora.py accumulates batch_size 128 // micro_batch_size
# micro-batches (not divided by the devices) under fabric.no_backward_sync.
# Only its first micro-batch holds the longest sample (get_batch: ix[0] = longest_seq_ix at iter_num 0,
# random samples after): runtime.later_steps_shorter.
LITGPT_LORA = {"task": "lora", "lora": {"rank": 8, "alpha": 16, "targets": ["q_proj", "v_proj"], "dropout": 0.05},
               "precision": "bf16", "optimizer": "adamw", "attention": "sdpa", "gpu": {"name": "A100-40GB"},
               "runtime": {"framework": "litgpt", "framework_version": "0.1.0", "later_steps_shorter": True}}
# The resource tables state "Bitsandbytes 0.41.1" among their libraries (tutorials/resource-tables.md at 0cc02afa1).
LITGPT_BNB_RESOURCE_TABLES = "0.41.1"
LITGPT_SEQ = {"meta-llama/Llama-2-7b-hf": 1304, "meta-llama/Llama-2-13b-hf": 1304, "tiiuae/falcon-40b": 1079}


def litgpt_lora(model, micro_batch, quantization=None, num_gpus=1):
    """A LitGPT resource-table LoRA row as a request (see LITGPT_LORA)."""
    parts = [LITGPT_LORA, {"model": {"id": model}, "micro_batch_size": micro_batch, "sequence_length": LITGPT_SEQ[model],
                           "gradient_accumulation_steps": 128 // micro_batch}]
    if "falcon" in model:  # LoRA sits inside the fused query_key_value projection
        parts.append({"lora": {"targets": ["query_key_value"]}})
    if quantization:
        parts.append({"task": "qlora", "quantization": quantization, "optimizer": "paged_adamw",
                      "runtime": {"bitsandbytes_version": LITGPT_BNB_RESOURCE_TABLES}})
    if num_gpus > 1:
        parts.append({"num_gpus": num_gpus, "parallelism": {"method": "fsdp_full_shard"}, "gradient_checkpointing": True})
    return merge(*parts)


def litgpt_generate(model, quantization=None):
    """A LitGPT resource-table inference row: generate/base.py, batch 1, default prompt + 50 new tokens."""
    request = {"model": {"id": model}, "task": "inference", "precision": "bf16",
               "inference": {"batch_size": 1, "context_length": 56}, "gpu": {"name": "A100-40GB"},
               "runtime": {"framework": "litgpt"}}
    return merge(request, {"quantization": quantization} if quantization else {})


# PEFT docs (accelerate/fsdp.md), run_peft_qlora_fsdp.sh: Llama-2-70B QLoRA (nf4 + nested quant, bf16
# storage) r 8 / alpha 16 / dropout 0.1 all-linear, 2 x 2048 packed, reentrant checkpointing, FA2, FSDP
# full shard on 2 GPUs through TRL's SFTTrainer (trl > 0.11.4: keeps the logits, no fused head).
PEFT_FSDP_QLORA_70B = {"model": {"id": "meta-llama/Llama-2-70b-hf"}, "task": "qlora", "quantization": "nf4_double",
                       "lora": {"rank": 8, "alpha": 16, "targets": "all-linear", "dropout": 0.1}, "precision": "bf16",
                       "micro_batch_size": 2, "sequence_length": 2048, "gradient_checkpointing": True,
                       "attention": "flash_attention_2", "gpu": {"name": "A100-80GB"}, "num_gpus": 2,
                       "parallelism": {"method": "fsdp_full_shard"},
                       "runtime": {"framework": "trl", "framework_version": "1.0"}}


# LitGPT config_hub/finetune benchmark table (LitGPT 0.4.x, one A10G, bf16-true, Alpaca2k cut at 512 tokens:
# its longest sample is 763 tokens, so the batch that holds it runs micro-batch x 512). finetune_lora as above
# (lm_head chunks of 128, no checkpointing on one device, PagedAdamW when quantized); rank, targets, dropout
# and micro-batch from each row's config file. "all" there also puts LoRA on lm_head, which a request cannot
# name: "all-linear" is the nearest request (noted on those records).
# The table does not name its bitsandbytes; LitGPT's pyproject.toml pins bitsandbytes==0.42.0 (extra "all") at
# every commit that changed the table's rows, 43c44323 (0.4.0.dev0, April 2024) to 00af8b0d (0.4.13.dev1), the
# QLoRA rows' re-run e5493986 (#1611, 0.4.5) included.
LITGPT_BNB_CONFIG_HUB = "0.42.0"


def litgpt_hub(model, micro_batch, rank, targets, dropout, quantization=None, attention="sdpa"):
    request = {"model": {"id": model}, "task": "lora", "lora": {"rank": rank, "alpha": 16, "targets": targets, "dropout": dropout},
               "precision": "bf16", "optimizer": "adamw", "micro_batch_size": micro_batch, "sequence_length": 512,
               "attention": attention, "gpu": {"name": "A10G-24GB"}, "runtime": {"framework": "litgpt", "framework_version": "0.4"}}
    if quantization:
        request = merge(request, {"task": "qlora", "quantization": quantization, "optimizer": "paged_adamw",
                                  "runtime": {"bitsandbytes_version": LITGPT_BNB_CONFIG_HUB}})
    return request


# record id -> (request, metric, notes). metric: "device" | "reserved" | "allocated" | "weights+context".
MAPPING = {
    "hf-bert-large-vanilla": (merge(BERT, {"precision": "fp32", "optimizer": "adamw_loop", "micro_batch_size": 4}), "device", ""),
    "hf-bert-large-bs1-ga4": (merge(BERT, {"precision": "fp32", "optimizer": "adamw_loop", "micro_batch_size": 1,
                                           "gradient_accumulation_steps": 4}), "device", ""),
    "hf-bert-large-bs1-ga4-gc": (merge(BERT, {"precision": "fp32", "optimizer": "adamw_loop", "micro_batch_size": 1,
                                              "gradient_accumulation_steps": 4, "gradient_checkpointing": True}), "device", ""),
    "hf-bert-large-bs4-fp16": (merge(BERT, {"precision": "amp_fp16", "optimizer": "adamw_loop", "micro_batch_size": 4}), "device", ""),
    "hf-bert-large-bs1-ga4-gc-fp16": (merge(BERT, {"precision": "amp_fp16", "optimizer": "adamw_loop", "micro_batch_size": 1,
                                                   "gradient_accumulation_steps": 4, "gradient_checkpointing": True}), "device", ""),
    "hf-bert-large-bs4-adafactor": (merge(BERT, {"precision": "fp32", "optimizer": "adafactor", "micro_batch_size": 4}), "device", ""),
    "hf-bert-large-bs1-ga4-gc-fp16-adafactor": (merge(BERT, {"precision": "amp_fp16", "optimizer": "adafactor", "micro_batch_size": 1,
                                                             "gradient_accumulation_steps": 4, "gradient_checkpointing": True}), "device", ""),
    "hf-bert-large-bs4-adam8bit": (merge(BERT, {"precision": "fp32", "optimizer": "adamw_8bit", "micro_batch_size": 4}), "device", ""),
    "hf-bert-large-bs1-ga4-gc-fp16-adam8bit": (merge(BERT, {"precision": "amp_fp16", "optimizer": "adamw_8bit", "micro_batch_size": 1,
                                                            "gradient_accumulation_steps": 4, "gradient_checkpointing": True}), "device", ""),
    "hf-bert-large-model-load": (merge(BERT, {"precision": "fp32", "micro_batch_size": 1}), "weights+context",
                                 "model load only: compared with the weights + CUDA context components"),
    "peft-readme-bloomz-7b1-lora": (merge(PEFT_BLOOM, {"task": "lora", "lora": {"rank": 8, "alpha": 32, "targets": ["query_key_value"]}}),
                                    "allocated", "bloomz-7b1 = bloom-7b1 fine-tuned (same shapes; bloom-7b1 config used); tweets padded "
                                                 "to the longest in batch: sequence 64 assumed"),
    "peft-readme-bloomz-7b1-lora-ds-offload": (merge(PEFT_BLOOM, {"task": "lora", "lora": {"rank": 8, "alpha": 32, "targets": ["query_key_value"]},
                                                                   "parallelism": {"method": "zero3", "offload_optimizer": True,
                                                                                   "offload_params": True}}),
                                               "allocated", "as above; ZeRO-3 with parameter + optimizer offload on one GPU"),
    "peft-readme-bloomz-7b1-full-oom": (merge(PEFT_BLOOM, {"task": "full"}), "oom", "ran out of memory on an 80 GB A100"),
    # torchtune, Llama-3.2-3B-Instruct (same shapes as Llama-3.2-3B), packed 2 x 4096
    "torchtune-llama3.2-3b-full-packed-dataset": (merge(TT_32_3B, UNCHUNKED, {"task": "full", "optimizer": "adamw_fused"}), "allocated", ""),
    "torchtune-llama3.2-3b-full-compile": (merge(TT_32_3B, UNCHUNKED, {"task": "full", "optimizer": "adamw_fused"}), "allocated",
                                           ""),
    "torchtune-llama3.2-3b-full-chunked-cross-entropy": (merge(TT_32_3B, {"task": "full", "optimizer": "adamw_fused",
                                                                          "runtime": {"loss_chunks": 8}}), "allocated",
                                                         ""),
    "torchtune-llama3.2-3b-full-activation-checkpointing": (merge(TT_32_3B, {"task": "full", "optimizer": "adamw_fused", "gradient_checkpointing": True,
                                                                             "runtime": {"loss_chunks": 8}}), "allocated",
                                                            ""),
    "torchtune-llama3.2-3b-full-fuse-optimizer-step-into-backward": (
        merge(TT_32_3B, {"task": "full", "optimizer": "adamw_fused", "gradient_checkpointing": True,
                         "runtime": {"loss_chunks": 8, "optimizer_in_backward": True}}), "allocated", ""),
    "torchtune-llama3.2-3b-full-activation-offloading": (
        merge(TT_32_3B, {"task": "full", "optimizer": "adamw_fused", "gradient_checkpointing": True,
                         "runtime": {"loss_chunks": 8, "optimizer_in_backward": True, "activation_offloading": True}}), "allocated",
        ""),
    "torchtune-llama3.2-3b-full-8-bit-adamw": (
        merge(TT_32_3B, {"task": "full", "optimizer": "paged_adamw_8bit", "gradient_checkpointing": True,
                         "runtime": {"loss_chunks": 8, "optimizer_in_backward": True, "activation_offloading": True}}), "allocated",
        ""),
    "torchtune-llama3.2-3b-lora-optflags": (
        merge(TT_32_3B, {"task": "lora", "lora": {"rank": 64, "alpha": 128, "targets": ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                                                  "adapter_dtype": "bf16"}, "optimizer": "adamw_fused", "gradient_checkpointing": True,
                         "runtime": {"loss_chunks": 8, "activation_offloading": True}}), "allocated", ""),
    "torchtune-llama3.2-3b-qlora-optflags": (
        merge(TT_32_3B, {"task": "qlora", "quantization": "nf4_double", "lora": {"rank": 64, "alpha": 128,
                         "targets": ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], "adapter_dtype": "bf16"},
                         "optimizer": "adamw_fused", "gradient_checkpointing": True,
                         "runtime": {"loss_chunks": 8, "activation_offloading": True}}), "allocated", ""),
    "torchtune-llama3.1-8b-full-4090": (
        merge(TT_31, {"model": {"id": "meta-llama/Llama-3.1-8B"}, "task": "full", "optimizer": "paged_adamw_8bit",
                      "gpu": {"name": "RTX4090-24GB"}, "runtime": {"loss_chunks": 8, "optimizer_in_backward": True}}), "allocated",
        ""),
    "torchtune-llama3.1-8b-lora-4090": (
        merge(TT_31, {"model": {"id": "meta-llama/Llama-3.1-8B"}, "task": "lora", "lora": {"rank": 8, "alpha": 16, "targets": ["q_proj", "v_proj"],
                                                                                              "adapter_dtype": "bf16"},
                      "optimizer": "adamw_fused", "gpu": {"name": "RTX4090-24GB"}, "runtime": {"loss_chunks": 8}}), "allocated",
        ""),
    "torchtune-llama3.1-8b-qlora-4090": (
        merge(TT_31, {"model": {"id": "meta-llama/Llama-3.1-8B"}, "task": "qlora", "quantization": "nf4_double",
                      "lora": {"rank": 8, "alpha": 16, "targets": "all-linear", "adapter_dtype": "bf16"},
                      "optimizer": "adamw_fused", "gpu": {"name": "RTX4090-24GB"}, "runtime": {"loss_chunks": 8}}), "allocated",
        ""),
    "torchtune-llama3.1-70b-lora-8xa100": (
        merge(TT_31, {"model": {"id": "meta-llama/Llama-3.1-70B"}, "task": "lora", "lora": {"rank": 16, "alpha": 32,
                      "targets": ["q_proj", "k_proj", "v_proj"], "adapter_dtype": "bf16"}, "optimizer": "adamw_fused",
                      "gpu": {"name": "A100-80GB"}, "num_gpus": 8, "parallelism": {"method": "fsdp_full_shard"},
                      "runtime": {"loss_chunks": 8}}), "allocated", ""),
    "torchtune-llama3.1-70b-full-8xa100-offload": (
        merge(TT_31, {"model": {"id": "meta-llama/Llama-3.1-70B"}, "task": "full", "optimizer": "adamw_fused",
                      "gpu": {"name": "A100-80GB"}, "num_gpus": 8,
                      # llama3_1/70B_full.yaml at 30b8519e8: custom_sharded_layers ['tok_embeddings', 'output']
                      "parallelism": {"method": "fsdp_full_shard", "offload_optimizer": True, "offload_params": True,
                                      "separate_embedding_units": True},
                      "runtime": {"loss_chunks": 8}}), "allocated", ""),
    "torchtune-llama3.1-405b-qlora-8xa100": (
        merge(TT_31, {"model": {"id": "meta-llama/Llama-3.1-405B"}, "task": "qlora", "quantization": "nf4_double",
                      "lora": {"rank": 16, "alpha": 32, "targets": "all-linear", "adapter_dtype": "bf16"}, "optimizer": "adamw_fused",
                      "gpu": {"name": "A100-80GB"}, "num_gpus": 8, "parallelism": {"method": "fsdp_full_shard"},
                      # llama3_1/405B_qlora.yaml at 30b8519e8: loss torch.nn.CrossEntropyLoss (not chunked)
                      "runtime": {"loss_chunks": 0}}), "allocated", ""),
    "torchtune-llama2-7b-qlora-4090": (
        merge(TT_L2, {"task": "qlora", "quantization": "nf4_double", "lora": {"rank": 8, "alpha": 16, "targets": "all-linear",
                      "adapter_dtype": "bf16"}, "gradient_checkpointing": True, "gpu": {"name": "RTX4090-24GB"}}), "allocated",
        ""),
    "torchtune-llama2-7b-lora-4090": (
        merge(TT_L2, {"task": "lora", "lora": {"rank": 8, "alpha": 16, "targets": ["q_proj", "v_proj"], "adapter_dtype": "bf16"},
                      "gradient_checkpointing": True, "gpu": {"name": "RTX4090-24GB"}}), "allocated", ""),
    "torchtune-llama2-7b-lora-2x4090": (
        merge(TT_L2, {"task": "lora", "lora": {"rank": 8, "alpha": 16, "targets": ["q_proj", "v_proj"], "adapter_dtype": "bf16"},
                      "gpu": {"name": "RTX4090-24GB"}, "num_gpus": 2, "parallelism": {"method": "fsdp_full_shard"}}), "allocated", ""),
    "torchtune-llama2-7b-full-4090-pagedadamw": (
        merge(TT_L2, {"task": "full", "optimizer": "paged_adamw", "gradient_checkpointing": True, "gpu": {"name": "RTX4090-24GB"},
                      "runtime": {"optimizer_in_backward": True}}), "allocated", ""),
    "torchtune-llama2-7b-full-4x4090": (
        merge(TT_L2, {"task": "full", "optimizer": "adamw", "gradient_checkpointing": True, "gpu": {"name": "RTX4090-24GB"},
                      "num_gpus": 4, "parallelism": {"method": "fsdp_full_shard"}}), "allocated", ""),
    "torchtune-llama2-70b-lora-8xa100": (
        merge(TT_L2, {"model": {"id": "meta-llama/Llama-2-70b-hf"}, "task": "lora", "sequence_length": 4096,
                      "lora": {"rank": 16, "alpha": 32, "targets": ["q_proj", "k_proj", "v_proj"], "adapter_dtype": "bf16"},
                      "gradient_checkpointing": True, "gpu": {"name": "A100-80GB"}, "num_gpus": 8,
                      "parallelism": {"method": "fsdp_full_shard"}}), "allocated", ""),
    "torchtune-pr961-llama2-7b-full-lowmem-a100": (
        merge(TT_L2, {"task": "full", "optimizer": "paged_adamw", "gradient_checkpointing": True, "gpu": {"name": "A100-80GB"},
                      "runtime": {"optimizer_in_backward": True}}), "allocated", ""),
    "torchtune-generate-llama3-8b-bf16": (
        {"model": {"id": "meta-llama/Meta-Llama-3-8B"}, "task": "inference", "precision": "bf16",
         "inference": {"batch_size": 1, "context_length": 8192}, "gpu": {"name": "A100-80GB"},
         "runtime": {"framework": "torchtune"}}, "allocated",
        "torchtune pre-allocates the KV cache for max_seq_len 8192"),
    "torchtune-e2e-llama3.2-3b-instruct-lora-model-init": (
        merge(TT_32_3B, {"task": "lora", "lora": {"rank": 64, "alpha": 128, "targets": ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                                                   "adapter_dtype": "bf16"}}), "weights", "model init only: compared with the weights component"),
    "litgpt-llama2-7b-lora-mb1": (litgpt_lora("meta-llama/Llama-2-7b-hf", 1), "allocated", ""),
    "litgpt-llama2-7b-qlora-nf4-mb1": (litgpt_lora("meta-llama/Llama-2-7b-hf", 1, quantization="nf4"), "allocated", ""),
    "litgpt-llama2-7b-qlora-nf4dq-mb1": (litgpt_lora("meta-llama/Llama-2-7b-hf", 1, quantization="nf4_double"), "allocated", ""),
    "litgpt-llama2-7b-lora-mb2": (litgpt_lora("meta-llama/Llama-2-7b-hf", 2), "allocated", ""),
    "litgpt-llama2-7b-lora-mb4-oom": (litgpt_lora("meta-llama/Llama-2-7b-hf", 4), "oom", ""),
    "litgpt-llama2-13b-lora-mb1": (litgpt_lora("meta-llama/Llama-2-13b-hf", 1), "allocated", ""),
    "litgpt-llama2-13b-qlora-nf4-mb1": (litgpt_lora("meta-llama/Llama-2-13b-hf", 1, quantization="nf4"), "allocated", ""),
    "litgpt-llama2-13b-qlora-nf4dq-mb1": (litgpt_lora("meta-llama/Llama-2-13b-hf", 1, quantization="nf4_double"), "allocated", ""),
    "litgpt-llama2-13b-lora-mb2-oom": (litgpt_lora("meta-llama/Llama-2-13b-hf", 2), "oom", ""),
    "litgpt-llama2-13b-lora-mb4-oom": (litgpt_lora("meta-llama/Llama-2-13b-hf", 4), "oom", ""),
    "litgpt-falcon-40b-lora-mb1-oom": (litgpt_lora("tiiuae/falcon-40b", 1), "oom", ""),
    "litgpt-falcon-40b-qlora-nf4-mb1-oom": (litgpt_lora("tiiuae/falcon-40b", 1, quantization="nf4"), "oom", ""),
    "litgpt-falcon-40b-qlora-nf4dq-mb1-oom": (litgpt_lora("tiiuae/falcon-40b", 1, quantization="nf4_double"), "oom", ""),
    "litgpt-llama2-7b-lora-mb1-fsdp2": (litgpt_lora("meta-llama/Llama-2-7b-hf", 1, num_gpus=2), "allocated", ""),
    "litgpt-llama2-7b-lora-mb2-fsdp2": (litgpt_lora("meta-llama/Llama-2-7b-hf", 2, num_gpus=2), "allocated", ""),
    "litgpt-llama2-7b-lora-mb4-fsdp2": (litgpt_lora("meta-llama/Llama-2-7b-hf", 4, num_gpus=2), "allocated", ""),
    "litgpt-llama2-13b-lora-mb1-fsdp2-oom": (litgpt_lora("meta-llama/Llama-2-13b-hf", 1, num_gpus=2), "oom", ""),
    "litgpt-llama2-13b-lora-mb1-fsdp4": (litgpt_lora("meta-llama/Llama-2-13b-hf", 1, num_gpus=4), "allocated", ""),
    "litgpt-falcon-40b-lora-mb1-fsdp4-oom": (litgpt_lora("tiiuae/falcon-40b", 1, num_gpus=4), "oom", ""),
    "litgpt-generate-llama2-7b-bf16": (litgpt_generate("meta-llama/Llama-2-7b-hf"), "allocated", ""),
    "litgpt-generate-llama2-7b-nf4": (litgpt_generate("meta-llama/Llama-2-7b-hf", "nf4"), "allocated", ""),
    "litgpt-generate-llama2-7b-nf4dq": (litgpt_generate("meta-llama/Llama-2-7b-hf", "nf4_double"), "allocated", ""),
    "litgpt-generate-llama2-13b-bf16": (litgpt_generate("meta-llama/Llama-2-13b-hf"), "allocated", ""),
    "litgpt-generate-llama2-13b-nf4": (litgpt_generate("meta-llama/Llama-2-13b-hf", "nf4"), "allocated", ""),
    "litgpt-generate-llama2-13b-nf4dq": (litgpt_generate("meta-llama/Llama-2-13b-hf", "nf4_double"), "allocated", ""),
    "litgpt-generate-falcon-40b-bf16-oom": (litgpt_generate("tiiuae/falcon-40b"), "oom", ""),
    "litgpt-generate-falcon-40b-nf4": (litgpt_generate("tiiuae/falcon-40b", "nf4"), "allocated", ""),
    "litgpt-generate-falcon-40b-nf4dq": (litgpt_generate("tiiuae/falcon-40b", "nf4_double"), "allocated", ""),
    "litgpt-generate-llama2-70b-bf16-oom": (litgpt_generate("meta-llama/Llama-2-70b-hf"), "oom", ""),
    "litgpt-generate-llama2-70b-nf4dq": (litgpt_generate("meta-llama/Llama-2-70b-hf", "nf4_double"), "allocated", ""),
    "litgpt-hub-falcon-7b-lora": (litgpt_hub("tiiuae/falcon-7b", 1, 32, ["query_key_value"], 0.05), "allocated", ""),
    "litgpt-hub-falcon-7b-qlora": (litgpt_hub("tiiuae/falcon-7b", 1, 32, ["query_key_value"], 0.05, "nf4"), "allocated", ""),
    "litgpt-hub-gemma-2b-lora": (litgpt_hub("google/gemma-2b", 2, 8, "all-linear", 0.1), "allocated", ""),
    "litgpt-hub-gemma-2b-qlora": (litgpt_hub("google/gemma-2b", 2, 16, "all-linear", 0.1, "nf4"), "allocated", ""),
    "litgpt-hub-gemma2-2b-lora": (litgpt_hub("google/gemma-2-2b", 2, 8, "all-linear", 0.1, attention="eager"), "allocated", ""),
    "litgpt-hub-gemma2-9b-lora-oom": (litgpt_hub("google/gemma-2-9b", 1, 16, "all-linear", 0.1, attention="eager"), "oom", ""),
    "litgpt-hub-gemma2-9b-qlora": (litgpt_hub("google/gemma-2-9b", 1, 16, "all-linear", 0.1, "nf4", attention="eager"), "allocated", ""),
    "litgpt-hub-llama-2-7b-lora": (litgpt_hub("meta-llama/Llama-2-7b-hf", 2, 32, ["q_proj", "v_proj"], 0.05), "allocated", ""),
    "litgpt-hub-llama-2-7b-qlora": (litgpt_hub("meta-llama/Llama-2-7b-hf", 2, 32, ["q_proj", "v_proj"], 0.05, "nf4"), "allocated", ""),
    "litgpt-hub-llama-3-8b-lora": (litgpt_hub("meta-llama/Meta-Llama-3-8B", 1, 32, ["q_proj", "v_proj"], 0.05), "allocated", ""),
    "litgpt-hub-llama-3-8b-qlora": (litgpt_hub("meta-llama/Meta-Llama-3-8B", 2, 32, ["q_proj", "v_proj"], 0.05, "nf4"), "allocated", ""),
    "litgpt-hub-llama-3.1-8b-lora": (litgpt_hub("meta-llama/Llama-3.1-8B", 1, 32, ["q_proj", "v_proj"], 0.05), "allocated", ""),
    "litgpt-hub-llama-3.1-8b-qlora": (litgpt_hub("meta-llama/Llama-3.1-8B", 2, 32, ["q_proj", "v_proj"], 0.05, "nf4"), "allocated", ""),
    "litgpt-hub-mistral-7b-lora": (litgpt_hub("mistralai/Mistral-7B-v0.1", 2, 32, ["q_proj", "v_proj"], 0.05), "allocated", ""),
    "litgpt-hub-mistral-7b-qlora": (litgpt_hub("mistralai/Mistral-7B-v0.1", 2, 32, ["q_proj", "v_proj"], 0.05, "nf4"), "allocated", ""),
    "litgpt-hub-phi-2-lora": (litgpt_hub("microsoft/phi-2", 4, 8, "all-linear", 0.05), "allocated", ""),
    "litgpt-hub-phi-2-qlora": (litgpt_hub("microsoft/phi-2", 4, 8, "all-linear", 0.05, "nf4"), "allocated", ""),
    "litgpt-hub-phi-3-lora": (litgpt_hub("microsoft/Phi-3-mini-4k-instruct", 4, 8, "all-linear", 0.05), "allocated", ""),
    "litgpt-hub-phi-3-qlora": (litgpt_hub("microsoft/Phi-3-mini-4k-instruct", 4, 8, "all-linear", 0.05, "nf4"), "allocated", ""),
    "litgpt-hub-tiny-llama-lora": (litgpt_hub("TinyLlama/TinyLlama-1.1B-Chat-v1.0", 8, 32, "all-linear", 0.05), "allocated", ""),
    "litgpt-hub-tiny-llama-qlora": (litgpt_hub("TinyLlama/TinyLlama-1.1B-Chat-v1.0", 8, 32, "all-linear", 0.05, "nf4"), "allocated", ""),
    "peft-docs-fsdp-qlora-llama2-70b-offload": (merge(PEFT_FSDP_QLORA_70B, {"parallelism": {"offload_params": True}}), "allocated", ""),
    "peft-docs-fsdp-qlora-llama2-70b-no-offload": (PEFT_FSDP_QLORA_70B, "allocated", ""),
    "vllm-llama3-8b-tp1-weights": (None, None, "vLLM engine profile (weights + profiler's activation peak + KV blocks): not a training "
                                                "or Transformers inference run"),
    "vllm-llama3-8b-tp2-weights": (None, None, "as above"),
}

# torch.compile'd runs: the records' "other features" say so; estimated with runtime.compile.
COMPILED = {
    "torchtune-llama3.2-3b-full-compile", "torchtune-llama3.2-3b-full-chunked-cross-entropy",
    "torchtune-llama3.2-3b-full-activation-checkpointing", "torchtune-llama3.2-3b-full-fuse-optimizer-step-into-backward",
    "torchtune-llama3.2-3b-full-activation-offloading", "torchtune-llama3.2-3b-full-8-bit-adamw",
    "torchtune-llama3.2-3b-lora-optflags", "torchtune-llama3.2-3b-qlora-optflags", "torchtune-llama3.1-8b-full-4090",
    "torchtune-llama3.1-8b-lora-4090", "torchtune-llama3.1-8b-qlora-4090", "torchtune-llama3.1-70b-lora-8xa100",
    "torchtune-llama3.1-70b-full-8xa100-offload", "torchtune-llama3.1-405b-qlora-8xa100", "torchtune-llama2-7b-qlora-4090",
}
for _rid in COMPILED:
    MAPPING[_rid][0].setdefault("runtime", {})["compile"] = True

# Records whose settings the source does not fully give: estimated, but reported apart from the
# records whose run is known (an error there may be the request's, not the estimate's).
_TT_README = ("the README table gives the configured maximum sequence; torchtune PR #961 reproduced it only "
              "with inputs forced to that length")
_PEFT_FSDP_DOC = ("the page does not say which figure its \"memory consumed per GPU\" is; library versions are minimums only "
                  "(TRL's loss path changed across them); optimizer not stated")
SETTINGS_NOT_KNOWN = {
    "peft-readme-bloomz-7b1-lora": "sequence 64 assumed (tweets padded to the longest in the batch)",
    "peft-readme-bloomz-7b1-lora-ds-offload": "sequence 64 assumed (tweets padded to the longest in the batch)",
    "torchtune-llama3.1-405b-qlora-8xa100": "the record's unit and batch are uncertain",
    "torchtune-llama2-7b-lora-4090": _TT_README,
    "torchtune-llama2-7b-lora-2x4090": _TT_README,
    "torchtune-llama2-7b-full-4090-pagedadamw": _TT_README,
    "torchtune-llama2-7b-full-4x4090": _TT_README,
    "torchtune-llama2-70b-lora-8xa100": _TT_README,
    # Same May 2024 README table as the five above. The llama2/7B_qlora_single_device config at
    # that commit (0217d44c2) has batch_size 2, gradient_accumulation_steps 16, compile False and
    # an unpacked alpaca_cleaned dataset; the row states batch 4 and "Seq Length = 2048" but not
    # how the length was reached nor the accumulation.
    "torchtune-llama2-7b-qlora-4090": _TT_README + "; gradient accumulation not stated (config default 16)",
    # The README's optimization table names the optimizer only as "AdamW8bit"; the
    # llama3_2/3B_full_single_device config at that commit (1814feb17) defaults to
    # bitsandbytes.optim.PagedAdamW8bit, whose large states come from F.get_paged
    # (cudaMallocManaged, outside torch's allocator: bitsandbytes optim/optimizer.py
    # get_state_buffer), so they cannot appear in "Peak Memory Active"; torchao's AdamW8bit and
    # bitsandbytes' AdamW8bit keep them as ordinary CUDA tensors, which can. The two readings
    # differ by the whole 6 GiB of states, so the record cannot check the estimate until the
    # class is known (both readings are printed; see ALTERNATIVE_READINGS).
    "peft-docs-fsdp-qlora-llama2-70b-offload": _PEFT_FSDP_DOC,
    "peft-docs-fsdp-qlora-llama2-70b-no-offload": _PEFT_FSDP_DOC + "; GPU not stated",
    "torchtune-llama3.2-3b-full-8-bit-adamw": "optimizer class not stated: \"AdamW8bit\" in the README prose, "
                                              "bitsandbytes PagedAdamW8bit in the config",
}
# Another reading of a record whose settings are not fully given: (label, request patch). The
# estimate under it is printed beside the record; neither reading enters the figures.
ALTERNATIVE_READINGS = {
    "torchtune-llama3.2-3b-full-8-bit-adamw": ("as non-paged AdamW8bit", {"optimizer": "adamw_8bit"}),
}
# Check records whose run is known but whose miss comes from a framework behaviour memfit does not
# model yet. They are printed with their errors and summarised on their own line, and left out of
# the gate until the behaviour is modelled: then delete the entry, and the record joins the figures.
# An OOM record here that is estimated to fit is printed as such but does not fail --check.
# LitGPT QLoRA (Lightning BitsandbytesPrecision), modelled from the sources, nothing fitted: bitsandbytes
# MatMul4Bit before 0.43.2 keeps its input A as a plain ctx attribute (9e753741, #1270; these runs used 0.41.1 /
# 0.42.0: runtime.bitsandbytes_version); fit() keeps `logits` and `loss`, hence the graph and those ctx
# tensors, through the optimizer step into the next step's forward and loss (the 2024 config-hub runs cut
# batches at 512 tokens with dozens of longer samples, so steps of that length follow each other; the 2023
# resource-table runs force the longest sample into the first micro-batch only: runtime.later_steps_shorter);
# lm_head is quantized too and every dequantization makes an fp16 copy and its cast to the compute dtype
# (Lightning _Linear4bit.quantize casts to fp16); LitGPT's GPT has its own lm_head where the checkpoint
# ties it. No LitGPT record is an open miss any more.
OPEN_MISSES = {
}
# torchtune logs three figures (training/memory.py get_memory_stats: active_bytes.all.peak,
# max_memory_allocated, max_memory_reserved). Records whose table does not say which one it
# shows are compared with allocated (the figure the estimate models most directly); the error
# against reserved is printed beside them.
METRIC_NOT_STATED = ("not stated", "does not say")
# Metrics that compare one component rather than the whole estimate.
COMPONENT_METRICS = {"weights", "weights+context"}
# The gate on check records with known settings (--check), at the targets of issue 8: median
# <= 5 % and p90 <= 15 %. Today, over 14 check records (all torchtune): median 4.2 %, p90 11.4 %,
# max 11.9 % (the PR 961 low-memory Llama-2-7B run, -11.9 %; the same config measured 20.2 GB
# allocated by another maintainer would be -2.8 %). Two records left this pool in calib8 because
# their source does not give a setting that moves the peak by more than the error (see
# SETTINGS_NOT_KNOWN); over the same 16 records as before: median 4.7 %, p90 19.1 % (was 5.9 %,
# 36.0 %). With the LitGPT resource-table and config-hub records (calib-records): 36 check records,
# median 4.6 %, p90 11.4 %, max 28.4 % (phi-2 LoRA) (torchtune 14: 4.2 % / 11.4 %; litgpt 22: 5.2 % /
# 10.2 %); 18 LitGPT records and 4 of its OOM runs are OPEN_MISSES (median 29.0 %, and those 4 OOM
# runs are estimated to fit). bnb-ctx models bitsandbytes < 0.43.2 (the LitGPT QLoRA runs: 0.41.1, 0.42.0): the
# two Falcon-40B QLoRA OOM runs are then estimated not to fit and join the gate; the 14 other QLoRA records
# improve (open-miss median 29.0 % -> 20.6 %) but stay OPEN_MISSES (-10..-27 %). litfsdp models LitGPT's FSDP1
# whole-Block gradients kept unsharded under no_sync (parallelism.frozen_in_trained_units /
# unsharded_grad_accumulation) and its models' missing dropout and fused GELU: the six FSDP records join the
# gate (within -1.7..+4.3 %, the two OOM runs estimated not to fit) and phi-2 LoRA goes +30.6 -> -0.6 %:
# 40 check records median 2.4 %, p90 9.0 %, max 11.9 % (litgpt 26: 1.5 % / 9.0 %); 14 QLoRA OPEN_MISSES left.
# Then LitGPT's quantized and untied lm_head and Lightning's fp16 dequantization copies: the four 2023
# resource-table QLoRA records join the gate (-3.6..-4.0 % -> -1.5..-1.9 %), Gemma / Falcon LoRA -9.0/-8.9/-5.3 %
# -> -0.7/-0.7/-1.7 %: 44 check records median 1.7 %, p90 7.8 % (litgpt 30); 10 config-hub QLoRA OPEN_MISSES.
# The same two Lightning facts in LitGPT's 4-bit generate (prefill dequantization of the layers and of the
# 4-bit lm_head, fp16 + bf16): its seven quantized generate records -5.6..-10.2 % -> -0.4..-0.7 %;
# 44 check records median 0.7 %, p90 5.9 %, max 11.9 % (litgpt 30: 0.6 % / 1.8 % / 4.3 %). Then the kept graph's
# ctx-held inputs in the next step (above): the ten config-hub QLoRA records -8.6..-16.7 % (Gemma +1.6, -3.7 %)
# -> -4.8..+1.6 % (Gemma-2B +8.7 %) join the gate: 54 check records median 1.3 %, p90 5.9 % (litgpt 40: 0.7 % / 2.4 %, max 8.7 %); no open miss left.
GATE_MEDIAN_PCT = 5.0
GATE_P90_PCT = 15.0

SKIP_REASONS = {
    "octocoder": "no authentic config.json of bigcode/octocoder (StarCoder) in the library",
    "peft-readme-t0_3b": "T5 encoder-decoder: not modelled (decoder-only and encoder-only models only)",
    "peft-readme-mt0-xxl": "mT5 encoder-decoder: not modelled (decoder-only and encoder-only models only)",
    "galore": "GaLore optimizer (projected low-rank states) not modelled",
    "torchtune-tutorial": "alpaca, unpacked, no max_seq_len: the peak is set by the longest batch, whose length the source does not give",
}


def metric_value(record):
    """Measured bytes from the record's value and unit."""
    v, unit = record["value"], record["unit"]
    if v is None:
        return None
    if unit.startswith("MiB"):
        return v * 2 ** 20
    if unit.startswith("GiB"):
        return v * GIB
    if unit.startswith("GB (1e9"):
        return v * 1e9
    if unit.startswith("GB"):  # ambiguous GB: the record's value_gib holds its reading
        return record["value_gib"] * GIB
    raise ValueError(unit)


def estimate(memfit, request):
    p = subprocess.run([memfit, "estimate", "-", "--json"], input=json.dumps(request), capture_output=True, text=True)
    if p.returncode != 0:
        return None, p.stderr.strip().removeprefix("memfit: ")
    return json.loads(p.stdout), None


def pick(est, metric):
    g = est["per_gpu"]
    parts = {c["name"]: c["bytes"] for c in g["breakdown"]}
    if metric == "device":
        return g["device_total_bytes"]
    if metric == "reserved":
        return g["reserved_peak_bytes"]
    if metric == "allocated":
        return g["allocated_peak_bytes"]
    if metric == "weights":
        return parts.get("weights", 0)
    if metric == "weights+context":
        return parts.get("weights", 0) + parts.get("cuda_context", 0)
    raise ValueError(metric)


def framework_of(request):
    fw = (request.get("runtime") or {}).get("framework", "transformers")
    return "transformers" if fw == "hf" else fw


def p90(values):
    """Nearest-rank 90th percentile."""
    v = sorted(values)
    return v[max(0, -(-9 * len(v) // 10) - 1)] if v else float("nan")


def summary(label, errs):
    if not errs:
        return f"  {label:44s} n=0"
    return (f"  {label:44s} n={len(errs):2d}  median |error| {statistics.median(errs):5.1f}%  "
            f"p90 {p90(errs):5.1f}%  max {max(errs):5.1f}%")


def classify(rec, rid, metric):
    """fit | check | check-settings-not-known | check-component, from explicit fields."""
    if rec.get("role") == "fit":
        return "fit"
    if rec.get("role") != "check":
        raise ValueError(f"record {rid}: role must be 'fit' or 'check'")
    if rid in SETTINGS_NOT_KNOWN:
        return "check-settings-not-known"
    if rid in OPEN_MISSES:
        return "check-open-miss"
    if metric in COMPONENT_METRICS:
        return "check-component"
    return "check"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--memfit", default=os.path.join(ROOT, "build/native/cli/memfit"))
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    records = json.load(open(os.path.join(ROOT, "data/calibration/published_measurements.json")))
    rows, oom_violations, open_oom = [], [], []
    errs = {}   # (class, framework) -> [|error| %]
    for rec in records:
        rid = rec["id"]
        skip = next((why for prefix, why in SKIP_REASONS.items() if rid.startswith(prefix)), None)
        role = rec.get("role", "?")
        if rid not in MAPPING:
            rows.append((rid, role, "-", "-", "-", "-", skip or "not mapped"))
            continue
        request, metric, note = MAPPING[rid]
        if request is None:
            rows.append((rid, role, "-", "-", "-", "-", note))
            continue
        notes = [n for n in (note, SETTINGS_NOT_KNOWN.get(rid), "open miss" if rid in OPEN_MISSES else "",
                             "compiled" if rid in COMPILED else "",
                             rec.get("role_note") if role == "fit" else "") if n]
        est, err = estimate(args.memfit, request)
        if err:
            rows.append((rid, role, metric, "-", "-", "-", "error: " + err))
            continue
        if metric == "oom":
            verdict = "does not fit" if not est["fits"] else "FITS (wrong)"
            if est["fits"]:
                (open_oom if rid in OPEN_MISSES else oom_violations).append(rid)
            rows.append((rid, role, "oom", f'{est["per_gpu"]["device_total_bytes"] / GIB:.1f}', "OOM", "-",
                         "; ".join([verdict] + notes)))
            continue
        e = pick(est, metric)
        m = metric_value(rec)
        if est["per_gpu"].get("reserved_method", "").startswith("simulated"):
            notes.append("reserved: simulated allocator over the tensor schedule")
        pct = (e - m) / m * 100
        if metric == "allocated" and any(w in rec.get("metric", "") for w in METRIC_NOT_STATED):
            notes.append(f'figure not stated; vs reserved {(est["per_gpu"]["reserved_peak_bytes"] - m) / m * 100:+.1f}%')
        if rid in ALTERNATIVE_READINGS:
            label, patch = ALTERNATIVE_READINGS[rid]
            alt, alt_err = estimate(args.memfit, merge(request, patch))
            if not alt_err:
                a = pick(alt, metric)
                notes.append(f"{label}: {a / GIB:.2f} GiB ({(a - m) / m * 100:+.1f}%)")
        errs.setdefault((classify(rec, rid, metric), framework_of(request)), []).append(abs(pct))
        rows.append((rid, role, metric, f"{e / GIB:.2f}", f"{m / GIB:.2f}", f"{pct:+.1f}%", "; ".join(notes)))
    if args.markdown:
        print("| record | role | metric | estimate GiB | measured GiB | error | note |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            print("| " + " | ".join(r) + " |")
    else:
        for r in rows:
            print(f"{r[0]:58s} {r[1]:5s} {r[2]:16s} {r[3]:>8s} {r[4]:>8s} {r[5]:>8s}  {r[6]}")

    def pool(cls, fw=None):
        return [x for (c, f), v in errs.items() if c == cls and (fw is None or f == fw) for x in v]

    check = pool("check")
    print("\ncheck records (role check, settings known, whole estimate): the accuracy figures")
    print(summary("all frameworks", check))
    for fw in sorted({f for (c, f) in errs if c == "check"}):
        print(summary(fw, pool("check", fw)))
    print("check records whose settings the source does not fully give (not in the figures above)")
    for fw in sorted({f for (c, f) in errs if c == "check-settings-not-known"}):
        print(summary(fw, pool("check-settings-not-known", fw)))
    print(summary("all check records whole-estimate, known or not", check + pool("check-settings-not-known")))
    print("check records that miss for a framework behaviour memfit does not model yet (OPEN_MISSES; not gated)")
    for fw in sorted({f for (c, f) in errs if c == "check-open-miss"}):
        print(summary(fw, pool("check-open-miss", fw)))
    print(summary("all check records whole-estimate incl. open misses", check + pool("check-settings-not-known")
                  + pool("check-open-miss")))
    print(summary("check records compared on one component only", pool("check-component")))
    print("fit records (set a constant or a modelling choice: not evidence of accuracy)")
    print(summary("all", pool("fit")))
    print(f"OOM records estimated to fit: {len(oom_violations)} {oom_violations}")
    print(f"OOM records estimated to fit among the open misses (not gated): {len(open_oom)} {open_oom}")
    if args.check:
        med = statistics.median(check) if check else float("inf")
        bad = med > GATE_MEDIAN_PCT or p90(check) > GATE_P90_PCT or oom_violations
        print(f"gate (check records): median <= {GATE_MEDIAN_PCT}% and p90 <= {GATE_P90_PCT}%, no OOM record "
              f"estimated to fit: {'FAIL' if bad else 'ok'} ({len(OPEN_MISSES)} open-miss records not gated)")
        if bad:
            sys.exit(1)


if __name__ == "__main__":
    main()
