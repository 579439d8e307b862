"""WorldModelObjective against numbers computed by hand."""
import math

import torch

from paw_lightning.objectives import WorldModelObjective

# Four transitions, T = 4, two groups (ids 5 and 9), λ = 0.5 for group 5 and 1.0 for group 9.
# "9.0" marks positions outside obs_mask (prompt / action tokens): they must not matter.
LOGPROBS = torch.tensor(
    [
        [9.0, -1.0, -3.0, 9.0],  # t0, group 5: ℓ = (1 + 3) / 2 = 2
        [-0.5, -0.5, -1.0, -2.0],  # t1, group 5: ℓ = (0.5 + 0.5 + 1 + 2) / 4 = 1
        [9.0, 9.0, 9.0, -0.6],  # t2, group 9: ℓ = 0.6 / 1 = 0.6
        [-2.0, -1.0, 9.0, 9.0],  # t3, group 9: ℓ = (2 + 1) / 2 = 1.5
    ]
)
MASK = torch.tensor(
    [
        [False, True, True, False],
        [True, True, True, True],
        [False, False, False, True],
        [True, True, False, False],
    ]
)
GROUPS = torch.tensor([5, 5, 9, 9])
LAMBDAS = torch.tensor([0.5, 0.5, 1.0, 1.0])


def _logprobs():
    return LOGPROBS.clone().requires_grad_(True)


def test_per_transition_cross_entropy():
    torch.testing.assert_close(WorldModelObjective().transition_losses(LOGPROBS, MASK), torch.tensor([2.0, 1.0, 0.6, 1.5]))


def test_group_weighted_loss_all_selected():
    # group 5: mean(2, 1) = 1.5, × λ 0.5 = 0.75;  group 9: mean(0.6, 1.5) = 1.05, × λ 1 = 1.05
    # total = (0.75 + 1.05) / 2 groups = 0.9;  unweighted wm/loss = (2 + 1 + 0.6 + 1.5) / 4 = 1.275
    out = WorldModelObjective()(_logprobs(), MASK, GROUPS, LAMBDAS)
    torch.testing.assert_close(out.loss, torch.tensor(0.9))
    torch.testing.assert_close(out.metrics["wm/weighted_loss"], torch.tensor(0.9))
    torch.testing.assert_close(out.metrics["wm/loss"], torch.tensor(1.275))
    torch.testing.assert_close(out.metrics["wm/selected_fraction"], torch.tensor(1.0))
    torch.testing.assert_close(out.metrics["wm/lambda_mean"], torch.tensor(0.75))  # (0.5 + 1.0) / 2 groups
    assert all(not v.requires_grad for v in out.metrics.values())


def test_group_without_selected_transition_has_no_term_but_counts():
    # only t0 selected: group 5: mean(2) × 0.5 = 1; group 9: no WM term (0) but still one of the 2 groups
    # total = (1 + 0) / 2 = 0.5;  wm/loss = 2;  selected 1 of 4 = 0.25
    logprobs = _logprobs()
    out = WorldModelObjective()(logprobs, MASK, GROUPS, LAMBDAS, selected=torch.tensor([True, False, False, False]))
    torch.testing.assert_close(out.loss, torch.tensor(0.5))
    torch.testing.assert_close(out.metrics["wm/loss"], torch.tensor(2.0))
    torch.testing.assert_close(out.metrics["wm/selected_fraction"], torch.tensor(0.25))
    torch.testing.assert_close(out.metrics["wm/lambda_mean"], torch.tensor(0.75))
    out.loss.backward()
    # d total / d log p of a t0 obs token = −λ / (#groups · #selected in group · |o|) = −0.5 / (2 · 1 · 2) = −0.125
    expected = torch.zeros(4, 4)
    expected[0, 1] = expected[0, 2] = -0.125
    torch.testing.assert_close(logprobs.grad, expected)


def test_gradient_all_selected():
    # t0 tokens: −0.5 / (2 groups · 2 selected · 2 tokens) = −0.0625;  t1: −0.5 / (2 · 2 · 4) = −0.03125
    # t2 token: −1 / (2 · 2 · 1) = −0.25;  t3 tokens: −1 / (2 · 2 · 2) = −0.125
    logprobs = _logprobs()
    WorldModelObjective()(logprobs, MASK, GROUPS, LAMBDAS).loss.backward()
    expected = torch.tensor(
        [
            [0.0, -0.0625, -0.0625, 0.0],
            [-0.03125, -0.03125, -0.03125, -0.03125],
            [0.0, 0.0, 0.0, -0.25],
            [-0.125, -0.125, 0.0, 0.0],
        ]
    )
    torch.testing.assert_close(logprobs.grad, expected)


def test_only_observation_tokens_count():
    base = WorldModelObjective()(_logprobs(), MASK, GROUPS, LAMBDAS)
    changed_lp = LOGPROBS.masked_fill(~MASK, -math.inf).requires_grad_(True)
    changed = WorldModelObjective()(changed_lp, MASK, GROUPS, LAMBDAS)
    torch.testing.assert_close(changed.loss, base.loss)
    changed.loss.backward()
    assert torch.isfinite(changed_lp.grad).all()
    assert torch.equal(changed_lp.grad[~MASK], torch.zeros(int((~MASK).sum())))


def test_transition_without_observation_tokens_is_never_selected():
    # a fifth transition in group 9 with an empty obs_mask (and -inf everywhere), explicitly "selected":
    # the loss stays 0.9 (as with four transitions); selected fraction = 4 / 5 = 0.8
    logprobs = torch.cat([LOGPROBS, torch.full((1, 4), -math.inf)]).requires_grad_(True)
    mask = torch.cat([MASK, torch.zeros(1, 4, dtype=torch.bool)])
    out = WorldModelObjective()(logprobs, mask, torch.tensor([5, 5, 9, 9, 9]), torch.tensor([0.5, 0.5, 1.0, 1.0, 1.0]), selected=torch.ones(5, dtype=torch.bool))
    torch.testing.assert_close(out.loss, torch.tensor(0.9))
    torch.testing.assert_close(out.metrics["wm/selected_fraction"], torch.tensor(0.8))
    out.loss.backward()
    assert torch.isfinite(logprobs.grad).all()


def test_nothing_selected_gives_zero_without_nan():
    logprobs = _logprobs()
    out = WorldModelObjective()(logprobs, MASK, GROUPS, LAMBDAS, selected=torch.zeros(4, dtype=torch.bool))
    out.loss.backward()
    assert out.loss.item() == 0.0
    assert torch.equal(logprobs.grad, torch.zeros(4, 4))
    assert not any(torch.isnan(v).any() for v in out.metrics.values())


def test_subclass_overrides_the_per_transition_loss():
    # the hook issue 5's clipped MAE uses: per-transition losses [1, 1, 1, 1] -> total = (0.5·1 + 1·1) / 2 = 0.75
    class Ones(WorldModelObjective):
        def transition_losses(self, obs_logprobs, obs_mask):
            return torch.ones(obs_logprobs.shape[0])

    torch.testing.assert_close(Ones()(LOGPROBS, MASK, GROUPS, LAMBDAS).loss, torch.tensor(0.75))
