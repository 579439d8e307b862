"""PPO's critic against hand-computed numbers (turn-level GAE, the clipped value loss and its
weight) and as one unit (its head, parameter group, and the module's checks)."""
from __future__ import annotations

import pytest
import torch

from paw_lightning.model import LMConfig
from paw_lightning.module import PaWModule
from paw_lightning.objectives import GAE, GRPO, Critic, PolicyObjective, gae_advantages
from paw_lightning.objectives.types import StepInfo


def test_gae_by_hand_with_unsorted_steps():
    # samples: B (one step), then A's steps in the order 2, 0, 1
    traj = torch.tensor([1, 0, 0, 0])
    step = torch.tensor([0, 2, 0, 1])
    rewards = torch.tensor([-0.1, 1.0, 0.0, 0.0])
    values = torch.tensor([0.3, 0.4, 0.5, 0.2])
    adv, ret = gae_advantages(rewards, values, traj, step, gamma=0.9, lam=0.5)
    # A, t=2: δ = 1 + 0.9·0 − 0.4 = 0.6                         → A = 0.6
    # A, t=1: δ = 0 + 0.9·0.4 − 0.2 = 0.16                      → A = 0.16 + 0.45·0.6 = 0.43
    # A, t=0: δ = 0 + 0.9·0.2 − 0.5 = −0.32                     → A = −0.32 + 0.45·0.43 = −0.1265
    # B, t=0: δ = −0.1 − 0.3 = −0.4                             → A = −0.4
    assert adv.tolist() == pytest.approx([-0.4, 0.6, -0.1265, 0.43])
    assert ret.tolist() == pytest.approx([-0.1, 1.0, 0.3735, 0.63])  # R = A + V


def test_gae_estimator_whitens_and_needs_values():
    info = StepInfo(torch.tensor([0, 0]), torch.tensor([0, 1]), torch.tensor([0, 0]), torch.tensor([1.0, 0.0]), values=torch.tensor([0.0, 0.0]))
    adv = GAE(whiten=True)(info)  # raw A = [1, 0] → mean 0.5, std 0.7071 → ±0.7071
    assert adv.tolist() == pytest.approx([0.70710678, -0.70710678], abs=1e-5)
    info.values = None
    with pytest.raises(ValueError, match="values"):
        GAE()(info)


def test_clipped_value_loss_by_hand():
    critic = Critic(value_clip=0.2)
    v = torch.tensor([1.0], requires_grad=True)
    out = critic.value_loss(v, torch.tensor([0.5]), torch.tensor([2.0]))
    # unclipped (1 − 2)² = 1; clipped V = 0.5 + 0.2 = 0.7 → (0.7 − 2)² = 1.69; ½·max = 0.845
    assert out.loss.item() == pytest.approx(0.845)
    out.loss.backward()
    assert v.grad.item() == 0.0  # the clipped branch wins and is flat in V
    v = torch.tensor([0.6], requires_grad=True)
    out = critic.value_loss(v, torch.tensor([0.5]), torch.tensor([2.0]))
    out.loss.backward()  # inside the clip: ½(0.6 − 2)² = 0.98, gradient 0.6 − 2 = −1.4
    assert out.loss.item() == pytest.approx(0.98) and v.grad.item() == pytest.approx(-1.4)


def test_critic_term_is_weighted_and_its_head_has_its_own_lr():
    critic = Critic(value_coef=0.5, value_clip=0.2, lr=3e-4)
    critic.build(hidden_size=4)
    assert critic.head.weight.shape == (1, 4) and torch.all(critic.head.bias == 0)
    group = critic.parameter_group()
    assert group["lr"] == 3e-4 and [p.shape for p in group["params"]] == [(1, 4), (1,)]
    hidden = torch.zeros(2, 3, 4)
    hidden[0, 1], hidden[1, 2] = 1.0, 2.0  # the last prompt tokens (prompt lengths 2 and 3)
    with torch.no_grad():
        critic.head.weight.fill_(0.25)
    values = critic(hidden, torch.tensor([2, 3]))
    assert values.tolist() == pytest.approx([1.0, 2.0])  # 4 · 0.25 · h
    batch = {"old_values": torch.tensor([1.0, 2.0]), "returns": torch.tensor([2.0, 2.0])}
    out = critic.loss(values, batch)
    # V = V_old: no clipping; L_V = ½ · ((1 − 2)² + 0) / 2 = 0.25; weighted 0.5 · 0.25
    assert out.loss.item() == pytest.approx(0.125) and out.metrics["value/loss"].item() == pytest.approx(0.25)
    with pytest.raises(ValueError, match="model.critic"):
        Critic(lr=0)


def test_module_requires_a_critic_exactly_with_gae(tiny_model_dir):
    lm = LMConfig(name_or_path=str(tiny_model_dir))
    with pytest.raises(ValueError, match="the GAE advantage reads a critic's values: set model.critic"):
        PaWModule(lm=lm, policy_objective=PolicyObjective(advantage=GAE()))
    with pytest.raises(ValueError, match="model.critic is set but the GRPO advantage uses no values"):
        PaWModule(lm=lm, policy_objective=PolicyObjective(advantage=GRPO()), critic=Critic())
    module = PaWModule(lm=lm, policy_objective=PolicyObjective(advantage=GAE()), critic=Critic(lr=3e-4))
    module.configure_model()
    optimizer = module.configure_optimizers()
    actor, head = optimizer.param_groups
    assert head["lr"] == 3e-4 and len(head["params"]) == 2
    assert sum(p.numel() for p in actor["params"]) == sum(p.numel() for n, p in module.lm.named_parameters() if p.requires_grad)
