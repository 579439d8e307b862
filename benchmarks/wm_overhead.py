"""Cost of PaW's world-model term: one update with PaW vs the same update without it.

Both variants train on the *same* rollout (collected once with the config's settings):

- ``vanilla``: samples ``[prompt][response]``, policy loss only;
- ``paw``:     samples ``[prompt][response][next observation]``, policy loss + clipped MAE
               on the top-α entropy transitions, reward-adaptive λ.

Time: the optimisation pass over all mini-batches (forward, backward, optimizer step),
from the same LoRA and optimizer state, the two variants alternated ``--repeats`` times in
one process; the median of each and their ratio are printed. The paper reports 1.021×
per step on GPUs.

Peak memory: on CUDA, ``torch.cuda.max_memory_allocated`` of each variant's pass in this
process. On CPU, each variant runs in its own child process on the saved rollout, and
the growth of peak RSS during the pass (peak − RSS before it) is compared.

    python benchmarks/wm_overhead.py                      # embedded model, configs/frozenlake.yaml
    python benchmarks/wm_overhead.py --model /path/to/model --repeats 5
    python benchmarks/wm_overhead.py --groups 1 --group-size 4 --max-steps 2   # a smaller rollout (CPU)
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
warnings.filterwarnings("ignore")

import torch  # noqa: E402
import yaml  # noqa: E402

from paw_lightning.callbacks import RewardAdaptiveLambda  # noqa: E402
from paw_lightning.envs import EnvPool, make_env_factory  # noqa: E402
from paw_lightning.model import LMConfig  # noqa: E402
from paw_lightning.module import PaWModule  # noqa: E402
from paw_lightning.objectives import ClippedMAE, PolicyObjective  # noqa: E402
from paw_lightning.rollout.collector import Collector  # noqa: E402
from paw_lightning.rollout.engine import GenerationEngine  # noqa: E402
from paw_lightning.rollout.prompts import PromptBuilder  # noqa: E402
from paw_lightning.rollout.samples import build_buffer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def data_settings(config: Path) -> dict:
    return yaml.safe_load(config.read_text())["data"]


def make_module(model: str, device: torch.device) -> PaWModule:
    module = PaWModule(lm=LMConfig(name_or_path=model), policy_objective=PolicyObjective(kl_coef=0.01), world_model_objective=ClippedMAE())
    module.configure_model()
    return module.to(device)


def collect(module: PaWModule, data: dict):
    env_factory = make_env_factory(data["env"], **(data.get("env_kwargs") or {}))
    with EnvPool(env_factory, data["groups"] * data["group_size"]) as pool:
        engine = GenerationEngine(module.lm, module.tokenizer, data["max_new_tokens"])
        collector = Collector(pool, engine, PromptBuilder(data["env"], data["history_length"]), data["max_steps"], -0.1)
        module.lm.eval()
        trajectories = collector.collect([(g, 1000 + g) for g in range(data["groups"])], data["group_size"], data["temperature"], seed=0, progress=False)
        module.lm.train()
    return trajectories


def prepare(module: PaWModule, trajectories, variant: str):
    """The variant's buffer after the scoring pass, with λ set; returns (buffer, mini-batches)."""
    paw = variant == "paw"
    module.world_model_objective = ClippedMAE() if paw else None
    buffer = build_buffer(trajectories, module.tokenizer, world_model=paw)
    module.prepare_update(buffer)
    module.wm_lambda = RewardAdaptiveLambda(r_max=1.0).lambdas(trajectories)
    return buffer


def optimise(module: PaWModule, buffer, variant: str, batches: list[list[int]], start_state: dict) -> float:
    """One optimisation pass from ``start_state``; returns its wall time in seconds."""
    module.world_model_objective = ClippedMAE() if variant == "paw" else None
    module.load_state_dict(start_state, strict=False)
    optimizer = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=1e-5)
    device = next(module.parameters()).device
    start = time.perf_counter()
    for i, indices in enumerate(batches):
        batch = {k: v.to(device) for k, v in buffer.collate(indices).items()}
        module.compute_loss(batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def mini_batches(n: int, size: int) -> list[list[int]]:
    return [list(range(i, min(i + size, n))) for i in range(0, n, size)]


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(args) -> None:
    """CPU memory: one variant's pass in a fresh process; prints the peak RSS growth."""
    torch.manual_seed(0)
    module = make_module(args.model, torch.device("cpu"))
    trajectories = torch.load(args.child_trajectories, weights_only=False)
    buffer = prepare(module, trajectories, args.child)
    state = {k: v.clone() for k, v in module.state_dict().items() if "lora_" in k}
    before = rss_bytes()
    optimise(module, buffer, args.child, mini_batches(len(buffer), args.mini_batch_size), state)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"growth": max(peak - before, 0), "peak": peak}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=ROOT / "configs/frozenlake.yaml")
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--groups", type=int, help="override data.groups of the config")
    parser.add_argument("--group-size", type=int, help="override data.group_size")
    parser.add_argument("--max-steps", type=int, help="override data.max_steps")
    parser.add_argument("--child", choices=["vanilla", "paw"], help=argparse.SUPPRESS)
    parser.add_argument("--child-trajectories", help=argparse.SUPPRESS)
    parser.add_argument("--mini-batch-size", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)

    data = data_settings(args.config)
    overrides = {"groups": args.groups, "group_size": args.group_size, "max_steps": args.max_steps}
    data.update({k: v for k, v in overrides.items() if v is not None})
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    module = make_module(args.model, device)
    trajectories = collect(module, data)
    buffers = {v: prepare(module, trajectories, v) for v in ("vanilla", "paw")}
    batches = mini_batches(len(buffers["paw"]), data["mini_batch_size"])
    state = {k: v.clone() for k, v in module.state_dict().items() if "lora_" in k}
    tokens = {v: sum(x.numel() for x in b.input_ids) for v, b in buffers.items()}
    print(f"rollout: {len(trajectories)} episodes, {len(buffers['paw'])} transitions, {len(batches)} mini-batches; "
          f"tokens per pass: vanilla {tokens['vanilla']}, paw {tokens['paw']} ({tokens['paw'] / tokens['vanilla']:.3f}x)")

    times = {"vanilla": [], "paw": []}
    peaks = {}
    optimise(module, buffers["vanilla"], "vanilla", batches, state)  # warm-up
    for _ in range(args.repeats):
        for variant in ("vanilla", "paw"):
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            times[variant].append(optimise(module, buffers[variant], variant, batches, state))
            if device.type == "cuda":
                peaks[variant] = torch.cuda.max_memory_allocated()
    if device.type != "cuda":
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "trajectories.pt"
            torch.save(trajectories, path)
            for variant in ("vanilla", "paw"):
                out = subprocess.run([sys.executable, __file__, "--model", args.model, "--child", variant, "--child-trajectories", str(path),
                                      "--mini-batch-size", str(data["mini_batch_size"])], capture_output=True, text=True, check=True)
                peaks[variant] = json.loads(out.stdout.strip().splitlines()[-1])["growth"]

    median = {v: statistics.median(t) for v, t in times.items()}
    kind = "peak CUDA memory" if device.type == "cuda" else "peak RSS growth during the pass"
    print(f"\n{'variant':<10}{'median s':>10}{'runs (s)':>28}{kind:>36}")
    for v in ("vanilla", "paw"):
        runs = ", ".join(f"{t:.2f}" for t in times[v])
        print(f"{v:<10}{median[v]:>10.2f}{runs:>28}{peaks[v] / 2**20:>33.0f} MiB")
    print(f"\nPaW / vanilla: time {median['paw'] / median['vanilla']:.3f}x, memory {peaks['paw'] / max(peaks['vanilla'], 1):.3f}x "
          f"(device: {device.type}; paper: 1.021x time, 1.024x memory on GPUs)")


if __name__ == "__main__":
    main()
