"""Security basics: checkpoints and caches load with ``torch.load(weights_only=True)`` only, cache
files named after config values stay inside their cache directory, and every server command in
the docs binds the loopback interface."""
from __future__ import annotations

import ast
import re
from types import SimpleNamespace

import torch

from paw_lightning.callbacks import BehaviourCloningWarmup
from paw_lightning.model import LMConfig

from helpers import ROOT


def test_every_torch_load_in_the_package_is_weights_only():
    calls = []
    for path in (ROOT / "src/paw_lightning").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "torch.load":
                flags = {k.arg: ast.unparse(k.value) for k in node.keywords}
                calls.append((path.name, node.lineno, flags.get("weights_only")))
    assert calls, "the package loads checkpoints somewhere"
    assert [c for c in calls if c[2] != "True"] == [], "torch.load without weights_only=True (unpickles arbitrary code)"


def test_a_cache_file_named_after_the_environment_stays_in_the_cache(tmp_path):
    warmup = BehaviourCloningWarmup(cache_dir=str(tmp_path / "cache"))
    datamodule = SimpleNamespace(env_name="../../outside/evil", env_kwargs={}, prompt=SimpleNamespace(style="verl", history_length=2),
                                 rollout=SimpleNamespace(max_steps=4))
    path = warmup.cache_file(SimpleNamespace(lm_config=LMConfig(name_or_path="x"), lm=torch.nn.Linear(2, 2)), datamodule)
    assert path.resolve().parent == (tmp_path / "cache").resolve()


def test_documented_server_commands_bind_loopback():
    docs = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    commands = [(p.name, line) for p in docs for line in p.read_text().splitlines() if re.search(r"\bmlflow (server|ui)\b", line) and not line.lstrip().startswith(">")]
    assert commands
    for name, line in commands:
        assert "0.0.0.0" not in line, (name, line)
        assert "--host" not in line or "--host 127.0.0.1" in line, (name, line)
