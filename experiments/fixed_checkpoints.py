"""The learning benchmark's weights re-scored on the fixed held-out transitions (docs/results/learning.md).

In one process: the shared warm-up's weights are validated first, which builds the fixed set
(``data.evaluation.fixed`` of the overlay: expert, random admissible actions and the start
policy, i.e. the warm-up, on the held-out maps) exactly as a fit builds it when RL starts; then
every run's ``last.ckpt`` is loaded into the same model and validated on the very same set.
Writes ``<out>/fixed/results.md`` (mean ± std over seeds, and PaW − vanilla paired by seed)
and ``<out>/fixed/results.json`` (every value)::

    python experiments/learning.py --seeds 0 1 2 --out runs/learning-fp32 -- --model.lm.dtype=float32
    python experiments/fixed_checkpoints.py --out runs/learning-fp32 --seeds 0 1 2 -- --model.lm.dtype=float32

Run it where the benchmark ran (the warm-up file its ``warmup.log`` names); arguments after
``--`` go to the validations (the benchmark's own, e.g. ``--model.lm.dtype=float32``).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

from dream_checkpoints import benchmark_parser, last_checkpoint, warmup_weights  # noqa: E402
from grid import ROOT, env_config  # noqa: E402
from learning import cell  # noqa: E402

SOURCES = ("all", "expert", "random", "start_policy")
MEASURES = (("NLL", "nll", False), ("token acc %", "token_acc", True), ("exact %", "exact_match", True))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    shared = argv[argv.index("--") + 1 :] if "--" in argv else []
    parser = benchmark_parser(__doc__.split("\n")[0])
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    out = Path(args.out)
    from paw_lightning.cli import PawCLI
    from paw_lightning.scale import checkpointing

    warmup = warmup_weights(out / "warmup.log")
    configs = ["-c", str(env_config(args.env)), "-c", str(ROOT / "configs/algorithms" / f"{args.algorithm}.yaml"),
               "-c", str(ROOT / "configs/objectives/vanilla.yaml"), "-c", args.overlay]  # the objective does not change a validation
    cli = PawCLI(args=[*configs, *shared, f"--model.init_weights={warmup}", "--trainer.logger=false", "--trainer.enable_progress_bar=false",
                       "--data.progress=false", f"--trainer.default_root_dir={out / 'fixed'}", "--model.wm_eval_samples=0"], run=False)

    def scores(name: str) -> dict[str, float]:
        (metrics,) = cli.trainer.validate(cli.model, cli.datamodule, verbose=False)
        print(f"{name}: " + ", ".join(f"{s} {metrics.get(f'val/wm_fixed/{s}/nll', float('nan')):.4f}" for s in SOURCES), flush=True)
        return {k: float(v) for k, v in metrics.items() if k.startswith("val/wm_fixed/")}

    results = {"warm-up": scores("warm-up (before RL)")}
    for objective in args.objectives:
        for seed in args.seeds:
            checkpointing.load_trainable(cli.model, str(last_checkpoint(out / "runs" / f"{args.algorithm}+{objective}" / f"seed{seed}")))
            cli.model.weights_changed()
            results[f"{objective}/seed{seed}"] = scores(f"{objective}, seed {seed}")
    (out / "fixed").mkdir(parents=True, exist_ok=True)
    (out / "fixed" / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    text = table(results, args)
    (out / "fixed" / "results.md").write_text(text)
    print(text + f"\nwritten: {out / 'fixed' / 'results.md'}")


def table(results: dict[str, dict], args) -> str:
    """Markdown: per source, NLL, token accuracy and exact match after the last update, mean ± std
    over seeds, the warm-up's row, and each objective − the first paired by seed."""
    columns = [(f"{source} {head}", f"val/wm_fixed/{source}/{key}", pct) for source in SOURCES for head, key, pct in MEASURES]
    lines = [f"Fixed held-out transitions of {args.env}'s learning benchmark, after the last update; seeds {', '.join(map(str, args.seeds))}; "
             "mean ± std over seeds (the warm-up: one set of weights).", "",
             "| weights | " + " | ".join(h for h, _, _ in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    rows = {"warm-up (before RL)": [results["warm-up"]]}
    rows.update({f"{args.algorithm} + {o}": [results[f"{o}/seed{s}"] for s in args.seeds] for o in args.objectives})
    first = args.objectives[0]
    for other in args.objectives[1:]:
        rows[f"{other} − {first} (paired by seed)"] = [{k: results[f"{other}/seed{s}"][k] - results[f"{first}/seed{s}"][k] for k in results[f"{first}/seed{s}"]}
                                                      for s in args.seeds]
    for name, runs in rows.items():
        lines.append(f"| {name} | " + " | ".join(cell([r[key] for r in runs if key in r], pct) for _, key, pct in columns) + " |")
    return "\n".join(lines) + "\n"

if __name__ == "__main__":
    main()
