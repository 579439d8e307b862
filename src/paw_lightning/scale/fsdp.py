"""FSDP2 for the shared LM: how it is sharded, and how its weights are gathered for generation.

`shard_model`: every decoder layer is one FSDP2 unit, then each LoRA linear outside the
layers, then the root, resharded after every forward. `gathered_for_generation`: the units
stay gathered after their first forward, so a rollout all-gathers every weight once instead
of once per generated token, at the price of the full model on every rank
(``gather_weights_for_generation``); `count_all_gathers` measures the difference. QLoRA's
4-bit weights are replicated, not sharded (FSDP2 would drop their ``quant_state``).

"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.distributed as dist
from peft import PeftModel
from peft.tuners.lora import LoraLayer
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard


def shard_model(model: PeftModel, device_mesh: DeviceMesh, mp_policy: MixedPrecisionPolicy | None = None) -> PeftModel:
    """Shard `model` in place with FSDP2 (`fully_shard`) over `device_mesh`; returns it.

    Units: every decoder layer (its LoRA linears, trainable and frozen weights share
    the unit: FSDP2 shards per parameter, so mixed `requires_grad` is fine); then the
    LoRA linears outside any decoder layer (e.g. adapters on `lm_head`), each its own
    unit, their frozen base weight left to the root; then the root, which is
    `model.get_base_model()` and not the `PeftModel` wrapper, because
    `PeftModel.generate` calls the base model directly and would skip a root hook on the
    wrapper. Every unit reshards after its forward. bitsandbytes' 4-bit weights (QLoRA)
    stay out of every unit: replicated, not sharded (see the module docstring).
    """
    base = model.get_base_model()
    kwargs = dict(
        mesh=device_mesh,
        mp_policy=mp_policy or MixedPrecisionPolicy(),
        reshard_after_forward=True,
        ignored_params={p for p in base.parameters() if type(p).__name__ == "Params4bit"} or None,
    )
    layers = decoder_layers(base)
    for layer in layers:
        fully_shard(layer, **kwargs)
    inside = {id(m) for layer in layers for m in layer.modules()}
    for module in base.modules():
        if isinstance(module, LoraLayer) and id(module) not in inside:
            for linear in (*module.lora_A.values(), *module.lora_B.values()):
                fully_shard(linear, **kwargs)
    fully_shard(base, **kwargs)
    return model


@contextlib.contextmanager
def gathered_for_generation(model: nn.Module, enabled: bool = True) -> Iterator[None]:
    """Inside, the FSDP2 units of `model` keep their full weights after their first forward,
    so a generation loop all-gathers each weight once instead of once per generated token;
    on exit every unit frees them and reshards after each forward again (as `shard_model`
    sets it). A no-op when not `enabled` or when `model` is not FSDP2-sharded. Purely
    local (no collective of its own): the all-gathers stay inside the forwards, which every
    rank runs in step (``synced_gpus``)."""
    units = [m for m in model.modules() if isinstance(m, FSDPModule)] if enabled else []
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(True, recurse=False)


@contextlib.contextmanager
def count_all_gathers() -> Iterator[list[int]]:
    """Inside, every all-gather this process runs appends the bytes it receives to the
    yielded list: FSDP2 gathers a unit's weights with one ``torch.distributed`` all-gather
    (``all_gather_single``; ``all_gather_into_tensor`` in older torch), looked up at each call,
    so wrapping that function counts them. For tests and benchmarks; not thread-safe."""
    name = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"
    original, received = getattr(dist, name), []

    def counting(output, *args, **kwargs):
        received.append(output.numel() * output.element_size())
        return original(output, *args, **kwargs)

    setattr(dist, name, counting)
    try:
        yield received
    finally:
        setattr(dist, name, original)


def fsdp_mixed_precision(precision: str | None) -> MixedPrecisionPolicy:
    """FSDP2's policy for Lightning's ``trainer.precision``: ``bf16-mixed`` / ``16-mixed``
    all-gather the weights and compute in bf16 / fp16 and reduce the gradients in float32
    (the sharded weights, and so the optimizer, keep their own dtype); anything else
    (``32-true``, ``bf16-true``, …) computes in the weights' own dtype."""
    half = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(str(precision))
    return MixedPrecisionPolicy(param_dtype=half, reduce_dtype=torch.float32) if half else MixedPrecisionPolicy()


def decoder_layers(base: nn.Module) -> list[nn.Module]:
    """The transformer blocks of a HF model: modules whose class (or a base class, since
    `fully_shard` subclasses it) is listed in the model's `_no_split_modules`, e.g.
    `LlamaDecoderLayer`."""
    names = set(getattr(base, "_no_split_modules", None) or [])
    layers = [m for m in base.modules() if any(c.__name__ in names for c in type(m).__mro__)]
    if not layers:
        raise ValueError(f"found no decoder layers in {type(base).__name__} ({names=})")
    return layers
