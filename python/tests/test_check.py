"""memfit.check and MemfitCallback print the estimate and warn when the run will not fit."""
import io
import warnings

import pytest

import memfit
from conftest import tiny_config

REQUEST = {"model": {"id": "meta-llama/Llama-2-7b-hf"}, "task": "full", "precision": "amp_bf16", "micro_batch_size": 4}


def test_check_warns_when_it_will_not_fit():
    out = io.StringIO()
    with pytest.warns(memfit.FitWarning, match="will not fit"):
        result = memfit.check(REQUEST, gpu="RTX4090-24GB", file=out)
    assert result["fits"] is False and result["request"]["gpu"]["name"] == "RTX4090-24GB"
    assert "DOES NOT FIT" in out.getvalue() and "Llama-2-7b-hf" in out.getvalue()
    assert result == memfit.estimate({**REQUEST, "gpu": {"name": "RTX4090-24GB"}})


def test_check_is_quiet_when_it_fits():
    out = io.StringIO()
    with warnings.catch_warnings():
        warnings.simplefilter("error", memfit.FitWarning)
        result = memfit.check({**REQUEST, "task": "qlora", "micro_batch_size": 1}, gpu=80, file=out)
    assert result["fits"] is True and "FITS" in out.getvalue()


def test_callback_warns_at_train_begin(hf):
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    model = AutoModelForCausalLM.from_config(tiny_config("llama"))
    args = TrainingArguments(output_dir="/tmp/memfit-py-tests", report_to=[], use_cpu=True, per_device_train_batch_size=64)
    small, large = memfit.MemfitCallback(gpu=0.25, sequence_length=512), memfit.MemfitCallback(gpu=80)
    trainer = Trainer(model=model, args=args, callbacks=[small, large])
    with pytest.warns(memfit.FitWarning) as caught:
        trainer.callback_handler.on_train_begin(trainer.args, trainer.state, trainer.control)
    assert len([w for w in caught if w.category is memfit.FitWarning]) == 1  # only the 0.25 GiB GPU
    assert small.result["fits"] is False and large.result["fits"] is True
    assert small.result["request"]["micro_batch_size"] == 64 and small.result["request"]["sequence_length"] == 512
