"""MLflow: tags, epoch steps, trajectory tables, the LoRA adapter artifact (also gathered under
FSDP2), system metrics, resuming into the same run, and a tracking server over HTTP."""
from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request

import mlflow
import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from paw_lightning.cli import PawCLI, main
from paw_lightning.tracking import PawMLFlowLogger, checkpoint_run_id, resume_mlflow_run

from helpers import ROOT, MlflowServer, mlflow_runs, tiny_args


def history(client, run, key):
    return [(m.step, m.value) for m in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)]


def lora_weights(model) -> dict[str, torch.Tensor]:
    return {n: p.detach() for n, p in model.named_parameters() if "lora_" in n}


def load_adapter(model_dir, adapter_dir) -> dict[str, torch.Tensor]:
    return lora_weights(PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), str(adapter_dir)))


def test_logger_accepts_servers_and_refuses_file_stores(tmp_path):
    for uri in ("http://127.0.0.1:5000", "https://mlflow.example.org", f"sqlite:///{tmp_path / 'a.db'}", "databricks"):
        assert PawMLFlowLogger(tracking_uri=uri)._tracking_uri == uri
    for uri in (str(tmp_path / "mlruns"), f"file://{tmp_path / 'mlruns'}"):
        with pytest.raises(ValueError, match="file store"):
            PawMLFlowLogger(tracking_uri=uri)


def test_runs_starting_together_share_the_experiment_tag(tmp_path, monkeypatch):
    """Two runs race to tag a new experiment (CI saw a UNIQUE-constraint error): the one whose
    write fails because the other's landed goes on; a failure that left no tag is raised."""
    from mlflow.exceptions import MlflowException

    from paw_lightning.tracking.logger import EXPERIMENT_KIND, mark_model_training

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.create_experiment("race")
    real_set = mlflow.MlflowClient.set_experiment_tag

    def the_other_run_wins(self, experiment_id, key, value):
        real_set(self, experiment_id, key, value)  # the other process's write lands first
        raise MlflowException("(sqlite3.IntegrityError) UNIQUE constraint failed: experiment_tags.key, experiment_tags.experiment_id")

    monkeypatch.setattr(mlflow.MlflowClient, "set_experiment_tag", the_other_run_wins)
    mark_model_training(client, experiment)
    assert client.get_experiment(experiment).tags[EXPERIMENT_KIND] == "custom_model_development"

    def disk_error(self, experiment_id, key, value):
        raise MlflowException("disk I/O error")

    monkeypatch.setattr(mlflow.MlflowClient, "set_experiment_tag", disk_error)
    with pytest.raises(MlflowException, match="disk I/O error"):
        mark_model_training(client, client.create_experiment("untagged"))


def test_checkpoint_run_id_and_resume_config(tmp_path):
    from jsonargparse import Namespace

    ckpt = tmp_path / "last.ckpt"
    torch.save({"epoch": 0, "mlflow_run_id": "abc"}, ckpt)
    folder = tmp_path / "sharded.ckpt"  # torch.distributed.checkpoint folder: non-tensor entries in its metadata file
    folder.mkdir()
    torch.save({"mlflow_run_id": "def"}, folder / "meta.pt")
    assert (checkpoint_run_id(ckpt), checkpoint_run_id(folder), checkpoint_run_id(tmp_path / "missing")) == ("abc", "def", None)

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("e")).info.run_id
    torch.save({"mlflow_run_id": run_id}, ckpt)
    config = Namespace(class_path="paw_lightning.tracking.PawMLFlowLogger", init_args=Namespace(tracking_uri=uri, run_id=None))
    resume_mlflow_run(config, str(ckpt))
    assert config.init_args.run_id == run_id
    torch.save({"mlflow_run_id": "not-in-this-store"}, ckpt)
    config.init_args.run_id = None
    resume_mlflow_run(config, str(ckpt))  # a checkpoint from another tracking store: a new run
    assert config.init_args.run_id is None


@pytest.mark.slow
def test_fit_artifacts_and_resume_into_the_same_run(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli = PawCLI(args=tiny_args(tiny_model_dir, tmp_path, "--trainer.max_epochs=1"), run=False)
    cli.trainer.fit(cli.model, cli.datamodule)
    client, (run,) = mlflow_runs(tmp_path)
    run_id = run.info.run_id
    tags = run.data.tags
    assert (tags["env"], tags["algorithm"], tags["world_model_objective"]) == ("frozenlake", "grpo", "ClippedMAE")
    assert run.info.run_name == "grpo+ClippedMAE/seed0"  # not MLflow's random name
    assert client.get_experiment(run.info.experiment_id).tags["mlflow.experimentKind"] == "custom_model_development"

    # trajectory table: the transitions whose next observation was predicted free-running
    table = client.load_table(run.info.experiment_id, "trajectories/val_epoch0.json", run_ids=[run_id])
    assert list(table.columns[:10]) == ["group", "episode", "step", "prompt", "response", "action", "observation", "reward",
                                        "next_observation", "predicted_next_observation"]
    buffer = cli.model.evaluations["val"].played.samples
    assert len(table) == min(8, len(buffer)) and table["predicted_next_observation"].notna().all()
    first = buffer.trajectories[0].steps[0]
    assert table["response"][0] == first.response and table["next_observation"][0] == first.next_observation
    assert table["prompt"][0] == cli.model.tokenizer.decode(first.prompt_ids)

    # the final adapter loads with peft and holds exactly the trained LoRA weights
    adapter = client.download_artifacts(run_id, "adapter", str(tmp_path / "download"))
    trained, loaded = lora_weights(cli.model.lm), load_adapter(tiny_model_dir, adapter)
    assert loaded.keys() == trained.keys() and any(t.abs().sum() > 0 for n, t in trained.items() if "lora_B" in n)
    assert all(torch.equal(loaded[n], trained[n]) for n in trained)

    # system metrics and the epoch as the step of every metric
    for key in ("system/cpu_percent", "system/process_cpu_percent", "system/rss_gib", "system/memory_percent", "system/peak_rss_gib"):
        assert [s for s, _ in history(client, run, key)] == [0], key
    assert history(client, run, "system/rss_gib")[0][1] > 0
    (ckpt,) = tmp_path.glob("runs/**/last.ckpt")
    assert torch.load(ckpt, weights_only=False)["mlflow_run_id"] == run_id

    main(["fit", *tiny_args(tiny_model_dir, tmp_path, "--trainer.max_epochs=2"), f"--ckpt_path={ckpt}"])
    client, runs = mlflow_runs(tmp_path)
    assert [r.info.run_id for r in runs] == [run_id], "a resumed fit continues its MLflow run"
    run = runs[0]
    assert run.info.status == "FINISHED"
    for key in ("train/loss", "train/policy/loss", "val/episode/success_rate", "val/wm_onpolicy/nll", "system/rss_gib"):
        assert [s for s, _ in history(client, run, key)] == [0, 1], key
    tables = [a.path for a in client.list_artifacts(run_id, "trajectories")]
    assert tables == ["trajectories/val_epoch0.json", "trajectories/val_epoch1.json"]
    assert {"eval/val_epoch0.json", "eval/val_epoch1.json"} <= {a.path for a in client.list_artifacts(run_id, "eval")}


@pytest.mark.slow
def test_parts_can_be_switched_off(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main(["fit", *tiny_args(tiny_model_dir, tmp_path, "--trainer.max_epochs=1", "--mlflow.trajectory_rows=0", "--mlflow.log_adapter=false",
                           "--mlflow.system_metrics=false", "--evaluation.write_json=false", "--summary.enabled=false")])
    client, (run,) = mlflow_runs(tmp_path)
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["config.yaml"]
    assert not any(k.startswith("system/") for k in run.data.metrics) and "val/episode/success_rate" in run.data.metrics
    assert not list(tmp_path.glob("runs/**/eval")) and not list(tmp_path.glob("runs/**/adapter")) and not list(tmp_path.glob("runs/**/summary.*"))


@pytest.mark.slow
def test_fsdp2_adapter_is_gathered_in_full(tiny_model_dir, tmp_path):
    args = tiny_args(tiny_model_dir, tmp_path, "-c", str(ROOT / "configs/scale/fsdp2.yaml"), "--trainer.accelerator=cpu", "--trainer.max_epochs=1",
                     "--model.optimizer.init_args.lr=0.01")
    result = subprocess.run([sys.executable, "-m", "paw_lightning", "fit", *args], check=False, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    client, (run,) = mlflow_runs(tmp_path)
    loaded = load_adapter(tiny_model_dir, client.download_artifacts(run.info.run_id, "adapter", str(tmp_path / "download")))
    (ckpt,) = tmp_path.glob("runs/**/last.ckpt")
    saved = torch.load(ckpt, weights_only=False)["state_dict"]  # full trainable weights (paw_lightning.scale.checkpointing)
    assert loaded and loaded.keys() == {k.removeprefix("lm.") for k in saved if "lora_" in k}
    assert all(torch.equal(loaded[n], saved[f"lm.{n}"]) for n in loaded)
    assert any(loaded[n].abs().sum() > 0 for n in loaded if "lora_B" in n), "the adapter holds trained weights"
    # validation ran on both ranks (its episodes are played lazily, when the loader is iterated)
    assert {"val/episode/success_rate", "val/episode/pass_at_1", "val/wm_onpolicy/nll"} <= run.data.metrics.keys()
    assert [a.path for a in client.list_artifacts(run.info.run_id, "trajectories")] == ["trajectories/val_epoch0.json"]


# --------------------------------------------------------------- tracking server
def _get(url: str, payload: dict | None = None) -> dict:
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


@pytest.fixture
def mlflow_server(tmp_path):
    """``mlflow server`` on a free loopback port with a SQLite store in tmp_path."""
    server = MlflowServer(tmp_path)
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.mark.slow
def test_fit_logs_to_a_tracking_server(tiny_model_dir, tmp_path, monkeypatch, mlflow_server):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)  # whatever MLflow sets during the run is restored afterwards
    main(["fit", *tiny_args(tiny_model_dir, tmp_path, "--trainer.max_epochs=1", "--trainer.check_val_every_n_epoch=1",
                           f"--trainer.logger.init_args.tracking_uri={mlflow_server}")])
    experiment = _get(f"{mlflow_server}/api/2.0/mlflow/experiments/get-by-name?experiment_name=frozenlake")["experiment"]
    (run,) = _get(f"{mlflow_server}/api/2.0/mlflow/runs/search", {"experiment_ids": [experiment["experiment_id"]]})["runs"]
    metrics = {m["key"]: m for m in run["data"]["metrics"]}
    assert {"train/loss", "val/episode/success_rate", "val/episode/pass_at_1", "system/rss_gib"} <= metrics.keys()
    assert {t["key"]: t["value"] for t in run["data"]["tags"]}["algorithm"] == "grpo"
    files = _get(f"{mlflow_server}/api/2.0/mlflow/artifacts/list?run_id={run['info']['run_id']}")["files"]
    assert {"adapter", "config.yaml", "eval", "trajectories"} <= {f["path"] for f in files}
    assert not (tmp_path / "mlflow.db").exists()  # nothing went to a local store
