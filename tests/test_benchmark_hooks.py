"""The benchmarks that time the trainer by wrapping its methods still find them (a renamed or
moved method would otherwise break the benchmark only when someone runs it), the update's
model-FLOP count by hand, and wm_overhead's two updates, prefix_sharing's two rollouts and
micro_batch_rows's two steps, warmup_micro_batches's two warm-ups, scoring_pass's three
scoring passes and activation_memory's count on the tiny model."""
from __future__ import annotations

import sys

import pytest
import torch
from helpers import ROOT, redrawn_lora

sys.path.insert(0, str(ROOT / "benchmarks"))

import activation_memory  # noqa: E402
import epoch_time_split  # noqa: E402
import micro_batch_rows  # noqa: E402
import prefix_sharing  # noqa: E402
import scoring_pass  # noqa: E402
import warmup_micro_batches  # noqa: E402
import wm_overhead  # noqa: E402

from paw_lightning.model import LMConfig, load_model  # noqa: E402


def test_epoch_time_split_wraps_methods_that_exist():
    for owner, name, _, _ in epoch_time_split.HOOKS:
        assert callable(getattr(owner, name, None)), f"{owner.__name__}.{name} is gone: update benchmarks/epoch_time_split.py"


def test_update_flops_by_hand():
    """Rows of 3 and 2 real tokens (prompts 2 and 1), N = 10 linear weights of which N_head = 4,
    2 layers, d_attn = 3. Per row: 4(N − N_head)·ℓ + 4·N_head·(ℓ − keep_from + 1) + 3·2·layers·ℓ²·d_attn."""
    sizes = {"n": 10, "head": 4, "layers": 2, "d_attn": 3}
    batch = {"input_ids": torch.ones(2, 3, dtype=torch.long), "attention_mask": torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool),
             "keep_from": torch.tensor([1]), "prompt_lengths": torch.tensor([2, 1])}
    # one micro-batch, keep_from 1 (the shortest prompt): heads read 3 and 2 positions
    row3, row2 = 4 * (6 * 3 + 4 * 3) + 3 * 2 * 2 * 9 * 3, 4 * (6 * 2 + 4 * 2) + 3 * 2 * 2 * 4 * 3
    assert epoch_time_split.update_flops(batch, None, None, sizes) == {"4N": row3 + row2, "6N": row3 + row2 + 2 * (6 * 3 + 4 * 3) + 2 * (6 * 2 + 4 * 2)}
    # a 3-token budget: one row per micro-batch; the longer row's keep_from is its own prompt (2): its head reads 2 positions
    row3 = 4 * (6 * 3 + 4 * 2) + 3 * 2 * 2 * 9 * 3
    assert epoch_time_split.update_flops(batch, 3, None, sizes)["4N"] == row3 + row2
    assert epoch_time_split.update_flops(batch, None, 1, sizes)["4N"] == row3 + row2  # one row per micro-batch: the same


def test_wm_overhead_compares_two_updates_of_the_configs_module(tiny_model_dir, tmp_path):
    """The benchmark builds the config's module as fit does and times both variants on one
    rollout from the same LoRA weights: PaW's samples are vanilla's plus the observation segments
    of its selected transitions (the closing chat tokens after them included), and an update run
    twice from the saved weights ends at the same weights."""
    args = wm_overhead.parse_args(["--model", str(tiny_model_dir), "-c", str(ROOT / "tests/configs/tiny.yaml"), "--stages.warmup=null"])
    module, data, trainer = wm_overhead.build(args, tmp_path)
    wm_objective = module.world_model_objective
    trajectories = wm_overhead.collect(module, data)
    assert len(trajectories) == data.rollout.groups * data.rollout.group_size
    start = {k: v.clone() for k, v in module.state_dict().items() if "lora_" in k}

    _, vanilla_tokens, vanilla_obs = wm_overhead.update(module, data, trajectories, "vanilla", start, wm_objective)
    after_vanilla = {k: v.clone() for k, v in module.state_dict().items() if "lora_" in k}
    _, paw_tokens, paw_obs = wm_overhead.update(module, data, trajectories, "paw", start, wm_objective)
    assert vanilla_obs == 0 and 0 < paw_obs <= paw_tokens - vanilla_tokens
    assert any(not torch.equal(after_vanilla[k], start[k]) for k in start)  # the update trained the LoRA weights

    wm_overhead.update(module, data, trajectories, "vanilla", start, wm_objective)
    assert all(torch.equal(v, after_vanilla[k]) for k, v in module.state_dict().items() if "lora_" in k)


@pytest.mark.parametrize("engine", ["hf", "ct2"])
def test_prefix_sharing_compares_the_configs_rollouts(tiny_model_dir, capsys, engine):
    """Both settings play the config's rollout of each rep on the same prompts: sharing the
    groups' prompt prefixes forwards fewer tokens and samples the same responses."""
    if engine == "ct2":
        pytest.importorskip("ctranslate2")
    chosen = ["--model.engine=paw_lightning.rollout.ct2.CT2Engine", "--model.engine.init_args.compute_type=float32",
              "--model.old_logprobs=recompute"] if engine == "ct2" else []
    results = prefix_sharing.main(["--model", str(tiny_model_dir), "-c", str(ROOT / "tests/configs/tiny.yaml"), "--stages.warmup=null",
                                   "--group-size", "4", "--reps", "2", *chosen])
    for plain, shared in zip(results["plain"], results["shared"]):
        assert shared[1] < plain[1]
        assert shared[2] == plain[2]
    assert "the same responses in 2 of 2 rollouts" in capsys.readouterr().out


def test_micro_batch_rows_times_the_same_work_both_ways(tiny_model_dir, capsys):
    """Batched (padded) and one sample at a time accumulate the same LoRA gradients, so the
    benchmark's ratio compares equal work; its table names both ways and their ratio."""
    torch.manual_seed(0)
    lm = load_model(LMConfig(name_or_path=str(tiny_model_dir), dtype="float32", lora_r=4))
    samples = [torch.randint(0, lm.config.vocab_size, (n,)) for n in (20, 12, 9)]
    grads = []
    with redrawn_lora(lm, std=0.3):  # a non-zero adapter: lora_A gets gradients too
        for parts in ([samples], [[s] for s in samples]):
            lm.zero_grad(set_to_none=True)
            for part in parts:
                micro_batch_rows.step(lm, part, response=4)
            grads.append({n: p.grad.clone() for n, p in lm.named_parameters() if p.requires_grad})
    assert grads[0] and all(g.abs().max() > 0 for g in grads[0].values())
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-4, atol=1e-4, msg=name)  # float32, summed in another order; gradients are ~1

    seconds = micro_batch_rows.main(["--model", str(tiny_model_dir), "--lengths", "20", "12", "9", "--response", "4", "--reps", "2"])
    assert {name: len(times) for name, times in seconds.items()} == {"batched": 2, "one at a time": 2}
    out = capsys.readouterr().out
    assert "3 samples of 20 + 12 + 9 tokens (60 padded, 41 real), forward + backward" in out
    assert "batched / one at a time:" in out


def test_warmup_micro_batches_times_both_ways_on_the_same_demonstrations(tiny_model_dir, capsys):
    """One demonstration per forward computes exactly the demonstrations' tokens; whole batches
    compute them plus their padding, on the same demonstration steps."""
    seconds, positions, lengths = warmup_micro_batches.main(
        ["--model", str(tiny_model_dir), "-c", str(ROOT / "tests/configs/tiny.yaml"), "--stages.warmup=null", "--warmup", "3",
         "--epochs", "1", "--reps", "2", "--model.micro_batch_rows=1"])
    assert all(len(times) == 2 and min(times) > 0 for times in seconds.values())
    assert len(set(lengths)) > 1 and positions["split"] == sum(lengths) < positions["whole"]
    assert "whole / split:" in capsys.readouterr().out


def test_scoring_pass_times_three_chunkings_of_the_same_samples(tiny_model_dir, capsys):
    """One sample per forward computes exactly the samples' tokens, forwards grouped by length
    pad less than neighbours do, and the three give the same π_old up to rounding."""
    seconds, positions, gaps = scoring_pass.main(
        ["--model", str(tiny_model_dir), "-c", str(ROOT / "tests/configs/tiny.yaml"), "--stages.warmup=null", "--batch", "4", "--reps", "2"])
    assert all(len(times) == 2 and min(times) > 0 for times in seconds.values())
    assert positions["one"] < positions["by_length"] < positions["neighbours"]
    assert gaps["one"] == 0.0 and max(gaps.values()) < 1e-3  # float32 rounding of other paddings: up to 1.2e-4 seen on an AVX-512 CPU
    out = capsys.readouterr().out
    assert "neighbours / by_length:" in out and "one / by_length:" in out


def test_activation_memory_counts_what_backward_keeps(tiny_model_dir, capsys):
    """The float32 log-softmax at the read positions is saved whole, 4 bytes × positions × vocabulary;
    the parameters are not counted; checkpointed layers keep far less."""
    rows, seq_len, read = 3, 40, 5
    counts = {}
    for checkpointed in (False, True):
        lm = load_model(LMConfig(name_or_path=str(tiny_model_dir), dtype="float32", gradient_checkpointing=checkpointed))
        lm.train()
        counts[checkpointed] = activation_memory.saved_for_backward(lm, rows, seq_len, read)
        vocab = lm.config.vocab_size
        assert counts[checkpointed][(rows * read, vocab)] == 4 * rows * read * vocab
        assert not any(shape == tuple(p.shape) for p in lm.parameters() if p.dim() == 2 for shape in counts[checkpointed])
    assert sum(counts[True].values()) < sum(counts[False].values()) / 2

    activation_memory.main(["--model", str(tiny_model_dir), "--rows", "2", "--seq-len", "16", "--read-tokens", "4"])
    assert "2 x 16 tokens, 4 read per row:" in capsys.readouterr().out


def test_engine_throughput_keeps_the_figures_of_the_engines_that_ran(tiny_model_dir, tmp_path, monkeypatch):
    """An engine that raises while it is built (here vLLM, not installed on a CPU machine) or while
    it generates (here a continuous-batching engine made to fail) is listed with its error; hf's
    figures are still written."""
    import json

    import engine_throughput

    class GeneratesNothing:
        last_sync_seconds = 0.0

        def __init__(self, **kwargs):
            pass

        def refresh(self, lm, tokenizer, version):
            pass

        def sampler(self, *args, **kwargs):
            raise RuntimeError("no rows today")

    try:
        import vllm  # noqa: F401
        pytest.skip("vLLM is installed: it would run")
    except ImportError:
        pass
    monkeypatch.setattr(engine_throughput, "CBEngine", GeneratesNothing)
    out, threads = tmp_path / "gen.json", torch.get_num_threads()
    try:
        engine_throughput.main(["--config", str(ROOT / "configs/frozenlake.yaml"), "--model", str(tiny_model_dir), "--engines", "hf,vllm,cb",
                                "--batch", "2", "--reps", "1", "--calls", "1", "--threads", "1", "--json", str(out)])
    finally:
        torch.set_num_threads(threads)
    data = json.loads(out.read_text())
    assert [row["engine"] for row in data["engines"]] == ["hf"] and data["engines"][0]["tokens_per_s"] > 0
    assert "needs vLLM" in data["failed"]["vllm"] and data["failed"]["cb"] == "RuntimeError: no rows today"
