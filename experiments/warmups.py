"""What each kind of behaviour-cloning warm-up leaves RL to work with: action-choice
entropy, invalid-action rate and held-out success after an ``expert`` and after a
``random_valid`` warm-up, on the learning benchmark's setting.

    python experiments/warmups.py                     # configs/frozenlake.yaml + configs/learning/frozenlake.yaml
    python experiments/warmups.py --config configs/frozenlake.yaml --overlay configs/warmup.yaml

For each source the warm-up of the overlay (its ``stages.warmup`` settings with
``source`` replaced; trained once, cached in its ``cache_dir``) is applied to a fresh
model, then, on the validation tasks (``derive_seed("val", g)``, as a fit validates):

- **action-choice entropy**: at each task's first state, the distribution over the
  admissible actions of the complete response ``<think>{reason}</think><action>a</action>``
  (the log-probability of ``a</action>`` after the fixed prefix, normalised over the
  admissible ``a``) and its entropy in nats (uniform over 4 actions: ln 4 = 1.386);
- **held-out success and invalid-action rate**: one episode per task at
  ``data.evaluation.temperature`` with the data module's prompt and step budget.
"""
from __future__ import annotations

import argparse
import copy
import math
import sys
from pathlib import Path

import torch
import yaml

from paw_lightning.callbacks import BehaviourCloningWarmup
from paw_lightning.cli import PawCLI
from paw_lightning.demonstrations import Demonstration, collate, response_ids, token_logprobs
from paw_lightning.envs import EnvPool
from paw_lightning.metrics import episode_metrics
from paw_lightning.rollout.collector import Collector, derive_seed
from paw_lightning.rollout.engine import GenerationEngine, chat_prompt_ids

ROOT = Path(__file__).resolve().parents[1]


def warmup_settings(overlay: Path) -> dict:
    """The init_args of the overlay's warm-up (``stages.warmup``)."""
    warmup = (yaml.safe_load(overlay.read_text()).get("stages") or {}).get("warmup") or {}
    if not warmup.get("class_path", "BehaviourCloningWarmup").endswith("BehaviourCloningWarmup"):
        sys.exit(f"{overlay}'s stages.warmup is not a BehaviourCloningWarmup")
    if not warmup:
        sys.exit(f"{overlay} has no warm-up (stages.warmup)")
    return dict(warmup.get("init_args") or {})


@torch.no_grad()
def action_distribution(module, datamodule, reason: str, task_seeds: list[int]) -> list[torch.Tensor]:
    """Per task: probabilities of its admissible actions at the first state."""
    env, out = datamodule.eval_env_factory(), []
    for seed in task_seeds:
        obs, info = env.reset(seed, 0)
        actions = [a for a in info["admissible_actions"] if a != "help"]
        prompt = chat_prompt_ids(module.tokenizer, datamodule.prompt(info["task"], obs, [], info["admissible_actions"]))
        rows = []
        for action in actions:
            ids, is_action = response_ids(module.tokenizer, f"<think>{reason}</think><action>{action}</action>", action)
            first = is_action.index(True)
            scored = [False] * first + [True] * (len(ids) - 1 - first) + [False]  # the action and </action>, not eos
            rows.append(Demonstration(torch.tensor(prompt + ids), torch.tensor([False] * len(prompt) + scored), torch.tensor([False] * len(prompt) + is_action), "", "", action, seed, 0))
        batch = collate(rows, module.tokenizer.pad_token_id)
        logp = token_logprobs(module.lm, {k: v.to(module.device) for k, v in batch.items()}).sum(-1)
        out.append(torch.softmax(logp.float(), dim=0).cpu())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/frozenlake.yaml")
    parser.add_argument("--overlay", default="configs/learning/frozenlake.yaml", help="a config with a warm-up (stages.warmup)")
    parser.add_argument("--sources", nargs="+", default=["expert", "random_valid"])
    parser.add_argument("--seed", type=int, default=0, help="sampling seed of the episodes")
    args, extra = parser.parse_known_args()
    overlay = Path(args.overlay)
    settings = warmup_settings(overlay)
    rows = []
    for source in args.sources:
        cli = PawCLI(args=["-c", args.config, "-c", str(overlay), "--trainer.logger=false", "--data.progress=false", *extra], run=False)
        module, datamodule = cli.model, cli.datamodule
        module.configure_model()
        warmup = BehaviourCloningWarmup(**{**copy.deepcopy(settings), "source": source, "progress": False})
        warmup.warm_up_or_load(module, datamodule)
        seeds = [derive_seed("val", g) for g in range(datamodule.evaluation.groups)]
        probs = action_distribution(module, datamodule, warmup.reason, seeds)
        entropy = sum(float(-(p * p.clamp_min(1e-12).log()).sum()) for p in probs) / len(probs)
        pool = EnvPool(datamodule.eval_env_factory, len(seeds))
        collector = Collector(pool, GenerationEngine(module.lm, module.tokenizer, datamodule.rollout.max_new_tokens), datamodule.prompt, datamodule.rollout.max_steps, datamodule.rollout.invalid_penalty)
        with module.generating():
            trajectories = collector.collect(list(enumerate(seeds)), 1, datamodule.evaluation.temperature, derive_seed(args.seed, "val", 0), progress=False)
        pool.close()
        metrics = episode_metrics(trajectories)
        rows.append((source, entropy, math.log(len(probs[0])), metrics["success_rate"], metrics["invalid_rate"], len(seeds)))
    print(f"\nAfter each warm-up ({args.config} + {overlay}; {rows[0][5]} held-out tasks, temperature {datamodule.evaluation.temperature}):\n")
    print("| warm-up source | action-choice entropy (nats) | held-out success % | invalid-action rate % |")
    print("|---|---|---|---|")
    for source, entropy, max_entropy, success, invalid, _ in rows:
        print(f"| {source} | {entropy:.3f} (uniform: {max_entropy:.3f}) | {100 * success:.1f} | {100 * invalid:.1f} |")


if __name__ == "__main__":
    main()
