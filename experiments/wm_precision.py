"""Does bf16-mixed learn the world model as float32 does? A world-model-only fit on fixed data.

The main job's two precisions train on different rollouts (their policies sample different
tokens), so their fixed-set drops mix arithmetic with data. Here both precisions fit the very
same transitions with the very same steps, so only the arithmetic differs:

- training data: the expert's and random admissible actions' episodes on ``--tasks`` tasks of
  the main job's training split (``configs/alfworld.yaml``), every step one transition, in the
  policy's format (:func:`paw_lightning.fixed_set.scripted_trajectories`);
- scored on: the main job's held-out fixed set without its start policy (expert and random on
  the first 4 held-out games, 16 transitions each, as ``data.evaluation.fixed`` plays them),
  teacher-forced NLL over every observation token;
- the fit: the embedded model with a fresh LoRA (no warm-up), the main job's world-model loss
  (clipped MAE, ρ = 0.2, λ = 1, every transition selected) or plain CE (``--loss ce``), AdamW at
  the main job's lr (1e-4), the gradient norm clipped at 1.0, mini-batches of 4 in a shuffled
  order that ``--seed`` fixes, for ``--epochs`` passes;
- precisions: ``float32`` (a float32 base), ``bf16-mixed`` (a bfloat16 base, every forward
  under CPU autocast to bfloat16: what ``dtype: auto`` runs on a CPU with AVX-512 BF16; LoRA
  weights and Adam's state float32 in both).

Prints one line per precision (NLL before → after, the drop, the mean gradient norm before
clipping) and the ratio of the drops; ``--out`` writes them as JSON::

    python experiments/wm_precision.py --precisions float32 bf16-mixed --seed 0
"""
from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def build(precision: str):
    """The main job's module and data module (no trainer), the model loaded in ``precision``'s base dtype."""
    from paw_lightning.cli import PawCLI

    dtype = "float32" if precision == "float32" else "bfloat16"
    cli = PawCLI(args=["-c", str(ROOT / "configs/alfworld.yaml"), f"--model.lm.dtype={dtype}", "--stages.warmup=null", "--trainer.logger=false",
                       "--trainer.enable_progress_bar=false", "--data.progress=false"], run=False)
    cli.model.configure_model()
    return cli.model, cli.datamodule


def transitions(datamodule, tokenizer, split: str, factory, task_seeds: list[int], keep: int | None):
    """Expert and random episodes on ``task_seeds`` as one sample buffer per source (at most ``keep``
    transitions each, spread evenly over the steps, as the fixed set keeps them)."""
    from paw_lightning.fixed_set import keep_spread, opened, scripted_trajectories
    from paw_lightning.rollout.samples import build_buffer

    buffers = {}
    with opened(factory, f"the {split} transitions") as env:
        for source in ("expert", "random"):
            played = scripted_trajectories(env, tokenizer, datamodule.prompt, task_seeds, source, 0, datamodule.rollout.max_steps)
            buffers[source] = build_buffer(keep_spread(played, keep) if keep else played, tokenizer)
    return buffers


def autocast(precision: str):
    return torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16-mixed" else contextlib.nullcontext()


def held_out_nll(module, samples, precision: str) -> dict[str, float]:
    from paw_lightning.evaluation import fixed_set_quality

    module.lm.eval()
    with torch.no_grad(), autocast(precision):
        scores = fixed_set_quality(module.token_outputs, samples, 4, "cpu", module.tokenizer.eos_token_id)
    module.lm.train()
    return {k: scores[f"{k}/nll"] for k in ("all", *samples)}


def fit(precision: str, args) -> dict:
    from paw_lightning.objectives import ClippedMAE, FixedLambda, WorldModelObjective
    from paw_lightning.rollout.collector import derive_seed as task_seed

    torch.manual_seed(args.seed)
    module, datamodule = build(precision)
    tokenizer = module.tokenizer
    train = transitions(datamodule, tokenizer, "train", datamodule.env_factory, [task_seed("wm-precision", g) for g in range(args.tasks)], None)
    held_out = transitions(datamodule, tokenizer, "val", datamodule.eval_env_factory, [task_seed("val", g) for g in range(4)], 16)
    samples = [(buffer, i) for buffer in train.values() for i in range(len(buffer))]
    objective = (ClippedMAE(rho=0.2, alpha=1.0, balancer=FixedLambda(1.0)) if args.loss == "cmae"
                 else WorldModelObjective(alpha=1.0, balancer=FixedLambda(1.0)))
    params = [p for p in module.lm.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.lr)
    before = held_out_nll(module, held_out, precision)
    norms, started = [], time.perf_counter()
    order = random.Random(args.seed)
    for epoch in range(args.epochs):
        order.shuffle(samples)
        for start in range(0, len(samples) - args.batch + 1, args.batch):
            chunk = samples[start : start + args.batch]
            for buffer, i in chunk:  # one unpadded sample per forward, as the main job (micro_batch_rows: 1)
                batch = buffer.collate([i])
                with autocast(precision):
                    logprobs = module.token_outputs(batch)["logprobs"]
                    loss = objective(logprobs, batch["obs_mask"], batch["group_ids"], torch.ones(1)).loss / len(chunk)
                loss.backward()
            norms.append(float(torch.nn.utils.clip_grad_norm_(params, 1.0)))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        print(f"  {precision}: epoch {epoch + 1}/{args.epochs}, {len(norms)} steps, {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    after = held_out_nll(module, held_out, precision)
    return {"precision": precision, "before": before, "after": after, "drop": before["all"] - after["all"], "steps": len(norms),
            "grad_norm_mean": sum(norms) / len(norms), "train_transitions": len(samples), "seconds": time.perf_counter() - started}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--precisions", nargs="+", default=["float32", "bf16-mixed"], choices=["float32", "bf16-mixed"])
    parser.add_argument("--loss", default="cmae", choices=["cmae", "ce"])
    parser.add_argument("--tasks", type=int, default=8, help="training-split tasks the expert and random actions play")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="write the results here as JSON")
    args = parser.parse_args(argv)
    results = []
    for precision in args.precisions:
        r = fit(precision, args)
        results.append(r)
        print(f"{precision:>10}: held-out NLL {r['before']['all']:.4f} -> {r['after']['all']:.4f} (drop {r['drop']:.4f}; expert "
              f"{r['before']['expert']:.3f} -> {r['after']['expert']:.3f}, random {r['before']['random']:.3f} -> {r['after']['random']:.3f}), "
              f"{r['steps']} steps on {r['train_transitions']} transitions, mean grad norm {r['grad_norm_mean']:.3f}, {r['seconds']:.0f} s", flush=True)
    if len(results) == 2 and results[0]["drop"]:
        print(f"drop ratio {results[1]['precision']} / {results[0]['precision']}: {results[1]['drop'] / results[0]['drop']:.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
