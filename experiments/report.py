"""Results table of an MLflow experiment in Markdown, like the paper's Tables 1 and 4: one
row per configuration (the ``base`` model first when present), success per task type and
overall, mean return, each "mean ± std over seeds" (success in %).

    python experiments/report.py --experiment ablations
    python experiments/report.py --experiment ablations --select best --metric val/wm_onpolicy/exact_match --metric val/wm_onpolicy/nll
    python experiments/report.py --tracking-uri sqlite:///other.db --experiment alfworld --split test --group-by advantage world_model_objective

How runs become rows, and the ``last``/``best`` rules: see :mod:`paw_lightning.analysis`.
Only finished runs count unless ``--all-runs`` is given.
"""
from __future__ import annotations

import argparse
import sys

from paw_lightning import analysis


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI or sqlite:///<cwd>/mlflow.db")
    parser.add_argument("--experiment", required=True, help="the MLflow experiment name")
    parser.add_argument("--split", default="val", help="metric prefix: val (default), test or train")
    parser.add_argument("--select", choices=("last", "best"), default="last",
                        help="last: each metric's final value; best: every metric at the step of the run's best overall success")
    parser.add_argument("--metric", action="append", default=[], help="an extra column (a metric key), repeatable")
    parser.add_argument("--group-by", nargs="+", default=None, help="group runs by these tags instead of the run name")
    parser.add_argument("--all-runs", action="store_true", help="include failed and unfinished runs")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    uri = args.tracking_uri or analysis.default_tracking_uri()
    try:
        client, runs = analysis.load_runs(uri, args.experiment, statuses=None if args.all_runs else ("FINISHED",))
        if not runs:
            raise ValueError(f"MLflow experiment {args.experiment!r} has no {'' if args.all_runs else 'finished '}runs")
        table = analysis.results_table(client, runs, split=args.split, select=args.select, extra=args.metric, group_by=args.group_by)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    which = "final value" if args.select == "last" else "value at the best validation epoch"
    print(f"{args.experiment}: {args.split} metrics, {which} of each run, mean ± std over runs (success in %)\n")
    print(table)


if __name__ == "__main__":
    main()
