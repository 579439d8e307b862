"""Where the time of one RL epoch goes: rollout, scoring pass, optimisation, the rest.

Runs the real ``fit`` of a config (default ``configs/frozenlake.yaml`` on the embedded
SmolLM2-135M) for one epoch through ``PawCLI(args=[...], run=False)``, with validation
off, the ModelCheckpoint callback removed from the trainer (unless ``--keep-checkpoint``),
no progress bars and a throw-away MLflow sqlite database in a temporary directory. The parts are timed by wrapping, at runtime and only in this
process, the methods that do the work:

- model load:     ``PaWModule.configure_model`` (base LM + LoRA, called inside ``fit``)
- rollout:        ``Collector.collect`` (of which ``GenerationEngine.generate`` = the LM
                  sampling; the rest is prompt building, action parsing, env steps)
- scoring pass:   ``update.score`` (π_old and reference log-probs, entropies)
- other data:     the rest of ``RolloutDataModule.train_dataloader`` (sample building) and of
                  ``PaWModule.on_train_epoch_start`` (advantages, world-model selection)
- optimisation:   ``on_train_batch_start`` → ``on_train_batch_end`` of a Callback, split at
                  ``on_before_backward`` / ``on_after_backward`` into forward (training_step),
                  backward, and gradient clipping + optimizer step
- other:          wall time of ``trainer.fit`` minus all of the above (trainer set-up,
                  MLflow logging, env pool, teardown)

The optimisation's share of the compute limit, for the real update (the issue's "update
tokens/s ÷ limit" at the run's own shapes, not train_throughput.py's synthetic step): model
FLOPs of every micro-batch the trainer runs (``micro_batches`` under ``micro_batch_tokens`` and ``_rows``),
over real tokens only (padding excluded): per row of ℓ tokens, 4(N − N_head)·ℓ for the frozen
linear layers (forward 2, input gradient 2: LoRA computes no base weight gradient), 4·N_head
per position whose logits the trainer computes (``read_log_softmax`` keeps them from the
micro-batch's shortest prompt on), and 3·2·n_layers·ℓ²·d_attn for causal attention (forward
once, backward twice); the 6N convention (6 instead of 4) is printed alongside. Divided by
the optimisation's seconds (forward, backward, clip + optimizer) and by this CPU's measured
limit, a 2048³ matmul in the dtype the matmuls run in (bfloat16 under ``bf16-mixed`` or with a
bfloat16 base, else float32; ``train_throughput.cpu_matmul_flops``), measured after every
optimizer step (outside the timed parts) and taken as the median: a shared CPU's matmul rate
drifts by tens of percent over minutes, so a limit measured once, before or after, misstates
the share. Activation checkpointing's recomputation is not counted (model FLOPs, not
hardware FLOPs).

    python benchmarks/epoch_time_split.py
    python benchmarks/epoch_time_split.py --data.rollout.max_steps=2     # extra args go to the CLI
    python benchmarks/epoch_time_split.py --keep-checkpoint      # also time ModelCheckpoint

Progress lines (one per part, with elapsed time) go to stderr; the table to stdout.
Ctrl-C prints the table of what was measured so far.
"""
from __future__ import annotations

import argparse
import functools
import logging
import os
import resource
import statistics
import sys
import tempfile
import time
import warnings
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "ERROR")

import torch
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import ModelCheckpoint
from machine import machine_load
from transformers.utils import logging as hf_logging

from paw_lightning import update
from paw_lightning.cli import PawCLI
from paw_lightning.data import RolloutDataModule
from paw_lightning.module import PaWModule
from paw_lightning.rollout.collector import Collector
from paw_lightning.rollout.engine import GenerationEngine
from paw_lightning.training.microbatch import micro_batches
from train_throughput import cpu_matmul_flops, model_sizes

T0 = time.perf_counter()
SECONDS: dict[str, float] = defaultdict(float)
CALLS: dict[str, int] = defaultdict(int)
FLOPS: dict[str, float] = defaultdict(float)  # the optimisation's model FLOPs, "4N" (LoRA) and "6N"
LIMITS: list[float] = []  # this CPU's matmul FLOP/s, measured after each optimizer step


def parse_args() -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Any other argument (e.g. --data.rollout.max_steps=2) is passed on to the CLI.",
        allow_abbrev=False,  # --model.lm.lora_r=8 must reach the CLI, not match --model
    )
    p.add_argument("--config", default=str(ROOT / "configs/frozenlake.yaml"), help="config file (-c) of the run (default: configs/frozenlake.yaml)")
    p.add_argument("--model", default="embedded", help="model.lm.name_or_path (default: embedded)")
    p.add_argument("--keep-checkpoint", action="store_true", help="keep the config's ModelCheckpoint (its save time lands in 'other')")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    return p.parse_known_args()


def progress(message: str) -> None:
    """One line on stderr per finished part, so that a long (or interrupted) run shows where it is."""
    print(f"[{time.perf_counter() - T0:7.1f} s, peak RSS {peak_rss_gb():4.1f} GB] {message}", file=sys.stderr, flush=True)


def peak_rss_gb() -> float:
    """Peak resident memory of this process so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def timed(owner, name: str, key: str, describe=None) -> None:
    """Replace ``owner.name`` by a wrapper that adds its wall time to ``SECONDS[key]``;
    ``describe(args, result)`` (optional) adds details to its progress line."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        start, result, done = time.perf_counter(), None, False
        try:
            result = original(*args, **kwargs)
            done = True
            return result
        finally:
            seconds = time.perf_counter() - start
            SECONDS[key] += seconds
            CALLS[key] += 1
            detail = f" ({describe(args, result)})" if describe and done else ""
            progress(f"{key}: {seconds:.1f} s{detail}{'' if done else ' (interrupted)'}")

    setattr(owner, name, wrapper)


HOOKS = [  # (owner, attribute, part, progress detail from (args, result)): what timed() wraps
    (PaWModule, "configure_model", "model load", None),
    (RolloutDataModule, "train_dataloader", "train_dataloader", None),
    (PaWModule, "on_train_epoch_start", "prepare update", None),
    (Collector, "collect", "rollout", lambda a, r: f"{len(r)} episodes, {sum(len(s.response_ids) for t in r for s in t.steps)} tokens"),
    (GenerationEngine, "generate", "generate", lambda a, r: f"batch {len(r)}, {sum(len(g.response_ids) for g in r)} tokens"),
    (update, "score", "scoring pass", lambda a, r: f"{len(a[1])} samples"),
]


class OptimisationTimer(Callback):
    """Times each training batch: forward (training_step), backward, clip + optimizer step."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        CALLS["optim tokens"] += int(batch["attention_mask"].sum())
        for key, value in update_flops(batch, pl_module.micro_batch_tokens, pl_module.micro_batch_rows, model_sizes(pl_module.lm)).items():
            FLOPS[key] += value
        self.mark = time.perf_counter()

    def _lap(self, key: str) -> None:
        now = time.perf_counter()
        SECONDS[key] += now - self.mark
        CALLS[key] += 1
        self.mark = now

    def on_before_backward(self, trainer, pl_module, loss):
        self._lap("forward")

    def on_after_backward(self, trainer, pl_module):
        self._lap("backward")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._lap("optimizer")
        LIMITS.append(cpu_matmul_flops(matmul_dtype(pl_module, trainer)))  # beside the step it divides (not timed)
        progress(f"optimizer step {trainer.global_step}: {len(batch['input_ids'])} samples × {batch['input_ids'].shape[1]} tokens")


def update_flops(batch: dict, micro_batch_tokens: int | None, micro_batch_rows: int | None, sizes: dict) -> dict[str, float]:
    """Model FLOPs of one optimizer step over its micro-batches (the module docstring's count):
    ``{"4N": LoRA's, "6N": the 6N convention's}``; also counts the positions the micro-batches'
    forwards compute, padding included (``CALLS["optim positions"]``)."""
    flops = {"4N": 0.0, "6N": 0.0}
    for micro in micro_batches(batch, micro_batch_tokens, micro_batch_rows):
        CALLS["optim positions"] += micro["input_ids"].numel()
        keep_from = int(micro["keep_from"])
        for length in micro["attention_mask"].sum(dim=-1).tolist():
            head_positions = max(length - keep_from + 1, 0)
            attention = 3 * 2 * sizes["layers"] * length**2 * sizes["d_attn"]
            for key, per_weight in (("4N", 4), ("6N", 6)):
                flops[key] += per_weight * ((sizes["n"] - sizes["head"]) * length + sizes["head"] * head_positions) + attention
    return flops


def matmul_dtype(model, trainer) -> torch.dtype:
    """The dtype the update's matmuls run in: bfloat16 under ``bf16-mixed`` or with a bfloat16 base."""
    bf16 = "bf16" in str(trainer.precision) or next(model.lm.parameters()).dtype == torch.bfloat16
    return torch.bfloat16 if bf16 else torch.float32


def update_limit_share(model, trainer, optim_seconds: float) -> str:
    """The optimisation's model FLOP/s against this CPU's matmul limit in the matmuls' dtype
    (the median of the limits measured after each optimizer step)."""
    if not FLOPS["4N"] or optim_seconds <= 0:
        return ""
    dtype = matmul_dtype(model, trainer)
    limits = LIMITS or [cpu_matmul_flops(dtype)]
    limit = statistics.median(limits)
    rate = FLOPS["4N"] / optim_seconds
    return (f"update vs the compute limit: {rate / 1e9:.1f} GFLOP/s of model FLOPs (4N + 3A, real tokens) = {100 * rate / limit:.1f}% of "
            f"{limit / 1e12:.3f} TFLOP/s (2048³ {str(dtype).removeprefix('torch.')} matmul, {torch.get_num_threads()} threads; "
            f"median of {len(limits)}, {min(limits) / 1e12:.3f}–{max(limits) / 1e12:.3f}); "
            f"at 6N + 3A {100 * FLOPS['6N'] / optim_seconds / limit:.1f}%")


def cli_args(args: argparse.Namespace, extra: list[str], workdir: Path) -> list[str]:
    cli = [
        "-c", args.config,
        f"--model.lm.name_or_path={args.model}",
        "--trainer.max_epochs=1",
        "--trainer.check_val_every_n_epoch=100",  # no validation rollout in the epoch
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--trainer.default_root_dir={workdir / 'runs'}",
        f"--trainer.logger.init_args.tracking_uri=sqlite:///{workdir / 'mlflow.db'}",
        "--data.progress=false",
        "--summary.enabled=false",  # no validation before the first update either
    ]
    return cli + extra


def quiet() -> None:
    warnings.filterwarnings("ignore")
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "mlflow", "alembic", "paw_lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)


def main() -> int:
    args, extra = parse_args()
    quiet()
    load_at_start = machine_load()
    if args.threads:
        torch.set_num_threads(args.threads)
    for owner, name, key, describe in HOOKS:
        timed(owner, name, key, describe)

    interrupted = False
    with tempfile.TemporaryDirectory(prefix="paw-epoch-") as tmp:
        argv = cli_args(args, extra, Path(tmp))
        start = time.perf_counter()
        cli = PawCLI(args=argv, run=False)
        build_s = time.perf_counter() - start
        if not args.keep_checkpoint:
            # PawCLI always adds a ModelCheckpoint (its ``checkpoint`` section), so
            # --trainer.enable_checkpointing=false is refused; drop it from this trainer instead.
            cli.trainer.callbacks[:] = [cb for cb in cli.trainer.callbacks if not isinstance(cb, ModelCheckpoint)]
        cli.trainer.callbacks.append(OptimisationTimer())
        start = time.perf_counter()
        try:
            cli.trainer.fit(cli.model, cli.datamodule)
        except (KeyboardInterrupt, SystemExit):  # Lightning turns Ctrl-C into sys.exit(1)
            interrupted = True
        fit_s = time.perf_counter() - start

    report(args, cli, fit_s, build_s, load_at_start, interrupted)
    return 130 if interrupted else 0


def scoring_positions(buffer, batch_size: int) -> tuple[int, int]:
    """(token positions the scoring forwards compute, real tokens): ``update.score``
    right-pads consecutive chunks of ``batch_size`` samples to the chunk's longest."""
    lengths = [x.numel() for x in buffer.input_ids]
    chunks = [lengths[i : i + batch_size] for i in range(0, len(lengths), batch_size)]
    return sum(len(c) * max(c) for c in chunks), sum(lengths)


def report(args, cli, fit_s: float, build_s: float, load_at_start: str, interrupted: bool) -> None:
    played = cli.datamodule.played.get("train")
    data, model, trainer, buffer = cli.datamodule, cli.model, cli.trainer, played.samples if played is not None else None
    trajs = buffer.trajectories if buffer is not None else []
    steps = [s for t in trajs for s in t.steps]
    gen_tokens = sum(len(s.response_ids) for s in steps)
    sample_tokens = sum(x.numel() for x in buffer.input_ids) if buffer is not None else 0
    optim = SECONDS["forward"] + SECONDS["backward"] + SECONDS["optimizer"]
    other_data = SECONDS["train_dataloader"] + SECONDS["prepare update"] - SECONDS["rollout"] - SECONDS["scoring pass"]

    def rate(n: float, seconds: float, unit: str) -> str:
        return f"{n / seconds:.1f} {unit}" if n and seconds > 1e-3 else ""

    parts = [
        ("model load (configure_model)", SECONDS["model load"], ""),
        ("rollout (Collector.collect)", SECONDS["rollout"], rate(gen_tokens, SECONDS["rollout"], "generated tok/s")),
        ("  of which LM generate", SECONDS["generate"], f"{CALLS['generate']} calls; " + rate(gen_tokens, SECONDS["generate"], "tok/s")),
        ("  of which prompts + env steps", SECONDS["rollout"] - SECONDS["generate"], ""),
        ("scoring pass (update.score)", SECONDS["scoring pass"], rate(sample_tokens, SECONDS["scoring pass"], "sample tok/s")),
        ("other data prep (samples, adv.)", other_data, ""),
        ("optimisation", optim, f"{CALLS['optimizer']} optimizer steps; " + rate(sample_tokens, optim, "sample tok/s")),
        ("  of which forward", SECONDS["forward"], ""),
        ("  of which backward", SECONDS["backward"], ""),
        ("  of which clip + optimizer", SECONDS["optimizer"], ""),
        ("other (trainer, MLflow, ...)", fit_s - SECONDS["model load"] - SECONDS["train_dataloader"] - SECONDS["prepare update"] - optim, ""),
    ]

    print(f"\nconfig {Path(args.config).name}, model {args.model!r}, 1 epoch (validation and {'' if args.keep_checkpoint else 'checkpointing '}off); "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"groups {data.rollout.groups} × group_size {data.rollout.group_size} = {data.rollout.groups * data.rollout.group_size} episodes, max_steps {data.rollout.max_steps}, "
          f"max_new_tokens {data.rollout.max_new_tokens}, mini_batch_size {data.mini_batch_size}, ppo_epochs {data.ppo_epochs}, score_batch_size {model.score_batch_size}")
    if buffer is not None:
        print(f"episodes {len(trajs)} (won {sum(t.won for t in trajs)}), steps = samples {len(buffer)}, invalid steps {sum(s.action is None for s in steps)}, "
              f"generated tokens {gen_tokens} ({gen_tokens / max(len(steps), 1):.1f}/step), sample tokens {sample_tokens} "
              f"({sample_tokens / max(len(buffer), 1):.0f}/sample), optimizer steps {trainer.global_step}")
        positions, tokens = scoring_positions(buffer, model.score_batch_size)
        print(f"padding: scoring forwards compute {positions} positions for {tokens} tokens ({100 * (1 - tokens / positions):.0f}% padding)"
              + (f", optimisation forwards {CALLS['optim positions']} for {CALLS['optim tokens']} ({100 * (1 - CALLS['optim tokens'] / CALLS['optim positions']):.0f}% padding)"
                 if CALLS["optim positions"] else ""))
    if interrupted:
        print("INTERRUPTED: the times below are what was measured up to the interrupt")
    width = max(len(name) for name, _, _ in parts)
    print(f"\n{'part':<{width}} {'seconds':>8} {'share':>6}")
    print("-" * (width + 16))
    for name, seconds, note in parts:
        print(f"{name:<{width}} {seconds:>8.1f} {100 * seconds / fit_s:>5.1f}%  {note}")
    print("-" * (width + 16))
    print(f"{'total (trainer.fit wall time)':<{width}} {fit_s:>8.1f} {100.0:>5.1f}%")
    share = update_limit_share(model, trainer, optim) if not interrupted else ""
    if share:
        print(f"\n{share}")
    print(f"\n(before fit: building the CLI — parser, tokenizer, env factory — took {build_s:.1f} s)")
    print(f"machine: {load_at_start} at start, {machine_load()} at end; peak RSS of this process {peak_rss_gb():.1f} GB")

if __name__ == "__main__":
    sys.exit(main())
