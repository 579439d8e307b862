"""The trainer's precision when ``model.lm.dtype: auto`` chose a bfloat16 base.

``dtype: auto`` loads the frozen base in bfloat16 where the hardware multiplies bfloat16
natively (:func:`paw_lightning.model.native_bf16`), else in float32. With such a base and
``trainer.precision`` left unset, the run computes in ``bf16-mixed``: forwards under bfloat16
autocast, so the LoRA branch multiplies in bfloat16 instead of casting every activation to
float32 and back, while the LoRA weights and Adam's state stay float32. Measured on the main
job (2-core CPU with AVX-512 BF16): the update 1.17× faster, the iteration 0.88× the time
(docs/results/speed-and-memory.md). A precision set in the config or on the command line is kept.
"""
from __future__ import annotations

import torch

from paw_lightning import model


def run_device(accelerator) -> torch.device | None:
    """The device ``trainer.accelerator`` trains on: ``cpu``, ``gpu``/``cuda``, or ``auto``
    (CUDA when available); ``None`` for anything else (another accelerator, an instance)."""
    if accelerator == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if accelerator in ("cpu", "gpu", "cuda"):
        return torch.device("cpu" if accelerator == "cpu" else "cuda")
    return None


def auto_precision(precision, dtype: str, accelerator) -> tuple[object, str | None]:
    """``(precision, line)``: ``bf16-mixed`` in place of an unset ``precision`` when ``dtype`` is
    ``auto`` and the run's device has native bfloat16, with the line that says so; otherwise
    ``precision`` unchanged and no line."""
    device = run_device(accelerator)
    if precision is not None or dtype != "auto" or device is None or not model.native_bf16(device):
        return precision, None
    return "bf16-mixed", (f"precision: bf16-mixed (model.lm.dtype auto loads the base in bfloat16 on this {device.type.upper()}; "
                          "set trainer.precision to choose)")
