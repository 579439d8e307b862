"""Say so when the policy collapses onto one action.

A policy can keep its action format and still stop playing: after an update that pushes one
move hard, it plays that move whatever it sees (in the learning benchmark PaW's seed 8 ended
playing one move on 94 % of its held-out steps, 15.6 % → 3.1 % held-out success, its last
rollout 8 episodes that all ran out of moves; docs/results/learning.md). Such a rollout wins
nothing, every valid step's advantage is 0, and only the world-model term or the format guard
still move the weights. The module logs the rollout's
``train/episode/top_action_share`` (the most frequent action's share of the valid steps) every
update and prints one warning when a rollout without a win played one action on at least
``min_share`` of at least ``min_steps`` valid steps.
"""
from __future__ import annotations

COLLAPSE_SHARE = 0.95  # the most frequent action's share of the valid steps
COLLAPSE_MIN_STEPS = 16  # valid steps the rollout must have for the share to mean something


class ActionCollapseWatch:
    """Returns the warning once per collapse: at the first update whose rollout won nothing and
    played its most frequent action on at least ``min_share`` of its valid steps (at least
    ``min_steps`` of them); again only after a rollout that was not collapsed."""

    def __init__(self, min_share: float = COLLAPSE_SHARE, min_steps: int = COLLAPSE_MIN_STEPS):
        if not 0.0 < min_share <= 1.0:
            raise ValueError(f"min_share must be in (0, 1] (got {min_share})")
        if min_steps < 1:
            raise ValueError(f"min_steps must be at least 1 (got {min_steps})")
        self.min_share = min_share
        self.min_steps = min_steps
        self.warned = False

    def observe(self, top_share: float, valid_steps: int, wins: int) -> str | None:
        collapsed = wins == 0 and valid_steps >= self.min_steps and top_share >= self.min_share
        if not collapsed:
            self.warned = False
            return None
        if self.warned:
            return None
        self.warned = True
        return (
            f"warning: the policy has collapsed onto one action: it played its most frequent action on {top_share:.0%} of the "
            f"rollout's {valid_steps} valid steps and won no episode, so every valid step's advantage is 0 and RL cannot pull it back by itself. "
            "Keep the action distribution wider: an entropy bonus (model.policy_objective.init_args.entropy_coef), a KL term "
            "(kl_coef) or a lower learning rate (train/episode/top_action_share shows it per update)."
        )
