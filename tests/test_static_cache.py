"""The hf engine with transformers' static KV cache (``HFEngine(cache="static")``) against the
dynamic cache on the tiny float32 model: the same greedy and seeded samples, the same stop
cut and log-probs within float32 rounding, on the trained model and on the merged copy; a
static cache prefills every row whole; an unknown cache is refused."""
from __future__ import annotations

import pytest
import torch

from paw_lightning.rollout.engine import GenerationEngine, HFEngine, chat_prompt_ids

PROMPTS = ["go up", "a much longer prompt about the frozen lake and its holes", "go up", "x"]


@pytest.mark.parametrize("merge_lora", [False, True])
def test_static_cache_samples_what_the_dynamic_cache_samples(module, merge_lora):
    ids = [chat_prompt_ids(module.tokenizer, p) for p in PROMPTS]
    engines = {cache: HFEngine(merge_lora=merge_lora, cache=cache).sampler(module.lm, module.tokenizer, 16, True, version=0) for cache in ("dynamic", "static")}
    for temperature, seed, stop in ((0.0, 0, None), (1.0, 3, None), (1.0, 5, "e")):
        results = {}
        for cache, sampler in engines.items():
            stats, caches = [], set()
            hook = sampler.model.get_decoder().register_forward_pre_hook(lambda mod, args, kwargs: caches.add(type(kwargs.get("past_key_values")).__name__), with_kwargs=True)
            try:
                results[cache] = sampler.generate_ids(ids, temperature, seed, stop=stop, token_stats=stats), stats
            finally:
                hook.remove()
            assert caches == {"StaticCache" if cache == "static" else "DynamicCache"}
        (dynamic, dynamic_stats), (static, static_stats) = results["dynamic"], results["static"]
        assert static == dynamic
        for (lp_d, ent_d), (lp_s, ent_s) in zip(dynamic_stats, static_stats):
            torch.testing.assert_close(torch.tensor(lp_s), torch.tensor(lp_d), atol=1e-5, rtol=0)
            torch.testing.assert_close(torch.tensor(ent_s), torch.tensor(ent_d), atol=1e-5, rtol=0)


def test_a_static_cache_prefills_every_row_whole(module):
    """Shared prefixes need a prefilled dynamic cache: with ``static`` the first forward takes
    every row's whole prompt, as ``share_prefixes=False`` does."""
    prompt = chat_prompt_ids(module.tokenizer, PROMPTS[1])
    forwarded = []
    hook = module.lm.get_input_embeddings().register_forward_hook(lambda mod, args, out: forwarded.append(tuple(args[0].shape)))
    try:
        sampler = GenerationEngine(module.lm, module.tokenizer, 3, share_prefixes=True, cache="static")
        assert not sampler.share_prefixes
        sampler.generate_ids([prompt] * 3, 1.0, seed=0, stop=None)
    finally:
        hook.remove()
    assert forwarded[0] == (3, len(prompt))


def test_an_unknown_cache_is_refused(module):
    with pytest.raises(ValueError, match="cache = 'paged': must be one of dynamic, static"):
        GenerationEngine(module.lm, module.tokenizer, 3, cache="paged")
