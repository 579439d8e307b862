"""PolicyObjective against numbers computed by hand."""
import math

import pytest
import torch

from paw_lightning.objectives import GRPO, AdvantageEstimator, PolicyObjective, StepInfo
from paw_lightning.objectives.policy import aggregate, kl_penalty

# Two samples, T = 4. old log-probs 0, so ρ = exp(logprobs) and logprobs = log ρ.
#   sample 0 (A = +1): action tokens at positions 0, 1 with ρ = 1.5, 0.9; positions 2, 3 are not actions.
#   sample 1 (A = -2): action tokens at positions 1, 2, 3 with ρ = 0.5, 1.1, 1.3; position 0 is prompt.
RATIOS = torch.tensor([[1.5, 0.9, 1.0, 1.0], [1.0, 0.5, 1.1, 1.3]])
MASK = torch.tensor([[True, True, False, False], [False, True, True, True]])
ADV = torch.tensor([1.0, -2.0])
# min(ρA, clip(ρ, 0.8, 1.2)A) per action token:
#   s0: ρ=1.5 -> min(1.5, 1.2) = 1.2 (clipped)   ρ=0.9 -> min(0.9, 0.9) = 0.9
#   s1: ρ=0.5 -> min(-1.0, -1.6) = -1.6 (clipped) ρ=1.1 -> -2.2   ρ=1.3 -> min(-2.6, -2.4) = -2.6
# token-mean:    -(1.2 + 0.9 - 1.6 - 2.2 - 2.6) / 5 = -(-4.3) / 5 = 0.86
# sequence-mean: -((1.2 + 0.9) / 2 + (-1.6 - 2.2 - 2.6) / 3) / 2 = -(1.05 - 2.13333) / 2 = 0.541667


def _inputs():
    logprobs = RATIOS.log().clone().requires_grad_(True)
    return logprobs, torch.zeros(2, 4)


def test_clipped_surrogate_token_mean_and_metrics():
    logprobs, old = _inputs()
    out = PolicyObjective(kl_coef=0.0)(logprobs, old, ADV, MASK)
    torch.testing.assert_close(out.loss, torch.tensor(0.86))
    m = out.metrics
    torch.testing.assert_close(m["policy/loss"], torch.tensor(0.86))
    torch.testing.assert_close(m["policy/clip_frac"], torch.tensor(0.4))  # 2 of 5 action tokens clipped
    torch.testing.assert_close(m["policy/ratio_mean"], torch.tensor(1.06))  # (1.5+.9+.5+1.1+1.3)/5 = 5.3/5
    # ½ log² ρ: ½(.405465² + .105361² + .693147² + .095310² + .262364²)
    #   = ½(.164402 + .011101 + .480453 + .009084 + .068835) / 5 = ½ · .733875 / 5 = .073388
    torch.testing.assert_close(m["policy/approx_kl"], torch.tensor(0.073388), atol=1e-5, rtol=0)
    # advantages over action tokens [1, 1, -2, -2, -2]: mean -0.8; deviations [1.8, 1.8, -1.2, -1.2, -1.2]
    #   population var (3.24·2 + 1.44·3) / 5 = 10.8 / 5 = 2.16, std 1.469694
    torch.testing.assert_close(m["policy/advantage_mean"], torch.tensor(-0.8))
    torch.testing.assert_close(m["policy/advantage_std"], torch.tensor(1.469694))
    assert "policy/kl" not in m and "policy/entropy" not in m
    assert all(not v.requires_grad for v in m.values())


def test_sequence_mean_on_unequal_lengths():
    logprobs, old = _inputs()
    out = PolicyObjective(kl_coef=0.0, aggregation="sequence-mean")(logprobs, old, ADV, MASK)
    torch.testing.assert_close(out.loss, torch.tensor(0.541667))


def test_gradient_is_zero_exactly_where_the_clip_is_active():
    logprobs, old = _inputs()
    PolicyObjective(kl_coef=0.0)(logprobs, old, ADV, MASK).loss.backward()
    # Unclipped token: d/dlogπ (−ρA/5) = −ρA/5.
    #   s0 ρ=1.5, A>0 above 1+ε: 0 exactly   s0 ρ=0.9: −0.9/5 = −0.18
    #   s1 ρ=0.5, A<0 below 1−ε: 0 exactly   s1 ρ=1.1: 2.2/5 = 0.44   s1 ρ=1.3 (A<0, above 1+ε, not clipped): 2.6/5 = 0.52
    #   non-action positions: 0
    expected = torch.tensor([[0.0, -0.18, 0.0, 0.0], [0.0, 0.0, 0.44, 0.52]])
    torch.testing.assert_close(logprobs.grad, expected)
    assert logprobs.grad[0, 0].item() == 0.0 and logprobs.grad[1, 1].item() == 0.0


def test_positions_outside_the_action_mask_change_nothing():
    objective = PolicyObjective(kl_coef=0.1, entropy_coef=0.01)
    ref = torch.full((2, 4), -0.3)
    entropy = torch.ones(2, 4)
    logprobs, old = _inputs()
    base = objective(logprobs, old, ADV, MASK, ref_logprobs=ref, entropy=entropy)
    base.loss.backward()
    base_grad = logprobs.grad.clone()

    outside = ~MASK
    changed_lp = torch.where(outside, torch.tensor(-math.inf), RATIOS.log()).requires_grad_(True)
    changed = objective(
        changed_lp,
        old.masked_fill(outside, 50.0),
        ADV,
        MASK,
        ref_logprobs=ref.masked_fill(outside, math.inf),
        entropy=entropy.masked_fill(outside, 1e6),
    )
    changed.loss.backward()
    torch.testing.assert_close(changed.loss, base.loss)
    torch.testing.assert_close(changed_lp.grad, base_grad)
    for key, value in base.metrics.items():
        torch.testing.assert_close(changed.metrics[key], value)


def test_empty_mask_gives_zero_loss_and_zero_gradient():
    logprobs, old = _inputs()
    mask = torch.zeros(2, 4, dtype=torch.bool)
    for aggregation in ("token-mean", "sequence-mean"):
        objective = PolicyObjective(kl_coef=0.1, entropy_coef=0.01, aggregation=aggregation)
        out = objective(logprobs, old, ADV, mask, ref_logprobs=torch.zeros(2, 4), entropy=torch.ones(2, 4))
        out.loss.backward()
        assert out.loss.item() == 0.0
        assert torch.equal(logprobs.grad, torch.zeros(2, 4))
        assert not any(torch.isnan(v).any() for v in out.metrics.values())
        logprobs.grad = None


def test_kl_estimators_against_hand_values():
    # log r = ref − logπ = [0.5, −1]
    logprobs = torch.tensor([0.0, 0.0])
    ref = torch.tensor([0.5, -1.0])
    # k1 = −log r = [−0.5, 1]
    torch.testing.assert_close(kl_penalty(logprobs, ref, "k1"), torch.tensor([-0.5, 1.0]))
    # k2 = ½ log² r = [0.125, 0.5]
    torch.testing.assert_close(kl_penalty(logprobs, ref, "k2"), torch.tensor([0.125, 0.5]))
    # k3 = r − 1 − log r = [e^0.5 − 1.5, e^−1 − 1 + 1] = [1.648721 − 1.5, 0.367879] = [0.148721, 0.367879]
    torch.testing.assert_close(kl_penalty(logprobs, ref, "k3"), torch.tensor([0.148721, 0.367879]))


def test_k3_is_clamped_like_verl():
    # log r = 30: clamped to 20, e^20 − 21 ≈ 4.85e8 -> 10;  log r = −30: clamped to −20, e^−20 + 19 ≈ 19 -> 10
    logprobs = torch.zeros(2, requires_grad=True)
    kl = kl_penalty(logprobs, torch.tensor([30.0, -30.0]), "k3")
    torch.testing.assert_close(kl, torch.tensor([10.0, 10.0]))
    kl.sum().backward()
    assert torch.equal(logprobs.grad, torch.zeros(2))  # beyond the clamp: no gradient, and no NaN


def test_kl_term_in_the_loss_and_its_gradient():
    # ρ = 1 (old = logπ) and A = 0: the surrogate is 0, so loss = kl_coef · token-mean(k3).
    # log r = [0.5, −1]: k3 = [0.148721, 0.367879], mean 0.258300, loss = 0.1 · 0.258300 = 0.025830
    # d k3 / d logπ = 1 − r = [1 − 1.648721, 1 − 0.367879] = [−0.648721, 0.632121]; × 0.1 / 2 = [−0.032436, 0.031606]
    logprobs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    ref = torch.tensor([[-0.5, -3.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    out = PolicyObjective(kl_coef=0.1)(logprobs, logprobs.detach(), torch.tensor([0.0]), mask, ref_logprobs=ref)
    torch.testing.assert_close(out.loss, torch.tensor(0.025830), atol=1e-6, rtol=0)
    torch.testing.assert_close(out.metrics["policy/kl"], torch.tensor(0.258300), atol=1e-6, rtol=0)
    out.loss.backward()
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-0.032436, 0.031606]]), atol=1e-6, rtol=0)
    # k1 instead: −log r = [−0.5, 1], mean 0.25 -> loss 0.025
    out = PolicyObjective(kl_coef=0.1, kl_estimator="k1")(logprobs, logprobs.detach(), torch.tensor([0.0]), mask, ref_logprobs=ref)
    torch.testing.assert_close(out.loss, torch.tensor(0.025))


def test_entropy_bonus():
    # surrogate 0.86 (module header); token-mean entropy over the 5 action tokens of
    #   [[1, 2, ·, ·], [·, 3, 4, 5]] = 15 / 5 = 3 -> loss = 0.86 − 0.01 · 3 = 0.83
    # sequence-mean: (1.5 + 4) / 2 = 2.75 -> loss = 0.541667 − 0.0275 = 0.514167
    entropy = torch.tensor([[1.0, 2.0, 9.0, 9.0], [9.0, 3.0, 4.0, 5.0]])
    logprobs, old = _inputs()
    out = PolicyObjective(kl_coef=0.0, entropy_coef=0.01)(logprobs, old, ADV, MASK, entropy=entropy)
    torch.testing.assert_close(out.loss, torch.tensor(0.83))
    torch.testing.assert_close(out.metrics["policy/entropy"], torch.tensor(3.0))
    out = PolicyObjective(kl_coef=0.0, entropy_coef=0.01, aggregation="sequence-mean")(logprobs, old, ADV, MASK, entropy=entropy)
    torch.testing.assert_close(out.loss, torch.tensor(0.514167))


def test_aggregate_token_vs_sequence_mean_skips_empty_samples():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = torch.tensor([[True, True, False], [True, False, False], [False, False, False]])
    # token-mean: (1 + 2 + 4) / 3 = 2.33333; sequence-mean: ((1 + 2) / 2 + 4 / 1) / 2 = 2.75 (sample 2 has no tokens)
    torch.testing.assert_close(aggregate(values, mask, "token-mean"), torch.tensor(7.0 / 3.0))
    torch.testing.assert_close(aggregate(values, mask, "sequence-mean"), torch.tensor(2.75))


def test_reference_requirements_and_defaults():
    assert PolicyObjective().needs_reference
    assert not PolicyObjective(kl_coef=0.0).needs_reference
    assert isinstance(PolicyObjective().advantage, GRPO)
    logprobs, old = _inputs()
    with pytest.raises(ValueError, match="ref_logprobs"):
        PolicyObjective(kl_coef=0.01)(logprobs, old, ADV, MASK)
    with pytest.raises(ValueError, match="entropy"):
        PolicyObjective(kl_coef=0.0, entropy_coef=0.01)(logprobs, old, ADV, MASK)
    with pytest.raises(ValueError):
        PolicyObjective(kl_estimator="k4")


def test_advantages_delegate_to_the_estimator():
    class Constant(AdvantageEstimator):
        def __call__(self, info):
            return torch.full_like(info.rewards, 3.0)

    info = StepInfo(
        group_ids=torch.zeros(2, dtype=torch.long),
        traj_ids=torch.tensor([0, 1]),
        step_ids=torch.zeros(2, dtype=torch.long),
        rewards=torch.tensor([1.0, 0.0]),
    )
    torch.testing.assert_close(PolicyObjective(advantage=Constant()).advantages(info), torch.tensor([3.0, 3.0]))
    # default GRPO: returns [1, 0] -> ±0.5 / (0.70711 + 1e-6) = ±0.70711
    torch.testing.assert_close(PolicyObjective().advantages(info), torch.tensor([0.70711, -0.70711]), atol=1e-5, rtol=0)


def shared_prefix_gradient(rows: list[int], aggregation: str = "token-mean") -> float:
    """d loss / d θ, θ the log-prob of a first response token that every response of a group
    shares (say a format tag), for the group's responses ``rows`` in one mini-batch. The group:
    4 responses of 2, 3, 4, 5 action tokens, advantages +1.5, −0.5, −0.5, −0.5 (one win in four)."""
    lengths, advantages = torch.tensor([2, 3, 4, 5]), torch.tensor([1.5, -0.5, -0.5, -0.5])
    theta = torch.zeros((), requires_grad=True)
    logprobs = torch.zeros(4, 5).index_put((torch.arange(4), torch.zeros(4, dtype=torch.long)), theta.expand(4))
    mask = torch.arange(5)[None, :] < lengths[:, None]
    out = PolicyObjective(kl_coef=0.0, aggregation=aggregation)(logprobs[rows], torch.zeros(len(rows), 5), advantages[rows], mask[rows])
    out.loss.backward()
    return theta.grad.item()


def test_tokens_every_response_shares_cancel_only_within_a_whole_group():
    """Why the learning and RWML configs take the whole update as one mini-batch: a group's
    advantages sum to 0, so under token-mean the tokens all its responses share (the format)
    get no gradient, whatever the lengths. Split across mini-batches they do, and Adam's step
    is about lr whatever the gradient's size: the format drifts on noise."""
    assert shared_prefix_gradient([0, 1, 2, 3]) == pytest.approx(0.0, abs=1e-7)  # −(1.5 − 0.5·3) / 14 = 0
    # the first two responses alone (5 action tokens): −(1.5 − 0.5) / 5 = −0.2
    assert shared_prefix_gradient([0, 1]) == pytest.approx(-0.2)
    # the other two (9 tokens): −(−0.5 − 0.5) / 9 = +0.111: the opposite push
    assert shared_prefix_gradient([2, 3]) == pytest.approx(1 / 9)
    # sequence-mean weighs each response's tokens by 1 / its length, so even a whole group does not cancel:
    # −¼ (1.5/2 − 0.5/3 − 0.5/4 − 0.5/5) = −¼ · 0.358333 = −0.0895833
    assert shared_prefix_gradient([0, 1, 2, 3], "sequence-mean") == pytest.approx(-0.0895833, abs=1e-6)
