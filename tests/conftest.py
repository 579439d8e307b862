"""Shared fixtures: a tiny random chat model written once per test session."""

from pathlib import Path

import pytest

from paw_lightning.testing import build_tiny_model_dir


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory of a tiny LlamaForCausalLM + char-level ChatML tokenizer (seed 0);
    load it with `LMConfig(name_or_path=str(tiny_model_dir))`."""
    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny_model"))


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` need CUDA; without it they are skipped (CI has no GPU)."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
