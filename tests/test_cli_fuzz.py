"""CLI fuzz: at least 200 generated bad invocations — unknown keys, wrong types, sizes and
probabilities out of range, GRPO with one episode per task, missing or corrupt files, an
incompatible checkpoint, class paths that do not exist, malformed config files. Every one must
exit with code 2 and one ``error:`` line naming the problem, print no traceback, and leave no
MLflow run behind."""
from __future__ import annotations

import itertools

import pytest
import torch


from fuzz_schema import invoke, runs_in
from helpers import tiny_args

pytestmark = pytest.mark.slow  # 200 CLI invocations of fit

UNKNOWN_KEYS = [
    f"--{section}.{key}=1"
    for section, key in itertools.product(
        ["trainer", "model", "data", "data.rollout", "data.evaluation", "model.lm", "checkpoint", "mlflow", "summary", "evaluation"],
        ["nonexistent", "lr_typo", "Groups"],
    )
] + ["--data.rollout.group=2", "--model.lm.lora=8", "--data.mini_batch=4", "--trainer.epochs=3", "--model.max_grad=1", "--frobnicate"]

NUMERIC_KEYS = [  # (key, accepts a float)
    ("data.rollout.groups", False), ("data.rollout.group_size", False), ("data.rollout.max_steps", False),
    ("data.rollout.max_new_tokens", False), ("data.rollout.temperature", True), ("data.rollout.history_length", False),
    ("data.rollout.invalid_penalty", True), ("data.rollout.max_obs_tokens", False), ("data.evaluation.groups", False),
    ("data.evaluation.group_size", False), ("data.evaluation.temperature", True), ("data.evaluation.batch_size", False),
    ("data.ppo_epochs", False), ("data.mini_batch_size", False), ("data.env_workers", False), ("model.score_batch_size", False),
    ("model.micro_batch_tokens", False), ("model.max_grad_norm", True), ("model.wm_eval_samples", False),
    ("model.max_nonfinite_steps", False), ("model.lm.lora_r", False), ("model.lm.lora_alpha", False),
    ("model.lm.lora_dropout", True), ("trainer.max_epochs", False), ("trainer.check_val_every_n_epoch", False),
]
WRONG_TYPES = [f"--{key}={value}" for (key, accepts_float), value in itertools.product(NUMERIC_KEYS, ["abc", "[1, 2]", "1.5", "{a: 1}"])
               if not (accepts_float and value == "1.5")]

OUT_OF_RANGE = [
    *(f"--data.rollout.{key}={value}" for key, value in itertools.product(["groups", "group_size", "max_steps"], [0, -1, -7])),
    *(f"--data.evaluation.{key}={value}" for key, value in itertools.product(["groups", "group_size"], [0, -2])),
    *(f"--data.{key}={value}" for key, value in itertools.product(["ppo_epochs", "mini_batch_size"], [0, -3])),
    "--model.micro_batch_tokens=0", "--model.micro_batch_tokens=-5", "--model.max_grad_norm=0", "--model.max_grad_norm=-1",
    *(f"--model.world_model_objective.init_args.alpha={a}" for a in (0, -0.5, 1.5, 2)),
    *(f"--model.world_model_objective.init_args.rho={r}" for r in (0, -1, 1.5)),
    "--model.world_model_objective.init_args.entropy=guess", "--model.policy_objective.init_args.kl_estimator=k9",
    "--model.policy_objective.init_args.aggregation=mean", "--model.old_logprobs=cached", "--data.rollout.prompt_style=fancy",
    "--model.policy_objective.init_args.aggregation=seq-mean-token-sum-norm --model.policy_objective.init_args.loss_norm_tokens=0",
    "--ckpt_path=last", "--ckpt_path=best",  # Lightning would look in the new run's own checkpoint folder
    "--model.policy_objective.init_args.clip_ratio_c=0.5", "--model.policy_objective.init_args.importance_sampling=trajectory",
    "--model.world_model_objective.init_args.balancer.init_args.r_max=0",
    "--model.world_model_objective.init_args.balancer.init_args.r_max=-10",
    "--data.rollout.group_size=1",  # GRPO compares the episodes of a task: one gives no signal
    "--data.rollout.dynamic_sampling.enabled=true --data.rollout.dynamic_sampling.oversample=0.5",
    "--data.rollout.dynamic_sampling.enabled=true --data.rollout.dynamic_sampling.max_extra_rounds=-1",
    "--data.rollout.overlong_buffer=-1", "--data.rollout.overlong_buffer=1000", "--data.rollout.overlong_penalty_factor=-1",
    "--data.env=frozenlak", "--data.env=os.path", "--data.env=no.such.Env", "--data.env_kwargs={sise: 4}",
    "--data.env_kwargs={size: 4, holes: 3}", "--model.engine=paw_lightning.rollout.ct2.CT2Engine --model.engine.init_args.compute_type=int4",
    "--model.engine=paw_lightning.rollout.ct2.CT2Engine --model.engine.init_args.tis_cap=0.5",
    "--model.engine=paw_lightning.rollout.ct2.CT2Engine --model.old_logprobs=rollout",
]

BAD_CLASSES = [
    "--model.policy_objective.init_args.advantage=paw_lightning.objectives.Nope",
    "--model.policy_objective.init_args.advantage=Nope",
    "--model.world_model_objective=nope.Objective",
    "--model.world_model_objective.init_args.balancer=paw_lightning.objectives.NoBalancer",
    "--model.engine=nowhere.Engine",
    "--model.optimizer=torch.optim.Nope",
    "--trainer.logger=nope.Logger",
    "--model.critic=paw_lightning.objectives.Critic",  # a critic without GAE
    "--model.policy_objective.init_args.advantage=paw_lightning.objectives.GAE",  # GAE without a critic
]

MALFORMED_CONFIGS = {
    "syntax.yaml": "trainer:\n  max_epochs: [1,\n data: {\n",
    "list.yaml": "- 1\n- 2\n",
    "scalar.yaml": "just text\n",
    "tabs.yaml": "trainer:\n\tmax_epochs: 2\n",
    "unknown_section.yaml": "nonsense:\n  a: 1\n",
    "wrong_nesting.yaml": "data: 5\n",
    "bad_class.yaml": "model:\n  world_model_objective:\n    class_path: paw_lightning.objectives.Missing\n",
    "bad_value.yaml": "data:\n  rollout:\n    groups: many\n",
    "duplicate_key.yaml": "trainer:\n  max_epochs: 1\n  max_epochs: [\n",
}


def bad_files(tmp_path, tiny_model_dir) -> list[list[str]]:
    """Invocations that name missing, corrupt or incompatible files."""
    (tmp_path / "corrupt.ckpt").write_bytes(b"\x00not a checkpoint" * 10)
    (tmp_path / "fake.gguf").write_text("not a gguf file")
    (tmp_path / "empty.ckpt").write_bytes(b"")
    torch.save({"state_dict": {"lm.some.other.model.lora_A.weight": torch.zeros(2, 2)}}, tmp_path / "other_model.ckpt")
    torch.save({"state_dict": {}}, tmp_path / "no_weights.ckpt")
    torch.save(torch.zeros(3), tmp_path / "tensor.ckpt")
    files = [["-c", str(tmp_path / "missing.yaml")], ["-c", str(tmp_path)], ["--model.lm.name_or_path=/no/such/model"],
             ["--model.lm.name_or_path=/no/such/model.gguf"], [f"--model.lm.name_or_path={tmp_path / 'fake.gguf'}"],
             [f"--model.lm.name_or_path={tmp_path}"], ["--model.init_weights=missing.ckpt"]]
    files += [[f"--model.init_weights={tmp_path / name}"] for name in ("corrupt.ckpt", "empty.ckpt", "other_model.ckpt", "no_weights.ckpt", "tensor.ckpt")]
    for name, text in MALFORMED_CONFIGS.items():
        (tmp_path / name).write_text(text)
        files.append(["-c", str(tmp_path / name)])
    return files


def invocations(tmp_path, tiny_model_dir) -> list[list[str]]:
    singles = [*UNKNOWN_KEYS, *WRONG_TYPES, *OUT_OF_RANGE, *BAD_CLASSES]
    return [arg.split(" ") for arg in singles] + bad_files(tmp_path, tiny_model_dir)


def test_every_bad_invocation_exits_2_with_one_line(tiny_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    cases = invocations(tmp_path, tiny_model_dir)
    assert len(cases) >= 200, len(cases)
    failures = []
    for extra in cases:
        code, err, errors = invoke(["fit", *tiny_args(tiny_model_dir, tmp_path, "--trainer.max_epochs=0"), *extra], capsys)
        if code != 2 or len(errors) != 1 or "Traceback" in err or runs_in(tmp_path / "mlflow.db"):
            failures.append((extra, code, err[-300:], runs_in(tmp_path / "mlflow.db")))
    assert not failures, f"{len(failures)} of {len(cases)} bad invocations were not one clean error line or left a run:\n" + "\n".join(map(str, failures[:10]))

