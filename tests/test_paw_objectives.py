"""PaW's world-model pieces against hand-computed numbers (METHODS.md §3)."""
from __future__ import annotations

import math

import pytest
import torch

from paw_lightning.objectives import ClippedMAE, WorldModelObjective
from paw_lightning.objectives.selection import top_alpha_mask, transition_entropy


# ----------------------------------------------------------------- selection
def test_top_alpha_keeps_ceil_alpha_n_with_ties_broken_by_index():
    h = torch.tensor([0.5, 2.0, 0.5, 1.0, 0.5])
    # α·N = 0.5·5 = 2.5 → ceil = 3 kept: 2.0 (i=1), 1.0 (i=3), then the first 0.5 (i=0) of the tie
    assert top_alpha_mask(h, 0.5).tolist() == [True, True, False, True, False]
    # α·N = 0.75·5 = 3.75 → 4 kept: the tie at 0.5 gives i=0 and i=2
    assert top_alpha_mask(h, 0.75).tolist() == [True, True, True, True, False]
    assert top_alpha_mask(h, 1.0).all() and top_alpha_mask(h, 0.01).sum() == 1  # α > 0 keeps ≥ 1
    assert top_alpha_mask(torch.zeros(0), 0.75).numel() == 0


def test_transition_entropy_estimators_by_hand():
    token_entropy = torch.tensor([[9.0, 1.0, 3.0, 9.0]])
    logprobs = torch.tensor([[0.0, math.log(0.5), math.log(0.25), 0.0]])
    action = torch.tensor([[False, True, True, False]])
    # full: mean of the entropies at the action tokens = (1 + 3) / 2 = 2
    assert transition_entropy(token_entropy, logprobs, action, "full").item() == pytest.approx(2.0)
    # sampled: mean of −q log q = (0.5·ln2 + 0.25·ln4) / 2 = (0.34657 + 0.34657) / 2 = 0.34657
    assert transition_entropy(token_entropy, logprobs, action, "sampled").item() == pytest.approx(0.5 * math.log(2))
    with pytest.raises(ValueError, match="entropy estimator"):
        transition_entropy(token_entropy, logprobs, action, "exact")


# ------------------------------------------------------------- clipped MAE
def two_observations():
    """Transition 0: obs tokens with p = 0.1, 0.5, 0.05 (|o| = 3); transition 1: p = 0.2, 0.9 (|o| = 2)."""
    p = torch.tensor([[0.7, 0.1, 0.5, 0.05], [0.7, 0.2, 0.9, 0.3]])
    mask = torch.tensor([[False, True, True, True], [False, True, True, False]])
    return p.log().requires_grad_(True), mask


def test_cmae_value_uses_the_full_observation_length():
    logprobs, mask = two_observations()
    losses = ClippedMAE(rho=0.2).transition_losses(logprobs, mask)
    # ρ = 0.2 keeps p ≤ 0.2: transition 0 keeps 0.1 and 0.05 → ((1−0.1) + (1−0.05)) / 3 = 1.85 / 3
    # transition 1 keeps 0.2 (≤ ρ) → (1 − 0.2) / 2 = 0.4 (the denominator is |o| = 2, not the 1 kept token)
    assert losses.tolist() == pytest.approx([1.85 / 3, 0.4])


def test_cmae_gradient_by_hand_and_zero_above_rho():
    logprobs, mask = two_observations()
    ClippedMAE(rho=0.2).transition_losses(logprobs, mask).sum().backward()
    grad = logprobs.grad
    # d/d log p of (1 − p)/|o| = −p/|o|
    assert grad[0, 1].item() == pytest.approx(-0.1 / 3)
    assert grad[0, 3].item() == pytest.approx(-0.05 / 3)
    assert grad[1, 1].item() == pytest.approx(-0.2 / 2)
    assert grad[0, 2].item() == 0.0 and grad[1, 2].item() == 0.0  # p > ρ: exactly no gradient
    assert grad[0, 0].item() == 0.0 and grad[1, 3].item() == 0.0  # outside obs_mask


def test_cmae_pushes_a_low_probability_target_less_than_ce():
    """Through the softmax: CE's gradient on the target logit is p − 1, CMAE's is −p(1 − p)."""
    logits = torch.tensor([[[-4.0, 2.0, 1.0]]], requires_grad=True)
    target = torch.tensor([[0]])
    mask = torch.tensor([[True]])

    def target_logit_grad(objective):
        logits.grad = None
        logp = logits.log_softmax(-1).gather(-1, target.unsqueeze(-1)).squeeze(-1)
        objective.transition_losses(logp, mask).sum().backward()
        return logits.grad[0, 0, 0].item()

    p = torch.tensor([-4.0, 2.0, 1.0]).softmax(0)[0].item()  # ≈ 0.0018, a noisy, unpredictable token
    ce, cmae = target_logit_grad(WorldModelObjective()), target_logit_grad(ClippedMAE(rho=0.2))
    assert ce == pytest.approx(p - 1, rel=1e-4) and cmae == pytest.approx(-p * (1 - p), rel=1e-4)
    assert abs(cmae) < abs(ce) / 100


def test_paw_total_on_two_groups_with_selection():
    """mean_g λ_g · mean_{i ∈ S_α ∩ g} ℓ_i; a group with no selected transition adds nothing."""
    logprobs, mask = two_observations()
    logprobs = torch.cat([logprobs, logprobs]).detach()  # 4 transitions: ℓ = [1.85/3, 0.4, 1.85/3, 0.4]
    mask = torch.cat([mask, mask])
    groups = torch.tensor([0, 0, 1, 1])
    weights = torch.tensor([0.5, 0.5, 1.0, 1.0])  # λ_0 = 0.5, λ_1 = 1
    out = ClippedMAE(rho=0.2)(logprobs, mask, groups, weights, selected=torch.tensor([True, True, False, False]))
    # group 0: 0.5 · (1.85/3 + 0.4) / 2; group 1: nothing selected → 0; mean over the 2 groups
    assert out.loss.item() == pytest.approx(0.5 * (1.85 / 3 + 0.4) / 2 / 2)
    assert out.metrics["wm/selected_fraction"].item() == pytest.approx(0.5)
    # clipped ratio over the selected transitions' obs tokens: 0.5 and 0.9 of 5 tokens
    assert out.metrics["wm/clipped_ratio"].item() == pytest.approx(2 / 5)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="alpha"):
        ClippedMAE(alpha=0.0)
    with pytest.raises(ValueError, match="rho"):
        ClippedMAE(rho=1.5)
    with pytest.raises(ValueError, match="entropy"):
        WorldModelObjective(entropy="exact")
