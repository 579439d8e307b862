"""Bad input ends with one clear `error:` line, exit code 2 and no traceback."""
from __future__ import annotations

import runpy
import subprocess
import sys

import pytest

from helpers import ROOT, tiny_args


def run_cli(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "paw_lightning", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # the CLI in a subprocess
@pytest.mark.parametrize(
    "extra, expected",
    [
        (["--data.env=frozenlak"], "unknown environment 'frozenlak'"),
        (["--model.lm.name_or_path=/no/such/model"], "/no/such/model"),
        (["--data.rollout.groups=0"], "data.rollout.groups = 0: must be an integer > 0"),
        (["--data.evaluation.fixed.sources=[oracle]"], "data.evaluation.fixed.sources: unknown source 'oracle'"),
        (["--data.evaluation.fixed.tasks=0"], "data.evaluation.fixed.tasks = 0: must be an integer > 0"),
        (["--data.evaluation.fixed.transitions=0"], "data.evaluation.fixed.transitions = 0: must be an integer > 0"),
        (["--data.env_kwargs.hole_prob=2"], "data.env_kwargs.hole_prob = 2: must be a number >= 0 and < 1"),  # the environment's own range
        (["--data.evaluation.env_kwargs.size=1"], "data.evaluation.env_kwargs.size = 1: must be an integer >= 2"),
    ],
)
def test_bad_values_give_one_clear_line(tiny_model_dir, tmp_path, extra, expected):
    result = run_cli("fit", *tiny_args(tiny_model_dir, tmp_path), *extra, cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and expected in error_lines[0], result.stderr[-2000:]


@pytest.mark.slow  # the CLI in a subprocess
def test_malformed_yaml(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  max_epochs: [1,\n data: {\n")
    result = run_cli("fit", "-c", str(bad), cwd=tmp_path)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "bad.yaml" in result.stderr


def test_print_config_lists_the_objectives(capsys, monkeypatch):
    """``python -m paw_lightning fit … --print_config``, run as ``-m`` runs it (``__main__``) in this process."""
    monkeypatch.setattr(sys, "argv", ["paw_lightning", "fit", "-c", str(ROOT / "configs/frozenlake.yaml"), "--print_config"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_module("paw_lightning", run_name="__main__")
    assert exit_info.value.code in (0, None), capsys.readouterr().err[-2000:]
    out = capsys.readouterr().out
    assert "paw_lightning.objectives.PolicyObjective" in out and "reload_dataloaders_every_n_epochs: 1" in out
