"""Evaluation: pass@k by hand, JSON reports, the base-model row and deterministic re-evaluation."""
from __future__ import annotations

import json
from math import comb
from types import SimpleNamespace

import pytest
import torch

from paw_lightning.cli import main
from paw_lightning.data import RolloutDataModule, _EvalEpisodes
from paw_lightning.evaluation import first_token_quality, teacher_forced_quality
from paw_lightning.metrics import pass_at_k, pass_at_k_metrics
from paw_lightning.rollout.collector import Trajectory

from helpers import mlflow_runs, tiny_args


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 0, 1, 0.0),
        (4, 1, 1, 0.25),  # 1 − C(3,1)/C(4,1) = 1 − 3/4
        (4, 1, 2, 0.5),  # 1 − C(3,2)/C(4,2) = 1 − 3/6
        (4, 2, 2, 5 / 6),  # 1 − C(2,2)/C(4,2) = 1 − 1/6
        (4, 3, 2, 1.0),  # C(1,2) = 0: every pair holds a success
        (5, 2, 3, 0.9),  # 1 − C(3,3)/C(5,3) = 1 − 1/10
        (4, 4, 4, 1.0),
        (1, 1, 1, 1.0),
    ],
)
def test_pass_at_k_by_hand(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_binomials_for_large_n():
    for c in range(21):
        for k in (1, 5, 10, 20):
            assert pass_at_k(20, c, k) == pytest.approx(1 - comb(20 - c, k) / comb(20, k), abs=1e-12)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 5, 1), (4, -1, 1), (4, 1, 0), (4, 1, 5)])
def test_pass_at_k_rejects_impossible_counts(n, c, k):
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)


def test_pass_at_k_averages_over_tasks():
    def group(g, wins):
        return [Trajectory(g, g * 4 + e, 0, won=w) for e, w in enumerate(wins)]

    trajectories = group(0, [True, False, False, False]) + group(1, [False, True, True, False])  # c = 1 and c = 2 of n = 4
    metrics = pass_at_k_metrics(trajectories)
    assert set(metrics) == {"pass_at_1", "pass_at_2", "pass_at_3", "pass_at_4"}
    assert metrics["pass_at_1"] == pytest.approx((0.25 + 0.5) / 2)
    assert metrics["pass_at_2"] == pytest.approx((0.5 + 5 / 6) / 2)
    assert metrics["pass_at_3"] == pytest.approx((0.75 + 1.0) / 2)  # 1 − C(3,3)/C(4,3) = 3/4; n − c = 2 < 3 gives 1
    assert metrics["pass_at_4"] == pytest.approx(1.0)
    assert pass_at_k_metrics([]) == {}


def _reports(workdir):
    return {path.name: json.loads(path.read_text()) for path in sorted(workdir.glob("runs/*/*/eval/*.json"))}


@pytest.mark.slow
def test_base_model_validate_and_same_checkpoint_same_results(tiny_model_dir, tmp_path, monkeypatch):
    """validate without a checkpoint is the base row; validating one checkpoint twice gives the
    same tasks and the same numbers, equal to the validation inside fit with those weights."""
    monkeypatch.chdir(tmp_path)
    extra = ["--data.evaluation.group_size=2", "--trainer.max_epochs=1"]
    main(["validate", *tiny_args(tiny_model_dir, tmp_path, *extra)])
    client, (base,) = mlflow_runs(tmp_path)
    (base_report,) = _reports(tmp_path).values()
    assert base_report["stage"] == "validate" and base_report["epoch"] is None and base_report["checkpoint"] is None
    assert base_report["metrics"]["val/episode/episode_length"] == 2.0  # max_steps of the tiny overlay
    for key in ("val/episode/success_rate", "val/episode/return_mean", "val/episode/invalid_rate", "val/episode/pass_at_1",
                "val/episode/pass_at_2", "val/wm_onpolicy/nll", "val/wm_onpolicy/token_acc", "val/wm_onpolicy/first_token_nll", "val/wm_onpolicy/first_token_acc",
                "val/wm_onpolicy/exact_match", "val/wm_onpolicy/cer"):
        assert base.data.metrics[key] == pytest.approx(base_report["metrics"][key], abs=1e-6), key
    plan = base_report["eval"]
    assert plan["split"] == "val" and plan["temperature"] == 0.4 and plan["groups"] == 2 and plan["group_size"] == 2
    assert len(plan["task_seeds"]) == 2 and len(plan["sampling_seeds"]) == 1
    assert "eval/val_base.json" in [a.path for a in client.list_artifacts(base.info.run_id, "eval")]

    main(["fit", *tiny_args(tiny_model_dir, tmp_path, *extra)])
    (ckpt,) = tmp_path.glob("runs/**/last.ckpt")
    for _ in range(2):
        main(["validate", *tiny_args(tiny_model_dir, tmp_path, *extra), f"--ckpt_path={ckpt}"])
    client, runs = mlflow_runs(tmp_path)
    assert len(runs) == 4
    fitted, *checks = [r for r in runs[1:]]
    reports = {r.info.run_id: json.loads(p.read_text()) for r in runs[1:] for p in tmp_path.glob(f"runs/*/{r.info.run_id}/eval/val_epoch0.json")}
    assert len(reports) == 3, reports.keys()
    in_fit = reports[fitted.info.run_id]
    assert in_fit["stage"] == "fit" and in_fit["epoch"] == 0 and in_fit["eval"]["task_seeds"] == plan["task_seeds"]
    for run in checks:
        report = reports[run.info.run_id]
        assert report["stage"] == "validate" and report["epoch"] == 0 and report["checkpoint"] == str(ckpt)
        assert report["eval"] == in_fit["eval"]
        assert report["metrics"] == in_fit["metrics"]  # same weights, same tasks, same seeds: identical numbers
    assert in_fit["metrics"] != base_report["metrics"]  # training changed the model

    main(["test", *tiny_args(tiny_model_dir, tmp_path, *extra, "--data.evaluation.test_groups=2"), f"--ckpt_path={ckpt}"])
    client, runs = mlflow_runs(tmp_path)
    tested = runs[-1]
    (report_path,) = tmp_path.glob(f"runs/*/{tested.info.run_id}/eval/test_epoch0.json")
    report = json.loads(report_path.read_text())
    assert report["stage"] == "test" and report["eval"]["split"] == "test" and report["eval"]["task_seeds"] != plan["task_seeds"]
    assert report["metrics"] and all(k.startswith("test/") for k in report["metrics"])
    assert report["metrics"]["test/episode/pass_at_2"] == tested.data.metrics["test/episode/pass_at_2"]
    artifacts = {a.path for a in client.list_artifacts(tested.info.run_id, "eval")} | {a.path for a in client.list_artifacts(tested.info.run_id, "trajectories")}
    assert artifacts == {"eval/test_epoch0.json", "trajectories/test_epoch0.json"}


def test_evaluation_batches_group_samples_by_length():
    """The held-out samples go into batches by length: each batch is right-padded to its
    longest sample, so grouping similar lengths pads least (the metrics are token sums, so the
    grouping changes none of them); every sample is in exactly one batch."""
    lengths = [900, 400, 700, 410, 950, 690, 420, 880]

    class Buffer:
        input_ids = [torch.zeros(n) for n in lengths]

        def __len__(self):
            return len(self.input_ids)

        def collate(self, indices):
            return list(indices)

    buffer = Buffer()
    datamodule = SimpleNamespace(play_eval=lambda split, groups: buffer, _split=RolloutDataModule._split, evaluation=SimpleNamespace(batch_size=3))
    batches = list(_EvalEpisodes(datamodule, "val", 1))
    assert [[lengths[i] for i in batch] for batch in batches] == [[400, 410, 420], [690, 700, 880], [900, 950]]
    padded = sum(len(batch) * max(lengths[i] for i in batch) for batch in batches)
    in_play_order = sum(len(c) * max(lengths[i] for i in c) for c in RolloutDataModule._split(list(range(8)), 3))
    assert (padded, in_play_order) == (3 * 420 + 3 * 880 + 2 * 950, 3 * 900 + 3 * 950 + 2 * 880)


def test_teacher_forced_quality_over_all_and_first_observation_tokens():
    """Two rows; observation tokens at positions 2-4 and 1-2 (the rest is context or padding)."""
    obs_mask = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 0, 0]], dtype=torch.bool)
    logprobs = torch.tensor([[-9.0, -9.0, -2.0, -0.5, -0.5], [-9.0, -1.0, -0.25, -9.0, -9.0]])
    correct = torch.tensor([[1, 1, 0, 1, 1], [1, 1, 1, 0, 1]], dtype=torch.bool)
    nll, acc, n = teacher_forced_quality(logprobs, correct, obs_mask)
    assert n == 5 and nll == pytest.approx((2 + 0.5 + 0.5 + 1 + 0.25) / 5) and acc == pytest.approx(4 / 5)
    nll, acc, n = first_token_quality(logprobs, correct, obs_mask)  # positions (0, 2) and (1, 1)
    assert n == 2 and nll == pytest.approx((2 + 1) / 2) and acc == pytest.approx(1 / 2)
    nll, acc, n = teacher_forced_quality(logprobs, correct, torch.zeros_like(obs_mask))  # no target: weight 0 in the epoch mean
    assert n == 0 and nll == 0 and acc == 0
