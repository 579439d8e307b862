"""experiments/dream_checkpoints.py: which weights it validates and the table it writes
(the validations themselves are the dream evaluation's, tested in test_dream*.py)."""
from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "experiments"))
import dream_checkpoints  # noqa: E402


def test_the_warmup_file_is_the_one_the_benchmark_log_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "warmup-frozenlake-abc.pt").write_bytes(b"x")
    log = tmp_path / "warmup.log"
    log.write_text("noise\nbehaviour-cloning warm-up loaded from cache/warmup-frozenlake-abc.pt (its loss: 0.7 → 0.1)\n")
    assert dream_checkpoints.warmup_weights(log) == "cache/warmup-frozenlake-abc.pt"
    log.write_text("behaviour-cloning warm-up saved to cache/warmup-frozenlake-abc.pt\n")
    assert dream_checkpoints.warmup_weights(log) == "cache/warmup-frozenlake-abc.pt"
    log.write_text("behaviour-cloning warm-up saved to cache/other.pt\n")
    with pytest.raises(SystemExit, match="not found here"):
        dream_checkpoints.warmup_weights(log)
    with pytest.raises(SystemExit, match="no cached warm-up"):
        dream_checkpoints.warmup_weights(tmp_path / "missing.log")


def test_only_a_finished_run_checkpoint_is_taken(tmp_path):
    seed_dir = tmp_path / "seed4"
    killed = seed_dir / "1" / "aaa" / "checkpoints" / "last.ckpt"
    finished = seed_dir / "1" / "bbb" / "checkpoints" / "last.ckpt"
    for path in (killed, finished):
        path.parent.mkdir(parents=True)
        path.write_bytes(b"x")
    with pytest.raises(SystemExit, match="no finished run"):
        dream_checkpoints.last_checkpoint(seed_dir)
    (finished.parent.parent / "summary.json").write_text("{}")
    os.utime(killed, (2e9, 2e9))  # the killed run's checkpoint is the newer one
    assert dream_checkpoints.last_checkpoint(seed_dir) == finished


def test_table_mean_and_std_over_seeds():
    args = SimpleNamespace(tasks=8, horizon=1, env="frozenlake", seeds=[0, 1])
    runs = [{"val/dream/exact_at_1": 0.25, "val/dream/cer_at_1": 0.5, "val/dream/success": 0.0, "val/wm_onpolicy/nll": 0.4},
            {"val/dream/exact_at_1": 0.75, "val/dream/cer_at_1": 0.25, "val/dream/success": 0.5, "val/wm_onpolicy/nll": 0.6}]
    text = dream_checkpoints.table({"warm-up (before RL)": runs}, args)
    header, _, row = text.strip().splitlines()[-3:]
    cells = dict(zip([h.strip() for h in header.split("|")[1:-1]], [c.strip() for c in row.split("|")[1:-1]]))
    # exact: 25 % and 75 % -> mean 50, sample std 35.355; CER 0.5, 0.25 -> 0.375 ± 0.177
    assert cells["exact@1 %"] == "50.0 ± 35.4"
    assert cells["CER@1"] == "0.375 ± 0.177"
    assert cells["success in the model %"] == "25.0 ± 35.4"
    assert cells["wm NLL"] == "0.500 ± 0.141"
    assert cells["replay success %"] == "–"  # not logged by these runs


def test_an_earlier_report_with_the_same_dream_settings_is_reused(tmp_path, monkeypatch):
    root = tmp_path / "dream" / "paw" / "seed4" / "eval"
    root.mkdir(parents=True)
    (root / "val_epoch13.json").write_text(json.dumps({"eval": {"dream": {"horizon": 4, "tasks": 32}}, "metrics": {"val/dream/success": 0.25}}))
    monkeypatch.setattr(dream_checkpoints.subprocess, "run", lambda *a, **k: pytest.fail("validated again"))
    args = SimpleNamespace(horizon=4, tasks=32, threads=1, env="frozenlake", algorithm="gigpo_verl", overlay="o.yaml")
    assert dream_checkpoints.validate(args, [], "paw", 4, [], "paw", tmp_path) == {"val/dream/success": 0.25}
    args.tasks = 8  # other settings: validated again
    with pytest.raises(pytest.fail.Exception, match="validated again"):
        dream_checkpoints.validate(args, [], "paw", 4, [], "paw", tmp_path)
