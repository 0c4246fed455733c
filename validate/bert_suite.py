#!/usr/bin/env python3
"""CPU cases for BERT fine-tuning (the encoder path of memfit's estimator): BertForMaskedLM with
MLM labels and BertForSequenceClassification with class labels, in train mode (dropout 0.1 as the
config says), fed what HF Trainer feeds them (validate/workload.py training_batch).

Two sets, kept apart as data/validation/README.md asks:
- tuning (data/validation/cpu_suite_bert.json, record data/measurements/cpu-suite-bert.jsonl): the
  tiny config (data/validation/tiny_configs/bert-tiny.json) at one shape; the estimator may be
  fitted on these;
- check (data/validation/cpu_check_bert.json, record data/measurements/cpu-check-bert.jsonl): other
  shapes (make_tiny_configs.variant), measured after the tuning fixes and never tuned on.

    python validate/bert_suite.py      # writes both case files
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_tiny_configs as tiny  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TUNING_OUT = os.path.join(ROOT, "data", "validation", "cpu_suite_bert.json")
CHECK_OUT = os.path.join(ROOT, "data", "validation", "cpu_check_bert.json")
HEAD_TAG = {"lm": "mlm", "classification": "cls"}


def case(head, task, precision, gc, attention, b, s, shape=None, optimizer="adamw", lora=None):
    """shape: None for the tiny config, else (k, layers, vocab) for make_tiny_configs.variant."""
    if shape is None:
        config, source = tiny.build("bert")[0], "data/validation/tiny_configs/bert-tiny.json"
    else:
        config = tiny.variant("bert", *shape)
        source = "validate/make_tiny_configs.py variant(bert, k={}, layers={}, vocab={})".format(*shape)
    hidden, layers, vocab = tiny.shape_of(config)
    lora_tag = "" if lora is None else f"-r{lora['rank']}-" + ("all" if lora["targets"] == "all-linear" else "qv")
    name = (f"bert/h{hidden}-L{layers}-V{vocab}/{HEAD_TAG[head]}/{task}{lora_tag}/{precision}/"
            f"{'gc' if gc else 'nogc'}/{attention}/b{b}s{s}/{optimizer}")
    c = {"name": name, "model": {"config": config, "source": source, "head": head}, "task": task,
         "precision": precision, "optimizer": optimizer, "micro_batch_size": b, "sequence_length": s,
         "gradient_accumulation_steps": 1, "gradient_checkpointing": gc, "attention": attention,
         "parallelism": {"method": "single", "dp": 1, "tp": 1}}
    if lora is not None:
        c["lora"] = dict(lora, dropout=0.0)
    return c


QV = {"rank": 8, "alpha": 16, "targets": ["query", "value"]}
ALL = {"rank": 16, "alpha": 32, "targets": "all-linear"}


def tuning_cases():
    """Full fine-tune fp32 AdamW with and without checkpointing, eager and SDPA, autocast bf16 and
    pure bf16, a LoRA case, sequence classification."""
    return [
        case("lm", "full", "fp32", False, "eager", 2, 128),
        case("lm", "full", "fp32", False, "sdpa", 2, 128),
        case("lm", "full", "fp32", True, "eager", 2, 128),
        case("lm", "full", "fp32", True, "sdpa", 2, 128),
        case("lm", "full", "amp_bf16", False, "sdpa", 2, 128),
        case("lm", "full", "bf16", True, "eager", 2, 128),
        case("lm", "lora", "fp32", False, "sdpa", 2, 128, lora=QV),
        case("classification", "full", "fp32", False, "sdpa", 2, 128),
        case("classification", "full", "fp32", True, "eager", 2, 128),
        # the patterns of the two check cases over 2 % at their first replay (autocast with eager
        # attention in a classifier; LoRA on every Linear in bf16 with checkpointing), at the
        # tuning shape (data/validation/README.md: check misses are reproduced, then fixed here)
        case("classification", "full", "amp_bf16", False, "eager", 2, 128),
        case("lm", "full", "amp_bf16", False, "eager", 2, 128),
        case("lm", "lora", "bf16", True, "eager", 2, 128, lora=ALL),
        # "all-linear" also wraps the MLM head's transform dense: at the loss backward (no
        # checkpointing) its adapter's saved tensors are alive
        case("lm", "lora", "fp32", False, "sdpa", 2, 128, lora=ALL),
    ]


def check_cases():
    """Other shapes, heads and settings than the tuning cases, never tuned on."""
    return [
        case("lm", "full", "fp32", True, "sdpa", 1, 256, shape=(2, 3, 4096)),
        case("classification", "full", "amp_bf16", False, "eager", 4, 96, shape=(1.5, 2, 2048)),
        case("lm", "lora", "bf16", True, "eager", 2, 192, shape=(0.5, 4, 2048), lora=ALL),
        case("classification", "lora", "fp32", False, "sdpa", 3, 128, shape=(1.5, 3, 8192), lora=QV),
    ]


def write(path, description, cases):
    with open(path, "w") as f:
        json.dump({"description": description, "defaults": {"steps": 2}, "cases": cases}, f, indent=1)
        f.write("\n")
    print(f"wrote {len(cases)} cases to {path}")


if __name__ == "__main__":
    write(TUNING_OUT, "BERT tuning cases (validate/bert_suite.py): tiny BertForMaskedLM / "
                      "BertForSequenceClassification, HF Trainer's inputs; formulas may be tuned on these.",
          tuning_cases())
    write(CHECK_OUT, "BERT check cases (validate/bert_suite.py): other shapes, measured after the tuning fixes; "
                     "never tuned on.", check_cases())
