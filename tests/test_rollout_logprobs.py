"""π_old and the action entropy read from the sampler (``model.old_logprobs: rollout``): the
same numbers as the scoring forward, and the scoring forward is then skipped."""
from __future__ import annotations

import pytest
import torch

import paw_lightning.update as update_lib
from paw_lightning.objectives import PolicyObjective
from paw_lightning.update import prepare_update, score

from helpers import CountingReference, make_module, sampled_buffer


def test_sampler_logprobs_and_entropies_equal_the_scoring_forward(tiny_model_dir):
    module = make_module(tiny_model_dir)
    buffer = sampled_buffer(module)
    assert len(buffer) >= 4 and len(buffer.sampler_logprobs) == len(buffer)
    sampler_old, sampler_entropy = list(buffer.sampler_logprobs), dict(buffer.sampler_entropy)
    assert len({int(n) for n in buffer.prompt_lengths}) > 1  # the batch really was padded
    score(module.update_inputs(), buffer)  # the default: recomputed by a forward
    for i in range(len(buffer)):
        mask = buffer.action_mask[i][: sampler_old[i].numel()]
        assert torch.allclose(sampler_old[i][mask], buffer.old_logprobs[i][mask], atol=1e-4)
        assert (sampler_old[i][~mask] == 0).all()  # nothing on the prompt
        assert (sampler_old[i][mask] < 0).all()  # untempered log-probs of sampled tokens
    for name in ("full", "sampled"):
        assert torch.allclose(sampler_entropy[name], buffer.action_entropy[name], atol=1e-4)


def test_rollout_mode_skips_the_scoring_forward_unless_the_kl_needs_the_reference(tiny_model_dir, monkeypatch):
    for kl_coef, reference_calls in ((0.0, 0), (0.01, 1)):
        counter = CountingReference()
        monkeypatch.setattr(update_lib, "reference_policy", counter)
        module = make_module(tiny_model_dir, policy_objective=PolicyObjective(kl_coef=kl_coef), old_logprobs="rollout", score_batch_size=64)
        buffer = sampled_buffer(module)
        sampler_old = list(buffer.sampler_logprobs)
        forwards = []
        original = module.token_outputs
        monkeypatch.setattr(module, "token_outputs", lambda batch, **kw: forwards.append(kw) or original(batch, **kw))
        prepare_update(module.update_inputs(), buffer)
        assert counter.calls == reference_calls
        assert len(forwards) == reference_calls  # only the reference forward, never the policy's
        assert all(torch.equal(a, b) for a, b in zip(sampler_old, buffer.old_logprobs))  # π_old kept from the sampler
        assert len(buffer.ref_logprobs) == (len(buffer) if kl_coef else 0)
        assert buffer.advantages.shape == (len(buffer),)


def test_rollout_mode_without_sampler_logprobs_is_a_clear_error(tiny_model_dir):
    module = make_module(tiny_model_dir, old_logprobs="rollout")
    buffer = sampled_buffer(module, token_stats=False)
    with pytest.raises(RuntimeError, match="token_stats"):
        score(module.update_inputs(), buffer)
    with pytest.raises(ValueError, match="old_logprobs"):
        make_module(tiny_model_dir, old_logprobs="sampler")
