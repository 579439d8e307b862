"""The algorithm comparison command runs its grid and prints the table."""
from __future__ import annotations

import re
import subprocess
import sys

from helpers import ROOT


def test_compare_algorithms_two_tiny_runs(tiny_model_dir, tmp_path):
    cmd = [sys.executable, str(ROOT / "experiments/compare_algorithms.py"), "--algorithms", "grpo", "rloo", "--seeds", "0",
           "--epochs", "1", "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", "--",
           "-c", str(ROOT / "tests/configs/tiny.yaml"), f"--model.lm.name_or_path={tiny_model_dir}"]
    result = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"grpo +seed 0: ok", result.stdout) and re.search(r"rloo +seed 0: ok", result.stdout), result.stdout
    rows = [line for line in result.stdout.splitlines() if line.startswith("| grpo-vanilla") or line.startswith("| rloo-vanilla")]
    assert len(rows) == 2 and all(row.count("±") == 2 for row in rows), result.stdout
