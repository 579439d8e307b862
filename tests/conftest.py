"""Shared fixtures: a tiny random chat model written once per test session."""

from pathlib import Path

import pytest

from paw_lightning.testing import build_tiny_model_dir


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory of a tiny LlamaForCausalLM + char-level ChatML tokenizer (seed 0);
    load it with `LMConfig(name_or_path=str(tiny_model_dir))`."""
    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny_model"))
