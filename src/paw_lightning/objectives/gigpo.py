"""GiGPO advantages (arXiv 2505.10978; verl-agent ``gigpo/core_gigpo.py``), METHODS.md §2::

    A = A^E + ω · A^S

``A^E``, the episode advantage: GRPO over the task group's distinct trajectories, each
counted once (``grpo_advantages`` at level ``trajectory``), with or without the std division.

``A^S``, the step advantage. Every step sample gets the discounted return of the rest of its
trajectory (the rewards already include the invalid-action penalty)::

    R_t = Σ_{k≥t} γ^{k−t} r_k

Inside each task group the step samples are bucketed by *anchor state*, the current
observation o_t as text (``StepInfo.anchor_obs``), and compared with their bucket::

    mean_std_norm:  A^S = (R_t − mean_bucket) / (std_bucket + ε)     (unbiased std, as GRPO)
    mean_norm:      A^S =  R_t − mean_bucket

Bucketing, as verl-agent's ``build_step_group``:

- anchors are never shared across task groups: the same text in two groups is two buckets;
- ``exact``: identical strings share a bucket;
- ``similarity``: greedy, in sample order: a sample joins the first bucket of its group whose
  representative (its first member) has ``difflib.SequenceMatcher(None, o_t, rep).ratio() ≥
  threshold``, otherwise it opens a new bucket. Membership is therefore judged against the
  representative only (not transitive: b ≈ a and c ≈ b does not put c with a).
  Identical strings reuse their bucket, each representative is indexed by difflib once and
  difflib's cheap upper bounds skip hopeless pairs: these only save time, the buckets
  are those of verl-agent's plain loop.

Deliberate choices (differences from verl-agent):

- a bucket of one, and a bucket (or task group) whose returns are all equal, gets exactly 0;
  verl-agent also gives 0 to a lone step, but to an equal bucket only up to rounding;
- a task group with a single trajectory gets A^E = 0 (verl-agent: A^E = R, std taken as 1);
- verl-agent's one ``mode`` switches the std division of both terms; here ``step_norm`` and
  ``episode_norm_by_std`` are separate (defaults: both divide, the paper's setting);
- the order of the steps of a trajectory comes from ``step_ids`` (verl-agent: batch order).
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from difflib import SequenceMatcher
from typing import Literal

import torch

from paw_lightning.objectives.advantages import AdvantageEstimator, _group_normalise, grpo_advantages
from paw_lightning.objectives.types import StepInfo

StepNorm = Literal["mean_std_norm", "mean_norm"]
AnchorMatch = Literal["exact", "similarity"]


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
        omega: float = 1.0,
        gamma: float = 0.95,
        step_norm: StepNorm = "mean_std_norm",
        episode_norm_by_std: bool = True,
        anchor_match: AnchorMatch = "exact",
        similarity_threshold: float = 0.95,
        eps: float = 1e-6,
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
        """
        if step_norm not in ("mean_std_norm", "mean_norm"):
            raise ValueError(f"step_norm must be 'mean_std_norm' or 'mean_norm', got {step_norm!r}")
        if anchor_match not in ("exact", "similarity"):
            raise ValueError(f"anchor_match must be 'exact' or 'similarity', got {anchor_match!r}")
        if not 0.0 < similarity_threshold <= 1.0:
            raise ValueError(f"similarity_threshold must be in (0, 1], got {similarity_threshold}")
        self.omega = omega
        self.gamma = gamma
        self.step_norm = step_norm
        self.episode_norm_by_std = episode_norm_by_std
        self.anchor_match = anchor_match
        self.similarity_threshold = similarity_threshold
        self.eps = eps

    def __call__(self, info: StepInfo) -> torch.Tensor:
        episode = grpo_advantages(
            info.trajectory_returns(), info.group_ids, info.traj_ids, norm_by_std=self.episode_norm_by_std, eps=self.eps
        )
        threshold = self.similarity_threshold if self.anchor_match == "similarity" else None
        buckets = anchor_buckets(info.anchor_obs, info.group_ids, threshold)
        step_returns = discounted_returns(info.rewards, info.traj_ids, info.step_ids, self.gamma)
        step = step_advantages(step_returns, buckets, norm_by_std=self.step_norm == "mean_std_norm", eps=self.eps)
        self.last_diagnostics = anchor_diagnostics(buckets, step)
        return episode + self.omega * step
