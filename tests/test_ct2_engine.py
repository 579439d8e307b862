"""The CTranslate2 rollout engine against the hf reference, on the tiny model built in code:
the same greedy tokens, log-probs and entropies (float32), the same stop cut, a re-sync when the
weights change, reproducible sampling per seed, and clear refusals."""
from __future__ import annotations

import gc

import pytest
import torch

from paw_lightning.model import LMConfig
from paw_lightning.rollout import ct2 as ct2_lib
from paw_lightning.rollout.ct2 import CT2Engine, assign_calls
from paw_lightning.rollout.engine import GenerationEngine, chat_prompt_ids, merged_weights

from helpers import make_module, metric_history, mlflow_runs, redrawn_lora, tiny_args

pytest.importorskip("ctranslate2")

PROMPTS = ["go up", "a much longer prompt about the frozen lake and its holes", "x"]


def prompt_ids(module):
    return [chat_prompt_ids(module.tokenizer, p) for p in PROMPTS]


def test_greedy_tokens_logprobs_and_entropies_equal_hf(module, tmp_path):
    ids = prompt_ids(module)
    hf_stats, ct2_stats = [], []
    expected = GenerationEngine(module.lm, module.tokenizer, 20).generate_ids(ids, 0.0, 0, stop=None, token_stats=hf_stats)
    sampler = CT2Engine("float32", workdir=str(tmp_path)).sampler(module.lm, module.tokenizer, 20, True, version=0)
    assert sampler.generate_ids(ids, 0.0, 0, stop=None, token_stats=ct2_stats) == expected
    for (hf_lp, hf_ent), (lp, ent) in zip(hf_stats, ct2_stats):
        torch.testing.assert_close(torch.tensor(lp), torch.tensor(hf_lp), atol=1e-5, rtol=0)
        torch.testing.assert_close(torch.tensor(ent), torch.tensor(hf_ent), atol=1e-5, rtol=0)
    # the stop string: a piece of the first row's text ends both engines' rows at the same token
    text = module.tokenizer.decode(expected[0][:12])
    stop = text[-3:]
    hf_cut = GenerationEngine(module.lm, module.tokenizer, 20).generate_ids(ids, 0.0, 0, stop=stop)
    assert sampler.generate_ids(ids, 0.0, 0, stop=stop) == hf_cut
    assert len(hf_cut[0]) <= 12 and stop in module.tokenizer.decode(hf_cut[0])


class CountingGenerator:
    """A CTranslate2 generator that records each call's static prompt and start tokens."""

    def __init__(self, generator, calls: list):
        self.generator, self.calls = generator, calls

    def generate_batch(self, start_tokens, **kwargs):
        self.calls.append((len(kwargs.get("static_prompt") or []), [len(tokens) for tokens in start_tokens]))
        return self.generator.generate_batch(start_tokens, **kwargs)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_calls_shared_prefix_is_forwarded_once_and_samples_the_same(module, tmp_path, temperature):
    """A task group's first step (4 copies of one prompt) and a second group's rows that share
    their head: with ``share_prefixes`` the head goes to CTranslate2 once as the static prompt,
    and the seeded samples, their log-probs and entropies are the plain layout's."""
    encode = lambda text: module.tokenizer.encode(text, add_special_tokens=False)
    head = chat_prompt_ids(module.tokenizer, "you are in a room. your task is to: put a mug in the sink.")
    ids = [head] * 4 + [head + encode("go"), head + encode("up")]
    engine = CT2Engine("float32", workers=1, workdir=str(tmp_path))
    engine.refresh(module.lm, module.tokenizer, version=0)
    results = {}
    for share in (False, True):
        engine.share_prefixes, calls, stats = share, [], []
        sampler = engine.sampler(module.lm, module.tokenizer, 16, True, version=0)
        sampler.load(seed=3)
        sampler.generators = [CountingGenerator(g, calls) for g in sampler.generators]
        results[share] = sampler.generate_ids(ids, temperature, 3, stop=None, token_stats=stats), stats, calls
    (plain, plain_stats, plain_calls), (shared, shared_stats, shared_calls) = results[False], results[True]
    assert shared == plain
    for (lp_plain, ent_plain), (lp, ent) in zip(plain_stats, shared_stats):
        torch.testing.assert_close(torch.tensor(lp), torch.tensor(lp_plain), atol=1e-5, rtol=0)
        torch.testing.assert_close(torch.tensor(ent), torch.tensor(ent_plain), atol=1e-5, rtol=0)
    n, rest = len(head), len(encode("go"))
    assert sorted(plain_calls) == [(0, [n] * 4), (0, [n + rest] * 2)]
    assert sorted(shared_calls) == [(n - 1, [1] * 4), (n, [rest] * 2)]


def test_the_copy_follows_the_weights(module, tmp_path, monkeypatch):
    conversions = []
    original = ct2_lib.convert
    monkeypatch.setattr(ct2_lib, "convert", lambda *a: conversions.append(1) or original(*a))
    engine, ids = CT2Engine("float32", workdir=str(tmp_path)), prompt_ids(module)
    before = engine.sampler(module.lm, module.tokenizer, 12, False, version=0).generate_ids(ids, 0.0, 0, stop=None)
    engine.sampler(module.lm, module.tokenizer, 12, False, version=0)
    assert len(conversions) == 1 and engine.last_sync_seconds > 0  # same version: no new copy
    with redrawn_lora(module.lm):
        after = engine.sampler(module.lm, module.tokenizer, 12, False, version=1).generate_ids(ids, 0.0, 0, stop=None)
        assert len(conversions) == 2
        assert after == GenerationEngine(module.lm, module.tokenizer, 12).generate_ids(ids, 0.0, 0, stop=None) != before


def test_conversion_skips_the_converters_collections_and_restores_them(module, tmp_path, monkeypatch):
    """The converter's per-layer ``gc.collect()`` (0.4 s each in a training process) is skipped
    while converting, and its module's ``gc`` is the real one again after, even after an error."""
    from ctranslate2.converters import transformers as converter_module

    collections = []
    monkeypatch.setattr(gc, "collect", lambda *args: collections.append(1) or 0)
    with torch.no_grad():
        ct2_lib.convert(merged_weights(None, module.lm), module.tokenizer, str(tmp_path / "copy"), "float32")
    assert collections == [] and converter_module.gc is gc and (tmp_path / "copy" / "model.bin").is_file()
    with pytest.raises(Exception):
        with torch.no_grad():  # no tokenizer: fails after the layers (and their collections) are converted
            ct2_lib.convert(merged_weights(None, module.lm), None, str(tmp_path / "bad"), "float32")
    assert converter_module.gc is gc


@pytest.mark.parametrize("workers", [1, 2])
def test_sampling_is_reproducible_from_the_first_calls_seed(module, tmp_path, workers):
    engine, ids = CT2Engine("float32", workers=workers, workdir=str(tmp_path)), prompt_ids(module)
    engine.refresh(module.lm, module.tokenizer, version=0)

    def rollout(seed):  # one sampler = one rollout: several calls
        sampler = engine.sampler(module.lm, module.tokenizer, 10, False, version=0)
        return [sampler.generate_ids(ids, 1.0, seed + t, stop=None) for t in range(2)]

    first = rollout(5)
    assert rollout(5) == first and rollout(6) != first
    assert first[0] != first[1]  # the calls of one rollout continue the stream


def test_calls_split_by_prompt_length_and_go_to_the_least_loaded_worker():
    prompts = [[1] * 5, [1] * 3, [1] * 5, [1] * 9, [1] * 3]  # lengths 5, 3, 5, 9, 3
    # longest first: 9 (1 row) → worker 0 (load 9); 5 (2 rows) → worker 1 (load 10); 3 (2 rows) → worker 0
    assert assign_calls(prompts, 2) == [(0, [3]), (1, [0, 2]), (0, [1, 4])]
    assert assign_calls(prompts, 1) == [(0, [3]), (0, [0, 2]), (0, [1, 4])]


def test_each_worker_samples_its_own_stream(module, tmp_path):
    """At a huge temperature every prompt's distribution is near uniform, so two workers with the
    same random stream would sample the same tokens for their different prompts."""
    engine, ids = CT2Engine("float32", workers=2, workdir=str(tmp_path)), prompt_ids(module)[:2]
    sampler = engine.sampler(module.lm, module.tokenizer, 12, False, version=0)
    assert [worker for worker, _ in assign_calls(ids, 2)] == [0, 1]
    first, second = sampler.generate_ids(ids, 1e6, 3, stop=None)
    shared = min(len(first), len(second))
    assert shared >= 3 and first[:shared] != second[:shared]


def test_a_rollout_leaves_torchs_thread_count_alone(module, tmp_path):
    """CTranslate2 sets the OpenMP thread count of the thread that loads or runs a generator;
    the update after the rollout must still get torch's threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        sampler = CT2Engine("float32", threads=2, workers=2, workdir=str(tmp_path)).sampler(module.lm, module.tokenizer, 4, False, version=0)
        sampler.generate_ids(prompt_ids(module), 1.0, 0, stop=None)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_refusals_name_the_fix(tiny_model_dir):
    engine = CT2Engine()
    with pytest.raises(ValueError, match="one process"):
        engine.check(LMConfig(), world_size=2)
    with pytest.raises(ValueError, match="quantization"):
        engine.check(LMConfig(quantization="nf4"), world_size=1)
    with pytest.raises(ValueError, match="compute_type"):
        CT2Engine("int4")
    with pytest.raises(ValueError, match="workers"):
        CT2Engine(workers=0)
    with pytest.raises(ValueError, match="with CT2Engine set model.old_logprobs: recompute"):
        make_module(tiny_model_dir, engine=CT2Engine(), old_logprobs="rollout")


@pytest.mark.slow
def test_fit_with_the_ct2_engine(tiny_model_dir, tmp_path, monkeypatch):
    from paw_lightning.cli import main

    monkeypatch.chdir(tmp_path)
    main(["fit", *tiny_args(tiny_model_dir, tmp_path, "--model.engine=paw_lightning.rollout.ct2.CT2Engine",
                            "--model.engine.init_args.compute_type=float32", "--trainer.max_epochs=1")])
    client, runs = mlflow_runs(tmp_path)
    assert metric_history(client, runs[0], "train/perf/engine_sync_s")[0] > 0
    assert len(metric_history(client, runs[0], "train/loss")) == 1
    # float32: the copy's log-probs equal the trainer's up to rounding, so every TIS weight is ~1
    assert metric_history(client, runs[0], "train/rollout/engine_kl")[0] < 1e-4
    assert metric_history(client, runs[0], "train/rollout/tis_capped_fraction") == [0.0]
