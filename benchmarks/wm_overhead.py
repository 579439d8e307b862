"""Cost of PaW's world-model term: one update with PaW vs the same update without it.

The module, data settings and trainer precision are the config's own, built as ``fit``
builds them (``PawCLI(run=False)``: model dtype, ``trainer.precision``, rollout engine,
``model.old_logprobs``, advantage estimator, KL coefficient, ``micro_batch_tokens`` and ``_rows``,
``max_grad_norm``, optimizer). Both variants train on the *same* rollout, collected once
with the config's engine and settings:

- ``vanilla``: samples ``[prompt][response]``, policy loss only (``configs/objectives/vanilla.yaml``);
- ``paw``:     samples ``[prompt][response][next observation]``, policy loss + the config's
               world-model objective on the top-α entropy transitions, reward-adaptive λ.

Time: one whole update, as the data module and ``training_step`` run it: sample building,
``prepare_update`` (the scoring pass where the config needs one: π_old unless
``old_logprobs: rollout``, π_ref when the KL coefficient is > 0; advantages; S_α and λ_g
for PaW) and the optimisation over all mini-batches of ``data.mini_batch_size`` (forward
in the trainer's precision and backward over its micro-batches, gradient
clipping, optimizer step), from the same LoRA weights and a fresh optimizer. The two variants
alternate ``--repeats`` times in one process after an untimed update of each; the medians,
their ratio and each alternated pair's ratio are printed. The paper reports 1.021× per step
on GPUs.

Tokens: the training forwards' tokens of each variant, and the observation share: the
next-observation tokens PaW adds (selected transitions only: the others lose their
observation segment), as a share of PaW's tokens.

Peak memory: on CUDA, ``torch.cuda.max_memory_allocated`` of each variant's update in this
process. On CPU, each variant runs in its own child process on the saved rollout, and the
growth of peak RSS during the update (peak − RSS before it; Linux's VmHWM, reset after the
model load) is compared, and printed for ``prepare_update`` and the optimisation apart.

Warm-up: the config's behaviour-cloning warm-up callback when it has one (``configs/alfworld.yaml``,
cached as in ``fit``), or ``--warmup N`` expert episodes (2 epochs, batch 2, lr 1e-4, cached
in ``<cache>/warmup``), so the rollout is a format-following policy's: the untrained embedded
model's invalid actions get one-line observations ("Nothing happens."), which understates
the world-model segment.

    python benchmarks/wm_overhead.py --warmup 8 --groups 1 --group-size 4     # configs/frozenlake.yaml
    python benchmarks/wm_overhead.py --warmup 8 --groups 1 --group-size 4 -c configs/sokoban.yaml   # Sokoban: an overlay on FrozenLake's recipe
    python benchmarks/wm_overhead.py --config configs/alfworld.yaml           # the main job's update, after its warm-up
    python benchmarks/wm_overhead.py --model /path/to/model --repeats 5 --model.lm.dtype=float32   # other args go to the CLI
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "ERROR")
warnings.filterwarnings("ignore")

import configured
import torch
from configured import collect, warm_up
from machine import machine_load, peak_rss_bytes, reset_peak_rss, rss_bytes

from paw_lightning.rollout.samples import build_buffer
from paw_lightning.training.microbatch import micro_batches
from paw_lightning.update import prepare_update

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("vanilla", "paw")


def build(args, workdir: Path):
    """The config's module, data module and trainer (:func:`configured.build`); a PaW config only."""
    module, data, trainer = configured.build(args, workdir)
    if module.world_model_objective is None:
        sys.exit(f"{args.config} has no world-model objective: nothing to compare (use a PaW config)")
    return module, data, trainer


def update(module, data, trajectories, variant: str, start_state: dict, wm_objective, after_prepare=None) -> tuple[float, int, int]:
    """One whole update of ``variant`` from ``start_state``: samples, ``prepare_update``,
    optimisation (``after_prepare()``, if given, is called between the two). Returns its wall
    time in seconds, the tokens of its training forwards and the observation tokens among them."""
    paw = variant == "paw"
    module.load_state_dict(start_state, strict=False)
    module.world_model_objective = wm_objective if paw else None
    optimizer = module.optimizer_factory([p for p in module.parameters() if p.requires_grad])
    device = module.device
    start = time.perf_counter()
    buffer = build_buffer(trajectories, module.tokenizer, data.rollout.max_obs_tokens, world_model=paw)
    prepare_update(module.update_inputs(), buffer, data.max_return)  # scoring pass where needed, advantages; PaW: S_α (unselected transitions lose their observation), λ_g
    if after_prepare is not None:
        after_prepare()
    size = data.mini_batch_size
    for i in range(0, len(buffer), size):
        batch = {k: v.to(device) for k, v in buffer.collate(list(range(i, min(i + size, len(buffer))))).items()}
        totals = module.loss_totals(batch)
        for part in micro_batches(batch, module.micro_batch_tokens, module.micro_batch_rows):  # as training_step: accumulate over micro-batches
            with module.forward_context():
                loss = module.compute_loss(part, totals).loss
            loss.backward()
        if module.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_([p for p in module.parameters() if p.requires_grad], module.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    observation = sum(int(m.sum()) for m in buffer.obs_mask) if paw else 0
    return seconds, sum(x.numel() for x in buffer.input_ids), observation


def child(args) -> None:
    """CPU memory: one variant's update in a fresh process; prints the peak RSS growth over the
    RSS before the update, of ``prepare_update`` (samples, scoring pass, selection) and of the
    optimisation."""
    saved = torch.load(args.child_state, weights_only=False)
    with tempfile.TemporaryDirectory(prefix="wm_overhead-") as tmp:
        module, data, _ = build(args, Path(tmp))
        wm_objective = module.world_model_objective
        with torch.no_grad():  # page the weights in first: transformers may mmap them, which is not the update's memory
            for param in module.parameters():
                param.sum()
        gc.collect()
        reset_peak_rss()  # loading the model peaks higher than its resident weights
        before, growth = rss_bytes(), {}

        def after_prepare():
            growth["prepare"] = max(peak_rss_bytes() - before, 0)
            reset_peak_rss()

        update(module, data, saved["trajectories"], args.child, saved["lora"], wm_objective, after_prepare)
        growth["optimisation"] = max(peak_rss_bytes() - before, 0)
    print(json.dumps({**growth, "growth": max(growth.values())}))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False,
                                     epilog="Any other argument (e.g. --model.lm.dtype=float32) is passed on to the CLI.")
    configured.add_run_arguments(parser, ROOT / "configs/frozenlake.yaml")
    parser.add_argument("--repeats", type=int, default=3, help="alternated timed pairs (0: tokens and memory only)")
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--child-state", help=argparse.SUPPRESS)
    args, args.extra = parser.parse_known_args(argv)
    return args


def forwarded(args) -> list[str]:
    """This run's arguments for a child process."""
    argv = ["--config", str(args.config), "--model", args.model]
    for flag, value in (("--groups", args.groups), ("--group-size", args.group_size), ("--max-steps", args.max_steps), ("--threads", args.threads)):
        if value is not None:
            argv += [flag, str(value)]
    return argv + args.extra


def config_names(args) -> str:
    """The config file and the overlays (``-c FILE``) among the extra arguments, by name."""
    overlays = [value for flag, value in zip(args.extra, args.extra[1:]) if flag in ("-c", "--config")]
    return " + ".join(Path(name).name for name in [args.config, *overlays])


def main() -> None:
    args = parse_args()
    if args.child:
        return child(args)
    with tempfile.TemporaryDirectory(prefix="wm_overhead-") as tmp:
        torch.manual_seed(0)
        module, data, trainer = build(args, Path(tmp))
        wm_objective = module.world_model_objective
        warm_up(module, data, trainer, args.warmup)
        trajectories = collect(module, data)
    state = {k: v.clone() for k, v in module.state_dict().items() if "lora_" in k}
    obs_tokens = [len(module.tokenizer.encode(s.next_observation, add_special_tokens=False)) for t in trajectories for s in t.steps]
    print(f"{config_names(args)}: precision {trainer.precision}, weights {next(module.lm.parameters()).dtype}, old_logprobs {module.old_logprobs}, "
          f"engine {type(module.engine).__name__}, {torch.get_num_threads()} threads, {machine_load()}")
    print(f"rollout: {len(trajectories)} episodes, {len(obs_tokens)} transitions, observations of {statistics.mean(obs_tokens):.0f} tokens "
          f"on average (min {min(obs_tokens)}, max {max(obs_tokens)}), {sum(s.reward for t in trajectories for s in t.steps):.1f} total reward", flush=True)

    tokens, observation = {}, 0
    for variant in VARIANTS:  # untimed: first-call allocations and kernel selection; the variants' training tokens
        _, tokens[variant], obs = update(module, data, trajectories, variant, state, wm_objective)
        observation = max(observation, obs)
    times, peaks = timed_pairs(module, data, trajectories, state, wm_objective, args.repeats)
    parts = {}
    if module.device.type == "cpu":
        del module  # the children need the memory
        gc.collect()
        parts = cpu_memory(args, trajectories, state)
        peaks = {v: part["growth"] for v, part in parts.items()}
    report(times, tokens, observation, peaks, parts)


def timed_pairs(module, data, trajectories, state: dict, wm_objective, repeats: int):
    """``repeats`` alternated pairs of timed updates: each variant's seconds and, on CUDA, its
    peak allocated memory."""
    times, peaks, cuda = {v: [] for v in VARIANTS}, {}, module.device.type == "cuda"
    for _ in range(repeats):
        for variant in VARIANTS:
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            times[variant].append(update(module, data, trajectories, variant, state, wm_objective)[0])
            if cuda:
                peaks[variant] = torch.cuda.max_memory_allocated()
        print(f"pair {len(times['paw'])}: vanilla {times['vanilla'][-1]:.2f} s, paw {times['paw'][-1]:.2f} s ({machine_load()})", flush=True)
    return times, peaks


def cpu_memory(args, trajectories, state: dict) -> dict[str, dict[str, int]]:
    """Each variant's update in a child process on the saved rollout: its peak RSS growth."""
    parts = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "update.pt"
        torch.save({"trajectories": trajectories, "lora": state}, path)
        for variant in VARIANTS:
            cmd = [sys.executable, __file__, *forwarded(args), "--child", variant, "--child-state", str(path)]
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"the {variant} memory child failed:\n{out.stderr[-3000:]}")
            parts[variant] = json.loads(out.stdout.strip().splitlines()[-1])
    return parts


def report(times, tokens, observation: int, peaks, parts) -> None:
    kind = "peak RSS growth" if parts else "peak CUDA memory"
    median = {v: statistics.median(t) if t else float("nan") for v, t in times.items()}
    print(f"\n{'variant':<10}{'tokens':>8}{'median s':>10}{'runs (s)':>28}{kind:>20}")
    for v in VARIANTS:
        runs = ", ".join(f"{t:.2f}" for t in times[v])
        split = f" (prepare {parts[v]['prepare'] / 2**20:.0f}, optimisation {parts[v]['optimisation'] / 2**20:.0f})" if parts else ""
        memory = f"{peaks[v] / 2**20:>16.0f} MiB" if v in peaks else ""
        print(f"{v:<10}{tokens[v]:>8}{median[v]:>10.2f}{runs:>28}{memory}{split}")
    pairs = ", ".join(f"{p / v:.3f}" for v, p in zip(times["vanilla"], times["paw"]))
    memory = f"{peaks['paw'] / max(peaks['vanilla'], 1):.3f}x" if peaks else "not measured"
    print(f"\nPaW / vanilla: training tokens {tokens['paw'] / tokens['vanilla']:.3f}x (observations {100 * observation / tokens['paw']:.1f}% of PaW's), "
          f"time {median['paw'] / median['vanilla']:.3f}x (pairs: {pairs or 'none'}), memory {memory} (paper: 1.021x time, 1.024x memory on GPUs)")


if __name__ == "__main__":
    main()
