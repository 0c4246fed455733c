"""from_trainer / from_model / from_training_args build the request that describes the run:
Trainer and TRL SFTTrainer setups built on the CPU from tiny configs (no GPU, no weights)."""
import json

import pytest

import memfit
from conftest import tiny_config


@pytest.fixture(scope="module")
def tr(hf):
    import torch
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    class Kit:
        def model(self, name="llama", dtype=torch.float32, meta=False, **config):
            cfg = tiny_config(name)
            for k, v in config.items():
                setattr(cfg, k, v)
            if meta:
                with torch.device("meta"):
                    return AutoModelForCausalLM.from_config(cfg, dtype=dtype)
            return AutoModelForCausalLM.from_config(cfg, dtype=dtype)

        def args(self, **kw):
            return TrainingArguments(output_dir="/tmp/memfit-py-tests", report_to=[], use_cpu=True, **kw)

        def trainer(self, model, **kw):
            return Trainer(model=model, args=self.args(**kw))

    return Kit()


def estimated(request):
    """The core accepts the request; returns its normalised echo."""
    return memfit.estimate(request)["request"]


def test_full_finetune_trainer(tr, hf):
    trainer = tr.trainer(tr.model(), bf16=True, per_device_train_batch_size=3, gradient_accumulation_steps=8,
                         activation_checkpointing=True, optim="adamw_torch")
    request = memfit.from_trainer(trainer, gpu="RTX4090-24GB", sequence_length=512)
    assert request["model"]["config"]["model_type"] == "llama"
    assert request["model"]["config"]["num_hidden_layers"] == 2
    assert request["model"]["head"] == "lm"
    echo = estimated(request)
    assert (echo["task"], echo["precision"], echo["optimizer"]) == ("full", "amp_bf16", "adamw")
    assert (echo["micro_batch_size"], echo["gradient_accumulation_steps"], echo["sequence_length"]) == (3, 8, 512)
    assert echo["gradient_checkpointing"] is True
    assert echo["gpu"]["name"] == "RTX4090-24GB" and echo["parallelism"]["method"] == "single"
    # the same model read directly, with its inline config: the estimate is the request's
    assert memfit.estimate(request)["params"]["total"] == memfit.inspect(tiny_config("llama"))["params"]["total"]
    assert (echo["runtime"]["framework"], echo["runtime"]["framework_version"]) == ("transformers", hf.__version__)


@pytest.mark.parametrize("flags, dtype, precision", [
    ({}, "float32", "fp32"), ({"fp16": True}, "float32", "amp_fp16"), ({"bf16": True}, "bfloat16", "bf16"),
    ({}, "float16", "fp16")])
def test_precision_from_load_dtype_and_flags(tr, flags, dtype, precision):
    import torch

    model = tr.model(dtype=getattr(torch, dtype), meta=True)
    assert memfit.from_model(model, args=tr.args(**flags) if "fp16" not in flags else _fp16_args(tr))["precision"] == precision


def _fp16_args(tr):
    args = tr.args()  # fp16 autocast needs CUDA at TrainingArguments time: set it as a script would read it
    args.fp16 = True
    return args


@pytest.mark.parametrize("optim, name", [("adamw_torch_fused", "adamw_fused"), ("paged_adamw_8bit", "paged_adamw_8bit"),
                                         ("adamw_bnb_8bit", "adamw_8bit"), ("adafactor", "adafactor"), ("sgd", "sgd"),
                                         ("paged_adamw_32bit", "paged_adamw"), ("lion_32bit", "lion")])
def test_optimizer_names(tr, optim, name):
    assert memfit.from_training_args(tr.args(optim=optim))["optimizer"] == name
    assert name in memfit.defaults()["options"]["optimizer"]


def test_unmodelled_optimizer_is_an_error_that_says_how_to_override(tr):
    with pytest.raises(memfit.Error, match="galore_adamw.*optimizer="):
        memfit.from_training_args(tr.args(optim="galore_adamw", optim_target_modules=["q_proj"]))
    galore = tr.args(optim="galore_adamw", optim_target_modules=["q_proj"])
    assert estimated(memfit.from_model(tr.model(meta=True), args=galore, optimizer="adamw"))["optimizer"] == "adamw"


def test_lora_from_a_peft_model(tr):
    import torch
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tr.model(dtype=torch.bfloat16),
                           LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", lora_dropout=0.1))
    request = memfit.from_trainer(tr.trainer(model, bf16=True))
    echo = estimated(request)
    assert (echo["task"], echo["precision"]) == ("lora", "bf16")
    assert echo["lora"]["rank"] == 8 and echo["lora"]["alpha"] == 16
    assert echo["lora"]["targets"] == ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
    assert echo["lora"]["adapter_dtype"] == "fp32"  # PEFT upcasts adapters over bf16 weights
    assert request["lora"]["dropout"] == 0.1
    assert memfit.estimate(request)["params"]["trainable"] == sum(p.numel() for p in model.parameters() if p.requires_grad)


def test_lora_config_before_wrapping_uses_peft_defaults(tr):
    from peft import LoraConfig

    model = tr.model(meta=True)
    request = memfit.from_model(model, LoraConfig(r=4, lora_alpha=8, task_type="CAUSAL_LM"))
    assert request["lora"]["targets"] == ["q_proj", "v_proj"]  # PEFT's mapping for llama
    assert memfit.from_model(model, LoraConfig(r=4, target_modules="all-linear"))["lora"]["targets"] == "all-linear"
    with pytest.raises(memfit.Error, match="pattern"):
        memfit.from_model(model, LoraConfig(r=4, target_modules=r".*\.q_proj"))
    overridden = memfit.from_model(model, LoraConfig(r=4, target_modules=r".*\.q_proj"), lora={"targets": ["q_proj"]})
    assert estimated(overridden)["lora"] == {**estimated(overridden)["lora"], "rank": 4, "targets": ["q_proj"]}


def test_qlora_from_a_bitsandbytes_4bit_model(tr, tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    tr.model().save_pretrained(tmp_path)  # tiny random weights, read back quantized on the CPU
    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                               bnb_4bit_compute_dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, quantization_config=quant, dtype=torch.bfloat16, device_map="cpu")
    assert memfit.hf._prepared_for_kbit(model) is False
    model = get_peft_model(prepare_model_for_kbit_training(model, use_gradient_checkpointing=True),
                           LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    assert memfit.hf._prepared_for_kbit(model) is True
    request = memfit.from_trainer(tr.trainer(model, bf16=True, optim="paged_adamw_8bit"))
    echo = estimated(request)
    assert (echo["task"], echo["quantization"], echo["precision"]) == ("qlora", "nf4_double", "bf16")
    assert echo["lora"]["targets"] == ["k_proj", "o_proj", "q_proj", "v_proj"]
    assert echo["gradient_checkpointing"] is True  # prepare_model_for_kbit_training turned it on in the model
    assert echo["optimizer"] == "paged_adamw_8bit"
    assert echo["runtime"]["prepare_kbit"] is True and echo["runtime"]["framework"] == "transformers"


@pytest.mark.parametrize("config, quantization", [
    ({"quant_method": "bitsandbytes", "load_in_8bit": True}, "int8"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}, "nf4"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128}, "gptq_int4"),
    ({"quant_method": "awq", "bits": 4, "version": "gemm"}, "awq_int4")])
def test_quantization_configs(tr, config, quantization):
    from peft import LoraConfig

    model = tr.model(meta=True, quantization_config=config)
    request = memfit.from_model(model, LoraConfig(r=8))
    assert estimated(request)["quantization"] == quantization
    assert estimated(request)["task"] == "qlora"


def test_fp4_and_unknown_quantization(tr):
    from peft import LoraConfig

    fp4 = tr.model(meta=True, quantization_config={"quant_method": "bitsandbytes", "load_in_4bit": True,
                                                   "bnb_4bit_quant_type": "fp4"})
    assert estimated(memfit.from_model(fp4, LoraConfig(r=8)))["quantization"] == "fp4"
    with pytest.raises(memfit.Error, match="not modelled"):
        memfit.from_model(tr.model(meta=True, quantization_config={"quant_method": "hqq", "nbits": 4}))


def launched(monkeypatch, world, local=None):
    """As torchrun / accelerate launch set it (after the args exist: accelerate would start a
    process group on seeing WORLD_SIZE)."""
    monkeypatch.setenv("WORLD_SIZE", str(world))
    if local:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local))


def test_fsdp_config(tr, monkeypatch):
    args = tr.args(bf16=True, fsdp=True, fsdp_config={"reshard_after_forward": False, "activation_checkpointing": True})
    legacy = tr.args(bf16=True, fsdp="full_shard offload")  # a Trainer with FSDP needs a process group
    launched(monkeypatch, 8, 4)
    fields = memfit.from_training_args(args)
    assert fields["parallelism"] == {"method": "fsdp_shard_grad_op", "gpus_per_node": 4}
    assert fields["num_gpus"] == 8 and fields["gradient_checkpointing"] is True
    offload = memfit.from_model(tr.model(meta=True), args=legacy)
    echo = estimated(offload)
    assert echo["parallelism"]["method"] == "fsdp_full_shard" and echo["num_gpus"] == 8
    assert echo["parallelism"]["offload_params"] and echo["parallelism"]["offload_optimizer"]


def test_deepspeed_config_dict_and_path(tr, tmp_path, monkeypatch):
    args, bare = tr.args(bf16=True), tr.args()
    launched(monkeypatch, 4)
    ds = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "none"}},
          "bf16": {"enabled": "auto"}, "train_micro_batch_size_per_gpu": "auto"}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(ds))
    model = tr.model(meta=True)
    for config in (ds, str(path)):
        echo = estimated(memfit.from_model(model, args=args, deepspeed=config))
        assert echo["parallelism"]["method"] == "zero3" and echo["num_gpus"] == 4
        assert echo["parallelism"]["offload_optimizer"] and not echo["parallelism"]["offload_params"]
    bare.deepspeed = {"zero_optimization": {"stage": 2}}  # TrainingArguments(deepspeed=...) imports deepspeed
    assert memfit.from_training_args(bare)["parallelism"] == {"method": "zero2"}
    with pytest.raises(memfit.Error, match="cannot read the DeepSpeed config"):
        memfit.from_model(model, deepspeed=str(tmp_path / "missing.json"))


def test_world_size_without_sharding_is_ddp(tr, monkeypatch):
    trainer = tr.trainer(tr.model())
    launched(monkeypatch, 2)
    echo = estimated(memfit.from_trainer(trainer))
    assert echo["parallelism"]["method"] == "ddp" and echo["num_gpus"] == 2


def test_sft_trainer_with_lora(tr):
    from datasets import Dataset
    from peft import LoraConfig
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from trl import SFTConfig, SFTTrainer

    words = Tokenizer(models.WordLevel({"[UNK]": 0, "[PAD]": 1, "a": 2, "b": 3}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, pad_token="[PAD]", eos_token="[PAD]")
    args = SFTConfig(output_dir="/tmp/memfit-py-tests", report_to=[], use_cpu=True, max_length=384, packing=True,
                     per_device_train_batch_size=2)
    trainer = SFTTrainer(model=tr.model(), args=args, train_dataset=Dataset.from_dict({"text": ["a b a", "b a"]}),
                         processing_class=tokenizer,
                         peft_config=LoraConfig(r=4, lora_alpha=8, lora_dropout=0.05, task_type="CAUSAL_LM"))
    request = memfit.from_trainer(trainer)
    echo = estimated(request)
    # SFTConfig's defaults: bf16 autocast over the fp32-loaded model, gradient checkpointing on
    assert (echo["task"], echo["precision"], echo["sequence_length"]) == ("lora", "amp_bf16", 384)
    assert echo["gradient_checkpointing"] is True and echo["micro_batch_size"] == 2
    assert request["lora"]["dropout"] == 0.05 and echo["lora"]["targets"] == ["q_proj", "v_proj"]
    import trl

    assert (echo["runtime"]["framework"], echo["runtime"]["framework_version"]) == ("trl", trl.__version__)
