"""The encoder path of validate/workload.py: which head a request builds and what one micro-batch holds."""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import workload  # noqa: E402


def req(model_type, head=None, arch=None):
    config = {"model_type": model_type}
    if arch:
        config["architectures"] = [arch]
    model = {"config": config}
    if head:
        model["head"] = head
    return {"model": model}


def test_heads_follow_the_estimator():
    assert workload.model_head(req("llama", head="classification")) == "causal_lm"
    assert workload.model_head(req("bert", arch="BertForMaskedLM")) == "masked_lm"
    assert workload.model_head(req("bert", arch="BertForSequenceClassification")) == "classification"
    assert workload.model_head(req("bert", head="lm", arch="BertForSequenceClassification")) == "masked_lm"
    assert workload.model_head(req("bert", head="classification")) == "classification"
    bert_file = {"model": {"config_path": "data/validation/tiny_configs/bert-tiny.json"}}
    assert workload.model_head(bert_file) == "masked_lm"


def test_batches():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 100, (4, 256), generator=g)
    causal = workload.training_batch("causal_lm", ids, g, 2)
    assert causal["labels"] is ids and causal["use_cache"] is False
    mlm = workload.training_batch("masked_lm", ids, g, 2)
    assert set(mlm) == {"input_ids", "token_type_ids", "attention_mask", "labels"}
    assert bool((mlm["token_type_ids"] == 0).all()) and bool((mlm["attention_mask"] == 1).all())
    chosen = mlm["labels"] != -100
    assert bool((mlm["labels"][chosen] == ids[chosen]).all())
    assert 0.10 < chosen.float().mean().item() < 0.20  # mlm_probability 0.15
    cls = workload.training_batch("classification", ids, g, 3)
    assert cls["labels"].shape == (4,) and int(cls["labels"].max()) < 3
