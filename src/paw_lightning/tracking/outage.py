"""Training goes on while an MLflow tracking server is unreachable.

:class:`OutageTolerantClient` wraps the ``MlflowClient`` of a logger that logs to an
``http(s)://`` server. Its writes run with short retries (2 retries, 10 s timeout: MLflow's own
default of 7 retries with exponential back-off would stall training for minutes per call). When
a write fails because the server cannot be reached (no HTTP answer; an answer with an error is
raised as before), the client

- says so once, on stderr, with the time;
- keeps every metric/param/tag batch (``log_batch``, what Lightning's logger sends) in memory, in
  order, and sends them when the server answers again — it tries again at most every
  ``retry_every`` seconds, at the next write — then tags the run ``paw.tracking_outage`` with
  how long the outage lasted and what was kept and lost;
- drops other writes meanwhile (artifacts, tables, single tags) and counts them: they are
  listed when the server is back, or at the end.

If the server is still down when the run ends, :meth:`OutageTolerantClient.close` writes the
unsent batches and the run's end status to a JSON-lines file and prints one line naming it;
``python -m paw_lightning.tracking.resend FILE URI`` (:mod:`paw_lightning.tracking.resend`) logs
such a file into its run later.
Checkpoints never depend on the server (their directory is fixed when the run starts).
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

from mlflow.exceptions import MlflowException, RestException

WRITES = {"log_batch", "log_metric", "log_param", "set_tag", "log_artifact", "log_artifacts", "log_table", "log_text",
          "log_dict", "log_figure", "log_image", "set_terminated", "update_run", "delete_tag"}
SHORT_RETRIES = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


def server_unreachable(uri: str, timeout: float = 5.0) -> str | None:
    """Why ``uri``'s tracking server cannot be reached (``None``: it answers). Any HTTP answer,
    even an error status, counts as reachable; a refused or timed-out connection does not."""
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout):
            return None
    except urllib.error.HTTPError:
        return None
    except (urllib.error.URLError, OSError) as err:
        return str(getattr(err, "reason", err))


def is_outage(err: BaseException) -> bool:
    """A failure to reach the server (an answer with an error status is a real error)."""
    return isinstance(err, (MlflowException, OSError)) and not isinstance(err, RestException)


@contextlib.contextmanager
def short_retries(quiet: bool = False):
    """MLflow's HTTP calls inside retry briefly (``SHORT_RETRIES``, unless the user set them);
    ``quiet``: without urllib3's line per retry (an outage already announced)."""
    saved = {k: os.environ.get(k) for k in SHORT_RETRIES}
    os.environ.update({k: v for k, v in SHORT_RETRIES.items() if saved[k] is None})  # the user's own settings win
    urllib3_log = logging.getLogger("urllib3.connectionpool")
    level = urllib3_log.level
    if quiet:
        urllib3_log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        urllib3_log.setLevel(level)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)


class OutageTolerantClient:
    """An ``MlflowClient`` whose writes survive a tracking-server outage (module docstring)."""

    def __init__(self, client, uri: str, retry_every: float = 30.0, unsent_dir: str | Path = ".") -> None:
        self._client, self.uri, self.retry_every, self.unsent_dir = client, uri, retry_every, Path(unsent_dir)
        self.pending: list[dict] = []  # log_batch kwargs kept during an outage, in order
        self.dropped: Counter[str] = Counter()
        self.kept_values = 0  # metric values kept in the current outage
        self.run_id: str | None = None  # the run the last batch went to (tagged after an outage)
        self.down_since: float | None = None
        self._next_try = 0.0

    def __getattr__(self, name: str):
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr
        if name not in WRITES:
            def read(*args, **kwargs):
                with short_retries():
                    return attr(*args, **kwargs)

            return read

        def write(*args, **kwargs):
            if self.down_since is not None and not self._recovered():
                return self._keep(name, args, kwargs)
            try:
                with short_retries():
                    return attr(*args, **kwargs)
            except Exception as err:  # noqa: BLE001 - only outages are kept, the rest re-raised
                if not is_outage(err):
                    raise
                self._went_down(err)
                return self._keep(name, args, kwargs)

        return write

    # ------------------------------------------------------------------ outage
    def _went_down(self, err: BaseException) -> None:
        self.down_since, self._next_try, self.kept_values = time.time(), time.monotonic() + self.retry_every, 0
        self.dropped.clear()
        reason = str(err).splitlines()[0][:200]
        print(f"warning: MLflow tracking server {self.uri} unreachable at {time.strftime('%H:%M:%S')} ({reason}); training goes on, "
              f"metrics are kept and sent when it is back (tried every {self.retry_every:.0f} s)", file=sys.stderr, flush=True)

    def _keep(self, name: str, args: tuple, kwargs: dict) -> None:
        if name == "log_batch":
            batch = _batch_kwargs(args, kwargs)
            self.pending.append(batch)
            self.kept_values += len(batch["metrics"])
            self.run_id = batch["run_id"]
        else:
            self.dropped[name] += 1

    def _recovered(self) -> bool:
        """Try to send what was kept (at most every ``retry_every`` s); whether the server is back."""
        if time.monotonic() < self._next_try:
            return False
        self._next_try = time.monotonic() + self.retry_every
        try:
            with short_retries(quiet=True):
                while self.pending:
                    self._client.log_batch(**self.pending[0])
                    self.pending.pop(0)
        except Exception as err:  # noqa: BLE001
            if not is_outage(err):
                raise
            return False
        note = f"{time.time() - self.down_since:.0f} s unreachable; metric values kept and sent: {self.kept_values}"
        if self.dropped:
            note += f"; dropped: {dict(self.dropped)}"
        self.down_since = None
        print(f"MLflow tracking server {self.uri} is back: {note}", file=sys.stderr, flush=True)
        if self.run_id:
            with short_retries(), contextlib.suppress(Exception):
                self._client.set_tag(self.run_id, "paw.tracking_outage", note)
        return True

    def close(self, run_id: str | None, status: str) -> Path | None:
        """At the end of a run: a last try; if the server is still down, write what was kept and
        the run's end ``status`` (FINISHED, FAILED, KILLED) to ``<unsent_dir>/unsent_mlflow_<run_id>.jsonl``
        and say so once. The file's path, or None (nothing kept: the run can be ended as usual)."""
        if self.down_since is None:
            return None
        self._next_try = 0.0
        if self._recovered():
            return None
        path = self.unsent_dir / f"unsent_mlflow_{run_id or 'run'}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            for batch in self.pending:
                f.write(json.dumps(_batch_to_json(batch)) + "\n")
            f.write(json.dumps({"run_id": run_id, "status": status}) + "\n")
        values = sum(len(b["metrics"]) for b in self.pending)
        print(f"warning: MLflow tracking server {self.uri} still unreachable: {values} metric values of run {run_id} not sent, kept in "
              f"{path} (send them with: python -m paw_lightning.tracking.resend {path} {self.uri}); "
              f"dropped meanwhile: {dict(self.dropped) or 'nothing'}", file=sys.stderr, flush=True)
        return path


def _batch_kwargs(args: tuple, kwargs: dict) -> dict:
    """``log_batch``'s arguments as keywords (run_id, metrics, params, tags)."""
    names = ("run_id", "metrics", "params", "tags")
    batch = {"metrics": [], "params": [], "tags": [], **dict(zip(names, args)), **{k: v for k, v in kwargs.items() if k in names}}
    return {k: list(v) if k != "run_id" else v for k, v in batch.items()}


def _batch_to_json(batch: dict) -> dict:
    return {
        "run_id": batch["run_id"],
        "metrics": [[m.key, m.value, m.timestamp, m.step] for m in batch["metrics"]],
        "params": [[p.key, p.value] for p in batch["params"]],
        "tags": [[t.key, t.value] for t in batch["tags"]],
    }
