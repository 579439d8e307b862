"""What a checkpoint holds: full (gathered) trainable weights and optimizer state, keyed by
parameter name, so that any world size and any strategy can resume it: one ordinary file
(not a sharded torch.distributed.checkpoint folder) with ``state_dict`` (trainable weights
only, full CPU tensors; the frozen base comes from the model source at load time),
``optimizer_states`` (gathered, keyed by parameter name) and ``trainable_parameters``
(checked on load), and ``rng_states`` (rank 0's torch CPU, numpy and Python generators: an
exact resume in one process; with several ranks every rank resumes rank 0's, and CUDA's
generators are not saved). The weight and optimizer functions are collectives under FSDP2:
every rank calls them. Simplification: a plain ``ModelParallelStrategy`` (not ``FSDP2Strategy``) first gathers the
whole model state on rank 0 at each save, a transient CPU-memory cost.

"""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)
FULL_TRAINABLE = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)


def trainable_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Full trainable weights of ``module`` on CPU, by name (empty on ranks other than 0
    when distributed). The name filter drops a frozen weight that ``ignore_frozen_params``
    keeps under a tied name (e.g. ``lm_head.weight`` tied to the input embedding)."""
    trainable = set(trainable_names(module))
    return {k: v for k, v in get_model_state_dict(module, options=FULL_TRAINABLE).items() if k in trainable}


def optimizer_state_dict(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Full state of ``optimizer`` on CPU, keyed by parameter name (empty on ranks other
    than 0 when distributed)."""
    return get_optimizer_state_dict(module, optimizer, options=FULL)


def trainable_names(module: torch.nn.Module) -> list[str]:
    return sorted(name for name, p in module.named_parameters() if p.requires_grad)


def load_trainable(module: torch.nn.Module, path: str) -> None:
    """Copy the trainable weights saved in ``path`` (a checkpoint's or a warm-up cache's
    ``state_dict``) into the unsharded ``module``: every LoRA weight must be there; a critic's
    head is loaded when the file has it (a warm-up cache has none)."""
    try:
        saved = torch.load(Path(path).expanduser(), map_location="cpu", weights_only=True).get("state_dict", {})
    except Exception as err:  # not a torch file, truncated, or holding objects weights_only refuses
        raise ValueError(f"{path} is not a readable checkpoint ({type(err).__name__}): give a last.ckpt written by paw_lightning") from None
    names = trainable_names(module)
    missing = {name for name in names if name.startswith("lm.")} - set(saved)
    if missing:
        raise ValueError(f"{path} lacks {len(missing)} of this model's LoRA weights (e.g. {sorted(missing)[0]}): it was written with another model or LoRA configuration")
    try:
        module.load_state_dict({name: saved[name] for name in names if name in saved}, strict=False)
    except RuntimeError as err:  # same names, other shapes (e.g. another LoRA rank)
        raise ValueError(f"{path} does not fit this model's trainable weights (another LoRA rank or model?): {str(err).splitlines()[-1].strip()}") from None


def rng_states() -> dict:
    """The states of torch's, numpy's and Python's global generators, as plain types (numpy's
    key as a list) so that the checkpoint loads with ``weights_only=True``."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {"torch": torch.get_rng_state(), "numpy": (name, keys.tolist(), pos, has_gauss, cached), "python": random.getstate()}


def restore_rng_states(states: dict) -> None:
    """Put the generators back where :func:`rng_states` found them."""
    torch.set_rng_state(states["torch"])
    name, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    random.setstate(states["python"])
