"""The main job's story: a validation before the first update, the before → after summary
built from logged metrics, and plain progress lines when stdout is not a terminal."""
from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import pytest

from paw_lightning.callbacks.summary import SummaryRow, format_markdown, format_summary, summary_rows
from paw_lightning.cli import main

from helpers import ROOT, mlflow_runs, tiny_args

# --------------------------------------------------------------- the table
BEFORE = {
    "val/episode/success_rate": 0.25, "val/episode/success_rate/pick": 0.5, "val/episode/success_rate/look": 0.0,
    "val/episode/invalid_rate": 0.125, "val/episode/return_mean": 2.5, "val/wm_onpolicy/nll": 1.25, "val/wm_onpolicy/exact_match": math.nan,
    "val/episode/pass_at_1": 0.25, "val/wm_onpolicy/cer": 0.9,  # logged, not rows of the table
    "val/wm_fixed/all/nll": 1.5, "val/wm_fixed/expert/nll": 1.0, "val/wm_fixed/start_policy/nll": 2.0, "val/wm_fixed/all/exact_match": 0.0,
    "val/wm_fixed/expert/token_acc": 0.5,  # logged, not a row
}
AFTER = {
    "val/episode/success_rate": 0.5, "val/episode/success_rate/pick": 1.0, "val/episode/success_rate/look": 0.0,
    "val/episode/success_rate/pick2": 0.5,  # a task type only the second validation has
    "val/episode/invalid_rate": 0.05, "val/episode/return_mean": 5.0, "val/wm_onpolicy/nll": 0.75, "val/wm_onpolicy/exact_match": 0.375,
    "val/wm_fixed/all/nll": 1.0, "val/wm_fixed/expert/nll": 0.5, "val/wm_fixed/start_policy/nll": 1.5, "val/wm_fixed/all/exact_match": 0.25,
}


def test_summary_table_from_hand_written_metrics():
    rows = summary_rows(BEFORE, AFTER)
    assert [r.key for r in rows] == [
        "val/episode/success_rate", "val/episode/success_rate/pick", "val/episode/success_rate/look", "val/episode/success_rate/pick2",
        "val/episode/invalid_rate", "val/episode/return_mean", "val/wm_fixed/all/nll", "val/wm_fixed/expert/nll", "val/wm_fixed/start_policy/nll",
        "val/wm_fixed/all/exact_match", "val/wm_onpolicy/nll", "val/wm_onpolicy/exact_match",
    ]  # ALFWorld's task-type order; the fixed set's rows, then the on-policy ones (a source not logged has none); NaN counts as missing
    assert [r.change for r in rows][:3] == [0.25, 0.5, 0.0] and rows[3].change is None and rows[-1].before is None
    text = format_summary(rows, "before the first update", "after epoch 4", "val: 4 held-out tasks × 2 episodes, temperature 0.4")
    assert text.splitlines() == [
        "Summary: held-out validation before the first update → after epoch 4",
        "val: 4 held-out tasks × 2 episodes, temperature 0.4",
        "                                    before   after    change  metric",
        "success rate                         25.0%   50.0%  +25.0 pp  val/episode/success_rate",
        "  pick                               50.0%  100.0%  +50.0 pp  val/episode/success_rate/pick",
        "  look                                0.0%    0.0%   +0.0 pp  val/episode/success_rate/look",
        "  pick2                                  –   50.0%         –  val/episode/success_rate/pick2",
        "invalid-action rate                  12.5%    5.0%   -7.5 pp  val/episode/invalid_rate",
        "return                               2.500   5.000    +2.500  val/episode/return_mean",
        "world-model NLL, fixed set           1.500   1.000    -0.500  val/wm_fixed/all/nll",
        "  expert                             1.000   0.500    -0.500  val/wm_fixed/expert/nll",
        "  start policy                       2.000   1.500    -0.500  val/wm_fixed/start_policy/nll",
        "world-model exact match, fixed set    0.0%   25.0%  +25.0 pp  val/wm_fixed/all/exact_match",
        "world-model NLL, on-policy           1.250   0.750    -0.500  val/wm_onpolicy/nll",
        "world-model exact match, on-policy       –   37.5%         –  val/wm_onpolicy/exact_match",
    ]
    markdown = format_markdown(rows, "before the first update", "after epoch 4")
    assert "| pick2 | – | 50.0% | – | `val/episode/success_rate/pick2` |" in markdown.splitlines()


def test_summary_rows_without_task_types_or_world_model_objective():
    """FrozenLake has no task types; vanilla RL still has val/wm_onpolicy/* (measured at every validation)."""
    before = {"val/episode/success_rate": 0.0, "val/episode/return_mean": -0.2, "val/episode/invalid_rate": 1.0, "val/wm_onpolicy/nll": 4.5, "val/wm_onpolicy/exact_match": 0.0}
    after = {**before, "val/episode/success_rate": 0.75, "val/wm_onpolicy/nll": 4.0}
    rows = summary_rows(before, after)
    assert [(r.label, r.before, r.after) for r in rows] == [
        ("success rate", 0.0, 0.75), ("invalid-action rate", 1.0, 1.0), ("return", -0.2, -0.2), ("world-model NLL, on-policy", 4.5, 4.0),
        ("world-model exact match, on-policy", 0.0, 0.0),
    ]
    scored = summary_rows({**before, "val/episode/score": 12.5}, {**after, "val/episode/score": 50.0})  # WebShop; the world-model task's exact match
    assert [(r.label, r.before, r.after, r.change) for r in scored if r.key == "val/episode/score"] == [("score (%)", 12.5, 50.0, 37.5)]
    assert format_summary(scored, "a", "b").count("12.500") == 1
    task = summary_rows({**before, "val/episode/score": 12.5}, after, env="world_model")  # RWML's: reward rate, exact match of the samples
    assert [r.label for r in task][:2] == ["reward rate (1 − cos < τ_d)", "invalid-action rate"] and task[3].label == "sampled predictions exact (%)"
    assert SummaryRow("x", "val/wm_onpolicy/nll", None, 1.0).change is None
    assert summary_rows({}, {}) == []


# --------------------------------------------------------------- end to end
def _printed_rows(stdout: str) -> tuple[str, dict[str, tuple[str, str, str]]]:
    """The summary's first line and its rows: metric key → (before, after, change) cells."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Summary: held-out validation"))
    rows = {}
    for line in lines[start + 3:]:
        if line.startswith("From the "):
            break
        *_, before, after, change, key = re.split(r"\s{2,}", line.strip())
        rows[key] = (before, after, change)
    return lines[start], rows


def _cell_matches(cell: str, value: float) -> bool:
    """A printed cell shows the logged value: in % with one decimal for rates, else 3 decimals."""
    if cell.endswith("%"):
        return abs(float(cell[:-1]) - 100 * value) <= 0.05 + 1e-9
    return abs(float(cell) - value) <= 0.0005 + 1e-9


def _value_at(client, run, key: str, step: int) -> float:
    (value,) = [m.value for m in client.get_metric_history(run.info.run_id, key) if m.step == step]
    return value


@pytest.mark.slow
def test_fit_prints_the_summary_of_its_logged_validations_and_plain_progress_lines(tiny_model_dir, tmp_path):
    """3 epochs validating every 2nd: the validation before the first update (step -1), epoch 1's,
    and one after the last epoch (2), which did not validate. The printed table and summary.json
    hold the values MLflow got at steps -1 and 2; stdout (a pipe) has one plain line per epoch."""
    args = tiny_args(tiny_model_dir, tmp_path, "--trainer.max_epochs=3", "--trainer.check_val_every_n_epoch=2", "--trainer.enable_progress_bar=true",
                     "--data.progress=true", "--summary.validate_at_start=true", "--summary.validate_at_end=true", "--model.optimizer.init_args.lr=0.01")
    result = subprocess.run([sys.executable, "-m", "paw_lightning", "fit", *args], cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    out = result.stdout
    client, (run,) = mlflow_runs(tmp_path)

    # the validations: before the first update at step (= epoch) -1, then epochs 1 and 2
    steps = [m.step for m in sorted(client.get_metric_history(run.info.run_id, "val/episode/success_rate"), key=lambda m: m.step)]
    assert steps == [-1, 1, 2]
    assert _value_at(client, run, "epoch", -1) == -1
    artifacts = {a.path for folder in ("eval", "trajectories") for a in client.list_artifacts(run.info.run_id, folder)}
    assert {"eval/val_start.json", "eval/val_epoch1.json", "eval/val_epoch2.json", "trajectories/val_start.json", "trajectories/val_epoch2.json"} <= artifacts
    report = json.loads((next(tmp_path.glob("runs/**/eval/val_start.json"))).read_text())
    assert report["epoch"] == -1 and report["global_step"] == 0
    assert report["metrics"]["val/wm_onpolicy/nll"] == _value_at(client, run, "val/wm_onpolicy/nll", -1)

    # the printed summary: every cell is the value logged at step -1 (before) and step 2 (after)
    first, rows = _printed_rows(out)
    assert first == "Summary: held-out validation before the first update → after epoch 2"
    fixed = [f"val/wm_fixed/{s}/nll" for s in ("all", "expert", "random", "start_policy")] + ["val/wm_fixed/all/exact_match"]
    assert list(rows) == ["val/episode/success_rate", "val/episode/invalid_rate", "val/episode/return_mean", *fixed, "val/wm_onpolicy/nll", "val/wm_onpolicy/exact_match"]
    for key, (before, after, change) in rows.items():
        b, a = _value_at(client, run, key, -1), _value_at(client, run, key, 2)
        assert _cell_matches(before, b) and _cell_matches(after, a), (key, before, after, b, a)
        assert _cell_matches(change.removesuffix(" pp") + ("%" if change.endswith("pp") else ""), a - b), (key, change)
    assert rows["val/wm_onpolicy/nll"][0] != rows["val/wm_onpolicy/nll"][1]  # trained: the world model's loss moved
    assert f"(MLflow run {run.info.run_id}: summary.md, summary.json)" in out

    # the random tiny model never writes a valid action: every episode gets the same return,
    # every advantage is 0, and after the 3rd such update the run says so, once
    zero = [m.value for m in client.get_metric_history(run.info.run_id, "train/policy/zero_advantage_fraction")]
    assert zero == [1.0, 1.0, 1.0]
    assert out.count("warning: no learning signal for 3 updates in a row") == 1
    (tmp_path / "download").mkdir()
    with open(client.download_artifacts(run.info.run_id, "summary.json", str(tmp_path / "download"))) as f:
        summary = json.load(f)
    assert (summary["before"]["epoch"], summary["after"]["epoch"]) == (-1, 2)
    for side, step in (("before", -1), ("after", 2)):
        logged = {k: _value_at(client, run, k, step) for k in summary[side]["metrics"]}
        assert summary[side]["metrics"] == logged and "val/episode/pass_at_1" in logged, side
    assert "summary.md" in {a.path for a in client.list_artifacts(run.info.run_id)}

    # plain progress: no animation, one line per epoch and per validation outside an epoch
    assert "\r" not in out and "\x1b[" not in out, out[:2000]
    progress = [line for line in out.splitlines() if line.startswith(("epoch ", "validation "))]
    assert [line.split(" · ")[0] for line in progress] == [
        "validation before the first update", "epoch 0/2", "epoch 1/2", "epoch 2/2", "validation after epoch 2"]
    for epoch, line in zip(range(3), progress[1:4]):
        train = _value_at(client, run, "train/episode/success_rate", epoch)
        assert f"· train success {train:.2f} ·" in line and line.endswith(" s"), line
    val = _value_at(client, run, "val/episode/return_mean", 1)
    assert f"val success {_value_at(client, run, 'val/episode/success_rate', 1):.2f} · return {val:.2f}" in progress[2]
    assert "val success" not in progress[1] and "val success" not in progress[3]


@pytest.mark.slow
def test_two_processes_validate_before_and_after_and_print_once(tiny_model_dir, tmp_path):
    """FSDP2 on 2 CPU processes: the extra validations are collectives every rank joins (no hang);
    rank 0 alone prints the progress lines and the summary."""
    args = tiny_args(tiny_model_dir, tmp_path, "-c", str(ROOT / "configs/scale/fsdp2.yaml"), "--trainer.accelerator=cpu", "--trainer.max_epochs=2",
                     "--trainer.check_val_every_n_epoch=3", "--trainer.enable_progress_bar=true", "--summary.validate_at_start=true", "--summary.validate_at_end=true")
    result = subprocess.run([sys.executable, "-m", "paw_lightning", "fit", *args], cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    client, (run,) = mlflow_runs(tmp_path)
    assert [m.step for m in sorted(client.get_metric_history(run.info.run_id, "val/wm_onpolicy/nll"), key=lambda m: m.step)] == [-1, 1]
    out = result.stdout
    assert out.count("Summary: held-out validation before the first update → after epoch 1") == 1, out
    assert [line.split(" · ")[0] for line in out.splitlines() if line.startswith(("epoch ", "validation "))] == [
        "validation before the first update", "epoch 0/1", "epoch 1/1", "validation after epoch 1"]


@pytest.mark.slow
def test_resumed_fit_reads_its_before_from_mlflow(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """Also: the validation before the first update is a normal validation: without a warm-up it
    logs exactly what ``validate`` of the base model logs."""
    monkeypatch.chdir(tmp_path)
    start = ("--summary.validate_at_start=true", "--summary.validate_at_end=true")
    main(["fit", *tiny_args(tiny_model_dir, tmp_path, "--trainer.max_epochs=1", *start)])
    capsys.readouterr()
    (ckpt,) = tmp_path.glob("runs/**/last.ckpt")
    main(["fit", *tiny_args(tiny_model_dir, tmp_path, "--trainer.max_epochs=2", *start), f"--ckpt_path={ckpt}"])
    out = capsys.readouterr().out
    client, (run,) = mlflow_runs(tmp_path)
    assert [m.step for m in sorted(client.get_metric_history(run.info.run_id, "val/episode/success_rate"), key=lambda m: m.step)] == [-1, 0, 1]
    first, rows = _printed_rows(out)
    assert first == "Summary: held-out validation before the first update → after epoch 1"
    for key, (before, after, _) in rows.items():
        assert _cell_matches(before, _value_at(client, run, key, -1)) and _cell_matches(after, _value_at(client, run, key, 1)), key

    main(["validate", *tiny_args(tiny_model_dir, tmp_path)])
    (start,), (base,) = tmp_path.glob("runs/**/eval/val_start.json"), tmp_path.glob("runs/**/eval/val_base.json")
    start, base = json.loads(start.read_text()), json.loads(base.read_text())
    assert start["metrics"] == base["metrics"] and start["eval"] == base["eval"] and start["epoch"] == -1
