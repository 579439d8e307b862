"""Rollout generation throughput of `GenerationEngine.generate` on real FrozenLake prompts.

Builds first-step FrozenLake prompts (``PromptBuilder`` on ``FrozenLakeEnv`` resets of
different seeds), loads the policy exactly as training does (``load_model``: base LM plus
fresh LoRA adapters) and times ``GenerationEngine.generate`` at batch 1 and at the batch
of one training rollout step (``data.groups × data.group_size`` of the config file).
Sampling temperature and ``max_new_tokens`` come from the config too.

Both batch sizes generate for the *same* prompts: batch 1 runs them one call at a time,
the batched run in calls of ``batch`` prompts. One warm-up call per batch size, then
``--reps`` timed repetitions, each with another sampling seed. "new tokens" are the
response tokens the engine returns (cut after ``</action>`` or EOS), not the padded
length the batched ``generate`` computes; the padded per-call width is reported too.

    python benchmarks/rollout_throughput.py                      # embedded SmolLM2-135M
    python benchmarks/rollout_throughput.py --reps 5 --batch-sizes 1 4 8
"""
from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
import yaml  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from paw_lightning.envs import FrozenLakeEnv  # noqa: E402
from paw_lightning.model import LMConfig, load_model, load_tokenizer  # noqa: E402
from paw_lightning.rollout.engine import GenerationEngine  # noqa: E402
from paw_lightning.rollout.prompts import PromptBuilder  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "configs/frozenlake.yaml"), help="training config: batch, max_new_tokens, temperature, LoRA, env")
    p.add_argument("--model", default="embedded", help="LMConfig.name_or_path")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=None, help="default: 1 and data.groups × data.group_size of the config")
    p.add_argument("--reps", type=int, default=3, help="timed repetitions per batch size (after one warm-up call)")
    p.add_argument("--temperature", type=float, default=None, help="default: data.temperature of the config")
    p.add_argument("--max-new-tokens", type=int, default=None, help="default: data.max_new_tokens of the config")
    p.add_argument("--seed", type=int, default=0, help="first FrozenLake map seed; prompt i uses seed + i")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    return p.parse_args()


def frozenlake_prompts(n: int, seed: int, env_kwargs: dict, history_length: int) -> list[str]:
    """First-step prompts of ``n`` FrozenLake maps (seeds ``seed … seed+n-1``)."""
    env, build = FrozenLakeEnv(**env_kwargs), PromptBuilder("frozenlake", history_length)
    prompts = []
    for i in range(n):
        obs, info = env.reset(seed + i)
        prompts.append(build(info["task"], obs, [], info["admissible_actions"]))
    return prompts


def run(engine: GenerationEngine, prompts: list[str], batch: int, temperature: float, seed: int) -> dict:
    """Generate for all ``prompts`` in calls of ``batch``; wall time and token counts."""
    calls = [prompts[i : i + batch] for i in range(0, len(prompts), batch)]
    generations, padded, seconds = [], 0, 0.0
    for k, chunk in enumerate(calls):
        start = time.perf_counter()
        out = engine.generate(chunk, temperature, seed * 1000 + k)
        seconds += time.perf_counter() - start
        padded += max(len(g.response_ids) for g in out)  # steps generate ran (upper bound: max_new_tokens)
        generations += out
    return {
        "seconds": seconds,
        "prompts": len(generations),
        "new_tokens": sum(len(g.response_ids) for g in generations),
        "prompt_tokens": sum(len(g.prompt_ids) for g in generations),
        "decode_steps": padded,
        "calls": len(calls),
        "stopped": sum(g.text.rstrip().endswith("</action>") or len(g.response_ids) < engine.max_new_tokens for g in generations),
    }


def main() -> None:
    args = parse_args()
    warnings.filterwarnings("ignore")
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    logging.getLogger("paw_lightning").setLevel(logging.WARNING)
    if args.threads:
        torch.set_num_threads(args.threads)

    cfg = yaml.safe_load(Path(args.config).read_text())
    data = cfg["data"]
    default_batch = data["groups"] * data["group_size"]
    batch_sizes = args.batch_sizes or [1, default_batch]
    temperature = data.get("temperature", 1.0) if args.temperature is None else args.temperature
    max_new_tokens = args.max_new_tokens or data["max_new_tokens"]
    lm_kwargs = {k: v for k, v in cfg.get("model", {}).get("lm", {}).items() if k != "name_or_path"}
    lm = LMConfig(name_or_path=args.model, **lm_kwargs)

    start = time.perf_counter()
    tokenizer, model = load_tokenizer(lm), load_model(lm)
    model.eval()
    load_s = time.perf_counter() - start
    engine = GenerationEngine(model, tokenizer, max_new_tokens)
    n_prompts = max(batch_sizes)  # every batch size generates for the same prompts
    prompts = frozenlake_prompts(n_prompts, args.seed, data.get("env_kwargs") or {}, data.get("history_length", 2))

    print(f"model {args.model!r} (LoRA r={lm.lora_r} on {lm.lora_target_modules}, {lm.dtype}) loaded in {load_s:.1f} s; "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs")
    print(f"config {Path(args.config).name}: default batch = groups {data['groups']} × group_size {data['group_size']} = {default_batch}; "
          f"max_new_tokens {max_new_tokens}, temperature {temperature}; {n_prompts} prompts (map seeds {args.seed}…{args.seed + n_prompts - 1}), "
          f"{args.reps} reps after 1 warm-up call\n")

    rows = {}
    for batch in batch_sizes:
        engine.generate(prompts[:batch], temperature, seed=10**6 + batch)  # warm-up
        reps = [run(engine, prompts, batch, temperature, seed=rep + 1) for rep in range(args.reps)]
        total = {k: sum(r[k] for r in reps) for k in reps[0]}
        rate = [r["new_tokens"] / r["seconds"] for r in reps]
        rows[batch] = dict(
            total,
            tok_s=total["new_tokens"] / total["seconds"],
            tok_s_sd=statistics.stdev(rate) if len(rate) > 1 else 0.0,
            prompts_s=total["prompts"] / total["seconds"],
        )

    header = (f"{'batch':>5} {'calls':>5} {'prompts/s':>9} {'new tok/s':>15} {'mean prompt tok':>15} {'mean resp tok':>13} "
              f"{'new tokens':>10} {'decode steps':>12} {'stopped':>8} {'wall s':>7} {'speed-up':>8}")
    print(header)
    print("-" * len(header))
    base = rows.get(1, rows[batch_sizes[0]])["tok_s"]
    for batch, r in rows.items():
        n = r["prompts"]
        print(f"{batch:>5} {r['calls']:>5} {r['prompts_s']:>9.3f} {r['tok_s']:>8.1f} ± {r['tok_s_sd']:<4.1f} "
              f"{r['prompt_tokens'] / n:>15.1f} {r['new_tokens'] / n:>13.1f} {r['new_tokens']:>10} {r['decode_steps']:>12} "
              f"{r['stopped']:>4}/{n:<3} {r['seconds']:>7.1f} {r['tok_s'] / base:>7.2f}x")
    print("\nnew tok/s = response tokens returned (cut at </action> or EOS) / wall time of generate, summed over the reps (± sd across reps);"
          "\ndecode steps = Σ over calls of the longest response (forward passes generate ran); stopped = responses that ended before max_new_tokens;"
          f"\nspeed-up = new tok/s relative to batch {1 if 1 in rows else batch_sizes[0]}.")


if __name__ == "__main__":
    sys.exit(main())
