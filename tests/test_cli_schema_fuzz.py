"""CLI fuzz, round two: bad values generated from the CLI's own schema (tests/fuzz_schema.py):
every leaf key of ``fit`` / ``validate`` / ``test`` (Lightning's ``trainer.*`` included) and the
``init_args`` of every class a config selects, each given values its type or declared range
refuses; and bad files (tests/fuzz_files.py): missing, empty, cut, random or wrong-content
checkpoints, configs and data files. Each must exit 2 with ONE ``error:`` line naming the key
and the value and saying what is allowed (``must be …``; a file: its key and path), print no
traceback, and leave no MLflow run and no checkpoint.

The whole campaign (``slow``) runs every case, in ``CHUNKS`` tests that xdist spreads over its
workers; the fast loop counts the cases and runs a fixed-seed sample of 50 (40 values, 10
files). Every case calls ``main()`` itself, with the parser built once (``shared_parser``)."""
from __future__ import annotations

import random
import re
import shutil
import time

import pytest

from paw_lightning.cli import main
from paw_lightning.envs import ENV_REGISTRY

from fuzz_files import FIXTURES, env_data_cases, file_cases
from fuzz_schema import Case, as_parsed, cases, env_argument_cases, invoke, runs_in, shared_parser
from helpers import tiny_args

MIN_CASES = 1000
CHUNKS = 4


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> list[Case]:
    """The schema's cases, the environments' arguments, then the bad files' (fixed seed)."""
    return cases() + env_argument_cases(tmp_path_factory.mktemp("env_arguments")) + file_cases(tmp_path_factory.mktemp("bad_files"), random.Random(0))


def run_cases(chosen: list[Case], model_dir, workdir, capsys) -> list[tuple]:
    """Run each case through ``main()``; the ones that were not one clean line naming its key
    and value, or that left an MLflow run or a checkpoint behind."""
    failures, before = [], 0
    with shared_parser():
        for case in chosen:
            code, err, errors = invoke([case.subcommand, *tiny_args(model_dir, workdir, "--trainer.max_epochs=0"), *case.args], capsys)
            line = errors[0] if errors else ""
            named = case.key in line and (not case.value or _shown(case.value, line)) and ("must" in line or not case.says_allowed)
            runs, checkpoints = runs_in(workdir / "mlflow.db"), sorted((workdir / "runs").rglob("*.ckpt"))
            if code != 2 or len(errors) != 1 or "Traceback" in err or not named or runs > before or checkpoints:
                failures.append((case.args, code, line or err[-300:], f"runs left: {runs - before}, checkpoints: {len(checkpoints)}"))
            before = runs
            for checkpoint in checkpoints:
                checkpoint.unlink()
    return failures


def _shown(value: str, line: str) -> bool:
    """Whether the error line shows the given value, as typed or as the parser read it (``1e999`` → inf)."""
    read = as_parsed(value)
    return any(str(form) in line for form in (value, read, repr(read)))


def report(failures, chosen) -> str:
    return f"{len(failures)} of {len(chosen)} generated bad invocations were not one clean error line:\n" + "\n".join(map(str, failures[:25]))


def test_the_campaign_has_enough_cases_of_every_kind(generated):
    keys = {case.key for case in generated}
    with_class = [case for case in generated if ".init_args." in case.key]
    print(f"{len(generated)} generated bad invocations: {len(keys)} keys, {len(with_class)} of class arguments, "
          f"{sum(not case.says_allowed for case in generated)} of files")
    assert len(generated) >= MIN_CASES
    assert {"trainer.devices", "trainer.max_epochs", "data.rollout.temperature", "model.world_model_objective.init_args.alpha", "ckpt_path"} <= keys
    assert {case.subcommand for case in generated} == {"fit", "validate", "test"}
    env_keys = {case.args[0].split("=")[1] for case in generated if case.key.startswith("data.env_kwargs.") and case.says_allowed}
    assert env_keys == set(ENV_REGISTRY), env_keys  # every registered environment's arguments
    assert {"data.env_kwargs.hole_prob", "data.evaluation.env_kwargs.size", "data.env_kwargs.tau_d"} <= keys


def test_every_environment_argument_case(generated, tiny_model_dir, tmp_path, monkeypatch, capsys):
    """The environments' arguments (from their constructors' types) fail before anything loads,
    each with one line naming the key and the value: cheap enough to run every case."""
    monkeypatch.chdir(tmp_path)
    chosen = [case for case in generated if case.key.startswith(("data.env_kwargs.", "data.evaluation.env_kwargs.")) and case.says_allowed]
    print(f"{len(chosen)} bad environment arguments")
    failures = run_cases(chosen, tiny_model_dir, tmp_path, capsys)
    assert not failures, report(failures, chosen)


def test_a_fixed_sample_of_the_campaign(generated, tiny_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    values = [case for case in generated if case.says_allowed]
    files = [case for case in generated if not case.says_allowed]
    chosen = random.Random(0).sample(values, 40) + random.Random(0).sample(files, 10)
    failures = run_cases(chosen, tiny_model_dir, tmp_path, capsys)
    assert not failures, report(failures, chosen)


def test_a_sample_of_each_environments_damaged_data(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """Four cases of each environment's data (ALFWorld games, WebShop files, RWML triplets); the
    whole campaign runs all of them."""
    monkeypatch.chdir(tmp_path)
    every = env_data_cases(tmp_path / "bad", random.Random(0))
    chosen = [case for env in ("alfworld", "webshop", "world_model")
              for case in random.Random(0).sample([c for c in every if c.args[0] == f"--data.env={env}"], 4)]
    failures = run_cases(chosen, tiny_model_dir, tmp_path, capsys)
    assert not failures, report(failures, chosen)


def test_valid_environment_data_passes_the_checks(tmp_path, monkeypatch):
    """The checks of the environments' data refuse only bad data: the fixtures in the official
    layouts, triplets as RWMLData writes them, and triplets RWMLData is about to collect pass."""
    from jsonargparse import Namespace

    from paw_lightning.input_files import check_input_files
    from paw_lightning.envs.world_model import Triplet, write_triplets

    def config(env, kwargs, evaluation=None, rwml=None):
        return Namespace(model=Namespace(init_weights=None), stages=Namespace(rwml=rwml), ckpt_path=None,
                         data=Namespace(env=env, env_kwargs=kwargs, evaluation=Namespace(env_kwargs=evaluation)))

    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    monkeypatch.delenv("WEBSHOP_DATA", raising=False)
    check_input_files(config("alfworld", {"data_path": str(FIXTURES / "alfworld")}, {"split": "eval_in_distribution"}))
    check_input_files(config("alfworld", {"data_path": str(tmp_path), "source": "generated"}))
    check_input_files(config("webshop", {"data_path": str(FIXTURES / "webshop")}, {"split": "eval"}))
    write_triplets(tmp_path / "triplets" / "train.jsonl", [Triplet("t", "o", "a", "n", [("o0", "a0")])] * 3)
    check_input_files(config("world_model", {"directory": str(tmp_path / "triplets")}, {"split": "eval"}))  # eval.jsonl: read when validating
    check_input_files(config("paw_lightning.envs.world_model.WorldModelEnv", {"directory": str(tmp_path / "triplets")}))
    check_input_files(config("world_model", {"directory": str(tmp_path / "later")}, rwml={"class_path": "paw_lightning.callbacks.RWMLData"}))
    (tmp_path / "triplets" / "train.jsonl").write_text("{}\n")
    with pytest.raises(ValueError, match="data.env_kwargs.directory: .*train.jsonl' line 1 is not a triplet: it lacks task"):
        check_input_files(config("paw_lightning.envs.world_model.WorldModelEnv", {"directory": str(tmp_path / "triplets")}))
    bad = tmp_path / "webshop"
    shutil.copytree(FIXTURES / "webshop", bad)
    (bad / "reviews.json").write_text("[")
    monkeypatch.setenv("WEBSHOP_DATA", str(bad))  # what the environment reads without data_path
    with pytest.raises(ValueError, match=r"^\$WEBSHOP_DATA \(data.env_kwargs.data_path unset\): .*reviews.json' is not valid JSON at line 1"):
        check_input_files(config("webshop", {}))


@pytest.mark.slow  # every generated case (~0.15 s each)
@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_every_generated_bad_invocation_exits_2_with_one_line(chunk, generated, tiny_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    chosen = generated[chunk::CHUNKS]
    started = time.perf_counter()
    failures = run_cases(chosen, tiny_model_dir, tmp_path, capsys)
    with capsys.disabled():
        print(f"\nchunk {chunk}: {len(chosen)} of {len(generated)} generated bad invocations in {time.perf_counter() - started:.0f} s")
    assert not failures, report(failures, chosen)


@pytest.mark.slow  # a fit, then two resumes that stop after the model loads
@pytest.mark.parametrize("other", [["--model.lm.lora_r=4"], ["--model.lm.lora_target_modules=[q_proj]"]], ids=["lora_rank", "lora_modules"])
def test_a_checkpoint_of_another_lora_says_which_checkpoint_and_why(other, tiny_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    main(["fit", *tiny_args(tiny_model_dir, tmp_path, "--trainer.max_epochs=1", "--summary.enabled=false")])
    checkpoint = next((tmp_path / "runs").rglob("last.ckpt"))
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        main(["fit", *tiny_args(tiny_model_dir, tmp_path, "--trainer.max_epochs=2", "--summary.enabled=false", f"--ckpt_path={checkpoint}", *other)])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert done.value.code == 2 and len(errors) == 1 and "Traceback" not in err, err[-2000:]
    assert f"ckpt_path '{checkpoint}' cannot be restored into this model: " in errors[0]


NESTED = '''Parser key "model.policy_objective":
  Does not validate against any of the Union subtypes
  Subtypes: [<class 'paw_lightning.objectives.policy.PolicyObjective'>, <class 'NoneType'>]
  Errors:
    - Problem with given class_path 'paw_lightning.objectives.PolicyObjective':
        Parser key "advantage":
          Does not validate against any of the Union subtypes
          Subtypes: [<class 'paw_lightning.objectives.advantages.AdvantageEstimator'>, <class 'NoneType'>]
          Errors:
            - Problem with given class_path 'paw_lightning.objectives.GiGPO':
                Parser key "gamma":
                  Not of type ClosedUnitInterval: 1.5 does not conform to restriction v>=0 and v<=1
            - Expected a <class 'NoneType'>
          Given value type: <class 'jsonargparse._util.NestedArg'>
          Given value: NestedArg(key='gamma', val='1.5')
    - Expected a <class 'NoneType'>
  Given value type: <class 'jsonargparse._util.NestedArg'>
  Given value: NestedArg(key='advantage.init_args.gamma', val='1.5')'''


@pytest.mark.parametrize("message, args, line", [
    (NESTED, (), "model.policy_objective.init_args.advantage.init_args.gamma = 1.5: must be a number >= 0 and <= 1"),
    ('Parser key "data.rollout.groups":\n  Expected a <class \'int\'>. Got value: abc', (), "data.rollout.groups = abc: must be an integer"),
    ('Parser key "data.rollout.temperature":\n  Not of type NonNegativeFloat: could not convert string to float: \'x\'', ("--data.rollout.temperature=x",),
     "data.rollout.temperature = x: must be a number >= 0"),
    ('Parser key "model.lm.dtype":\n  Expected a typing.Literal[\'float32\', \'auto\']. Got value: f8', (), "model.lm.dtype = f8: must be one of 'float32', 'auto'"),
    ("unrecognized arguments: fit --frobnicate=1", (), "unrecognized arguments: --frobnicate=1"),
])
def test_one_line_names_the_key_the_value_and_what_is_allowed(message, args, line):
    from paw_lightning.cli_checks import one_line

    assert one_line(message, args) == line


def test_non_finite_numbers_are_refused_wherever_they_are():
    from jsonargparse import Namespace

    from paw_lightning.cli_checks import check_finite

    check_finite(Namespace(a=1.0, b=Namespace(c=[1, 2.5], d={"e": -3.0})))
    for bad, key in ((Namespace(a=float("nan")), "a"), (Namespace(b=Namespace(c=[1.0, float("inf")])), "b.c[1]"),
                     (Namespace(d={"e": float("-inf")}), "d.e")):
        with pytest.raises(ValueError, match=rf"^{re.escape(key)} = -?(nan|inf): must be a finite number$"):
            check_finite(bad)
