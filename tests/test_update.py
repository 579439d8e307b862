"""The preparation of one RL update (:mod:`paw_lightning.update`) on the tiny model:
scoring pass, advantages, S_α selection and λ_g per sample."""
from __future__ import annotations

import math

import pytest
import torch

import paw_lightning.update as update_lib
from paw_lightning.model import LMConfig
from paw_lightning.module import PaWModule
from paw_lightning.objectives import GAE, ClippedMAE, Critic, FixedLambda, PolicyObjective, RewardAdaptiveLambda
from paw_lightning.update import prepare_update, score

from helpers import CountingReference, make_module, rollout


def test_kl_coef_zero_skips_the_reference_forward(tiny_model_dir, monkeypatch):
    for kl_coef, expected_calls in ((0.0, 0), (0.01, 3)):  # 12 samples / score_batch_size 4 = 3 forwards
        counter = CountingReference()
        monkeypatch.setattr(update_lib, "reference_policy", counter)
        module = make_module(tiny_model_dir, policy_objective=PolicyObjective(kl_coef=kl_coef), score_batch_size=4)
        buffer = rollout(module)
        prepare_update(module.update_inputs(), buffer, max_return=3.0)
        assert counter.calls == expected_calls
        assert len(buffer.ref_logprobs) == (12 if kl_coef else 0)
        if kl_coef:  # the reference differs from π_θ once the adapter is non-zero
            assert not torch.allclose(buffer.ref_logprobs[0], buffer.old_logprobs[0])


def test_prepare_update_selects_the_top_alpha_transitions_and_sets_lambda_per_sample(tiny_model_dir):
    module = make_module(tiny_model_dir, world_model_objective=ClippedMAE(alpha=0.75))
    buffer = rollout(module)
    metrics = prepare_update(module.update_inputs(), buffer, max_return=3.0)
    entropy = buffer.action_entropy["full"]
    selected = buffer.wm_selected
    assert selected.sum() == math.ceil(0.75 * 12)
    assert entropy[selected].min() >= entropy[~selected].max()
    assert buffer.advantages.shape == (12,)
    # GRPO at trajectory level: returns per group are 0·3 = 0 and 1·3 = 3 → ±0.7071 on every step
    assert torch.allclose(buffer.advantages.abs(), torch.full((12,), 0.70710677), atol=1e-4)
    assert {"wm/entropy_p50", "wm/update_selected_fraction"} <= set(metrics)
    # RewardAdaptiveLambda: each group's trajectories return 0 and 3, R̄_g = 1.5, R_max = 3 → λ_g = 0.5
    assert torch.equal(buffer.wm_lambda, torch.full((12,), 0.5))
    assert torch.equal(buffer.collate([1, 7])["wm_lambda"], torch.tensor([0.5, 0.5]))


def test_only_selected_transitions_keep_their_world_model_segment_and_the_loss_is_unchanged(tiny_model_dir):
    """The scoring pass runs on [prompt][response] and the transitions outside S_α lose their
    observation tokens; π_old, the loss and its gradient equal those of the full samples."""
    module = make_module(tiny_model_dir, world_model_objective=ClippedMAE(alpha=0.5, rho=1.0), policy_objective=PolicyObjective(kl_coef=0.01))
    cut = rollout(module)
    prepare_update(module.update_inputs(), cut, max_return=3.0)
    cut.wm_lambda = torch.tensor([0.7 if g == 0 else 0.3 for g in cut.info.group_ids])
    full = rollout(module)  # the same update without any cut: scored on the full samples, same selection
    score(module.update_inputs(), full)
    full.advantages, full.wm_selected, full.wm_lambda = cut.advantages, cut.wm_selected, cut.wm_lambda

    ends, selected = full.policy_lengths(), cut.wm_selected
    assert selected.sum() == 6
    for i in range(len(full)):
        assert len(cut.input_ids[i]) == (len(full.input_ids[i]) if selected[i] else ends[i])
        assert cut.obs_mask[i].any() == selected[i]
        assert len(cut.old_logprobs[i]) == len(cut.ref_logprobs[i]) == ends[i]
        assert torch.allclose(cut.old_logprobs[i], full.old_logprobs[i][: ends[i]], atol=1e-5)
        assert torch.allclose(cut.ref_logprobs[i], full.ref_logprobs[i][: ends[i]], atol=1e-5)
    assert sum(map(len, cut.input_ids)) < sum(map(len, full.input_ids))

    def loss_and_grads(buffer):
        module.zero_grad(set_to_none=True)
        out = module.compute_loss(buffer.collate(list(range(len(buffer)))))
        out.loss.backward()
        return out, [p.grad.clone() for p in module.parameters() if p.requires_grad]

    (cut_out, cut_grads), (full_out, full_grads) = loss_and_grads(cut), loss_and_grads(full)
    assert full_out.metrics["wm/loss"] > 0
    assert torch.allclose(cut_out.loss, full_out.loss, atol=1e-5)
    for key in ("wm/loss", "wm/selected_fraction", "wm/clipped_ratio", "policy/kl"):
        assert torch.allclose(torch.as_tensor(cut_out.metrics[key]), torch.as_tensor(full_out.metrics[key]), atol=1e-5), key
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(cut_grads, full_grads))


def test_lambda_follows_the_balancer_and_needs_r_max(tiny_model_dir):
    module = make_module(tiny_model_dir, world_model_objective=ClippedMAE(balancer=FixedLambda(0.25)))
    buffer = rollout(module)
    prepare_update(module.update_inputs(), buffer)
    assert torch.equal(buffer.wm_lambda, torch.full((12,), 0.25))
    # an explicit r_max wins over the environment's: R̄_g = 1.5, λ_g = 1 − 1.5 / 6 = 0.75
    module = make_module(tiny_model_dir, world_model_objective=ClippedMAE(balancer=RewardAdaptiveLambda(r_max=6.0)))
    buffer = rollout(module)
    prepare_update(module.update_inputs(), buffer, max_return=3.0)
    assert torch.allclose(buffer.wm_lambda, torch.full((12,), 0.75))
    module = make_module(tiny_model_dir, world_model_objective=ClippedMAE())
    with pytest.raises(ValueError, match="r_max"):
        prepare_update(module.update_inputs(), rollout(module))  # neither the balancer nor the environment knows R_max


def test_vanilla_rl_has_no_selection_and_no_lambda(tiny_model_dir):
    module = make_module(tiny_model_dir)
    buffer = rollout(module)
    prepare_update(module.update_inputs(), buffer)
    assert buffer.wm_selected is None and buffer.wm_lambda is None
    assert {"advantages", "old_logprobs"} <= set(buffer.collate([0, 1])) and "wm_lambda" not in buffer.collate([0, 1])


def test_score_chunks_group_the_samples_by_length():
    assert update_lib.score_chunks([5, 9, 7, 9, 3], 2) == [[1, 3], [2, 0], [4]]  # longest first, ties by index
    assert update_lib.score_chunks([5, 9, 7], 1) == [[1], [2], [0]]
    assert update_lib.score_chunks([], 4) == []


def test_the_scoring_pass_in_length_groups_stores_each_samples_results_at_its_index(tiny_model_dir):
    """Forwards of 4 samples of similar length give every sample the π_old, π_ref, entropies and
    V(h_t) that a forward of it alone gives; each forward holds the next 4 samples by length."""
    module = make_module(tiny_model_dir, policy_objective=PolicyObjective(kl_coef=0.01, advantage=GAE()), critic=Critic(), score_batch_size=4)
    with torch.no_grad():
        module.critic.head.weight.normal_(0, 1.0)  # values that differ per sample
    forwards = []
    hook = module.lm.register_forward_pre_hook(lambda _, args, kwargs: forwards.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    grouped = rollout(module)
    score(module.update_inputs(), grouped)
    hook.remove()
    lengths = [ids.numel() for ids in grouped.policy_view().input_ids]
    by_length = sorted(lengths, reverse=True)
    assert lengths != by_length  # neighbours in the buffer differ in length
    expected = [(len(rows), rows[0]) for rows in (by_length[k : k + 4] for k in range(0, len(lengths), 4))]  # (rows, longest)
    assert forwards == [shape for shape in expected for _ in range(2)]  # reference, then policy forward
    consecutive = sum(len(lengths[k : k + 4]) * max(lengths[k : k + 4]) for k in range(0, len(lengths), 4))
    assert sum(rows * width for rows, width in expected) < consecutive  # less padding than 4 neighbours per forward
    alone = rollout(module)
    module.score_batch_size = 1
    score(module.update_inputs(), alone)
    for i in range(len(grouped)):
        assert torch.allclose(grouped.old_logprobs[i], alone.old_logprobs[i], atol=1e-5)
        assert torch.allclose(grouped.ref_logprobs[i], alone.ref_logprobs[i], atol=1e-5)
    for name in ("full", "sampled"):
        assert torch.allclose(grouped.action_entropy[name], alone.action_entropy[name], atol=1e-5)
    assert torch.allclose(grouped.info.values, alone.info.values, atol=1e-5)
    assert grouped.info.values.std() > 0


def test_score_batch_size_must_be_positive(tiny_model_dir):
    with pytest.raises(ValueError, match="model.score_batch_size must be at least 1"):
        PaWModule(lm=LMConfig(name_or_path=str(tiny_model_dir)), score_batch_size=0)
