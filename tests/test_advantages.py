"""GRPO advantages against numbers computed by hand."""
import pytest
import torch

from paw_lightning.objectives import GRPO, AdvantageEstimator, StepInfo, grpo_advantages

# Two groups with unequal episode lengths (group ids deliberately not 0..G-1):
#   group 7: trajectory 10 has 3 steps, R = 1; trajectory 11 has 1 step, R = 0
#   group 3: trajectory 20 has 2 steps, R = 2; trajectory 21 has 1 step, R = 0; trajectory 22 has 1 step, R = 1
GROUPS = torch.tensor([7, 7, 7, 7, 3, 3, 3, 3])
TRAJS = torch.tensor([10, 10, 10, 11, 20, 20, 21, 22])
RETURNS = torch.tensor([1.0, 1.0, 1.0, 0.0, 2.0, 2.0, 0.0, 1.0])


def test_paper_example_four_trajectories():
    # returns [1, 0, 0, 1]: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 0.57735 -> A = ±0.5 / 0.57735 = ±0.86603
    adv = grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.zeros(4, dtype=torch.long), torch.arange(4), eps=0.0)
    torch.testing.assert_close(adv, torch.tensor([0.86603, -0.86603, -0.86603, 0.86603]), atol=1e-5, rtol=0)


def test_trajectory_level_counts_each_trajectory_once():
    # group 7 over trajectories [1, 0]: mean 0.5, std sqrt((0.25 + 0.25) / 1) = 0.70711 -> ±0.70711
    # group 3 over trajectories [2, 0, 1]: mean 1, std sqrt((1 + 1 + 0) / 2) = 1 -> [1, -1, 0]
    adv = grpo_advantages(RETURNS, GROUPS, TRAJS, level="trajectory", eps=0.0)
    expected = torch.tensor([0.70711, 0.70711, 0.70711, -0.70711, 1.0, 1.0, -1.0, 0.0])
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)


def test_step_level_weighs_longer_episodes_more():
    # group 7 over samples [1, 1, 1, 0]: mean 0.75, deviations [.25, .25, .25, -.75],
    #   squares sum 3 * .0625 + .5625 = .75, / 3 = .25, std 0.5 -> [0.5, 0.5, 0.5, -1.5]
    # group 3 over samples [2, 2, 0, 1]: mean 1.25, deviations [.75, .75, -1.25, -.25],
    #   squares sum .5625 + .5625 + 1.5625 + .0625 = 2.75, / 3 = .91667, std .95743
    #   -> [.75/.95743, .75/.95743, -1.25/.95743, -.25/.95743] = [.78335, .78335, -1.30558, -.26112]
    adv = grpo_advantages(RETURNS, GROUPS, TRAJS, level="step", eps=0.0)
    expected = torch.tensor([0.5, 0.5, 0.5, -1.5, 0.78335, 0.78335, -1.30558, -0.26112])
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)


def test_without_std_only_subtracts_the_mean():
    # trajectory level: group 7 mean 0.5 -> [.5, .5, .5, -.5]; group 3 mean 1 -> [1, 1, -1, 0]
    adv = grpo_advantages(RETURNS, GROUPS, TRAJS, norm_by_std=False, level="trajectory")
    torch.testing.assert_close(adv, torch.tensor([0.5, 0.5, 0.5, -0.5, 1.0, 1.0, -1.0, 0.0]))
    # step level: group 7 mean 0.75 -> [.25, .25, .25, -.75]; group 3 mean 1.25 -> [.75, .75, -1.25, -.25]
    adv = grpo_advantages(RETURNS, GROUPS, TRAJS, norm_by_std=False, level="step")
    torch.testing.assert_close(adv, torch.tensor([0.25, 0.25, 0.25, -0.75, 0.75, 0.75, -1.25, -0.25]))


def test_eps_is_added_to_the_std():
    # returns [1, 0]: mean 0.5, std 0.70711 -> 0.5 / (0.70711 + 0.1) = 0.61949
    adv = grpo_advantages(torch.tensor([1.0, 0.0]), torch.zeros(2, dtype=torch.long), torch.arange(2), eps=0.1)
    torch.testing.assert_close(adv, torch.tensor([0.61949, -0.61949]), atol=1e-5, rtol=0)


@pytest.mark.parametrize("level", ["trajectory", "step"])
@pytest.mark.parametrize("norm_by_std", [True, False])
def test_all_equal_group_is_exactly_zero(level, norm_by_std):
    # Six returns of 9.9 (a win with one invalid step): in float32, 9.9 - mean = -9.5e-7 (not 0) and
    # torch.std gives 1.04e-6, so a naive (R - mean) / (std + 1e-6) would give -0.466. The rule gives exact 0.
    returns = torch.full((6,), 9.9)
    adv = grpo_advantages(returns, torch.zeros(6, dtype=torch.long), torch.arange(6), norm_by_std=norm_by_std, level=level)
    assert torch.equal(adv, torch.zeros(6))


@pytest.mark.parametrize("level", ["trajectory", "step"])
def test_singleton_group_is_zero_not_nan(level):
    # group 0: one trajectory of 2 steps (R = 5), alone in its group -> 0 (no NaN from an n-1 = 0 std)
    # group 1: trajectories [1, 0] -> ±0.70711 at trajectory level (one step each, so step level agrees)
    returns = torch.tensor([5.0, 5.0, 1.0, 0.0])
    adv = grpo_advantages(returns, torch.tensor([0, 0, 1, 1]), torch.tensor([0, 0, 1, 2]), level=level, eps=0.0)
    assert not torch.isnan(adv).any()
    torch.testing.assert_close(adv, torch.tensor([0.0, 0.0, 0.70711, -0.70711]), atol=1e-5, rtol=0)


def test_integer_returns_are_accepted():
    adv = grpo_advantages(torch.tensor([1, 0]), torch.zeros(2, dtype=torch.long), torch.arange(2), norm_by_std=False)
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5]))


def test_grpo_class_reads_step_info():
    # trajectory 0: rewards [0, -0.1, 10] -> R = 9.9; trajectory 1: rewards [0, 0] -> R = 0 (one group)
    # mean 4.95, unbiased std sqrt(2 * 4.95^2 / 1) = 7.00036 -> A = ±4.95 / 7.00036 = ±0.70711
    info = StepInfo(
        group_ids=torch.zeros(5, dtype=torch.long),
        traj_ids=torch.tensor([0, 0, 0, 1, 1]),
        step_ids=torch.tensor([0, 1, 2, 0, 1]),
        rewards=torch.tensor([0.0, -0.1, 10.0, 0.0, 0.0]),
    )
    estimator = GRPO(eps=0.0)
    assert isinstance(estimator, AdvantageEstimator)
    torch.testing.assert_close(estimator(info), torch.tensor([0.70711, 0.70711, 0.70711, -0.70711, -0.70711]), atol=1e-5, rtol=0)
    # step level: samples [9.9]*3 + [0]*2, mean 5.94, deviations [3.96]*3 + [-5.94]*2,
    #   squares 3 * 15.6816 + 2 * 35.2836 = 117.612, / 4 = 29.403, std 5.42245
    #   -> [3.96 / 5.42245]*3 + [-5.94 / 5.42245]*2 = [0.73030]*3 + [-1.09545]*2
    expected = torch.tensor([0.73030, 0.73030, 0.73030, -1.09545, -1.09545])
    torch.testing.assert_close(GRPO(level="step", eps=0.0)(info), expected, atol=1e-5, rtol=0)


def test_unknown_level_is_rejected():
    with pytest.raises(ValueError):
        GRPO(level="episode")
    with pytest.raises(ValueError):
        grpo_advantages(RETURNS, GROUPS, TRAJS, level="episode")
