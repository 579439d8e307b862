"""Bad input ends with one clear `error:` line, exit code 2 and no traceback."""
from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import ROOT, tiny_args

pytestmark = pytest.mark.slow  # every test runs the CLI in a subprocess


def run_cli(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "paw_lightning", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    "extra, expected",
    [
        (["--data.env=frozenlak"], "unknown environment 'frozenlak'"),
        (["--model.lm.name_or_path=/no/such/model"], "/no/such/model"),
        (["--data.rollout.groups=0"], "data.rollout.groups must be at least 1"),
    ],
)
def test_bad_values_give_one_clear_line(tiny_model_dir, tmp_path, extra, expected):
    result = run_cli("fit", *tiny_args(tiny_model_dir, tmp_path), *extra, cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and expected in error_lines[0], result.stderr[-2000:]


def test_malformed_yaml(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  max_epochs: [1,\n data: {\n")
    result = run_cli("fit", "-c", str(bad), cwd=tmp_path)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "bad.yaml" in result.stderr


def test_print_config_lists_the_objectives(tmp_path):
    result = run_cli("fit", "-c", str(ROOT / "configs/frozenlake.yaml"), "--print_config", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "paw_lightning.objectives.PolicyObjective" in result.stdout and "reload_dataloaders_every_n_epochs: 1" in result.stdout
