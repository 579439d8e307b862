"""Where an RL iteration's time goes: the ``train/perf/*`` metrics, one value per epoch.

- ``rollout_s``: playing the update's episodes (batched generation and environment steps);
- ``scoring_s``: the scoring pass (π_old, π_ref, entropies), advantages and S_α selection;
- ``update_s``: the optimizer steps over the update's mini-batches (forward, backward, step);
- ``rollout_tokens_per_s`` / ``update_tokens_per_s``: response tokens generated / sample
  tokens trained on (padding excluded) by all ranks ÷ ``rollout_s`` / ``update_s``.

Seconds are the slowest rank's; validation is in no phase.
"""
from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Iterator

import torch

from paw_lightning.scale import distributed

PHASES = ("rollout", "scoring", "update")
TOKEN_PHASES = ("rollout", "update")


class EpochClock:
    """Seconds and token counts of the current RL iteration's phases."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.tokens: dict[str, int] = defaultdict(int)

    def reset(self) -> None:
        self.seconds.clear()
        self.tokens.clear()

    @contextlib.contextmanager
    def phase(self, name: str, device: torch.device | None = None) -> Iterator[None]:
        """Add the block's wall time to phase ``name`` (after synchronising ``device`` if CUDA)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            if device is not None and device.type == "cuda":
                torch.cuda.synchronize(device)
            self.seconds[name] += time.perf_counter() - start

    def add(self, name: str, seconds: float, tokens: int = 0) -> None:
        """Add a phase timed elsewhere (the rollout, which the data module plays)."""
        self.seconds[name] += seconds
        self.tokens[name] += int(tokens)

    def count(self, name: str, tokens: int) -> None:
        self.tokens[name] += int(tokens)

    def metrics(self) -> dict[str, float]:
        """``perf/*`` over all ranks (a collective: every rank calls it, in the same order)."""
        seconds = {name: max(distributed.gather_floats(self.seconds.get(name, 0.0))) for name in PHASES}
        tokens = {name: sum(distributed.gather_floats(self.tokens.get(name, 0))) for name in TOKEN_PHASES}
        out = {f"perf/{name}_s": s for name, s in seconds.items()}
        out.update({f"perf/{name}_tokens_per_s": tokens[name] / seconds[name] for name in TOKEN_PHASES if seconds[name] > 0})
        return out
