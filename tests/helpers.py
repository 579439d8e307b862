"""Helpers shared by the tests (fixtures are in conftest.py): CLI arguments for tiny runs,
MLflow read-back, subprocess fits, an MLflow server, and builders of the tiny module and its
rollouts. Test files import from here, never from one another."""
from __future__ import annotations

import atexit
import contextlib
import functools
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import mlflow
import torch

from paw_lightning.tracking.resumed_config import flat

ROOT = Path(__file__).resolve().parents[1]


def tiny_args(model_dir: Path, workdir: Path, *extra: str, config: str = "configs/frozenlake.yaml") -> list[str]:
    """CLI arguments of a tiny run in ``workdir``: ``config``, then tests/configs/tiny.yaml, the
    tiny model, an MLflow SQLite store and the checkpoints in ``workdir``, then ``extra``."""
    if not any(arg.startswith("--trainer.logger.init_args.tracking_uri=") for arg in extra):
        empty_store(workdir / "mlflow.db")
    return [
        "-c", str(ROOT / config),
        "-c", str(ROOT / "tests/configs/tiny.yaml"),
        f"--model.lm.name_or_path={model_dir}",
        f"--trainer.logger.init_args.tracking_uri=sqlite:///{workdir / 'mlflow.db'}",
        f"--trainer.default_root_dir={workdir / 'runs'}",
        *extra,
    ]


_EMPTY_STORE: list[Path] = []


def empty_store(path: Path) -> None:
    """Put a copy of an empty MLflow SQLite store at ``path`` (if ``path``'s folder exists and no
    store is there yet). MLflow builds a new store by running its ~50 schema migrations, about
    1.3 s of every fit's start; the copy is that store, built once per test process."""
    if path.exists() or not path.parent.is_dir():
        return
    if not _EMPTY_STORE:
        folder = tempfile.mkdtemp(prefix="paw_empty_mlflow_")
        atexit.register(shutil.rmtree, folder, True)
        template = Path(folder) / "mlflow.db"
        mlflow.MlflowClient(tracking_uri=f"sqlite:///{template}").search_experiments()
        _EMPTY_STORE.append(template)
    shutil.copyfile(_EMPTY_STORE[0], path)


SMALL_WARMUP = """
stages:
  warmup:
    class_path: paw_lightning.callbacks.warmup.BehaviourCloningWarmup
    init_args: {demonstrations: 2, epochs: 2, batch_size: 2, progress: false}
"""


def small_warmup(workdir: Path) -> str:
    """An overlay that cuts an env config's behaviour-cloning warm-up (``stages.warmup``) to 2
    episodes × 2 epochs; its other settings stay the env config's."""
    path = workdir / "warmup.yaml"
    path.write_text(SMALL_WARMUP)
    return str(path)


flatten = flat  # nested dicts → {dotted key: leaf} (lists, None and empty dicts are leaves)


def mlflow_runs(workdir: Path, experiment: str = "frozenlake"):
    """The client and the experiment's runs, oldest first; fails on a metric key that
    docs/reference/metrics.md does not document (every fit a test reads is checked)."""
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{workdir / 'mlflow.db'}")
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"])
    undocumented = sorted({key for run in runs for key in run.data.metrics if not documented_metric(key)})
    assert not undocumented, f"metric keys missing from docs/reference/metrics.md (checked by tests/helpers.py mlflow_runs): {undocumented}"
    return client, runs


def documented_metric(key: str) -> bool:
    """Whether docs/reference/metrics.md documents a logged key: its tables' backticked keys, with
    ``<…>`` standing for one path part, ``…_pNN`` for the row's first key with another suffix,
    ``episode/`` and ``dream/`` keys under any split and ``val/wm_onpolicy/``, ``val/wm_fixed/`` also under ``test/``."""
    return key == "epoch" or any(pattern.fullmatch(key) for pattern in _metric_patterns())  # Lightning's epoch: the page's "Steps"


@functools.cache
def _metric_patterns() -> list[re.Pattern]:
    patterns = []
    for line in (ROOT / "docs/reference/metrics.md").read_text().splitlines():
        if not line.startswith("| `"):
            continue
        first = line.split("|")[1]
        names = re.findall(r"`([^`]+)`", first)
        names = [names[0].rsplit("_", 1)[0] + name[1:] if name.startswith("…") else name for name in names]
        for name in names:
            body = "".join(re.escape(part) if not (part.startswith("<") and part.endswith(">")) else "[^/]+" for part in re.split(r"(<[^>]+>)", name))
            if name.startswith(("episode/", "dream/")):
                body = r"(train|val|test)/" + body
            elif name.startswith(("val/wm_onpolicy/", "val/wm_fixed/")):
                body = r"(val|test)/" + body[len("val/"):]
            patterns.append(re.compile(body))
    return patterns


def metric_history(client, run, key: str) -> list[float]:
    return [m.value for m in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)]


# Greedy rollouts and no KL term: a fit whose losses do not depend on how the groups are
# spread over processes (see test_fsdp_fit.py).
RANK_INDEPENDENT = ("--trainer.accelerator=cpu", "--data.rollout.temperature=0", "--data.evaluation.temperature=0", "--trainer.max_epochs=2",
                    "--model.optimizer.init_args.lr=0.01", "--data.mini_batch_size=8", "--model.policy_objective.init_args.kl_coef=0")


def fit_in_subprocess(model_dir: Path, workdir: Path, *extra: str):
    """`python -m paw_lightning fit` on the tiny model in a fresh `workdir` (RANK_INDEPENDENT
    settings, then `extra`); returns `mlflow_runs(workdir)`."""
    workdir.mkdir()
    args = tiny_args(model_dir, workdir, *RANK_INDEPENDENT, *extra)
    result = subprocess.run([sys.executable, "-m", "paw_lightning", "fit", *args], cwd=workdir, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return mlflow_runs(workdir)


def fit_in_process(model_dir: Path, workdir: Path, *extra: str):
    """What ``fit_in_subprocess`` runs, in this process (one process needs no launcher: the
    reference that multi-process fits are compared with); returns ``mlflow_runs(workdir)``."""
    from paw_lightning.cli import main

    workdir.mkdir()
    with contextlib.chdir(workdir):
        main(["fit", *tiny_args(model_dir, workdir, *RANK_INDEPENDENT, *extra)])
    return mlflow_runs(workdir)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class MlflowServer:
    """``mlflow server`` on a free loopback port with a SQLite store in ``workdir``; ``stop`` it
    (SIGTERM, or SIGKILL: gone at once) and ``start`` it again on the same port and store."""

    def __init__(self, workdir: Path) -> None:
        self.workdir, self.port, self.process = workdir, free_port(), None
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self) -> str:
        with open(self.workdir / "server.log", "a") as log:  # the child keeps its own copy of the descriptor
            self.process = subprocess.Popen(
                [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{self.workdir / 'server.db'}",
                 "--artifacts-destination", str(self.workdir / "server_artifacts"), "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"],
                cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        for _ in range(300):  # a loaded CI machine can take a minute to migrate the database and start
            if self.process.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {(self.workdir / 'server.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as response:
                    if response.status == 200:
                        return self.url
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(1)
        raise RuntimeError("mlflow server did not answer /health")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """The server and its uvicorn workers (its own process group)."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, sig)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@contextlib.contextmanager
def redrawn_lora(lm, std: float = 0.5):
    """Inside the block, ``lm``'s LoRA B weights are redrawn from N(0, std²) (an update, as a
    rollout engine's copy would see it); restored after it."""
    lora_b = [p for n, p in lm.named_parameters() if "lora_B" in n]
    saved = [p.detach().clone() for p in lora_b]
    try:
        with torch.no_grad():
            for p in lora_b:
                p.normal_(0, std)
        yield
    finally:
        with torch.no_grad():
            for p, value in zip(lora_b, saved):
                p.copy_(value)


# ----------------------------------------------------------------- the tiny module, no Trainer
def make_module(tiny_model_dir, dtype: str = "float32", **kwargs):
    """A configured ``PaWModule`` on the tiny model whose LoRA B weights are drawn from N(0, 0.5²):
    a non-zero adapter, so the reference policy differs from π_θ."""
    from paw_lightning.model import LMConfig
    from paw_lightning.module import PaWModule

    kwargs = {"world_model_objective": None, "max_grad_norm": None, **kwargs}  # vanilla RL, no clipping, unless a test asks
    module = PaWModule(lm=LMConfig(name_or_path=str(tiny_model_dir), dtype=dtype), **kwargs)
    module.configure_model()
    with torch.no_grad():
        for name, p in module.lm.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    return module


def rollout(module, n_groups=2, steps=3):
    """A hand-built buffer: ``n_groups`` groups × 2 episodes × ``steps`` steps; episode e of a
    group gets reward e on every step (returns 0 and ``steps``)."""
    from paw_lightning.rollout.collector import Step, Trajectory
    from paw_lightning.rollout.engine import chat_prompt_ids
    from paw_lightning.rollout.samples import build_buffer

    tok = module.tokenizer
    trajs = []
    for g in range(n_groups):
        for e in range(2):
            traj = Trajectory(g, 2 * g + e, g)
            for t in range(steps):
                response = tok.encode(f"<think>{'ab' * (t + e)}</think><action>Up</action>", add_special_tokens=False)
                traj.steps.append(Step(f"o{t}", chat_prompt_ids(tok, f"task {g} step {t}"), response, "", "Up", float(e), f"obs {g} {t}\n_P_", t == steps - 1))
            trajs.append(traj)
    return build_buffer(trajs, tok)


def sampled_buffer(module, token_stats=True, engine=None):
    """Four FrozenLake episodes (maps of different sizes: prompts of different lengths, so the
    generation batch is left-padded) of up to two steps, sampled at temperature 0.7 (in-process
    environments) by ``engine`` (a rollout engine; default: ``generate`` on ``module.lm``)."""
    from paw_lightning.envs import EnvPool, make_env_factory
    from paw_lightning.rollout.collector import Collector
    from paw_lightning.rollout.engine import GenerationEngine
    from paw_lightning.rollout.prompts import PromptBuilder
    from paw_lightning.rollout.samples import build_buffer

    pool = EnvPool(make_env_factory("frozenlake"), 4)
    sampler = (GenerationEngine(module.lm, module.tokenizer, max_new_tokens=6, token_stats=token_stats) if engine is None
               else engine.sampler(module.lm, module.tokenizer, 6, token_stats, version=0))
    collector = Collector(pool, sampler, PromptBuilder("FrozenLake", history_length=1), max_steps=2, invalid_penalty=-0.1)
    with module.generating():
        trajectories = collector.collect([(0, 3), (1, 8)], group_size=2, temperature=0.7, seed=0, progress=False)
    pool.close()
    return build_buffer(trajectories, module.tokenizer)


def write_checkpoints_forever(path: str, ready) -> None:
    """A writer process (test_checkpoint_io.py): rewrites a 32 MB checkpoint at ``path`` with
    versions 1, 2, … until it is killed; sets the ``ready`` event first."""
    from paw_lightning.training.checkpoint_io import DurableCheckpointIO

    io, version = DurableCheckpointIO(), 0
    ready.set()
    while True:
        version += 1
        io.save_checkpoint({"version": version, "weights": torch.full((8_000_000,), float(version))}, path)


class CountingReference:
    """Stands in for ``update.reference_policy``: counts its uses, then disables the adapter."""

    def __init__(self):
        self.calls = 0

    @contextlib.contextmanager
    def __call__(self, model):
        self.calls += 1
        with model.disable_adapter():
            yield
