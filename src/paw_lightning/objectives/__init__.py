"""Pure training objectives: tensors in, ``LossOutput(loss, metrics)`` out (no Lightning, no model)."""
from paw_lightning.objectives.advantages import GRPO, AdvantageEstimator, grpo_advantages
from paw_lightning.objectives.policy import PolicyObjective
from paw_lightning.objectives.types import LossOutput, StepInfo
from paw_lightning.objectives.world_model import WorldModelObjective

__all__ = [
    "GRPO",
    "AdvantageEstimator",
    "LossOutput",
    "PolicyObjective",
    "StepInfo",
    "WorldModelObjective",
    "grpo_advantages",
]
