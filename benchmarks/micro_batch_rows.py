"""One training step's forward + backward on a few samples: batched (right-padded to the longest,
one forward) vs one sample at a time (``model.micro_batch_rows: 1``), side by side.

The model is loaded as training loads it (``LMConfig`` + ``load_model``: the embedded
SmolLM2-135M in ``--dtype`` with fresh LoRA adapters). Each sample is ``--lengths`` random
token ids whose last ``--response`` positions are read as training reads them
(``read_log_softmax`` from the micro-batch's shortest prompt on: logits there, the
vocabulary's log-softmax at the read positions), loss = −Σ log p of the read tokens; the
gradients accumulate over the micro-batches as ``training_step``'s do. ``--no-grad`` times the
forward alone (the scoring pass's case). After one untimed step of each, the two ways
alternate ``--reps`` times (which goes first alternates too); printed: each way's median and
per-rep seconds, and the median of the per-pair ratios batched / one at a time.

    python benchmarks/micro_batch_rows.py                          # 700 + 600 + 450 tokens
    python benchmarks/micro_batch_rows.py --lengths 600 600 600    # equal lengths: no padding
    python benchmarks/micro_batch_rows.py --lengths 600 600 600 600 600 600 600 600 --no-grad
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
warnings.filterwarnings("ignore")

import torch
from machine import machine_load

from paw_lightning.model import LMConfig, load_model, read_log_softmax


def step(lm, samples: list[torch.Tensor], response: int) -> None:
    """Forward (and backward, under grad) of ``samples`` as one right-padded micro-batch."""
    width = max(len(s) for s in samples)
    ids = torch.zeros(len(samples), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    read = torch.zeros_like(ids, dtype=torch.bool)  # position t is read to predict token t + 1
    for row, sample in enumerate(samples):
        ids[row, : len(sample)], mask[row, : len(sample)] = sample, 1
        read[row, len(sample) - response - 1 : len(sample) - 1] = True
    keep_from = min(len(s) for s in samples) - response - 1
    logp, targets, _ = read_log_softmax(lm, ids, mask, read, keep_from)
    loss = -logp.gather(-1, targets[:, None]).sum()
    if loss.requires_grad:
        loss.backward()


def main(argv: list[str] | None = None) -> dict[str, list[float]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="embedded", help="LMConfig.name_or_path (default: embedded)")
    p.add_argument("--lengths", type=int, nargs="+", default=[700, 600, 450], help="tokens per sample (default: 700 600 450)")
    p.add_argument("--response", type=int, default=60, help="read positions at the end of each sample (default: 60)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--no-grad", action="store_true", help="forward only (the scoring pass)")
    p.add_argument("--reps", type=int, default=4, help="timed alternations (default: 4)")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's choice)")
    args = p.parse_args(argv)
    if min(args.lengths) <= args.response + 1:
        p.error(f"--lengths must all exceed --response + 1 = {args.response + 1}")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    lm = load_model(LMConfig(name_or_path=args.model, dtype=args.dtype))
    lm.train()
    vocab = lm.config.vocab_size
    samples = [torch.randint(0, vocab, (n,)) for n in args.lengths]
    ways = {
        "batched": lambda: step(lm, samples, args.response),
        "one at a time": lambda: [step(lm, [s], args.response) for s in samples],
    }
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    with torch.set_grad_enabled(not args.no_grad):
        for rep in range(args.reps + 1):
            for name in list(ways) if rep % 2 == 0 else list(ways)[::-1]:
                lm.zero_grad(set_to_none=True)
                start = time.perf_counter()
                ways[name]()
                if rep:  # rep 0 is the untimed warm-up
                    seconds[name].append(time.perf_counter() - start)
    padded = len(args.lengths) * max(args.lengths)
    print(f"{len(args.lengths)} samples of {' + '.join(map(str, args.lengths))} tokens ({padded} padded, {sum(args.lengths)} real), "
          f"{'forward only' if args.no_grad else 'forward + backward'}, {args.dtype}, {torch.get_num_threads()} threads, {machine_load()}")
    for name, times in seconds.items():
        print(f"{name:>14}: {statistics.median(times):6.2f} s  (per rep {', '.join(f'{t:.2f}' for t in times)})")
    ratios = [b / o for b, o in zip(seconds["batched"], seconds["one at a time"])]
    print(f"batched / one at a time: {statistics.median(ratios):.3f}x (per pair {', '.join(f'{r:.3f}' for r in ratios)})")
    return seconds


if __name__ == "__main__":
    main()
