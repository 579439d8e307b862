"""QLoRA against the plain model, side by side: weights held, peak memory and tokens/s.

Runs ``benchmarks/train_throughput.py`` twice on the same model, device, dtype and shapes,
each in its own process (so neither inherits the other's peak memory), first plain, then
with ``--quantization nf4`` (the frozen base linear layers as bitsandbytes 4-bit NF4, LoRA
on top, as ``model.lm.quantization=nf4`` trains), and prints both and the ratios
NF4 / plain. Every argument after ``--`` goes to both runs.

Both children run with ``MALLOC_MMAP_THRESHOLD_=65536``: glibc then serves every large
buffer with its own mapping and returns it on free, so a CPU run's peak RSS follows the
peak of live tensors (with glibc's adaptive threshold, the same run's peak varied by ±10%
here; the fixed one costs both runs alike, about 10% of their speed). On a CPU
bitsandbytes (>= 0.47) dequantises a weight in every matmul, so QLoRA trades time for
memory there; on a CUDA GPU its kernels do the same on the device.

    python benchmarks/qlora_memory.py                                     # embedded model, default shapes
    python benchmarks/qlora_memory.py -- --batch 4 --prompt-tokens 256 --new-tokens 32 --train-batch 2 --seq-len 512 --threads 2
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

SCRIPT = Path(__file__).with_name("train_throughput.py")
FIGURES = [("weights_gib", "weights held, GiB"), ("rollout_peak_gib", "rollout peak, GiB"), ("train_peak_gib", "train step peak, GiB"),
           ("train_total_gib", "weights + train peak, GiB"),
           ("rollout_tokens_per_s", "rollout tokens/s"), ("train_tokens_per_s", "train tokens/s")]


def measure(extra: list[str], quantized: bool, out: Path) -> dict:
    command = [sys.executable, str(SCRIPT), *extra, "--json", str(out), *(["--quantization", "nf4"] if quantized else [])]
    print(f"$ {shlex.join(command)}", flush=True)
    subprocess.run(command, check=True, env={**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"})
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("extra", nargs="*", help="arguments for train_throughput.py (after --)")
    extra = parser.parse_args().extra
    with tempfile.TemporaryDirectory() as tmp:
        plain, nf4 = (measure(extra, quantized, Path(tmp) / f"{quantized}.json") for quantized in (False, True))
    for run in (plain, nf4):  # CUDA peaks include the weights, CPU peaks are the growth over them
        run["train_total_gib"] = run["train_peak_gib"] + (0 if run["peak_includes_weights"] else run["weights_gib"])
    print(f"\nQLoRA vs plain: {plain['model']} in {plain['dtype']} on {plain['device']}")
    header = f"{'':<27}{'plain':>10}{'NF4':>10}{'NF4 / plain':>13}"
    print(header + "\n" + "-" * len(header))
    for key, label in FIGURES:
        print(f"{label:<27}{plain[key]:>10.2f}{nf4[key]:>10.2f}{nf4[key] / plain[key] if plain[key] else float('nan'):>12.3f}x")


if __name__ == "__main__":
    main()
