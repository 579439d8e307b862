"""docs/reference/metrics.md documents what runs log. Every fit a test reads through
``helpers.mlflow_runs`` is checked key by key; this file checks the matcher itself and, without a
fit, the keys of the episode metrics."""
from __future__ import annotations

from paw_lightning.metrics import episode_metrics, pass_at_k_metrics
from paw_lightning.rollout.collector import Step, Trajectory

from helpers import documented_metric


def test_the_matcher_reads_placeholders_splits_and_abbreviations():
    for key in ("train/episode/success_rate/pick", "val/episode/pass_at_3", "test/wm_onpolicy/nll", "train/wm/entropy_p90",
                "train/memory/peak_gib/rank_1", "test/dream/exact_at_2", "rwml/filter/demo_steps", "epoch"):
        assert documented_metric(key), key
    for key in ("train/wm/nll", "train/episode/made_up", "val/episode/success_rate/pick/extra", "policy/loss"):
        assert not documented_metric(key), key


def test_every_episode_metric_is_documented():
    won = Trajectory(group_id=0, traj_id=0, task_seed=0, won=True, task_type="pick_and_place_simple", score=1.0)
    won.steps.append(Step("o0", [1], [2], "r", "Up", 1.0, "o1", True))
    lost = Trajectory(group_id=0, traj_id=1, task_seed=0, task_type="pick_and_place_simple", score=0.0)
    lost.steps.append(Step("o0", [1], [2], "r", None, 0.0, "o1", True))
    keys = [*episode_metrics([won, lost]), *pass_at_k_metrics([won, lost])]
    assert "score" in keys and "pass_at_2" in keys and "success_rate/pick" in keys
    for split in ("train", "val", "test"):
        assert [k for k in keys if not documented_metric(f"{split}/episode/{k}")] == []
