"""Send what a tracking-server outage left in a file (:mod:`paw_lightning.tracking.outage`):
``python -m paw_lightning.tracking.resend unsent_mlflow_<run>.jsonl http://127.0.0.1:5000``."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from mlflow.entities import Metric, Param, RunTag


def resend(path: str | Path, tracking_uri: str) -> int:
    """Log the batches an outage left in ``path`` into their runs (tagged ``paw.tracking_outage``);
    the number of metric values sent."""
    import mlflow

    client, sent, runs = mlflow.MlflowClient(tracking_uri=tracking_uri), 0, set()
    for line in Path(path).read_text().splitlines():
        batch = json.loads(line)
        if "status" in batch:  # the run's end
            client.set_terminated(batch["run_id"], batch["status"])
            continue
        metrics = [Metric(key, value, timestamp, step) for key, value, timestamp, step in batch["metrics"]]
        client.log_batch(batch["run_id"], metrics=metrics, params=[Param(*p) for p in batch["params"]], tags=[RunTag(*t) for t in batch["tags"]])
        sent, runs = sent + len(metrics), runs | {batch["run_id"]}
    for run_id in runs:
        client.set_tag(run_id, "paw.tracking_outage", f"metrics sent after the run from {Path(path).name}")
    return sent


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m paw_lightning.tracking.resend UNSENT.jsonl TRACKING_URI")
    print(f"sent {resend(sys.argv[1], sys.argv[2])} metric values")
