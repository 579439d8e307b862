"""The hf engine on a merged copy (``HFEngine(merge_lora=True)``) against the hf reference on the
tiny float32 model built in code: the same greedy and sampled tokens, log-probs within float32
rounding, the copy rewritten when the weights' version moves (and only then), the trained
model untouched, and clear refusals."""
from __future__ import annotations

import pytest
import torch

from paw_lightning.model import LMConfig
from paw_lightning.rollout.engine import GenerationEngine, HFEngine, chat_prompt_ids

from helpers import make_module, metric_history, mlflow_runs, redrawn_lora, tiny_args

PROMPTS = ["go up", "a much longer prompt about the frozen lake and its holes", "x"]


def test_merged_copy_samples_as_the_trained_model(module):
    ids = [chat_prompt_ids(module.tokenizer, p) for p in PROMPTS]
    frozen = {n: p.detach().clone() for n, p in module.lm.named_parameters()}
    sampler = HFEngine(merge_lora=True).sampler(module.lm, module.tokenizer, 16, True, version=0)
    assert sampler.model is not module.lm and not any("lora" in n for n, _ in sampler.model.named_parameters())
    for temperature, seed in ((0.0, 0), (1.0, 3)):
        ref_stats, merged_stats = [], []
        expected = GenerationEngine(module.lm, module.tokenizer, 16).generate_ids(ids, temperature, seed, stop=None, token_stats=ref_stats)
        assert sampler.generate_ids(ids, temperature, seed, stop=None, token_stats=merged_stats) == expected
        for (ref_lp, ref_ent), (lp, ent) in zip(ref_stats, merged_stats):
            torch.testing.assert_close(torch.tensor(lp), torch.tensor(ref_lp), atol=1e-5, rtol=0)
            torch.testing.assert_close(torch.tensor(ent), torch.tensor(ref_ent), atol=1e-5, rtol=0)
    # the trained model keeps its adapters and its weights, bit for bit
    assert all(torch.equal(p, frozen[n]) for n, p in module.lm.named_parameters())


def test_the_copy_is_rewritten_when_the_version_moves(module):
    engine, ids = HFEngine(merge_lora=True), [chat_prompt_ids(module.tokenizer, p) for p in PROMPTS]
    before = engine.sampler(module.lm, module.tokenizer, 12, False, version=0).generate_ids(ids, 0.0, 0, stop=None)
    copy, synced = engine.merged, engine.last_sync_seconds
    with redrawn_lora(module.lm):
        stale = engine.sampler(module.lm, module.tokenizer, 12, False, version=0).generate_ids(ids, 0.0, 0, stop=None)
        assert stale == before and engine.last_sync_seconds == synced  # same version: the copy is kept as it is
        after = engine.sampler(module.lm, module.tokenizer, 12, False, version=1).generate_ids(ids, 0.0, 0, stop=None)
        assert engine.merged is copy  # rewritten in place, not copied again
        assert after == GenerationEngine(module.lm, module.tokenizer, 12).generate_ids(ids, 0.0, 0, stop=None) != before


def test_refusals_name_the_fix():
    with pytest.raises(ValueError, match="one process.*merge_lora=false"):
        HFEngine(merge_lora=True).check(LMConfig(), world_size=2)
    with pytest.raises(ValueError, match="unquantized"):
        HFEngine(merge_lora=True).check(LMConfig(quantization="nf4"), world_size=1)
    HFEngine().check(LMConfig(quantization="nf4"), world_size=2)  # the reference serves any setting


@pytest.mark.slow
def test_fit_with_the_merged_copy(tiny_model_dir, tmp_path, monkeypatch):
    from paw_lightning.cli import main

    monkeypatch.chdir(tmp_path)
    main(["fit", *tiny_args(tiny_model_dir, tmp_path, "--model.engine=paw_lightning.rollout.engine.HFEngine",
                            "--model.engine.init_args.merge_lora=true", "--model.old_logprobs=rollout", "--trainer.max_epochs=2")])
    client, runs = mlflow_runs(tmp_path)
    assert len(metric_history(client, runs[0], "train/loss")) == 2
    assert all(s > 0 for s in metric_history(client, runs[0], "train/perf/engine_sync_s"))


def test_stages_before_the_first_update_refresh_the_copy(tiny_model_dir):
    """The warm-up fits the weights at global step 0: a sampler asked for after it must sample
    the new weights, not the copy made before it."""
    from paw_lightning.callbacks.warmup import BehaviourCloningWarmup
    from paw_lightning.data import RolloutDataModule, RolloutSettings

    module = make_module(tiny_model_dir, engine=HFEngine(merge_lora=True))
    module.lm.eval()
    ids = [chat_prompt_ids(module.tokenizer, p) for p in PROMPTS]
    before = module.sampler(12).generate_ids(ids, 0.0, 0, stop=None)
    datamodule = RolloutDataModule(env="frozenlake", rollout=RolloutSettings(max_steps=3, history_length=1), progress=False)
    BehaviourCloningWarmup(demonstrations=2, epochs=4, lr=1e-2, batch_size=2, progress=False).warm_up(module, datamodule)
    module.lm.eval()
    after = module.sampler(12).generate_ids(ids, 0.0, 0, stop=None)
    assert module.global_step == 0
    assert after == GenerationEngine(module.lm, module.tokenizer, 12).generate_ids(ids, 0.0, 0, stop=None) != before
