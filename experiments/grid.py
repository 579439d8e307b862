"""Grid points of an ablation sweep: the `python -m paw_lightning …` command of one point,
running it as a subprocess with its log in the point's output directory, and the summary
of a whole sweep (used by ``sweep.py`` through Hydra and by ``compare_algorithms.py``).

A point never raises: a run that exits non-zero, times out or cannot start is recorded
(``result.json`` next to its ``run.log``) and the sweep goes on; the summary lists every
point with its status, and the last lines of the log of each failed one.
"""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hydra.experimental.callback import Callback

from paw_lightning import analysis

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
STAGES = ("fit", "validate")
METHODS = ("none", "spa", "rwml")  # what runs before (rwml) or inside (spa) the point's RL fit
TAIL_LINES = 15
LAST_FAILURES: int | None = None  # set by SweepSummary: failed points of the last sweep


def available(folder: Path) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.yaml"))


def overlay(kind: str, name: str) -> Path:
    """``configs/algorithms/<name>.yaml`` or ``configs/objectives/<name>.yaml``."""
    folder = CONFIGS / {"algorithm": "algorithms", "objective": "objectives"}[kind]
    path = folder / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"unknown {kind} {name!r}: choose one of {', '.join(available(folder))} (files in {folder.relative_to(ROOT)}/)")
    return path


def env_config(env: str) -> Path:
    """An environment config by name (``frozenlake`` → ``configs/frozenlake.yaml``) or by
    path (relative to the working directory, else to the repository)."""
    if "/" not in env and not env.endswith((".yaml", ".yml")):
        path = CONFIGS / f"{env}.yaml"
        if path.is_file():
            return path
        raise ValueError(f"unknown env {env!r}: choose one of {', '.join(available(CONFIGS))} or give a path to a config file")
    for path in (Path(env), ROOT / env):
        if path.is_file():
            return path.resolve()
    raise FileNotFoundError(f"env config file '{env}' does not exist (relative paths are tried from the working directory and from {ROOT})")


def check_method(method: str) -> str:
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}: choose one of {', '.join(METHODS)}")
    return method


def check_stage(stage: str) -> str:
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}: choose one of {', '.join(STAGES)}")
    return stage


def flatten(params: dict, prefix: str = "") -> dict[str, object]:
    """``{"model": {"lr": 1}}`` → ``{"model.lr": 1}``."""
    out = {}
    for key, value in params.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def cli_value(value: object) -> str:
    """A value as the paw_lightning CLI parses it (YAML)."""
    if isinstance(value, str):
        return value
    return json.dumps(value)


def is_method_overlay(path: str) -> bool:
    """A config file of ``configs/methods/`` (a method or one of its ablations)."""
    return Path(path).resolve().parent == CONFIGS / "methods"


def spa_position(cmd: list[str]) -> int:
    """Where ``configs/methods/spa.yaml`` goes in a fit command: after every config file, so that it
    replaces the learning overlay's warm-up, but before SPA's own ablation overlays (config files
    under ``configs/methods/``, e.g. ``spa_sft1.yaml``), which change it."""
    files = [i for i, arg in enumerate(cmd) if arg == "-c"]
    ablations = [i for i in files if is_method_overlay(cmd[i + 1])]
    return ablations[0] if ablations else files[-1] + 2


@dataclass
class GridPoint:
    """One run: ``stage`` ∈ {fit, validate} of ``env`` with one algorithm and one objective
    overlay, a seed, per-point dotted overrides ``params`` (part of the run name) and
    ``extra`` CLI arguments shared by the sweep (not part of the name). ``extra`` comes right
    after the overlays (so it may add ``-c`` files), before the point's own settings (seed,
    logger, epochs, params), which therefore win. ``validate`` without a checkpoint
    evaluates the untrained model: its configuration is ``base``. The MLflow run gets the
    tags ``config`` (the label: the results table's row), ``algorithm_overlay``,
    ``objective_overlay``, ``seed`` and ``stage``. ``method``: ``spa`` adds
    ``configs/methods/spa.yaml`` after every config file (``extra``'s too) but before SPA's ablation overlays
    in ``extra`` (``-c configs/methods/spa_sft1.yaml``); ``rwml`` first runs the RWML stage
    (``configs/methods/rwml.yaml`` on the environment the fit plays, MLflow experiment
    ``<experiment_name>-rwml``) and starts the fit from its ``last.ckpt`` (``validate``: no method)."""

    env: str
    algorithm: str
    objective: str
    seed: int
    experiment_name: str
    tracking_uri: str
    stage: str = "fit"
    epochs: int | None = None
    params: dict = field(default_factory=dict)
    extra: list[str] = field(default_factory=list)
    method: str = "none"

    @property
    def label(self) -> str:
        """The configuration: ``[<method>+]<algorithm>+<objective>[,<param>=<value>…]`` or ``base``."""
        name = "base" if self.stage == "validate" else f"{self.algorithm}+{self.objective}"
        if self.method != "none" and self.stage != "validate":
            name = f"{self.method}+{name}"
        return ",".join([name] + [f"{k.rsplit('.', 1)[-1]}={cli_value(v)}" for k, v in flatten(self.params).items()])

    @property
    def run_name(self) -> str:
        return f"{self.label}/seed{self.seed}"

    def command(self, output_dir: Path) -> list[str]:
        """The subprocess command; raises ValueError/FileNotFoundError for unknown names."""
        check_stage(self.stage)
        tags = {"config": self.label, "algorithm_overlay": self.algorithm, "objective_overlay": self.objective, "seed": str(self.seed), "stage": self.stage}
        cmd = [
            sys.executable, "-m", "paw_lightning", self.stage,
            "-c", str(env_config(self.env)),
            "-c", str(overlay("algorithm", self.algorithm)),
            "-c", str(overlay("objective", self.objective)),
            *[str(a) for a in self.extra],
            f"--seed_everything={self.seed}",
            f"--trainer.logger.init_args.experiment_name={self.experiment_name}",
            f"--trainer.logger.init_args.tracking_uri={self.tracking_uri}",
            f"--trainer.logger.init_args.run_name={self.run_name}",
            f"--trainer.logger.init_args.tags={json.dumps(tags)}",
            f"--trainer.default_root_dir={output_dir}",
            "--trainer.enable_progress_bar=false",
            "--data.progress=false",
        ]
        if self.epochs is not None and self.stage == "fit":
            cmd.append(f"--trainer.max_epochs={self.epochs}")
        if self.method == "spa" and self.stage == "fit":
            at = spa_position(cmd)
            cmd[at:at] = ["-c", str(CONFIGS / "methods/spa.yaml")]
        if self.method == "rwml" and self.stage == "fit":
            cmd.append(f"--model.init_weights={output_dir / 'rwml' / 'last.ckpt'}")
        return cmd + [f"--{key}={cli_value(value)}" for key, value in flatten(self.params).items()]

    def rwml_command(self, output_dir: Path) -> list[str]:
        """The RWML stage before the fit: world-model triplets of the environment the fit plays
        (the env config, then ``extra``'s config files and ``--data.env…=`` overrides)."""
        from paw_lightning.cli import resolved_config

        files = [self.extra[i + 1] for i, arg in enumerate(self.extra[:-1]) if arg in ("-c", "--config")]
        env_overrides = tuple(str(a) for a in self.extra if str(a).startswith(("--data.env=", "--data.env_kwargs")))
        data = resolved_config(env_config(self.env), *files, overrides=env_overrides)["data"]
        stage_dir = output_dir / "rwml"
        return [
            sys.executable, "-m", "paw_lightning", "fit", "-c", str(env_config(self.env)), "-c", str(CONFIGS / "methods/rwml.yaml"),
            f"--data.env_kwargs.source={data['env']}", f"--data.env_kwargs.source_kwargs={json.dumps(data.get('env_kwargs') or {})}",
            f"--data.env_kwargs.directory={stage_dir / 'triplets'}", f"--checkpoint.dirpath={stage_dir}", f"--trainer.default_root_dir={stage_dir}",
            f"--seed_everything={self.seed}", f"--trainer.logger.init_args.experiment_name={self.experiment_name}-rwml",
            f"--trainer.logger.init_args.tracking_uri={self.tracking_uri}", f"--trainer.logger.init_args.run_name={self.run_name}",
            f"--trainer.logger.init_args.tags={json.dumps({'config': self.label, 'seed': str(self.seed), 'stage': 'rwml'})}",
            "--trainer.enable_progress_bar=false", "--data.progress=false",
        ]

    def commands(self, output_dir: Path) -> list[list[str]]:
        """Every subprocess of the point, in order."""
        check_method(self.method)
        main = self.command(output_dir)
        return [self.rwml_command(output_dir), main] if self.method == "rwml" and self.stage == "fit" else [main]


def log_tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").rstrip().splitlines()[-lines:])
    except OSError:
        return ""


def kill(proc: subprocess.Popen) -> None:
    """Kill a point's process group (the run and its environment workers) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


RUNNING: set[subprocess.Popen] = set()  # the grid points' processes running now (several with parallel jobs)


def kill_running() -> None:
    """Stop every running grid point (Ctrl-C with parallel jobs: the worker threads cannot see it)."""
    for proc in list(RUNNING):
        kill(proc)


def run_command(cmd: list[str], out, timeout_s: float | None) -> tuple[str, int | None]:
    """Run one command with its output in ``out``: (status, exit code)."""
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    RUNNING.add(proc)
    try:
        proc.wait(timeout=None if timeout_s is None else max(timeout_s, 1.0))
        return ("ok" if proc.returncode == 0 else "failed"), proc.returncode
    except subprocess.TimeoutExpired:
        kill(proc)
        return "timeout", proc.returncode
    except BaseException:  # Ctrl-C: stop the run we started, then stop the sweep
        kill(proc)
        raise
    finally:
        RUNNING.discard(proc)


def run_point(point: GridPoint, output_dir: Path, num: int = 0, timeout_s: float | None = None) -> dict:
    """Run one grid point; write ``run.log`` and ``result.json`` in ``output_dir`` and return
    the result (status ``ok``, ``failed``, ``timeout`` or ``error`` when it could not start)."""
    output_dir = Path(output_dir).resolve()
    output_dir.mkdir(parents=True, exist_ok=True)
    log = output_dir / "run.log"
    result = {"num": num, "run_name": point.run_name, "config": point.label, "seed": point.seed, "status": "error",
              "returncode": None, "seconds": 0.0, "log": str(log), "command": [], "point": asdict(point)}
    start = time.time()
    print(f"[#{num}] {point.run_name}: running, log {log}", flush=True)
    try:
        commands = point.commands(output_dir)
        result["command"] = commands[-1]
        with open(log, "w") as out:
            for cmd in commands:  # the method's stage (if any), then the point's run
                out.write("$ " + shlex.join(cmd) + "\n")
                out.flush()
                result["status"], result["returncode"] = run_command(cmd, out, None if timeout_s is None else timeout_s - (time.time() - start))
                if result["status"] != "ok":
                    break
    except (OSError, ValueError) as err:
        result["message"] = f"{type(err).__name__}: {err}"
        try:
            with open(log, "a") as out:
                out.write(f"error: {err}\n")
        except OSError:
            pass
    result["seconds"] = round(time.time() - start, 1)
    if result["status"] != "ok":
        result["tail"] = log_tail(log) or result.get("message", "")
    (output_dir / "result.json").write_text(json.dumps(result, indent=2))
    exit_note = f" (exit code {result['returncode']})" if result["returncode"] not in (None, 0) else ""
    print(f"[#{num}] {point.run_name}: {result['status']}{exit_note} after {result['seconds']:.0f} s", flush=True)
    return result


def summary(results: list[dict]) -> str:
    """Markdown: a table of every point, then the log tail of each point that did not succeed."""
    failed = [r for r in results if r["status"] != "ok"]
    lines = [f"Sweep summary: {len(results) - len(failed)} of {len(results)} grid points succeeded", "",
             "| # | run | status | exit code | time (s) | log |", "|---|---|---|---|---|---|"]
    for r in results:
        code = "–" if r["returncode"] is None else r["returncode"]
        lines.append(f"| {r['num']} | {r['run_name']} | {r['status']} | {code} | {r['seconds']:.0f} | {r['log']} |")
    for r in failed:
        lines += ["", f"#{r['num']} {r['run_name']}: {r['status']}, last lines of its log:", "```", r.get("tail", ""), "```"]
    return "\n".join(lines)


def collect(folder: Path) -> list[dict]:
    """The ``result.json`` of every point under ``folder``, in launch order."""
    results = [json.loads(p.read_text()) for p in Path(folder).glob("**/result.json")]
    return sorted(results, key=lambda r: r["num"])


class SweepSummary(Callback):
    """Hydra callback: after the jobs, print the summary of the points under the sweep (or
    single-run) directory, write it to ``summary.md`` there and set ``LAST_FAILURES``."""

    def _report(self, folder: str, config) -> None:
        global LAST_FAILURES
        results = collect(Path(folder))
        text = summary(results)
        uri, name = config.get("tracking_uri") or analysis.default_tracking_uri(), config.get("experiment_name")
        text += f"\n\nResults table: python experiments/report.py --tracking-uri {uri} --experiment {name}\n"
        Path(folder, "summary.md").write_text(text)
        print("\n" + text, flush=True)
        LAST_FAILURES = sum(r["status"] != "ok" for r in results)

    def on_run_end(self, config, **kwargs) -> None:
        self._report(config.hydra.run.dir, config)

    def on_multirun_end(self, config, **kwargs) -> None:
        self._report(config.hydra.sweep.dir, config)
