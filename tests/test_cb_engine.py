"""The continuous-batching engine (transformers' ``init_continuous_batching`` on the merged copy)
against the hf reference, on the tiny float32 model built in code, on a CPU: the same greedy
tokens, log-probs and entropies, the same stop cut, untempered log-probs of sampled tokens equal
to a plain forward's and to the scoring pass's, reproducible sampling per seed that leaves the
caller's random state alone, a shared prompt prefilled once, the copy following the weights, and
clear refusals."""
from __future__ import annotations

import builtins

import pytest
import torch

from paw_lightning.model import LMConfig
from paw_lightning.rollout import cb_engine as cb_lib
from paw_lightning.rollout.cb_engine import CBEngine, score_responses
from paw_lightning.rollout.engine import GenerationEngine, chat_prompt_ids
from paw_lightning.update import score

from helpers import make_module, metric_history, mlflow_runs, redrawn_lora, sampled_buffer, tiny_args

PROMPTS = ["go up", "a much longer prompt about the frozen lake and its holes", "x"]


def prompt_ids(module):
    return [chat_prompt_ids(module.tokenizer, p) for p in PROMPTS]


def test_greedy_tokens_logprobs_entropies_and_stop_cut_equal_hf(module):
    ids = prompt_ids(module)
    hf_stats, cb_stats = [], []
    reference = GenerationEngine(module.lm, module.tokenizer, 20)
    expected = reference.generate_ids(ids, 0.0, 0, stop=None, token_stats=hf_stats)
    sampler = CBEngine().sampler(module.lm, module.tokenizer, 20, True, version=0)
    assert sampler.model is not module.lm  # the merged copy
    assert sampler.generate_ids(ids, 0.0, 0, stop=None, token_stats=cb_stats) == expected
    for (hf_lp, hf_ent), (lp, ent) in zip(hf_stats, cb_stats):
        torch.testing.assert_close(torch.tensor(lp), torch.tensor(hf_lp), atol=1e-5, rtol=0)
        torch.testing.assert_close(torch.tensor(ent), torch.tensor(hf_ent), atol=1e-5, rtol=0)
    # a piece of the first row's text as the stop string ends both engines' rows at the same token
    stop = module.tokenizer.decode(expected[0][:12])[-3:]
    cut = reference.generate_ids(ids, 0.0, 0, stop=stop)
    assert sampler.generate_ids(ids, 0.0, 0, stop=stop) == cut
    assert sampler._generate(ids, 0.0, 0, 20, stop)[0] == cut[0]  # the row ended in the generation loop, not cut after it
    assert len(cut[0]) <= 12 and stop in module.tokenizer.decode(cut[0])


def test_sampling_is_reproducible_per_seed_and_leaves_the_callers_random_state(module):
    sampler, ids = CBEngine().sampler(module.lm, module.tokenizer, 12, False, version=0), prompt_ids(module)
    state = torch.get_rng_state()
    first = sampler.generate_ids(ids, 1.0, 5, stop=None)
    assert torch.equal(torch.get_rng_state(), state)  # transformers seeds the global generator; restored after
    assert sampler.generate_ids(ids, 1.0, 5, stop=None) == first
    assert sampler.generate_ids(ids, 1.0, 6, stop=None) != first
    # the temperature reaches the sampling: at 1e-3 each token is the argmax up to a near-tie (a token
    # 0.02 below it in log-prob is drawn with probability e^-20); at 1 they are not
    for temperature, argmax in ((1e-3, True), (1.0, False)):
        gaps = [logp.max(-1).values - logp.gather(-1, torch.tensor(row)[:, None]).squeeze(-1)
                for prompt, row in zip(ids, sampler.generate_ids(ids, temperature, 5, stop=None))
                for logp in [torch.log_softmax(module.lm(input_ids=torch.tensor([prompt + row])).logits[0, len(prompt) - 1 : -1], dim=-1)]]
        assert bool((torch.cat(gaps) < 0.02).all()) == argmax


def test_logprobs_of_sampled_tokens_are_untempered_and_equal_a_plain_forward(module):
    """At temperature 0.7 transformers' own log-probs would be tempered; the engine's are log π
    at temperature 1, here against one unpadded forward per row."""
    sampler, ids = CBEngine(score_rows=2).sampler(module.lm, module.tokenizer, 10, True, version=0), prompt_ids(module)
    stats = []
    rows = sampler.generate_ids(ids, 0.7, 3, stop=None, token_stats=stats)
    for prompt, row, (lp, ent) in zip(ids, rows, stats):
        assert len(lp) == len(ent) == len(row)
        logp = torch.log_softmax(module.lm(input_ids=torch.tensor([prompt + row])).logits[0, len(prompt) - 1 : -1].float(), dim=-1)
        torch.testing.assert_close(torch.tensor(lp), logp.gather(-1, torch.tensor(row)[:, None]).squeeze(-1), atol=1e-5, rtol=0)
        torch.testing.assert_close(torch.tensor(ent), -(logp.exp() * logp).sum(-1), atol=1e-5, rtol=0)


def test_score_responses_pads_prompts_left_and_responses_right(module):
    """Two rows of different prompt and response lengths scored in one forward equal each row
    scored alone."""
    ids, responses = prompt_ids(module)[:2], [[5, 6, 7], [8]]
    together = score_responses(module.lm, ids, responses, module.tokenizer.pad_token_id, rows=2)
    alone = score_responses(module.lm, ids, responses, module.tokenizer.pad_token_id, rows=1)
    for (lp, ent), (lp_alone, ent_alone) in zip(together, alone):
        torch.testing.assert_close(torch.tensor(lp), torch.tensor(lp_alone), atol=1e-5, rtol=0)
        torch.testing.assert_close(torch.tensor(ent), torch.tensor(ent_alone), atol=1e-5, rtol=0)
    assert [len(lp) for lp, _ in together] == [3, 1]


def test_a_task_groups_shared_prompt_is_prefilled_once(module):
    """A task group's first step (4 copies of a 255-token prompt) and two rows that share its
    head: with ``share_prefixes`` the head's complete pages are prefilled once and reused, the
    greedy tokens unchanged."""
    tok = module.tokenizer
    head = chat_prompt_ids(tok, "you are in a room. your task is to: put a mug in the sink. " * 4)
    rows = [head] * 4 + [head + tok.encode("go", add_special_tokens=False), head + tok.encode("up", add_special_tokens=False)]
    expected = GenerationEngine(module.lm, tok, 8).generate_ids(rows, 0.0, 0, stop=None)
    engine, forwarded = CBEngine(page_size=32), {}
    for share in (False, True):
        engine.share_prefixes = share
        sampler = engine.sampler(module.lm, tok, 8, False, version=0)
        counts = []
        hook = sampler.model.register_forward_pre_hook(lambda m, args, kwargs: counts.append(kwargs["input_ids"].numel()), with_kwargs=True)
        try:
            assert sampler.generate_ids(rows, 0.0, 0, stop=None) == expected
        finally:
            hook.remove()
        forwarded[share] = sum(counts)
    plain_prefill = sum(map(len, rows))
    assert forwarded[False] >= plain_prefill
    # shared: the head once (its 2-token warm-up request adds a decode step), each row's rest from its last page on
    assert forwarded[True] < forwarded[False] - 4 * (len(head) // 32 - 1) * 32


def test_only_a_prefix_that_rows_share_is_warmed_up(module, monkeypatch):
    """A row alone in its cluster shares nothing: it gets no warm-up request (which would prefill
    its prompt twice); the task group's head gets one."""
    from paw_lightning.rollout import cb_engine

    tok = module.tokenizer
    head = chat_prompt_ids(tok, "you are in a room. your task is to: put a mug in the sink. " * 4)
    alone = chat_prompt_ids(tok, "a different task altogether, with its own long description of the room. " * 3)
    queued, queue = [], cb_engine._queue
    monkeypatch.setattr(cb_engine, "_queue", lambda manager, states: (queued.append([s.request_id for s in states]), queue(manager, states))[1])
    CBEngine(page_size=32).sampler(module.lm, tok, 4, False, version=0).generate_ids([head] * 4 + [alone], 0.0, 0, stop=None)
    assert queued[0] == ["prefix0"] and sorted(queued[1]) == [f"row{i}" for i in range(5)]


def test_flash_attention_only_for_a_half_precision_copy(module, monkeypatch):
    """transformers would switch a float32 copy to FlashAttention where it is installed, whose
    kernels take half precision only: the engine allows the switch for a float16/bfloat16 copy;
    ``cb_kwargs`` decides over it."""
    from paw_lightning.rollout import cb_engine

    Config, Generation, Request = cb_engine._continuous_batching()
    seen = []
    monkeypatch.setattr(cb_engine, "_continuous_batching", lambda: (lambda **kw: (seen.append(kw), Config(**kw))[1], Generation, Request))
    ids = prompt_ids(module)
    for cb_kwargs in ({}, {"auto_switch_to_flash": True}):
        CBEngine(cb_kwargs=cb_kwargs).sampler(module.lm, module.tokenizer, 4, False, version=0).generate_ids(ids, 0.0, 0, stop=None)
    assert [kw["auto_switch_to_flash"] for kw in seen] == [False, True]  # the tiny model is float32
    assert cb_engine._half(torch.nn.Linear(2, 2, dtype=torch.bfloat16)) and not cb_engine._half(torch.nn.Linear(2, 2))


def test_the_copy_follows_the_weights(module):
    engine, ids = CBEngine(), prompt_ids(module)
    before = engine.sampler(module.lm, module.tokenizer, 12, False, version=0).generate_ids(ids, 0.0, 0, stop=None)
    synced = engine.last_sync_seconds
    with redrawn_lora(module.lm):
        assert engine.sampler(module.lm, module.tokenizer, 12, False, version=0).generate_ids(ids, 0.0, 0, stop=None) == before
        assert engine.last_sync_seconds == synced  # same version: the copy is kept
        after = engine.sampler(module.lm, module.tokenizer, 12, False, version=1).generate_ids(ids, 0.0, 0, stop=None)
        assert after == GenerationEngine(module.lm, module.tokenizer, 12).generate_ids(ids, 0.0, 0, stop=None) != before


def test_sampler_logprobs_equal_the_scoring_forward_on_a_rollout(tiny_model_dir):
    """``model.old_logprobs: rollout`` with the engine: the collector's π_old and entropies are
    the scoring pass's."""
    module = make_module(tiny_model_dir)
    buffer = sampled_buffer(module, engine=CBEngine())
    sampler_old, sampler_entropy = list(buffer.sampler_logprobs), dict(buffer.sampler_entropy)
    score(module.update_inputs(), buffer)
    for i in range(len(buffer)):
        mask = buffer.action_mask[i][: sampler_old[i].numel()]
        assert torch.allclose(sampler_old[i][mask], buffer.old_logprobs[i][mask], atol=1e-4)
    for name in ("full", "sampled"):
        assert torch.allclose(sampler_entropy[name], buffer.action_entropy[name], atol=1e-4)


def test_refusals_name_the_fix(monkeypatch):
    with pytest.raises(ValueError, match="one process"):
        CBEngine().check(LMConfig(), world_size=2)
    with pytest.raises(ValueError, match="unquantized"):
        CBEngine().check(LMConfig(quantization="nf4"), world_size=1)
    with pytest.raises(ValueError, match="page_size"):
        CBEngine(page_size=2)
    with pytest.raises(ValueError, match="tis_cap"):
        CBEngine(tis_cap=0.5)
    with pytest.raises(ValueError, match=r"cb_kwargs \['seed'\]"):
        CBEngine(cb_kwargs={"seed": 1})
    assert not CBEngine().off_policy and CBEngine(off_policy=True).off_policy
    real_import = builtins.__import__

    def without_continuous_batching(name, *args, **kwargs):
        if name.startswith("transformers.generation.continuous_batching"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_continuous_batching)
    with pytest.raises(ValueError, match="continuous batching.*hf engine"):
        cb_lib._continuous_batching()


@pytest.mark.slow
@pytest.mark.parametrize("extra", [("--model.old_logprobs=rollout",),
                                   ("--model.engine.init_args.off_policy=true", "--model.old_logprobs=recompute")])
def test_fit_with_the_continuous_batching_engine(tiny_model_dir, tmp_path, monkeypatch, extra):
    from paw_lightning.cli import main

    monkeypatch.chdir(tmp_path)
    main(["fit", *tiny_args(tiny_model_dir, tmp_path, "--model.engine=paw_lightning.rollout.cb_engine.CBEngine", *extra, "--trainer.max_epochs=2")])
    client, runs = mlflow_runs(tmp_path)
    assert len(metric_history(client, runs[0], "train/loss")) == 2
    assert all(s > 0 for s in metric_history(client, runs[0], "train/perf/engine_sync_s"))
    if "--model.engine.init_args.off_policy=true" in extra:  # TIS: the gap to the trainer is rounding only
        gaps = metric_history(client, runs[0], "train/rollout/engine_kl")
        assert gaps and all(0 <= kl < 1e-3 for kl in gaps)
