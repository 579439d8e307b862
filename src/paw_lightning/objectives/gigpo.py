"""GiGPO advantages (arXiv 2505.10978; verl-agent ``gigpo/core_gigpo.py``), METHODS.md §2::

    A = A^E + ω · A^S                R_t = Σ_{k≥t} γ^{k−t} r_k
    mean_std_norm: A^S = (R_t − mean_bucket) / (std_bucket + ε);  mean_norm: A^S = R_t − mean_bucket

``A^E``: GRPO over the task group's distinct trajectories; ``A^S``: step samples bucketed by
*anchor state* o_t in their task group (``exact`` or greedy difflib ``similarity``, as verl-agent).
``episode_level: step`` and ``penalty_mode: after_discount`` follow verl-agent's released code.
Choices: lone and all-equal buckets or groups get exactly 0; two separate std-division switches.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from difflib import SequenceMatcher
from typing import Literal

import torch

from paw_lightning.objectives.advantages import (
    AdvantageEstimator,
    Level,
    _group_normalise,
    _group_stats,
    _normalise,
    _per_trajectory,
    grpo_advantages,
)
from paw_lightning.objectives.types import StepInfo
from paw_lightning.ranges import ClosedUnitInterval, NonNegativeFloat, UnitIntervalOpenClosed

StepNorm = Literal["mean_std_norm", "mean_norm"]
AnchorMatch = Literal["exact", "similarity"]
PenaltyMode = Literal["in_reward", "after_discount"]


def discounted_returns(
    rewards: torch.Tensor, traj_ids: torch.Tensor, step_ids: torch.Tensor, gamma: float = 0.95
) -> torch.Tensor:
    """R_t = Σ_{k≥t} γ^{k−t} r_k of every step sample within its trajectory, shape (N,).

    Args:
        rewards: r_t of each step sample (N,).
        traj_ids: trajectory of each sample (N,); samples may come in any order.
        step_ids: index t of each sample inside its trajectory (N,), one sample per step;
            only their order matters (a gap counts as one step).
        gamma: discount factor γ.
    """
    rewards = rewards if rewards.is_floating_point() else rewards.to(torch.get_default_dtype())
    by_step = torch.argsort(step_ids, stable=True)
    order = by_step[torch.argsort(traj_ids[by_step], stable=True)]  # by trajectory, then by step
    r, trajs = rewards.tolist(), traj_ids.tolist()
    returns = [0.0] * len(r)
    running, next_traj = 0.0, None
    for i in reversed(order.tolist()):
        running = r[i] + (gamma * running if trajs[i] == next_traj else 0.0)
        returns[i], next_traj = running, trajs[i]
    return torch.tensor(returns, dtype=rewards.dtype)


def penalised_step_returns(
    env_rewards: torch.Tensor,
    penalties: torch.Tensor,
    traj_ids: torch.Tensor,
    step_ids: torch.Tensor,
    gamma: float = 0.95,
) -> torch.Tensor:
    """verl-agent's step returns, shape (N,): ``R_t = Σ_{k≥t} γ^{k−t} e_k + p_t``, the
    environment rewards discounted and then each step's own penalty added (not discounted
    into earlier steps). Arguments as ``discounted_returns``; ``penalties`` p_t (N,)."""
    return discounted_returns(env_rewards, traj_ids, step_ids, gamma) + penalties


def episode_advantages(
    returns: torch.Tensor,
    group_ids: torch.Tensor,
    traj_ids: torch.Tensor,
    *,
    own_penalties: torch.Tensor | None = None,
    level: Level = "trajectory",
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """A^E of every step sample, shape (N,).

    Args:
        returns: R(τ) of each sample's trajectory (N,), equal for all samples of one trajectory.
        group_ids: task group of each sample (N,).
        traj_ids: trajectory of each sample (N,), unique across the update.
        own_penalties: ``None``: GRPO on ``returns`` (``grpo_advantages``). Otherwise p_t of
            each sample (N,) and ``returns`` are environment returns: each sample's score is
            S_t = R(τ) + p_t (``penalty_mode: after_discount``, module docstring).
        level: ``trajectory`` or ``step``, where the group's mean/std come from (module docstring).
        norm_by_std: divide by (std_g + eps); otherwise only subtract the group mean.
        eps: added to the std in the denominator.
    """
    if level not in ("trajectory", "step"):
        raise ValueError(f"level must be 'trajectory' or 'step', got {level!r}")
    if own_penalties is None:
        return grpo_advantages(returns, group_ids, traj_ids, norm_by_std=norm_by_std, level=level, eps=eps)
    returns = returns if returns.is_floating_point() else returns.to(torch.get_default_dtype())
    scores = returns + own_penalties.to(returns.dtype)
    if level == "step":
        return grpo_advantages(scores, group_ids, traj_ids, norm_by_std=norm_by_std, level="step", eps=eps)
    _, groups = torch.unique(group_ids, return_inverse=True)
    traj_returns, traj_groups, _ = _per_trajectory(returns, groups, traj_ids)
    return _normalise(scores, groups, _group_stats(traj_returns, traj_groups), norm_by_std=norm_by_std, eps=eps)


def anchor_buckets(
    anchor_obs: Sequence[str], group_ids: torch.Tensor, similarity_threshold: float | None = None
) -> torch.Tensor:
    """Dense anchor-bucket id of every step sample (N,), numbered in order of first appearance.

    Args:
        anchor_obs: current observation o_t of each sample (N texts).
        group_ids: task group of each sample (N,); buckets never span two groups.
        similarity_threshold: ``None`` buckets identical texts; a number uses the greedy
            ``SequenceMatcher`` rule of the module docstring with this threshold.
    """
    if len(anchor_obs) != len(group_ids):
        raise ValueError(f"need one anchor observation per step sample, got {len(anchor_obs)} for {len(group_ids)}")
    bucket_of: dict[tuple[int, str], int] = {}  # (group, text) -> bucket
    # group -> [(matcher holding the bucket's first member as its second sequence, bucket)]
    representatives: dict[int, list[tuple[SequenceMatcher, int]]] = defaultdict(list)
    ids, num_buckets = [], 0
    for group, obs in zip(group_ids.tolist(), anchor_obs):
        if (group, obs) not in bucket_of:
            bucket = None
            if similarity_threshold is not None:
                bucket = _first_similar(obs, representatives[group], similarity_threshold)
            if bucket is None:
                bucket, num_buckets = num_buckets, num_buckets + 1
                if similarity_threshold is not None:
                    representatives[group].append((SequenceMatcher(None, "", obs), bucket))
            bucket_of[(group, obs)] = bucket
        ids.append(bucket_of[(group, obs)])
    return torch.tensor(ids, dtype=torch.long)


def _first_similar(obs: str, representatives: list[tuple[SequenceMatcher, int]], threshold: float) -> int | None:
    """Bucket of the first representative with ``SequenceMatcher(None, obs, rep).ratio() ≥ threshold``.

    Each matcher keeps its representative as the second sequence, which difflib indexes once.
    """
    for matcher, bucket in representatives:
        matcher.set_seq1(obs)
        # real_quick_ratio ≥ quick_ratio ≥ ratio: the cheap bounds reject most pairs early.
        if matcher.real_quick_ratio() >= threshold and matcher.quick_ratio() >= threshold and matcher.ratio() >= threshold:
            return bucket
    return None


def step_advantages(
    step_returns: torch.Tensor, buckets: torch.Tensor, *, norm_by_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """A^S of every step sample (N,): R_t − mean_bucket, divided by (std_bucket + eps) when
    ``norm_by_std`` (unbiased std). Buckets of one or of equal returns give exactly 0.

    Args:
        step_returns: discounted return R_t of each sample (N,).
        buckets: dense anchor-bucket id of each sample (N,), from ``anchor_buckets``.
        norm_by_std: ``mean_std_norm`` when True, ``mean_norm`` when False.
        eps: added to the std in the denominator.
    """
    return _group_normalise(step_returns, buckets, norm_by_std=norm_by_std, eps=eps)


def anchor_diagnostics(buckets: torch.Tensor, step_adv: torch.Tensor) -> dict[str, float]:
    """Bucket sizes and the spread of A^S: mean and max size, the fraction of buckets of
    one sample (they carry no step signal) and the population std of A^S over the samples."""
    sizes = torch.bincount(buckets).to(step_adv.dtype)
    return {
        "gigpo/anchor_group_size_mean": sizes.mean().item(),
        "gigpo/anchor_group_size_max": sizes.max().item(),
        "gigpo/singleton_fraction": (sizes == 1).to(step_adv.dtype).mean().item(),
        "gigpo/step_adv_std": step_adv.std(correction=0).item(),
    }


class GiGPO(AdvantageEstimator):
    """Group-in-group advantage ``A = A^E + ω·A^S`` (module docstring).

    Every call sets ``last_diagnostics`` to ``anchor_diagnostics`` of that update.
    """

    def __init__(
        self,
        omega: NonNegativeFloat = 1.0,
        gamma: ClosedUnitInterval = 0.95,
        step_norm: StepNorm = "mean_std_norm",
        episode_norm_by_std: bool = True,
        anchor_match: AnchorMatch = "exact",
        similarity_threshold: UnitIntervalOpenClosed = 0.95,
        eps: NonNegativeFloat = 1e-6,
        episode_level: Level = "trajectory",
        penalty_mode: PenaltyMode = "in_reward",
    ) -> None:
        """
        Args:
            omega: ω, the weight of the step advantage A^S.
            gamma: γ, the discount of the step return R_t = Σ_{k≥t} γ^{k−t} r_k.
            step_norm: ``mean_std_norm`` divides R_t − mean_bucket by (std_bucket + eps);
                ``mean_norm`` only subtracts the bucket mean.
            episode_norm_by_std: divide the episode advantage A^E by the group's std (+ eps);
                False only subtracts the group mean.
            anchor_match: ``exact`` buckets identical observations; ``similarity`` joins a
                sample to the first bucket of its group whose first member is at least
                ``similarity_threshold`` similar (``difflib.SequenceMatcher`` ratio).
            similarity_threshold: in (0, 1]; used only with ``anchor_match: similarity``
                (paper: 0.95 for games, 0.9 for QA).
            eps: added to the std in both denominators.
            episode_level: where A^E's group mean/std come from. ``trajectory`` (METHODS.md):
                the group's trajectories, each once. ``step`` (verl-agent's default,
                ``compute_mean_std_cross_steps``): the group's step samples, so longer
                episodes weigh more.
            penalty_mode: ``in_reward`` (METHODS.md): the invalid-action penalty p_t is part of
                r_t, so it is discounted into earlier steps' R_t and summed into R(τ).
                ``after_discount`` (verl-agent): R_t = Σ_{k≥t} γ^{k−t} e_k + p_t and the episode
                score S_t = Σ_k e_k + p_t, with e_k = r_k − p_k the environment's reward
                (``StepInfo.penalties``): the penalty hits the invalid step's own sample only.
        """
        if step_norm not in ("mean_std_norm", "mean_norm"):
            raise ValueError(f"step_norm must be 'mean_std_norm' or 'mean_norm', got {step_norm!r}")
        if anchor_match not in ("exact", "similarity"):
            raise ValueError(f"anchor_match must be 'exact' or 'similarity', got {anchor_match!r}")
        if not 0.0 < similarity_threshold <= 1.0:
            raise ValueError(f"similarity_threshold must be in (0, 1], got {similarity_threshold}")
        if episode_level not in ("trajectory", "step"):
            raise ValueError(f"episode_level must be 'trajectory' or 'step', got {episode_level!r}")
        if penalty_mode not in ("in_reward", "after_discount"):
            raise ValueError(f"penalty_mode must be 'in_reward' or 'after_discount', got {penalty_mode!r}")
        self.omega = omega
        self.gamma = gamma
        self.step_norm = step_norm
        self.episode_norm_by_std = episode_norm_by_std
        self.anchor_match = anchor_match
        self.similarity_threshold = similarity_threshold
        self.episode_level = episode_level
        self.penalty_mode = penalty_mode
        self.eps = eps

    def __call__(self, info: StepInfo) -> torch.Tensor:
        if self.penalty_mode == "after_discount":
            penalties, env_rewards = info.step_penalties(), info.env_rewards()
            returns, own_penalties = info.trajectory_returns(env_rewards), penalties
            step_returns = penalised_step_returns(env_rewards, penalties, info.traj_ids, info.step_ids, self.gamma)
        else:
            returns, own_penalties = info.trajectory_returns(), None
            step_returns = discounted_returns(info.rewards, info.traj_ids, info.step_ids, self.gamma)
        episode = episode_advantages(
            returns, info.group_ids, info.traj_ids, own_penalties=own_penalties, level=self.episode_level,
            norm_by_std=self.episode_norm_by_std, eps=self.eps,
        )
        threshold = self.similarity_threshold if self.anchor_match == "similarity" else None
        buckets = anchor_buckets(info.anchor_obs, info.group_ids, threshold)
        step = step_advantages(step_returns, buckets, norm_by_std=self.step_norm == "mean_std_norm", eps=self.eps)
        self.last_diagnostics = anchor_diagnostics(buckets, step)
        return episode + self.omega * step
