"""The results table and learning curves read back from a synthetic MLflow store with known values."""
from __future__ import annotations

import math
import sys

import matplotlib
import mlflow
import pytest
from mlflow.entities import Metric

from paw_lightning import analysis
from paw_lightning.metrics import TASK_TYPE_NAMES

from helpers import ROOT

sys.path.insert(0, str(ROOT / "experiments"))
import report  # noqa: E402

matplotlib.use("Agg")

S, PICK, LOOK, RET, TRAIN = ("val/episode/success_rate", "val/episode/success_rate/pick", "val/episode/success_rate/look",
                             "val/episode/return_mean", "train/episode/success_rate")


def add_run(client, exp_id, name, start, metrics, tags=None, status="FINISHED"):
    run = client.create_run(exp_id, start_time=start, tags=tags or {}, run_name=name)
    points = [Metric(key, value, 1000 + step, step) for key, history in metrics.items() for step, value in history]
    client.log_batch(run.info.run_id, metrics=points)
    client.set_terminated(run.info.run_id, status)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Two base runs, grpo+vanilla over two seeds (grouped by run name), grpo+paw (grouped by
    its config tag; its second seed FAILED and is left out), and an untagged, unnamed run."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('store') / 'mlflow.db'}"
    client = mlflow.MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("abl")
    epochs = {"epoch": [(1, 0), (3, 1)]}
    add_run(client, exp, "base/seed0", 1, {"epoch": [(0, 0)], S: [(0, 0.1)], PICK: [(0, 0.0)], RET: [(0, -0.5)]}, {"config": "base"})
    add_run(client, exp, "base/seed1", 2, {"epoch": [(0, 0)], S: [(0, 0.3)], PICK: [(0, 0.5)], RET: [(0, -0.3)]}, {"config": "base"})
    add_run(client, exp, "grpo+vanilla/seed0", 3, {**epochs, S: [(1, 0.2), (3, 0.5)], PICK: [(1, 0.0), (3, 1.0)], LOOK: [(1, 0.5), (3, 0.0)],
                                                   RET: [(1, -0.1), (3, 0.4)], TRAIN: [(1, 0.25), (3, 0.5)]})
    add_run(client, exp, "grpo+vanilla/seed1", 4, {**epochs, S: [(1, 0.4), (3, 0.3)], PICK: [(1, 1.0), (3, 0.5)], LOOK: [(1, 0.5), (3, 0.5)],
                                                   RET: [(1, 0.2), (3, 0.1)], TRAIN: [(1, 0.0), (3, 0.5)]})
    add_run(client, exp, "paw-first", 5, {**epochs, S: [(1, 0.6), (3, 0.6)], PICK: [(1, 0.5), (3, 1.0)], RET: [(1, 0.5), (3, 0.7)],
                                          "train/wm/loss": [(2, 0.9), (3, 0.7)]}, {"config": "grpo+paw"})
    add_run(client, exp, "grpo+paw/seed1", 6, {**epochs, S: [(1, 1.0)]}, {"config": "grpo+paw"}, status="FAILED")
    add_run(client, exp, "lucky-cat-7", 7, {**epochs, S: [(1, 0.25)], TRAIN: [(1, 0.0)]}, {"advantage": "GRPO", "world_model_objective": "ClippedMAE"})
    return uri


def test_table_last_values_mean_std_over_seeds(store, capsys):
    report.main(["--tracking-uri", store, "--experiment", "abl", "--metric", TRAIN])
    assert capsys.readouterr().out == (
        "abl: val metrics, final value of each run, mean ± std over runs (success in %)\n\n"
        "| Configuration | Pick | Look | All | Return | train/episode/success_rate | Runs |\n"
        "|---|---|---|---|---|---|---|\n"
        "| base | 25.0 ± 35.4 | – | 20.0 ± 14.1 | -0.40 ± 0.14 | – | 2 |\n"
        "| grpo+vanilla | 75.0 ± 35.4 | 25.0 ± 35.4 | 40.0 ± 14.1 | 0.25 ± 0.21 | 50.0 ± 0.0 | 2 |\n"
        "| grpo+paw | 100.0 | – | 60.0 | 0.70 | – | 1 |\n"
        "| GRPO+ClippedMAE | – | – | 25.0 | – | 0.0 | 1 |\n"
    )


def test_table_best_epoch_reads_every_column_at_the_best_success(store, capsys):
    """vanilla seed 1 peaks at its first epoch (0.4); grpo+paw ties (0.6, 0.6): the earlier epoch."""
    report.main(["--tracking-uri", store, "--experiment", "abl", "--select", "best"])
    assert capsys.readouterr().out.splitlines()[2:] == [
        "| Configuration | Pick | Look | All | Return | Runs |",
        "|---|---|---|---|---|---|",
        "| base | 25.0 ± 35.4 | – | 20.0 ± 14.1 | -0.40 ± 0.14 | 2 |",
        "| grpo+vanilla | 100.0 ± 0.0 | 25.0 ± 35.4 | 45.0 ± 7.1 | 0.30 ± 0.14 | 2 |",
        "| grpo+paw | 50.0 | – | 60.0 | 0.50 | 1 |",
        "| GRPO+ClippedMAE | – | – | 25.0 | – | 1 |",
    ]


def test_all_runs_and_group_by_tags(store, capsys):
    report.main(["--tracking-uri", store, "--experiment", "abl", "--all-runs", "--group-by", "config"])
    rows = capsys.readouterr().out.splitlines()[4:]
    assert [r.split(" | ")[0] for r in rows] == ["| base", "| ?", "| grpo+paw"]
    assert rows[2] == "| grpo+paw | 100.0 | – | 80.0 ± 28.3 | 0.70 | 2 |"  # the FAILED seed counts now (it logged no pick)


def test_unknown_experiment_is_one_line_error(store, capsys):
    with pytest.raises(SystemExit) as exit_info:
        report.main(["--tracking-uri", store, "--experiment", "ab"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: MLflow experiment 'ab' not found") and err.rstrip().endswith("choose one of Default, abl")


def test_curves_against_epochs_with_seed_statistics(store):
    client, runs = analysis.load_runs(store, "abl")
    by_config = analysis.curves(client, runs, S)
    assert list(by_config) == ["base", "grpo+vanilla", "grpo+paw", "GRPO+ClippedMAE"]
    vanilla = by_config["grpo+vanilla"]
    assert vanilla.epochs == [0, 1] and vanilla.count == [2, 2]
    assert vanilla.mean == pytest.approx([0.3, 0.4]) and vanilla.std == pytest.approx([2 ** 0.5 / 10] * 2)
    assert vanilla.low == [0.2, 0.3] and vanilla.high == [0.4, 0.5]
    # a point logged between two epoch markers belongs to the earlier epoch
    wm = analysis.curves(client, runs, "train/wm/loss")
    assert list(wm) == ["grpo+paw"] and wm["grpo+paw"].epochs == [0, 1] and wm["grpo+paw"].mean == [0.9, 0.7]


def test_plot_curves_draws_lines_bands_and_the_base_line(store):
    from matplotlib.figure import Figure

    client, runs = analysis.load_runs(store, "abl")
    ax = Figure().subplots()
    analysis.plot_curves(ax, analysis.curves(client, runs, S), title="success", band="minmax")
    labels = [text.get_text() for text in ax.get_legend().get_texts()]
    assert labels == ["base", "grpo+vanilla (n=2)", "grpo+paw (n=1)", "GRPO+ClippedMAE (n=1)"]
    assert len(ax.collections) == 3  # one shaded band per configuration that trained
    with pytest.raises(ValueError, match="band must be"):
        analysis.plot_curves(ax, {}, band="iqr")


def test_an_experiment_mixing_environments_prefixes_each_configuration(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("mixed")
    for start, (env, name, success) in enumerate([("sokoban", "grpo+paw/seed0", 0.5), ("frozenlake", "base/seed0", 0.25),
                                                  ("sokoban", "base/seed0", 0.0), ("frozenlake", "grpo+paw/seed0", 0.75)]):
        add_run(client, exp, name, start + 1, {S: [(0, success)]}, {"env": env})
    report.main(["--tracking-uri", uri, "--experiment", "mixed"])
    assert capsys.readouterr().out.splitlines()[4:] == [
        "| sokoban: base | 0.0 | 1 |", "| sokoban: grpo+paw | 50.0 | 1 |", "| frozenlake: base | 25.0 | 1 |", "| frozenlake: grpo+paw | 75.0 | 1 |",
    ]


def test_task_type_columns_follow_the_metric_names():
    assert analysis.TASK_TYPES == tuple(TASK_TYPE_NAMES.values())


def test_mean_interval_is_students_t_on_hand_computed_numbers():
    # [1, 2, 3, 6]: mean 3, s = √(14/3) = 2.16025, s/√4 = 1.08012, t(3 d.o.f., 0.975) = 3.18245
    mean, low, high = analysis.mean_interval([1.0, 2.0, 3.0, 6.0])
    assert mean == 3.0 and low == pytest.approx(3 - 3.43743, abs=1e-5) and high == pytest.approx(3 + 3.43743, abs=1e-5)
    # two values 10, 20: s/√2 = 5, t(1, 0.975) = 12.7062; a 90 % interval: t(1, 0.95) = 6.31375
    assert analysis.mean_interval([10.0, 20.0])[1:] == pytest.approx((15 - 63.531, 15 + 63.531), abs=1e-3)
    assert analysis.mean_interval([10.0, 20.0], level=0.9)[1:] == pytest.approx((15 - 31.569, 15 + 31.569), abs=1e-3)
    with pytest.raises(ValueError, match="at least 2 values"):
        analysis.mean_interval([1.0])


def test_binomial_variance_is_unbiased_for_the_rate_of_n_episodes():
    # 8 wins in 32 episodes: 0.25 · 0.75 / 31 = 0.0060484 (standard error 7.8 points)
    assert analysis.binomial_variance(0.25, 32) == pytest.approx(0.1875 / 31)
    # its mean over every outcome k of 4 episodes at p = 0.3 is Var(p̂) = 0.3 · 0.7 / 4 = 0.0525 exactly
    outcomes = [(math.comb(4, k) * 0.3**k * 0.7 ** (4 - k), k / 4) for k in range(5)]
    assert sum(prob * analysis.binomial_variance(rate, 4) for prob, rate in outcomes) == pytest.approx(0.0525)
    with pytest.raises(ValueError, match="at least 2 episodes"):
        analysis.binomial_variance(0.5, 1)
