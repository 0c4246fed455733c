"""The package speaks the core's JSON exactly as the CLI does (the same bytes), and raises the
core's own message as memfit.Error."""
import json
import subprocess
import sys

import pytest

import memfit
from conftest import ROOT, TINY

EXAMPLES = sorted((ROOT / "data" / "examples").glob("*.json"))
LLAMA_TINY = json.loads((TINY / "llama-tiny.json").read_text())
REQUESTS = [p.read_text() for p in EXAMPLES] + [json.dumps(r) for r in [
    {"model": {"id": "meta-llama/Meta-Llama-3-8B"}, "task": "lora", "precision": "bf16", "micro_batch_size": 2,
     "sequence_length": 4096, "gradient_checkpointing": True, "gpu": {"name": "A100-80GB"}},
    {"model": {"id": "meta-llama/Llama-2-7b-hf"}, "task": "full", "precision": "amp_bf16", "num_gpus": 8,
     "parallelism": {"method": "zero3", "offload_optimizer": True}, "gpu": {"memory_gib": 40}},
    {"model": {"id": "meta-llama/Llama-2-7b-hf"}, "task": "inference", "quantization": "awq_int4",
     "inference": {"batch_size": 8, "context_length": 8192, "kv_cache_dtype": "fp8"}},
    {"model": {"config": LLAMA_TINY}, "task": "full", "precision": "fp32", "micro_batch_size": 3,
     "sequence_length": 100, "device": "cpu", "optimizer": "sgd_momentum"},
]]


def run(args, stdin=None):
    return subprocess.run(args, input=stdin, capture_output=True, text=True, cwd=ROOT)


@pytest.mark.parametrize("request_text", REQUESTS, ids=lambda t: t[:60])
def test_estimate_and_plan_are_the_clis_bytes(cli, request_text):
    for command, function in (("estimate", memfit.estimate_json), ("plan", memfit.plan_json)):
        native = run([cli, command, "-", "--json"], request_text)
        if native.returncode == 0:
            # the core's text, printed as the CLI prints it (indent 2), is the CLI's output
            assert memfit._core.indented(function(request_text)) + "\n" == native.stdout
            assert json.loads(native.stdout) == getattr(memfit, command)(json.loads(request_text))
        else:  # e.g. plan of an inference request: the same refusal
            with pytest.raises(memfit.Error) as caught:
                getattr(memfit, command)(request_text)
            assert native.stderr == f"memfit: {caught.value}\n"
        for flags in ([], ["--json"]):  # python -m memfit: the human report too
            python = run([sys.executable, "-m", "memfit", command, "-", *flags], request_text)
            reference = run([cli, command, "-", *flags], request_text)
            assert (python.returncode, python.stdout, python.stderr) == (reference.returncode, reference.stdout, reference.stderr)


@pytest.mark.parametrize("command", [["models"], ["models", "--json"], ["gpus"], ["gpus", "--json"], ["defaults"],
                                     ["inspect", str(TINY / "qwen3_moe-tiny.json")]])
def test_listing_commands_match_the_cli(cli, command):
    native = run([cli, *command])
    python = run([sys.executable, "-m", "memfit", *command])
    assert native.returncode == 0 and (python.returncode, python.stdout) == (0, native.stdout)


def test_lists_are_the_cores():
    assert memfit.models_json() == memfit._core.models_json()
    ids = [m["id"] for m in memfit.models()]
    assert "meta-llama/Llama-2-7b-hf" in ids
    assert "A100-80GB" in [g["name"] for g in memfit.gpus()]
    assert "nf4_double" in memfit.defaults()["options"]["quantization"]
    assert memfit.inspect(LLAMA_TINY) == json.loads(memfit._core.parse_config_json(json.dumps(LLAMA_TINY)))


@pytest.mark.parametrize("name", sorted(p.name[:-len("-tiny.json")] for p in TINY.glob("*-tiny.json")))
def test_a_transformers_config_reads_as_its_config_json(hf, name):
    """from_model sends config.to_json_string(): Transformers 5 renames some fields on the way
    (Qwen3-MoE num_experts -> num_local_experts); the model must come out the same."""
    from conftest import tiny_config

    raw = json.loads((TINY / f"{name}-tiny.json").read_text())
    assert memfit.inspect(tiny_config(name))["params"] == memfit.inspect(raw)["params"]


BAD = [
    {"model": {"id": "nope/not-bundled"}},
    {"model": {"id": "meta-llama/Llama-2-7b-hf"}, "task": "full", "quantization": "nf4"},
    {"model": {"id": "meta-llama/Llama-2-7b-hf"}, "optimizer": "adamw_torch"},
    {"model": {"id": "meta-llama/Llama-2-7b-hf"}, "micro_batch_size": 0},
    {"model": {"id": "meta-llama/Llama-2-7b-hf"}, "typo_field": 1},
]


@pytest.mark.parametrize("request_dict", BAD, ids=lambda r: json.dumps(r)[-40:])
def test_bad_input_raises_the_cores_message(cli, request_dict):
    native = run([cli, "estimate", "-"], json.dumps(request_dict))
    assert native.returncode == 2 and native.stderr.startswith("memfit: ")
    with pytest.raises(memfit.Error) as caught:
        memfit.estimate(request_dict)
    assert isinstance(caught.value, ValueError)
    assert f"memfit: {caught.value}\n" == native.stderr
    # the *_json form returns the core's error text unchanged; python -m memfit exits like the CLI
    assert json.loads(memfit.estimate_json(request_dict)) == {"error": str(caught.value)}
    python = run([sys.executable, "-m", "memfit", "estimate", "-"], json.dumps(request_dict))
    assert (python.returncode, python.stderr) == (2, native.stderr)


def test_input_that_is_not_json():
    with pytest.raises(memfit.Error, match="JSON"):
        memfit.estimate("{not json")
    with pytest.raises(memfit.Error, match="plain JSON data"):
        memfit.estimate({"model": {"id": "meta-llama/Llama-2-7b-hf"}, "sequence_length": float("nan")})
    with pytest.raises(memfit.Error, match="dict or JSON text"):
        memfit.estimate(42)
    with pytest.raises(memfit.Error):
        memfit.inspect({"model_type": "llama"})


def test_unreadable_file_and_unknown_command_exit_as_the_cli(cli):
    for args in (["estimate", "/nonexistent/request.json"], ["nonsense"], ["estimate"]):
        native, python = run([cli, *args]), run([sys.executable, "-m", "memfit", *args])
        assert python.returncode == native.returncode != 0
        assert python.stderr.splitlines()[0] == native.stderr.splitlines()[0].replace("usage: memfit", "usage: python -m memfit")


def test_a_run_the_framework_rejects_is_a_rejected_error():
    # FlashAttention-2 over fp32 weights without autocast fails at the first forward: memfit.Rejected,
    # a memfit.Error, with the core's message; an unreadable request stays a plain memfit.Error
    request = {"model": {"id": "meta-llama/Llama-3.1-8B"}, "task": "lora", "precision": "fp32",
               "attention": "flash_attention_2", "gpu": {"name": "A100-80GB"}}
    with pytest.raises(memfit.Rejected, match="fp16 / bf16 only"):
        memfit.estimate(request)
    assert json.loads(memfit.estimate_json(request))["rejected"] is True
    with pytest.raises(memfit.Error) as caught:
        memfit.estimate({"model": {"id": "no/such-model"}})
    assert not isinstance(caught.value, memfit.Rejected)
