"""Tools for tests and CPU smoke runs: the tiny random model built in code (:mod:`.tiny_model`)
and the harness that kills a training run on purpose (:mod:`.kill`)."""
from paw_lightning.testing.tiny_model import build_tiny_model_dir, build_tiny_tokenizer

__all__ = ["build_tiny_model_dir", "build_tiny_tokenizer"]
