"""RWML's reward and easy filter against hand-computed numbers, and the embedded encoder offline."""
from __future__ import annotations

import math

import pytest
import torch

from paw_lightning.embedding import SentenceEmbedder
from paw_lightning.objectives.rwml import keep_mask, predicted_state, similarity_rewards, wrong_copy_reward_rate


def unit_with_cos(cos: float) -> torch.Tensor:
    """A unit vector whose dot product with (1, 0) is exactly ``cos``."""
    return torch.tensor([cos, math.sqrt(1 - cos * cos)], dtype=torch.float64)


def test_reward_threshold_edges():
    """1 − cos against τ_d = 0.25, with binary-exact cosines: 1 − 0.75 is exactly the edge
    (reward 0: the rule is strict), 1 − 0.8125 = 0.1875 earns 1, 1 − 0.6875 = 0.3125 earns 0;
    a response without <next_state> earns 0 whatever its vector."""
    true = torch.tensor([[1.0, 0.0]], dtype=torch.float64).repeat(4, 1)
    predicted = torch.stack([unit_with_cos(c) for c in (1.0, 0.8125, 0.75, 0.6875)])
    assert similarity_rewards(predicted, true, tau_d=0.25).tolist() == [1.0, 1.0, 0.0, 0.0]
    valid = torch.tensor([False, True, True, True])
    assert similarity_rewards(predicted, true, 0.25, valid=valid).tolist() == [0.0, 1.0, 0.0, 0.0]
    assert similarity_rewards(unit_with_cos(0.0)[None], true[:1], tau_d=1.0).tolist() == [0.0]  # orthogonal: distance exactly 1


def test_wrong_copy_reward_rate_counts_only_changed_observations():
    """Distances 1 − cos of E(o_t) to E(o_{t+1}): 0.1875 and 0.3125 where the observation changed,
    0.0 where it did not (left out: copying is right there). At τ_d = 0.25 the wrong copy earns 1
    once in 2 → 0.5; at τ_d = 0.5 both → 1.0; nothing changed → None."""
    true = torch.tensor([[1.0, 0.0]], dtype=torch.float64).repeat(3, 1)
    current = torch.stack([unit_with_cos(c) for c in (0.8125, 0.6875, 1.0)])
    changed = torch.tensor([True, True, False])
    assert wrong_copy_reward_rate(current, true, changed, tau_d=0.25) == 0.5
    assert wrong_copy_reward_rate(current, true, changed, tau_d=0.5) == 1.0
    assert wrong_copy_reward_rate(current, true, torch.zeros(3, dtype=torch.bool), tau_d=0.25) is None


def test_next_state_span():
    assert predicted_state("<think>it opens</think><next_state> The drawer is open. </next_state>") == "The drawer is open."
    assert predicted_state("<think>x</think>The drawer is open.") is None


def test_easy_triplets_are_kept_with_probability_p():
    """20 000 easy triplets (all K predictions rewarded) at p = 0.1: the kept share is within 4σ
    of 0.1 (σ = √(0.1·0.9/20000) ≈ 0.0021); triplets with any failure are all kept."""
    mean_rewards = torch.cat([torch.ones(20_000), torch.full((1000,), 0.9), torch.zeros(1000)])
    kept = keep_mask(mean_rewards, tau_easy=0.0, p=0.1, generator=torch.Generator().manual_seed(0))
    share = kept[:20_000].float().mean().item()
    assert abs(share - 0.1) < 4 * math.sqrt(0.1 * 0.9 / 20_000)
    assert kept[20_000:].all()
    again = keep_mask(mean_rewards, tau_easy=0.0, p=0.1, generator=torch.Generator().manual_seed(0))
    assert torch.equal(kept, again)  # seeded
    looser = keep_mask(torch.tensor([0.9, 0.7]), tau_easy=0.2, p=0.0, generator=torch.Generator().manual_seed(0))
    assert looser.tolist() == [False, True]  # failure rate 0.1 ≤ 0.2 is easy, 0.3 is not


@pytest.fixture(scope="module")
def embedder():
    return SentenceEmbedder()


def test_embedded_encoder_ranks_paraphrases_above_unrelated_text(embedder):
    vectors = embedder(["The drawer is open.", "You open the drawer.", "A red apple lies on the table.", "The drawer is open."])
    assert vectors.shape == (4, 384)
    torch.testing.assert_close(vectors.norm(dim=-1), torch.ones(4))
    cos = vectors @ vectors.T
    assert cos[0, 3] == pytest.approx(1.0, abs=1e-5) and cos[0, 1] > cos[0, 2] + 0.2
    rewards = similarity_rewards(vectors[[1, 2]], vectors[[0, 0]], tau_d=1 - (cos[0, 1].item() + cos[0, 2].item()) / 2)
    assert rewards.tolist() == [1.0, 0.0]
