"""The hf engines sample from the policy alone: a model's own generation defaults (a hub
model's repetition penalty, suppressed tokens, …), which ``generate`` would fill into every
unset field, change neither the samples nor the recorded log-probs, and stay the model's."""
from __future__ import annotations

import contextlib
import copy

import torch
from transformers import GenerationMixin

from paw_lightning.rollout.engine import GenerationEngine, HFEngine, chat_prompt_ids

PROMPTS = ["go up", "a much longer prompt about the frozen lake and its holes", "x"]


@contextlib.contextmanager
def hub_defaults(model, suppressed: int):
    """Every transformers model in ``model`` with a generation config as a hub model might ship
    it: a strong repetition penalty and ``suppressed`` never to be sampled."""
    owners = [m for m in model.modules() if isinstance(m, GenerationMixin)]
    saved = [m.generation_config for m in owners]
    hub = copy.deepcopy(saved[0])
    hub.repetition_penalty, hub.suppress_tokens = 50.0, [suppressed]
    for m in owners:
        m.generation_config = hub
    try:
        yield hub
        assert all(m.generation_config is hub for m in owners)  # the model keeps its own
    finally:
        for m, config in zip(owners, saved):
            m.generation_config = config


def test_a_models_generation_defaults_do_not_reach_the_sampler(module):
    ids = [chat_prompt_ids(module.tokenizer, p) for p in PROMPTS]
    merged = HFEngine(merge_lora=True).sampler(module.lm, module.tokenizer, 12, True, version=0)
    for engine in (GenerationEngine(module.lm, module.tokenizer, 12), merged):
        for temperature, seed in ((0.0, 0), (1.0, 3)):
            plain_stats, stats = [], []
            plain = engine.generate_ids(ids, temperature, seed, stop=None, token_stats=plain_stats)
            with hub_defaults(engine.model, suppressed=plain[0][0]):  # the first row's first token, and a penalty on repeats
                assert engine.generate_ids(ids, temperature, seed, stop=None, token_stats=stats) == plain
            for (plain_lp, _), (lp, _) in zip(plain_stats, stats):
                torch.testing.assert_close(torch.tensor(lp), torch.tensor(plain_lp), atol=1e-6, rtol=0)
