"""Is the world-model term drowned? Each loss term's gradient on the LoRA weights.

On a measured optimizer step (the first of every ``every``-th RL iteration: epoch 0, every,
2·every, …) the gradient of each term of the loss, g_π (the policy objective's whole loss,
KL and entropy terms included) and g_wm (the world-model term as it enters the loss,
λ_g-weighted), is taken on the LM's trainable weights with ``torch.autograd.grad`` of each
micro-batch's term times its micro-batch weight, summed over the step's micro-batches: the
gradients of the mini-batch's terms, before clipping. The step's own backward runs as without
the measurement, so training is unchanged bit for bit. Logged as ``train/grad/*``:

- ``policy_norm`` ‖g_π‖ and ``wm_norm`` ‖g_wm‖ (L2 over every trainable LM weight);
- ``wm_to_policy`` ‖g_wm‖ / ‖g_π‖;
- ``cosine`` g_π · g_wm / (‖g_π‖ ‖g_wm‖): below 0 the world-model term pulls against the policy term.

Cost: one extra backward pass per term over the measured step's micro-batches (measured in
docs/results/speed-and-memory.md). Simplification: one process only; under
``torch.distributed`` nothing is measured (``autograd.grad`` bypasses the gradient hooks of
FSDP2 and DDP, so the per-rank values would not be the global gradient's).
"""
from __future__ import annotations

import math

import torch

from paw_lightning.scale import distributed


class TermGradients:
    """Args:
    every: measure on the first optimizer step of every ``every``-th RL iteration; 0: never.
    """

    def __init__(self, every: int):
        if every < 0:
            raise ValueError(f"model.term_gradients_every must be at least 0 (got {every})")
        self.every = every
        self._sums: dict[str, list[torch.Tensor]] = {}

    def measures(self, epoch: int, batch_idx: int) -> bool:
        """Whether the optimizer step ``batch_idx`` of RL iteration ``epoch`` is measured."""
        return self.every > 0 and batch_idx == 0 and epoch % self.every == 0 and not distributed.is_distributed()

    def add(self, terms: dict[str, torch.Tensor], params: list[torch.nn.Parameter], weight: float) -> None:
        """Accumulate ``weight`` × ∇ of each term of one micro-batch (the graph is kept for its backward)."""
        for name, term in terms.items():
            sums = self._sums.setdefault(name, [torch.zeros_like(p, dtype=torch.float32) for p in params])
            if not term.requires_grad:  # e.g. no selected transition in this micro-batch: no gradient
                continue
            grads = torch.autograd.grad(term * weight, params, retain_graph=True, allow_unused=True)
            for total, grad in zip(sums, grads):
                if grad is not None:
                    total.add_(grad.float())

    def metrics(self) -> dict[str, float]:
        """The measured step's ``grad/*`` values (empty if nothing was accumulated); resets."""
        sums, self._sums = self._sums, {}
        if "policy" not in sums:
            return {}
        policy = torch.cat([g.flatten() for g in sums["policy"]])
        out = {"grad/policy_norm": float(policy.norm())}
        if "world_model" in sums:
            wm = torch.cat([g.flatten() for g in sums["world_model"]])
            p_norm, wm_norm = out["grad/policy_norm"], float(wm.norm())
            out["grad/wm_norm"] = wm_norm
            out["grad/wm_to_policy"] = wm_norm / p_norm if p_norm > 0 else math.nan
            out["grad/cosine"] = float(policy @ wm) / (p_norm * wm_norm) if p_norm > 0 and wm_norm > 0 else math.nan
        return out
