"""GiGPO advantages against numbers computed by hand."""
import math

import pytest
import torch
from jsonargparse import ArgumentParser

from paw_lightning.objectives import (
    GRPO,
    RLOO,
    GiGPO,
    PolicyObjective,
    StepInfo,
    anchor_buckets,
    discounted_returns,
    step_advantages,
)

# Two task groups (ids 5 and 9), unequal episode lengths, γ = 0.5 in the hand computations below.
# Anchor texts: S(tart), K(itchen), F(ridge); "S" occurs in both groups and must give two buckets.
#   group 5, trajectory 40: anchors S K F, rewards [0, -0.1, 10] (an invalid step, then the win) -> R(τ) = 9.9
#            step returns R_2 = 10, R_1 = -0.1 + 0.5 * 10 = 4.9, R_0 = 0 + 0.5 * 4.9 = 2.45
#   group 5, trajectory 41: anchors S K,   rewards [0, 0]    -> R(τ) = 0,    step returns [0, 0]
#   group 5, trajectory 42: anchors S,     rewards [-0.1]    -> R(τ) = -0.1, step returns [-0.1]
#   group 9, trajectory 50: anchors S S (an invalid step keeps the observation), rewards [-0.1, 10] -> R(τ) = 9.9
#            step returns R_1 = 10, R_0 = -0.1 + 0.5 * 10 = 4.9
#   group 9, trajectory 51: anchors S,     rewards [0]       -> R(τ) = 0,    step returns [0]
# Buckets: group 5 S {2.45, 0, -0.1}, K {4.9, 0}, F {10} (a singleton); group 9 S {4.9, 10, 0}.
INFO = StepInfo(
    group_ids=torch.tensor([5, 5, 5, 5, 5, 5, 9, 9, 9]),
    traj_ids=torch.tensor([40, 40, 40, 41, 41, 42, 50, 50, 51]),
    step_ids=torch.tensor([0, 1, 2, 0, 1, 0, 0, 1, 0]),
    rewards=torch.tensor([0.0, -0.1, 10.0, 0.0, 0.0, -0.1, -0.1, 10.0, 0.0]),
    anchor_obs=["S", "K", "F", "S", "K", "S", "S", "S", "S"],
)
STEP_RETURNS = torch.tensor([2.45, 4.9, 10.0, 0.0, 0.0, -0.1, 4.9, 10.0, 0.0])
BUCKETS = torch.tensor([0, 1, 2, 0, 1, 0, 3, 3, 3])

# A^S, mean_std_norm (eps = 0, unbiased std):
#   group 5 S {2.45, 0, -0.1}: mean 2.35 / 3 = 0.783333, deviations [1.666667, -0.783333, -0.883333],
#     squares 2.777778 + 0.613611 + 0.780278 = 4.171667, / 2 = 2.085833, std 1.444241
#     -> [1.154009, -0.542384, -0.611625]
#   group 5 K {4.9, 0}: mean 2.45, std sqrt(2 * 2.45^2 / 1) = 3.464823 -> ±0.707107
#   group 5 F {10}: a bucket of one -> 0
#   group 9 S {4.9, 10, 0}: mean 14.9 / 3 = 4.966667, deviations [-0.066667, 5.033333, -4.966667],
#     squares 0.004444 + 25.334444 + 24.667778 = 50.006667, / 2 = 25.003333, std 5.000333
#     -> [-0.013332, 1.006600, -0.993267]
STEP_ADV_STD = torch.tensor([1.154009, 0.707107, 0.0, -0.542384, -0.707107, -0.611625, -0.013332, 1.006600, -0.993267])
# A^S, mean_norm: the deviations above -> [1.666667, 2.45, 0, -0.783333, -2.45, -0.883333, -0.066667, 5.033333, -4.966667]
STEP_ADV_MEAN = torch.tensor([1.666667, 2.45, 0.0, -0.783333, -2.45, -0.883333, -0.066667, 5.033333, -4.966667])


def test_discounted_returns_three_steps_gamma_095():
    # trajectory 7, rewards [0, -0.1, 10] at steps 0, 1, 2, γ = 0.95:
    #   R_2 = 10, R_1 = -0.1 + 0.95 * 10 = 9.4, R_0 = 0 + 0.95 * 9.4 = 8.93
    # trajectory 3, rewards [1, 0] at steps 0, 1: R_1 = 0, R_0 = 1 + 0.95 * 0 = 1
    # samples shuffled and interleaved; step_ids give the order inside a trajectory
    rewards = torch.tensor([10.0, 0.0, 0.0, -0.1, 1.0])
    traj_ids = torch.tensor([7, 3, 7, 7, 3])
    step_ids = torch.tensor([2, 1, 0, 1, 0])
    returns = discounted_returns(rewards, traj_ids, step_ids, gamma=0.95)
    torch.testing.assert_close(returns, torch.tensor([10.0, 0.0, 8.93, 9.4, 1.0]))


def test_discounted_returns_of_the_fixture():
    torch.testing.assert_close(discounted_returns(INFO.rewards, INFO.traj_ids, INFO.step_ids, gamma=0.5), STEP_RETURNS)


def test_exact_anchors_are_never_shared_across_groups():
    # "S" in group 5 is bucket 0, "S" in group 9 is bucket 3; ids numbered in order of first appearance
    assert torch.equal(anchor_buckets(INFO.anchor_obs, INFO.group_ids), BUCKETS)


@pytest.mark.parametrize(
    ("norm_by_std", "expected"), [(True, STEP_ADV_STD), (False, STEP_ADV_MEAN)], ids=["mean_std_norm", "mean_norm"]
)
def test_step_advantages(norm_by_std, expected):
    adv = step_advantages(STEP_RETURNS, BUCKETS, norm_by_std=norm_by_std, eps=0.0)
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)


def test_gigpo_mean_std_norm():
    # A^E (trajectory level, eps = 0):
    #   group 5 over [9.9, 0, -0.1]: mean 9.8 / 3 = 3.266667, deviations [6.633333, -3.266667, -3.366667],
    #     squares 44.001111 + 10.671111 + 11.334444 = 66.006667, / 2 = 33.003333, std 5.744853
    #     -> [1.154657, -0.568626, -0.586033]
    #   group 9 over [9.9, 0] -> ±0.707107
    # A = A^E + 1 * A^S:
    #   trajectory 40: 1.154657 + [1.154009, 0.707107, 0] = [2.308666, 1.861764, 1.154657]
    #   trajectory 41: -0.568626 + [-0.542384, -0.707107] = [-1.111010, -1.275733]
    #   trajectory 42: -0.586033 - 0.611625 = -1.197658
    #   trajectory 50: 0.707107 + [-0.013332, 1.006600] = [0.693775, 1.713707]
    #   trajectory 51: -0.707107 - 0.993267 = -1.700374
    estimator = GiGPO(gamma=0.5, eps=0.0)
    expected = torch.tensor([2.308666, 1.861764, 1.154657, -1.111010, -1.275733, -1.197658, 0.693775, 1.713707, -1.700374])
    torch.testing.assert_close(estimator(INFO), expected, atol=1e-5, rtol=0)
    # bucket sizes [3, 2, 1, 3]: mean 9 / 4 = 2.25, max 3, one singleton of four buckets.
    # A^S has mean 0 (each bucket is centred); a bucket of n normalised by its unbiased std has
    # Σ A^S² = n - 1, so Σ A^S² = 2 + 1 + 0 + 2 = 5 over 9 samples: population std sqrt(5 / 9) = 0.745356
    assert estimator.last_diagnostics == pytest.approx(
        {
            "gigpo/anchor_group_size_mean": 2.25,
            "gigpo/anchor_group_size_max": 3.0,
            "gigpo/singleton_fraction": 0.25,
            "gigpo/step_adv_std": math.sqrt(5 / 9),
        }
    )


def test_gigpo_mean_norm_without_episode_std():
    # A^E without std: group 5 mean 3.266667 -> [6.633333, -3.266667, -3.366667]; group 9 mean 4.95 -> ±4.95
    # A = A^E + A^S (mean_norm):
    #   trajectory 40: 6.633333 + [1.666667, 2.45, 0] = [8.3, 9.083333, 6.633333]
    #   trajectory 41: -3.266667 + [-0.783333, -2.45] = [-4.05, -5.716667]
    #   trajectory 42: -3.366667 - 0.883333 = -4.25
    #   trajectory 50: 4.95 + [-0.066667, 5.033333] = [4.883333, 9.983333]
    #   trajectory 51: -4.95 - 4.966667 = -9.916667
    estimator = GiGPO(gamma=0.5, step_norm="mean_norm", episode_norm_by_std=False)
    expected = torch.tensor([8.3, 9.083333, 6.633333, -4.05, -5.716667, -4.25, 4.883333, 9.983333, -9.916667])
    torch.testing.assert_close(estimator(INFO), expected, atol=1e-5, rtol=0)


def test_omega_weighs_the_step_term():
    # ω = 0 is exactly GRPO (trajectory level); ω = 2 adds twice the step advantage
    torch.testing.assert_close(GiGPO(omega=0.0)(INFO), GRPO()(INFO))
    expected = GRPO(eps=0.0)(INFO) + 2 * STEP_ADV_STD
    torch.testing.assert_close(GiGPO(omega=2.0, gamma=0.5, eps=0.0)(INFO), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("step_norm", ["mean_std_norm", "mean_norm"])
def test_all_equal_returns_give_exactly_zero(step_norm):
    # group 0: three trajectories, each anchors [S, K], rewards [-0.1, 10] (γ = 0.95):
    #   R(τ) = 9.9 for all -> A^E = 0; step returns [-0.1 + 9.5, 10] = [9.4, 10] in each -> buckets S {9.4}*3, K {10}*3 -> 0
    # group 1: one trajectory alone, anchors [S, K], rewards [0, 10] -> singleton group and singleton buckets -> 0
    info = StepInfo(
        group_ids=torch.tensor([0, 0, 0, 0, 0, 0, 1, 1]),
        traj_ids=torch.tensor([0, 0, 1, 1, 2, 2, 3, 3]),
        step_ids=torch.tensor([0, 1, 0, 1, 0, 1, 0, 1]),
        rewards=torch.tensor([-0.1, 10.0, -0.1, 10.0, -0.1, 10.0, 0.0, 10.0]),
        anchor_obs=["S", "K"] * 4,
    )
    estimator = GiGPO(step_norm=step_norm)
    assert torch.equal(estimator(info), torch.zeros(8))
    assert estimator.last_diagnostics["gigpo/step_adv_std"] == 0.0
    assert estimator.last_diagnostics["gigpo/singleton_fraction"] == 0.5  # buckets [3, 3, 1, 1]


# ALFWorld-like texts: LONG_2 differs from LONG_1 in one character out of 82, so the matching blocks cover 81
# characters of each and ratio = 2 * 81 / (82 + 82) = 0.987805 >= 0.95. SHORT has 47 characters, so even a full
# match could give at most 2 * 47 / (47 + 82) = 0.728682 < 0.95.
LONG_1 = "You arrive at countertop 1. On the countertop 1, you see a apple 1, and a knife 1."
LONG_2 = "You arrive at countertop 1. On the countertop 1, you see a apple 1, and a knife 2."
SHORT = "You arrive at fridge 1. The fridge 1 is closed."


def test_similarity_groups_near_identical_texts_only():
    assert (len(LONG_1), len(LONG_2), len(SHORT)) == (82, 82, 47)
    obs = [LONG_1, SHORT, LONG_2, LONG_1, LONG_2]
    groups = torch.tensor([0, 0, 0, 1, 1])
    # exact: five buckets: group 0 LONG_1 -> 0, SHORT -> 1, LONG_2 -> 2; group 1 LONG_1 -> 3, LONG_2 -> 4
    assert torch.equal(anchor_buckets(obs, groups), torch.tensor([0, 1, 2, 3, 4]))
    # similarity 0.95: LONG_2 joins LONG_1's bucket, SHORT stays alone; group 1 gets its own bucket (never shared)
    assert torch.equal(anchor_buckets(obs, groups, similarity_threshold=0.95), torch.tensor([0, 1, 0, 2, 2]))
    # threshold 0.99 > 0.987805: LONG_2 no longer joins
    assert torch.equal(anchor_buckets(obs, groups, similarity_threshold=0.99), torch.tensor([0, 1, 2, 3, 4]))


def test_similarity_compares_with_the_first_member_only():
    # b = a with the last letter changed, c = b with the first letter changed too (20 characters each):
    #   ratio(b, a) = 2 * 19 / 40 = 0.95; ratio(c, a) = 2 * 18 / 40 = 0.9; ratio(c, b) = 0.95.
    # With threshold 0.93, b joins a's bucket, but c is compared with that bucket's first member a (0.9) and
    # opens a new bucket even though it is 0.95-similar to b (the greedy rule, as verl-agent).
    a, b, c = "abcdefghijklmnopqrst", "abcdefghijklmnopqrsZ", "Abcdefghijklmnopqrs" + "Z"
    buckets = anchor_buckets([a, b, c], torch.zeros(3, dtype=torch.long), similarity_threshold=0.93)
    assert torch.equal(buckets, torch.tensor([0, 0, 1]))


def test_gigpo_similarity_mode_gives_a_step_signal():
    # one group, two one-step trajectories on near-identical observations, rewards [10, 0]:
    #   A^E = ±0.707107 (mean 5, std sqrt(2 * 25 / 1) = 7.071068)
    #   exact: two singleton buckets -> A^S = 0; similarity: one bucket {10, 0} -> A^S = ±0.707107 as well
    info = StepInfo(
        group_ids=torch.zeros(2, dtype=torch.long),
        traj_ids=torch.tensor([0, 1]),
        step_ids=torch.zeros(2, dtype=torch.long),
        rewards=torch.tensor([10.0, 0.0]),
        anchor_obs=[LONG_1, LONG_2],
    )
    exact = GiGPO(eps=0.0)(info)
    similar = GiGPO(anchor_match="similarity", eps=0.0)(info)
    torch.testing.assert_close(exact, torch.tensor([0.707107, -0.707107]))
    torch.testing.assert_close(similar, torch.tensor([1.414214, -1.414214]))


def test_bad_inputs_are_rejected():
    with pytest.raises(ValueError, match="one anchor observation per step sample"):
        GiGPO()(StepInfo(INFO.group_ids, INFO.traj_ids, INFO.step_ids, INFO.rewards))  # no anchor_obs
    with pytest.raises(ValueError):
        GiGPO(step_norm="std_norm")
    with pytest.raises(ValueError):
        GiGPO(anchor_match="fuzzy")
    with pytest.raises(ValueError):
        GiGPO(similarity_threshold=0.0)


@pytest.mark.parametrize(
    ("advantage_yaml", "cls"),
    [
        ("{class_path: paw_lightning.objectives.GiGPO, init_args: {omega: 0.5, anchor_match: similarity, "
         "similarity_threshold: 0.9, step_norm: mean_norm}}", GiGPO),
        ("{class_path: paw_lightning.objectives.RLOO}", RLOO),
    ],
    ids=["gigpo", "rloo"],
)
def test_estimators_are_yaml_options_of_the_policy_objective(advantage_yaml, cls):
    parser = ArgumentParser()
    parser.add_class_arguments(PolicyObjective, "policy")
    cfg = parser.parse_string(f"policy:\n  kl_coef: 0.0\n  advantage: {advantage_yaml}\n")
    policy = parser.instantiate_classes(cfg).policy
    assert isinstance(policy, PolicyObjective) and isinstance(policy.advantage, cls)
    if cls is GiGPO:
        adv = policy.advantage
        assert (adv.omega, adv.anchor_match, adv.similarity_threshold, adv.step_norm) == (0.5, "similarity", 0.9, "mean_norm")
        assert (adv.gamma, adv.episode_norm_by_std) == (0.95, True)  # defaults
    assert policy.advantages(INFO).shape == (9,)
