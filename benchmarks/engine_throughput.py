"""Rollout engines side by side: hf ``generate`` (on the trained model and on a merged copy,
``HFEngine(merge_lora=True)``) vs CTranslate2 int8 and float32 (2 workers, the default) and
int8 with 1 worker (``1w``) at a config's shapes.

First-step prompts of the config's environment (``data.env``, its ``env_kwargs`` and prompt
settings; task seeds 0…N−1) are generated in calls of the config's rollout batch
(``rollout.groups × rollout.group_size``) with its token budget, ``</action>`` stop and
temperature, by each engine on the same policy (base model plus fresh LoRA). The engines
alternate rep by rep (a shared machine drifts); each rep uses another sampling seed. Printed
per engine: response tokens/s (pooled; per rep), the median of the per-rep ratios to hf, the
copy's conversion time (``sync``), and the engine/trainer gap ``engine_kl`` = mean
|log π_engine − log π_θ| over the sampled tokens (π_θ from a forward of the trained model).

    python benchmarks/engine_throughput.py                               # configs/alfworld.yaml
    python benchmarks/engine_throughput.py --config configs/frozenlake.yaml --reps 5
    python benchmarks/engine_throughput.py --device cuda --engines hf,"hf merged",vllm   # a CUDA GPU with vLLM
    python benchmarks/engine_throughput.py --device cuda --engines hf,"hf merged","hf merged static",cb --batch 32 --random 1.5b

``--batch`` replaces the config's rollout batch; ``--model`` its ``model.lm.name_or_path``;
``--random 1.5b`` samples from a randomly initialised model of Qwen2.5-1.5B's shape
(train_throughput.py's) with the config's tokenizer and its vocabulary (random weights sample
random tokens, so rows run to the budget: a speed figure, not a rollout). ``--json`` also
writes the table. ``hf static`` / ``hf merged static``: ``HFEngine(cache="static")`` (on CUDA
transformers compiles the decoding step); ``cb``: ``CBEngine`` (continuous batching).

Every engine records the sampled tokens' log-probs, as a run with ``model.old_logprobs:
rollout`` does: ``cb``'s time includes the scoring forward it runs for them, and its
``engine_kl`` is that forward's gap (the merged copy's), not the paged sampler's.

The torch engines generate in the run's precision (``--precision config``: ``bf16-mixed`` for
a bfloat16 ``dtype: auto`` base, as ``fit`` chooses; autocast, as ``PaWModule.forward_context``),
and π_θ of ``engine_kl`` is computed in it too.

``vllm``: ``VLLMEngine`` without sleep mode (one adapter push, timed as its ``sync``), extra
``vllm.LLM`` arguments as JSON in ``--vllm-kwargs``.

An engine other than ``hf`` that raises (while it is built or while it generates) is left out
of the rest of the comparison and listed with its error (``failed`` in the JSON); the others'
figures are kept.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
warnings.filterwarnings("ignore")

import torch
from machine import machine_load
from train_throughput import RANDOM_CONFIGS, random_peft_model

from paw_lightning.cli import resolved_config
from paw_lightning.envs import make_env_factory
from paw_lightning.model import LMConfig, load_model, load_tokenizer, read_log_softmax
from paw_lightning.rollout.cb_engine import CBEngine
from paw_lightning.rollout.ct2 import CT2Engine
from paw_lightning.rollout.engine import GenerationEngine, HFEngine, chat_prompt_ids
from paw_lightning.rollout.prompts import EpisodeState, PromptBuilder
from paw_lightning.rollout.vllm_engine import VLLMEngine
from paw_lightning.training.precision import auto_precision

CPU_ENGINES = "hf,hf merged,ct2 int8,ct2 int8 1w,ct2 float32"


def first_prompts(data: dict, n: int) -> list[str]:
    """The first prompt of ``n`` episodes of the config's environment (task seeds 0…n−1)."""
    env = make_env_factory(data["env"], **(data["env_kwargs"] or {}))()
    build = PromptBuilder(data["env"].rsplit(".", 1)[-1], data["rollout"]["history_length"], data["rollout"]["prompt_style"])
    prompts = []
    for seed in range(n):
        obs, info = env.reset(seed, 0)
        prompts.append(build.render(EpisodeState.start(obs, info)))
    return prompts


def engine_gap(lm, generations, forward_context) -> float:
    """Mean |log π_engine − log π_θ| over the sampled tokens (π_θ: a forward of the trained model
    in the run's precision, as the scoring pass computes it)."""
    gaps = []
    with torch.no_grad(), forward_context():
        for g in generations:
            ids = torch.tensor([g.prompt_ids + g.response_ids], device=lm.device)
            read = torch.zeros_like(ids, dtype=torch.bool)
            read[0, len(g.prompt_ids):] = True
            logp, targets, _ = read_log_softmax(lm, ids, torch.ones_like(ids, dtype=torch.bool), read, len(g.prompt_ids))
            trainer = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
            gaps.append((trainer.float().cpu() - torch.tensor(g.logprobs)).abs())
    return float(torch.cat(gaps).mean())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "configs/alfworld.yaml"))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--calls", type=int, default=2, help="generate calls per rep and engine (default 2)")
    parser.add_argument("--threads", type=int, default=None, help="torch and CTranslate2 threads (default: torch's choice)")
    parser.add_argument("--engines", default=CPU_ENGINES, help=f"comma-separated, hf first (default: {CPU_ENGINES}; also: vllm)")
    parser.add_argument("--device", default="cpu", help="where the trained model lives (cpu, cuda)")
    parser.add_argument("--precision", choices=["config", "32-true", "bf16-mixed"], default="config",
                        help="the torch engines' precision (default: the config's run's: bf16-mixed for a bfloat16 dtype: auto base)")
    parser.add_argument("--vllm-kwargs", default="{}", help='vllm.LLM arguments as JSON, e.g. \'{"enforce_eager": true}\'')
    parser.add_argument("--batch", type=int, help="prompts per generate call (default: the config's groups × group_size)")
    parser.add_argument("--model", help="model.lm.name_or_path (default: the config's)")
    parser.add_argument("--random", choices=sorted(RANDOM_CONFIGS), help="a randomly initialised model of this shape (the config's tokenizer)")
    parser.add_argument("--json", help="also write the table to this JSON file")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.engines.split(",")]
    if names[0] != "hf":
        parser.error("--engines must start with hf (the ratios are to it)")
    if args.threads:
        torch.set_num_threads(args.threads)
    config = resolved_config(args.config)
    data, rollout = config["data"], config["data"]["rollout"]
    batch, budget, temperature = args.batch or rollout["groups"] * rollout["group_size"], rollout["max_new_tokens"], rollout["temperature"]
    lm_config = LMConfig(**{**config["model"]["lm"], **({"name_or_path": args.model} if args.model else {})})
    tokenizer = load_tokenizer(lm_config)
    lm = random_peft_model(args.random, lm_config, args.device, tokenizer) if args.random else load_model(lm_config)
    lm.to(args.device).eval()
    prompts = first_prompts(data, batch * args.calls)
    precision = args.precision if args.precision != "config" else auto_precision(config["trainer"].get("precision"), lm_config.dtype, args.device)[0] or "32-true"

    def forward_context():  # as PaWModule.forward_context() in the run: autocast under bf16-mixed
        return torch.autocast(torch.device(args.device).type, torch.bfloat16, enabled=precision == "bf16-mixed")
    threads = torch.get_num_threads()

    # a sampler per rep and engine (a CTranslate2 sampler seeds its stream at its first call)
    samplers, sync = {"hf": lambda: GenerationEngine(lm, tokenizer, budget, token_stats=True)}, {"hf": 0.0}
    copies = {
        "hf merged": lambda: HFEngine(merge_lora=True),
        "ct2 int8": lambda: CT2Engine("int8", threads=threads, workers=2, tis_cap=None),
        "ct2 int8 1w": lambda: CT2Engine("int8", threads=threads, workers=1, tis_cap=None),
        "ct2 float32": lambda: CT2Engine("float32", threads=threads, workers=2, tis_cap=None),
        "hf merged static": lambda: HFEngine(merge_lora=True, cache="static"),
        "cb": lambda: CBEngine(tis_cap=None),
        "vllm": lambda: VLLMEngine(sleep=False, tis_cap=None, llm_kwargs=json.loads(args.vllm_kwargs)),
    }
    samplers["hf static"], sync["hf static"] = lambda: GenerationEngine(lm, tokenizer, budget, token_stats=True, cache="static"), 0.0
    failed: dict[str, str] = {}  # engine → its error: left out of the comparison
    for name in [n for n in names[1:] if n != "hf static"]:
        if name not in copies:
            parser.error(f"unknown engine {name!r}: choose from hf, {', '.join(copies)}")
        try:
            engine = copies[name]()
            engine.refresh(lm, tokenizer, version=0)
        except Exception as err:
            failed[name] = f"{type(err).__name__}: {err}"
            continue
        sync[name] = engine.last_sync_seconds
        samplers[name] = lambda engine=engine: engine.sampler(lm, tokenizer, budget, True, version=0)
    print(f"{Path(args.config).name}: {data['env']}, batch {batch}, budget {budget} tokens, temperature {temperature}, "
          f"{len(prompts)} prompts of {statistics.mean(len(chat_prompt_ids(tokenizer, p)) for p in prompts):.0f} tokens; "
          f"{threads} threads, {precision}; at start: {machine_load()}\n")

    samplers = {name: samplers[name] for name in names if name not in failed}  # the order asked for
    rates = {name: [] for name in samplers}
    tokens = {name: 0 for name in samplers}
    seconds = {name: 0.0 for name in samplers}
    generations = {name: [] for name in samplers}
    for rep in range(args.reps + 1):  # rep 0 warms every engine up and is not counted
        for name, make in list(samplers.items()):
            start, out = time.perf_counter(), []
            try:
                sampler = make()
                with forward_context():
                    for k in range(args.calls):
                        out += sampler.generate(prompts[k * batch : (k + 1) * batch], temperature, seed=1000 * rep + k)
            except Exception as err:
                if name == "hf":  # the reference of every ratio
                    raise
                failed[name] = f"{type(err).__name__}: {err}"
                del samplers[name]
                continue
            elapsed = time.perf_counter() - start
            if rep == 0:
                continue
            n = sum(len(g.response_ids) for g in out)
            rates[name].append(n / elapsed)
            tokens[name] += n
            seconds[name] += elapsed
            generations[name] += out

    print(f"{'engine':<16} {'tok/s':>7} {'per rep':>22} {'× hf (median)':>13} {'resp tok':>8} {'sync s':>7} {'engine_kl':>9}")
    table = []
    for name in samplers:
        row = {"engine": name, "tokens_per_s": tokens[name] / seconds[name], "per_rep": rates[name],
               "ratio_to_hf": statistics.median(a / b for a, b in zip(rates[name], rates["hf"])),
               "mean_response_tokens": tokens[name] / max(len(generations[name]), 1), "sync_s": sync[name],
               "engine_kl": engine_gap(lm, generations[name], forward_context)}
        table.append(row)
        per_rep = "/".join(f"{r:.1f}" for r in rates[name])
        print(f"{name:<16} {row['tokens_per_s']:>7.1f} {per_rep:>22} {row['ratio_to_hf']:>12.2f}× {row['mean_response_tokens']:>8.1f} {row['sync_s']:>7.1f} {row['engine_kl']:>9.2e}")
    for name, error in failed.items():
        print(f"{name:<16} failed: {error[:300]}")
    if args.json:
        Path(args.json).write_text(json.dumps({"config": args.config, "model": args.random or lm_config.name_or_path, "batch": batch, "budget": budget,
                                               "device": args.device, "precision": precision, "threads": threads, "engines": table, "failed": failed}, indent=1))
    print("\ntok/s: response tokens / generate wall time over the counted reps; × hf: median of the per-rep ratios;"
          "\nsync: make the merged copy (ct2: also convert and write it; per update in training); engine_kl: mean |log π_engine − log π_θ|.")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
