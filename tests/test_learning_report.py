"""The learning benchmark's report (experiments/learning.py) from a hand-made MLflow store:
the warm-up row, the lift, the paired PaW − vanilla difference and the curves."""
from __future__ import annotations

import json
import sys

import mlflow
import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "experiments"))
import learning  # noqa: E402

# validation success per (objective, seed) at epochs -1 (before the first update), 2 and 5
SUCCESS = {
    ("vanilla", 0): {-1: 0.1, 2: 0.2, 5: 0.4},
    ("vanilla", 1): {-1: 0.2, 2: 0.3, 5: 0.5},
    ("paw", 0): {-1: 0.1, 2: 0.3, 5: 0.5},
    ("paw", 1): {-1: 0.2, 2: 0.4, 5: 0.7},
}
NLL = {"vanilla": {-1: 0.8, 2: 0.8, 5: 0.7}, "paw": {-1: 0.8, 2: 0.5, 5: 0.3}}
# held-out maps without holes, start and goal in opposite corners of 2×2, 2 moves: random moves win
# 1/2 · 1/4 = 12.5 %, random Down-or-Right moves 1/2 (the second move must be the other one)
OPEN_2X2 = {"size": 2, "hole_prob": 0.0, "layout": "corners"}


@pytest.fixture(params=["vanilla first", "paw first"])
def store(tmp_path, request):
    """The runs logged in either order: the report does not depend on the store's."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment("learning")
    items = list(SUCCESS.items())
    for (objective, seed), success in (items if request.param == "vanilla first" else items[::-1]):
        run = client.create_run(exp, run_name=f"gigpo+{objective}/seed{seed}",
                                tags={"objective_overlay": objective, "algorithm_overlay": "gigpo", "seed": str(seed)})
        rid = run.info.run_id
        for epoch, value in success.items():
            client.log_metric(rid, "val/episode/success_rate", value, step=epoch)
            client.log_metric(rid, "val/episode/invalid_rate", 0.0, step=epoch)
            client.log_metric(rid, "val/wm_onpolicy/nll", NLL[objective][epoch], step=epoch)
            client.log_metric(rid, "val/wm_fixed/all/nll", NLL[objective][epoch] + 1.0, step=epoch)  # the fixed set's: its own column
        for epoch in range(6):
            client.log_metric(rid, "train/policy/advantage_std", 0.0 if epoch % 3 == 0 else 1.0, step=epoch)
            if objective == "paw":  # a newer run; update 0's advantages are all equal and non-zero (std 0)
                client.log_metric(rid, "train/policy/zero_advantage_fraction", [0.0, 0.5, 0.25, 1.0, 0.5, 0.5][epoch], step=epoch)
            client.log_metric(rid, "train/episode/success_rate", 0.1 * epoch, step=epoch)
            if seed == 1:  # a newer run: the most frequent action's share, 0.4 at the first update → 0.9 at the last
                client.log_metric(rid, "train/episode/top_action_share", 0.4 + 0.1 * epoch, step=epoch)
            client.log_metric(rid, "train/episode/invalid_rate", 0.01 * epoch * (seed + 1), step=epoch)
            for phase in ("rollout_s", "scoring_s", "update_s"):
                client.log_metric(rid, f"train/perf/{phase}", 10.0 + epoch, step=epoch)
        client.log_text(rid, '{"plan": "val: 32 held-out tasks × 1 episode, temperature 1.0"}', "summary.json")  # as RunSummary logs it
        client.log_text(rid, json.dumps({"eval": {"env": "frozenlake", "env_kwargs": OPEN_2X2, "task_seeds": [1, 2], "max_steps": 2}}),
                        "eval/val_start.json")  # as the evaluation report logs it
        client.set_terminated(rid)
    return uri, tmp_path


def test_report_table_and_plot(store):
    uri, out = store
    text = learning.write_report(uri, "learning", out, ["gigpo"], ["vanilla", "paw"])
    results, rest = text.split("Success of the updates' own rollouts")
    diagnostics = rest.split("RL diagnostics")[1]
    rows, diag = (
        {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in part.splitlines() if line.startswith("| ")}
        for part in (results, diagnostics)
    )
    # columns: success %, return, invalid %, WM NLL fixed set, WM NLL on-policy, WM exact %, lift, seeds
    assert rows["warm-up (before RL)"][0] == "15.0 ± 7.1" and rows["warm-up (before RL)"][4] == "0.800 ± 0.000"
    assert rows["warm-up (before RL)"][3] == "1.800 ± 0.000"
    assert rows["gigpo + vanilla"][0] == "45.0 ± 7.1" and rows["gigpo + vanilla"][6] == "+30.0 ± 0.0"
    assert rows["gigpo + paw"][0] == "60.0 ± 14.1" and rows["gigpo + paw"][6] == "+45.0 ± 7.1"
    assert rows["gigpo + paw"][4] == "0.300 ± 0.000" and rows["gigpo + paw"][3] == "1.300 ± 0.000"
    assert rows["paw − vanilla (paired by seed)"][0] == "+15.0 ± 7.1"  # per seed +10, +20
    assert rows["paw − vanilla (paired by seed)"][4] == "-0.400 ± 0.000" and rows["paw − vanilla (paired by seed)"][3] == "-0.400 ± 0.000"
    # +10 and +20 points: s/√2 = 5, t(1 d.o.f., 0.975) = 12.706
    assert "- paw − vanilla: +15.0 points, 95 % CI [-48.5, +78.5] over 2 seeds; the interval holds 0: these seeds do not tell the two apart" in text
    # diagnostics: 4 of 6 updates had a non-zero advantage; median of 30+3e per update = 37.5 s
    # from advantage_std (no zero_advantage_fraction); the action share of seed 1 only; no run logged an entropy, a clip fraction or dynamic sampling: no column
    assert diag["gigpo + vanilla"] == ["66.7 ± 0.0", "40.0 → 90.0 (1 of 2 runs)", "37.5 ± 0.0"]
    assert diag["gigpo + paw"][0] == "83.3 ± 0.0"  # zero_advantage_fraction < 1 in 5 of 6 updates, where advantage_std says 4
    assert "validation (32 held-out tasks × 1 episode, temperature 1.0) after 6 updates" in text
    # the rollouts' success 0.0, 0.1, …, 0.5 per update: first 0 %, last three 40 %
    assert "| gigpo + paw | 0.0 ± 0.0 | 40.0 ± 0.0 | +40.0 ± 0.0 | 2 |" in text
    assert (out / "results.md").read_text() in text and (out / "learning_curves.png").stat().st_size > 10_000
    # every run on its own line: held-out success and invalid rate per validation, the rollouts' invalid rate first → last
    assert "| gigpo + vanilla, seed 1 | 20.0 → 30.0 → 50.0 | 0.0 → 0.0 → 0.0 | 0.0 → 10.0 |  |" in text
    assert "No run ends below its own start." in text
    assert "uniformly random moves 12.5 %, random Down-or-Right moves 50.0 %, a shortest hole-free path 100.0 %." in text
    # 2 held-out maps × 1 episode: p̂(1 − p̂)/(n − 1) per run; vanilla ends at 0.4 and 0.5: √((0.24 + 0.25)/2) = 49.5 points;
    # paw at 0.5 and 0.7: √((0.25 + 0.21)/2) = 48.0; their difference adds the two: √((0.49 + 0.46)/2) = 68.9
    assert "a validation plays 2 episodes" in text
    assert "- gigpo + vanilla: at most 49.5 points from the episodes alone; its std over seeds 7.1" in text
    assert "- gigpo + paw: at most 48.0 points from the episodes alone; its std over seeds 14.1" in text
    assert "- paw − vanilla: at most 68.9 points from the episodes alone; its std over seeds 7.1" in text
    assert learning.noise_line("a row", [], []) == "- a row: no run validated"


def test_a_run_that_ends_below_its_start_is_flagged(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment("learning")
    for seed, (start, middle, end) in enumerate(((0.031, 0.469, 0.312), (0.031, 0.156, 0.0))):
        run = client.create_run(exp, run_name=f"gigpo+vanilla/seed{seed}", tags={"objective_overlay": "vanilla", "algorithm_overlay": "gigpo", "seed": str(seed)})
        for epoch, value in ((-1, start), (6, middle), (13, end)):
            client.log_metric(run.info.run_id, "val/episode/success_rate", value, step=epoch)
        client.set_terminated(run.info.run_id)
    text = learning.write_report(uri, "learning", tmp_path, ["gigpo"], ["vanilla"])
    assert "| gigpo + vanilla, seed 0 | 3.1 → 46.9 → 31.2 | – | – |  |" in text  # below its middle, not below its start
    assert "| gigpo + vanilla, seed 1 | 3.1 → 15.6 → 0.0 | – | – | **ends below its start** |" in text
    assert "Runs that end below their own start: gigpo + vanilla, seed 1." in text


def test_report_without_runs_says_so(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.MlflowClient(uri).create_experiment("learning")
    text = learning.write_report(uri, "learning", tmp_path, ["gigpo"], ["vanilla"])
    assert text.startswith("no finished gigpo run of vanilla")


def test_a_methods_runs_are_rows_of_their_own(tmp_path):
    """``--methods none spa``: SPA's runs (config tag ``spa+gigpo+vanilla``) are a row and a
    start row of their own, not the latest run of the vanilla row."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment("learning")
    for config, start, end in (("gigpo+vanilla", 0.1, 0.4), ("spa+gigpo+vanilla", 0.0, 0.3)):
        run = client.create_run(exp, run_name=f"{config}/seed0", tags={"config": config, "objective_overlay": "vanilla", "algorithm_overlay": "gigpo", "seed": "0"})
        for epoch, value in ((-1, start), (5, end)):
            client.log_metric(run.info.run_id, "val/episode/success_rate", value, step=epoch)
        client.set_terminated(run.info.run_id)
    text = learning.write_report(uri, "learning", tmp_path, ["gigpo"], ["vanilla"])
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in text.split("Success of the updates")[0].splitlines() if line.startswith("| ")}
    assert rows["warm-up (before RL)"] == "10.0" and rows["gigpo + vanilla"] == "40.0"
    assert rows["spa's stages (before RL)"] == "0.0" and rows["spa + gigpo + vanilla"] == "30.0"


def test_several_algorithms_are_rows_of_one_table(tmp_path):
    """``--algorithms gigpo_verl dapo``: each algorithm's runs are rows with their own lift, the
    start row covers every seed, the paired difference stays within an algorithm, and DAPO's
    dynamic-sampling diagnostics (kept share of groups, extra rounds) are averaged over updates."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment("learning")
    runs = [  # (algorithm, objective, seed, start, end, kept fraction per update, extra rounds per update)
        ("gigpo_verl", "vanilla", 0, 0.1, 0.4, None, None),
        ("gigpo_verl", "paw", 0, 0.1, 0.6, None, None),
        ("dapo", "vanilla", 0, 0.1, 0.5, [1.0, 0.5], [0.0, 1.0]),
        ("dapo", "vanilla", 1, 0.3, 0.4, [0.25, 0.25], [3.0, 3.0]),
    ]
    for algorithm, objective, seed, start, end, kept, extra in runs:
        run = client.create_run(exp, run_name=f"{algorithm}+{objective}/seed{seed}",
                                tags={"objective_overlay": objective, "algorithm_overlay": algorithm, "seed": str(seed)})
        rid = run.info.run_id
        for epoch, value in ((-1, start), (1, end)):
            client.log_metric(rid, "val/episode/success_rate", value, step=epoch)
        for epoch in range(2):
            if kept is not None:
                client.log_metric(rid, "train/rollout/kept_group_fraction", kept[epoch], step=epoch)
                client.log_metric(rid, "train/rollout/extra_rounds", extra[epoch], step=epoch)
        client.set_terminated(rid)
    text = learning.write_report(uri, "learning", tmp_path, ["gigpo_verl", "dapo"], ["vanilla", "paw"])
    results, rest = text.split("Success of the updates' own rollouts")
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in results.splitlines() if line.startswith("| ")}
    # columns: success %, return, invalid %, WM NLL fixed set, WM NLL on-policy, WM exact %, lift, seeds
    assert rows["warm-up (before RL)"][0] == "20.0 ± 14.1" and rows["warm-up (before RL)"][-1] == "2"  # seeds 0 and 1, over both algorithms
    assert rows["gigpo_verl + vanilla"][0] == "40.0" and rows["gigpo_verl + vanilla"][6] == "+30.0"
    assert rows["dapo + vanilla"][0] == "45.0 ± 7.1" and rows["dapo + vanilla"][6] == "+25.0 ± 21.2"  # lifts +40 and +10
    assert rows["gigpo_verl: paw − vanilla (paired by seed)"][0] == "+20.0"
    assert not any("dapo: paw" in name for name in rows)  # DAPO ran no PaW: nothing to pair
    diag = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in rest.split("RL diagnostics")[1].splitlines() if line.startswith("| ")}
    assert diag["dapo + vanilla"][-2:] == ["50.0 ± 35.4", "1.750 ± 1.768"]  # kept 75 % and 25 %; extra rounds 0.5 and 3.0 per update
    assert diag["gigpo_verl + vanilla"][-2:] == ["–", "–"]  # the columns stay: a DAPO run logged them
    assert "Scripted policies" not in text  # no run logged its evaluation plan


def test_each_algorithm_is_paired_with_the_first_and_seeds_select_runs(tmp_path):
    """``--algorithms grpo dapo gigpo_verl``: each other algorithm − GRPO, paired by seed within
    the objective, over the seeds both ran; ``seeds`` keeps only those seeds' runs."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment("learning")
    ends = {("grpo", 0): 0.4, ("grpo", 1): 0.2, ("dapo", 0): 0.5, ("dapo", 1): 0.5, ("gigpo_verl", 0): 0.3, ("gigpo_verl", 2): 0.9}
    for (algorithm, seed), end in ends.items():
        rid = client.create_run(exp, run_name=f"{algorithm}+vanilla/seed{seed}",
                                tags={"objective_overlay": "vanilla", "algorithm_overlay": algorithm, "seed": str(seed)}).info.run_id
        client.log_metric(rid, "val/episode/success_rate", 0.1, step=-1)
        client.log_metric(rid, "val/episode/success_rate", end, step=1)
        client.set_terminated(rid)

    def rows(seeds):
        text = learning.write_report(uri, "learning", tmp_path, ["grpo", "dapo", "gigpo_verl"], ["vanilla"], seeds)
        table = text.split("Success of the updates' own rollouts")[0]
        return {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in table.splitlines() if line.startswith("| ")}

    every = rows(None)
    assert every["vanilla: dapo − grpo (paired by seed)"][0] == "+20.0 ± 14.1" and every["vanilla: dapo − grpo (paired by seed)"][-1] == "2"  # +10, +30
    assert every["vanilla: gigpo_verl − grpo (paired by seed)"][0] == "-10.0" and every["vanilla: gigpo_verl − grpo (paired by seed)"][-1] == "1"  # seed 0 only
    assert every["gigpo_verl + vanilla"][0] == "60.0 ± 42.4" and every["warm-up (before RL)"][-1] == "3"
    text = (tmp_path / "results.md").read_text()
    assert "- vanilla: gigpo_verl − grpo: -10.0 points, 1 seed: no interval" in text
    assert "- vanilla: dapo − grpo: +20.0 points, 95 % CI [-107.1, +147.1] over 2 seeds" in text  # 20 ± 12.706 · 14.14/√2
    first = rows([0])
    assert first["gigpo_verl + vanilla"][0] == "30.0" and first["dapo + vanilla"][-1] == "1" and first["warm-up (before RL)"][-1] == "1"
    assert first["vanilla: dapo − grpo (paired by seed)"][0] == "+10.0"
    assert learning.write_report(uri, "learning", tmp_path, ["grpo"], ["vanilla"], [5]).startswith("no finished grpo run of vanilla of seeds 5")
