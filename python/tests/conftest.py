"""Shared fixtures: the native CLI (the reference for byte-identity), tiny models on the CPU."""
import json
import os
import pathlib
import warnings

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = ROOT / "data" / "validation" / "tiny_configs"
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach the Hub


@pytest.fixture(scope="session")
def cli():
    """build/native/cli/memfit, or $MEMFIT_CLI (scripts/test.sh sets it: then it must exist)."""
    path = pathlib.Path(os.environ.get("MEMFIT_CLI", ROOT / "build" / "native" / "cli" / "memfit"))
    if not path.exists():
        if "MEMFIT_CLI" in os.environ:
            pytest.fail(f"MEMFIT_CLI={path} does not exist: build it with cmake --build --preset native --target memfit")
        pytest.skip("the native CLI is not built (cmake --preset native && cmake --build --preset native --target memfit)")
    return str(path)


def tiny_config(name):
    from transformers import AutoConfig

    return AutoConfig.for_model(**json.loads((TINY / f"{name}-tiny.json").read_text()))


@pytest.fixture(scope="session")
def hf():
    """transformers / peft ready for CPU-only tests."""
    warnings.filterwarnings("ignore", category=FutureWarning)
    import peft.tuners.lora.torchao as peft_torchao
    import transformers

    # The venv pins torchao 0.13 for torchtune; PEFT 0.21 raises on any torchao below 0.16 while
    # deciding whether a layer is a torchao tensor (none here are).
    peft_torchao.is_torchao_available = lambda: False
    transformers.logging.set_verbosity_error()
    return transformers
