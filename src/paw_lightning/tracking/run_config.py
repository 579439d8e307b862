"""The resolved config, git SHA, seed and the grouping tags of an MLflow run.

:class:`MLflowSaveConfigCallback` (the CLI's save-config callback) logs the resolved config as
the run's ``config.yaml`` artifact and tags the run with the git SHA, the environment, the
algorithm and the objectives, so the MLflow UI can group and compare runs; the environment's
``tagged_kwargs`` (WebShop's reward rule) become tags ``env.<name>`` (:func:`env_tags`). A run
without an explicit ``run_name`` is named like the sweeps' runs, ``<algorithm>+<objective>/seed<seed>``.
The ``runtime.*`` tags say what the config leaves to the machine (:func:`runtime_tags`): two runs of
one config compute the same numbers only where these agree too.
"""
from __future__ import annotations

import os
import platform
import sys
from importlib.metadata import PackageNotFoundError, version

import torch
from lightning.pytorch.cli import SaveConfigCallback

from paw_lightning.envs import tagged_env_kwargs
from paw_lightning.model import weights_dtype
from paw_lightning.tracking.artifacts import mlflow_logger
from paw_lightning.tracking.logger import git_sha
from paw_lightning.tracking.resumed_config import changed_settings, logged_config


ALGORITHM_NAMES = {"GAE": "ppo"}  # the `algorithm` tag: the advantage estimator's name, lower case, except PPO


def env_tags(datamodule) -> dict[str, str]:
    """``env.<name>``: each of the training environment's ``tagged_kwargs`` and its value in this
    run, e.g. ``{"env.reward": "webshop"}`` (:func:`~paw_lightning.envs.registry.tagged_env_kwargs`)."""
    return {f"env.{name}": str(value) for name, value in tagged_env_kwargs(getattr(datamodule, "env_factory", None)).items()}


VERSIONED = ("torch", "transformers", "peft", "lightning")


def device_name(device: torch.device) -> str:
    """The GPU's name; the CPU's model name (``/proc/cpuinfo``) and the logical CPUs this process
    may run on; else the device type."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type != "cpu":
        return device.type
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            model = next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{model} ({usable} logical CPUs)"


def package_versions(names=VERSIONED) -> str:
    """e.g. ``torch 2.13.0, transformers 5.23.0, …`` (a package that is not installed is left out)."""
    found = []
    for name in names:
        try:
            found.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            continue
    return ", ".join(found)


def runtime_tags(trainer, pl_module) -> dict[str, str]:
    """What the config leaves to the machine, and so what can change a run's numbers: the
    device, the base weights' dtype (``model.lm.dtype: auto`` picks by hardware), Lightning's
    precision, the world size, torch's CPU threads (``threads: auto`` picks by load; a different
    count changes float rounding) and the versions of the numeric packages. A resumed run's tags
    are those of its latest segment."""
    device = trainer.strategy.root_device
    tags = {
        "runtime.device": device_name(device),
        "runtime.base_dtype": str(weights_dtype(pl_module.lm_config.dtype, device)).removeprefix("torch."),
        "runtime.precision": str(trainer.precision),
        "runtime.world_size": str(trainer.world_size),
        "runtime.versions": package_versions(),
    }
    if device.type == "cpu":
        tags["runtime.torch_threads"] = str(torch.get_num_threads())
    return tags


class MLflowSaveConfigCallback(SaveConfigCallback):
    """Saves the resolved config as the run's ``config.yaml`` artifact, plus git SHA, seed and
    the tags that let the MLflow UI group runs (environment, algorithm, objectives); a resume
    says which settings it changed (:mod:`paw_lightning.tracking.resumed_config`)."""

    def __init__(self, parser, config, **kwargs):
        kwargs["save_to_log_dir"] = False
        super().__init__(parser, config, **kwargs)

    def save_config(self, trainer, pl_module, stage: str) -> None:
        logger = mlflow_logger(trainer)
        if logger is None:
            return
        client, run_id = logger.experiment, logger.run_id
        dumped = self.parser.dump(self.config, skip_none=False)
        before = logged_config(client, run_id, self.config_filename) if getattr(logger, "_resuming", False) else None
        changed = changed_settings(before, dumped) if before is not None else []
        if changed:
            print(f"warning: resuming MLflow run {run_id} with {len(changed)} setting{'s' if len(changed) > 1 else ''} changed from "
                  f"its config: {'; '.join(changed)}", file=sys.stderr)
            client.set_tag(run_id, "resume.changed", "; ".join(changed)[:4000])
        client.log_text(run_id, dumped, self.config_filename)
        sha = git_sha()
        datamodule = trainer.datamodule
        wm = pl_module.world_model_objective
        advantage = type(getattr(pl_module.policy_objective, "advantage", None)).__name__
        tags = {
            "git_sha": sha,
            "mlflow.source.git.commit": sha,
            "env": datamodule.env_name if datamodule is not None else "",
            "policy_objective": type(pl_module.policy_objective).__name__,
            "advantage": advantage,
            "algorithm": ALGORITHM_NAMES.get(advantage, advantage.lower()),
            "world_model_objective": type(wm).__name__ if wm is not None else "none",
            **(env_tags(datamodule) if datamodule is not None else {}),
            **runtime_tags(trainer, pl_module),
        }
        if logger._run_name is None and not getattr(logger, "_resuming", False):  # named like the sweeps' runs, not at random
            tags["mlflow.runName"] = f"{tags['algorithm']}+{tags['world_model_objective'] if wm is not None else 'vanilla'}/seed{datamodule.seed if datamodule is not None else 0}"
        for key, value in tags.items():
            client.set_tag(run_id, key, value)
        if datamodule is not None:
            logged = client.get_run(run_id).data.params.get("seed")
            if logged is not None and logged != str(datamodule.seed):  # a resumed run (MLflow params are write-once)
                raise ValueError(f"MLflow run {run_id} was logged with seed {logged}, not {datamodule.seed}: resume with the same seed (--seed_everything={logged} or --data.seed={logged})")
            client.log_param(run_id, "seed", datamodule.seed)
