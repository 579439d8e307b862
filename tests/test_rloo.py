"""RLOO advantages against numbers computed by hand."""
import torch

from paw_lightning.objectives import RLOO, AdvantageEstimator, StepInfo, rloo_advantages


def test_group_of_three_and_a_singleton():
    # group 4: trajectory 0 has 2 steps, R = 9.9; trajectory 1 has 1 step, R = 0; trajectory 2 has 1 step, R = -0.1
    #   A_0 = 9.9 - (0 - 0.1) / 2 = 9.95;  A_1 = 0 - (9.9 - 0.1) / 2 = -4.9;  A_2 = -0.1 - (9.9 + 0) / 2 = -5.05
    # group 8: trajectory 3 alone (R = 5) -> 0, not NaN
    returns = torch.tensor([9.9, 9.9, 0.0, -0.1, 5.0])
    adv = rloo_advantages(returns, torch.tensor([4, 4, 4, 4, 8]), torch.tensor([0, 0, 1, 2, 3]))
    torch.testing.assert_close(adv, torch.tensor([9.95, 9.95, -4.9, -5.05, 0.0]))


def test_each_trajectory_counts_once():
    # group of two: trajectory 0 has 3 steps (R = 1), trajectory 1 has 1 step (R = 0): A = 1 - 0 = 1 and 0 - 1 = -1,
    # whatever the episode lengths
    adv = rloo_advantages(torch.tensor([1.0, 1.0, 1.0, 0.0]), torch.zeros(4, dtype=torch.long), torch.tensor([0, 0, 0, 1]))
    torch.testing.assert_close(adv, torch.tensor([1.0, 1.0, 1.0, -1.0]))


def test_all_equal_group_is_exactly_zero():
    # Seven returns of 9.9 (a win with one invalid step): in float32 the naive R_i - (ΣR - R_i) / 6 gives -9.5e-7,
    # not 0; the constant-group rule gives exact 0.
    adv = rloo_advantages(torch.full((7,), 9.9), torch.zeros(7, dtype=torch.long), torch.arange(7))
    assert torch.equal(adv, torch.zeros(7))


def test_integer_returns_are_accepted():
    # [1, 0, 0]: A_0 = 1 - 0 = 1, A_1 = 0 - (1 + 0) / 2 = -0.5, A_2 = -0.5
    adv = rloo_advantages(torch.tensor([1, 0, 0]), torch.zeros(3, dtype=torch.long), torch.arange(3))
    torch.testing.assert_close(adv, torch.tensor([1.0, -0.5, -0.5]))


def test_rloo_class_reads_step_info():
    # trajectory 0: rewards [0, -0.1, 10] -> R = 9.9; trajectory 1: [0, 0] -> R = 0; trajectory 2: [-0.1] -> R = -0.1
    # (one group) -> as in the first test: [9.95]*3, [-4.9]*2, [-5.05]
    info = StepInfo(
        group_ids=torch.zeros(6, dtype=torch.long),
        traj_ids=torch.tensor([0, 0, 0, 1, 1, 2]),
        step_ids=torch.tensor([0, 1, 2, 0, 1, 0]),
        rewards=torch.tensor([0.0, -0.1, 10.0, 0.0, 0.0, -0.1]),
    )
    estimator = RLOO()
    assert isinstance(estimator, AdvantageEstimator)
    torch.testing.assert_close(estimator(info), torch.tensor([9.95, 9.95, 9.95, -4.9, -4.9, -5.05]))
    assert dict(estimator.last_diagnostics) == {}
