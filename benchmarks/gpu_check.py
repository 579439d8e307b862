"""The GPU check: one command on a fresh GPU machine measures what matters and writes one report.

    python benchmarks/gpu_check.py --out runs/gpu-check --model /path/to/SmolLM2-135M-Instruct.Q4_1.gguf
    python benchmarks/gpu_check.py --dry-run --out /tmp/gpu-check     # tiny sizes on a CPU (the tests run this)

Every section is a subprocess with its share of ``--budget`` (default 510 s, under the 9
minutes a one-call check may take), its commands run in order of importance; one that fails or
runs out of time is reported as such and the check goes on. The report is rewritten (and copied
to ``$OUT``) after every section, so a check stopped from outside still returns what it measured.
In order:

1. **machine**: device, driver, versions, and which engines this install can run;
2. **gpu tests**: ``pytest -m gpu`` on the files that hold them (``GPU_TESTS``: collecting the
   whole suite would import packages a GPU image lacks; on a CPU they are all skipped);
3. **generation**: benchmarks/engine_throughput.py on FrozenLake's first prompts at batch 32,
   8 and 128 (the target's batch first), for ``--model`` (the embedded SmolLM2-135M by default)
   and for a randomly initialised model of Qwen2.5-1.5B's shape: ``hf``, ``hf merged``,
   ``hf merged static`` (static KV cache: transformers compiles the decoding step on CUDA),
   ``cb`` (continuous batching, where transformers has it) and ``vllm`` (where it imports);
   response tokens/s, ratio to ``hf`` and ``engine_kl``;
4. **training**: benchmarks/train_throughput.py at the 1.5B shape, bf16, 8 × 2048 tokens with
   the loss reading the last 512 positions of each row, tokens/s and MFU, with the top
   kernels of one step from ``torch.profiler``;
5. **learning**: experiments/learning.py, PaW against vanilla RL, ``--jobs`` runs at once on the
   one GPU, two rounds of them queued (``--jobs`` seeds) and stopped at the deadline (then
   ``--report-only`` over the runs that finished).

The report, ``<out>/gpu_check.md`` (also copied, with the learning curves, into ``$OUT`` where
that is set, as on the device machine), holds the machine, every figure with the command that
measured it, each section's status and wall time, and the learning table. Nothing is
downloaded: ``--model`` (by default the embedded GGUF) must be on the machine
(docs/guides/gpus.md#the-gpu-check says how the weights and wheels travel). ``--dry-run`` runs
every section at tiny sizes on the tiny test model (built in code), so the check itself is tested on a CPU.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
GENERATION_ENGINES = ["hf", "hf merged", "hf merged static", "cb", "vllm"]
GPU_TESTS = ["tests/test_gpu.py", "tests/test_gpu_qlora.py"]
# the budget's shares; learning gets what is left, less STOP_GRACE and REPORT_ONLY (about a third)
SHARES = {"gpu tests": 0.10, "generation": 0.30, "training": 0.14}
STOP_GRACE = 30.0  # seconds a command has to stop after SIGINT, before SIGKILL
REPORT_ONLY = 40.0  # seconds kept at the end for learning.py --report-only and the report


@dataclass
class Section:
    """One part of the check: its commands, run one after another inside ``budget`` seconds."""

    name: str
    commands: list[list[str]]
    budget: float
    results: list[dict] = field(default_factory=list)  # per command: command, status, seconds, tail


@dataclass
class Plan:
    """What the check runs at which sizes (``dry_run``: tiny, on a CPU)."""

    out: Path
    model: str
    dry_run: bool
    budget: float
    jobs: int
    device: str = "cuda"
    batches: tuple[int, ...] = (32, 8, 128)  # the target's batch first: the deadline cuts the last ones

    @classmethod
    def make(cls, args: argparse.Namespace) -> Plan:
        if args.dry_run:
            return cls(args.out, args.model or str(tiny_model(args.out)), True, args.budget, 1, device="cpu", batches=(4, 2))
        return cls(args.out, args.model or "embedded", False, args.budget, args.jobs)


def tiny_model(out: Path) -> Path:
    """The tests' tiny random chat model, written once under ``out``."""
    from paw_lightning.testing.tiny_model import build_tiny_model_dir

    path = out / "tiny-model"
    return path if (path / "config.json").exists() else build_tiny_model_dir(path)


def available_engines(dry_run: bool) -> tuple[list[str], dict[str, str]]:
    """The generation engines this install can run, and why each other one is left out."""
    missing = {}
    try:
        from transformers import ContinuousBatchingConfig  # noqa: F401
    except Exception as err:  # an older transformers, or one that does not import at all
        missing["cb"] = f"transformers has no continuous batching ({type(err).__name__}: {err})"
    try:
        import vllm  # noqa: F401
    except ImportError:
        missing["vllm"] = "vllm is not installed"
    if dry_run:
        missing.setdefault("vllm", "not in a dry run")
    return [e for e in GENERATION_ENGINES if e not in missing], missing


def generation_section(plan: Plan, engines: list[str]) -> Section:
    shapes = [["--model", plan.model]] + ([] if plan.dry_run else [["--model", plan.model, "--random", "1.5b"]])
    reps = ["--reps", "1", "--calls", "1"] if plan.dry_run else ["--reps", "2", "--calls", "1"]
    commands = [[sys.executable, str(BENCHMARKS / "engine_throughput.py"), "--config", str(ROOT / "configs/frozenlake.yaml"), *shape,
                 "--engines", ",".join(engines), "--batch", str(batch), "--device", plan.device, *reps,
                 "--json", str(plan.out / f"generation-{'1.5b' if '--random' in shape else 'model'}-b{batch}.json")]
                for batch in plan.batches for shape in shapes]
    return Section("generation", commands, SHARES["generation"] * plan.budget)


def training_section(plan: Plan) -> Section:
    if plan.dry_run:
        sizes = ["--model", plan.model, "--batch", "2", "--prompt-tokens", "32", "--new-tokens", "8", "--train-batch", "2", "--seq-len", "64", "--reps", "1", "--threads", "1"]
    else:
        # the rollout phase at 64 new tokens (4 eager generate calls; the generation section measures rollouts in full): the section's share is tight
        sizes = ["--random", "1.5b", "--dtype", "bfloat16", "--batch", "32", "--prompt-tokens", "1024", "--new-tokens", "64", "--train-batch", "8",
                 "--seq-len", "2048", "--read-tokens", "512", "--reps", "3"]
    command = [sys.executable, str(BENCHMARKS / "train_throughput.py"), *sizes, "--profile", "--json", str(plan.out / "training.json")]
    return Section("training", [command], SHARES["training"] * plan.budget)


def learning_command(plan: Plan, seeds: int) -> list[str]:
    store = plan.out / "learning"
    if plan.dry_run:
        sizing = ["--overlay", str(ROOT / "tests/configs/tiny.yaml"), "--seeds", "0", "--jobs", "1", "--out", str(store), "--",
                  f"--model.lm.name_or_path={plan.model}", "--trainer.max_epochs=1"]
    else:
        sizing = ["--seeds", *map(str, range(seeds)), "--jobs", str(plan.jobs), "--out", str(store), "--", f"--model.lm.name_or_path={plan.model}",
                  "--trainer.accelerator=gpu", "--trainer.devices=1", "--trainer.precision=bf16-mixed"]
    return [sys.executable, str(ROOT / "experiments/learning.py"), *sizing]


def run_until(command: list[str], seconds: float) -> tuple[str, str]:
    """Run ``command`` for at most ``seconds``: (status, its output). At the limit it gets
    SIGINT (learning.py then stops its runs: they live in process groups of their own), and
    SIGKILL ``STOP_GRACE`` s later (then its output is read for at most 10 s more: a grandchild
    that kept the pipe open cannot hold the check). The command gets SIGINT's default
    disposition even when this check runs in the background (``nohup … &`` starts it with SIGINT
    ignored, which a Python child would inherit and keep: it would then run on to the SIGKILL
    and leave its runs behind)."""
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        output, _ = proc.communicate(timeout=seconds)
        return ("ok" if proc.returncode == 0 else f"failed (exit {proc.returncode})"), output
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            output, _ = proc.communicate(timeout=STOP_GRACE)
        except subprocess.TimeoutExpired:
            proc.kill()
            try:
                output, _ = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired as err:
                output = err.output.decode(errors="replace") if isinstance(err.output, bytes) else (err.output or "")
        return "timed out", output


def run_section(section: Section, deadline: float) -> None:
    """Run the section's commands in order until its budget or the check's deadline is spent
    (a stopped command may overrun it by up to ``STOP_GRACE`` + 10 s)."""
    end = min(time.monotonic() + section.budget, deadline)
    for command in section.commands:
        left = end - time.monotonic()
        if left < 5:
            section.results.append({"command": command, "status": "not run (out of time)", "seconds": 0.0, "tail": "", "last": ""})
            continue
        start = time.monotonic()
        status, output = run_until(command, left)
        last = next((line.strip() for line in reversed(output.splitlines()) if line.strip()), "")
        section.results.append({"command": command, "status": status, "seconds": time.monotonic() - start, "tail": output[-3000:], "last": last[:160]})
        print(f"[{section.name}] {status} in {time.monotonic() - start:.0f} s: {shlex.join(command)}", flush=True)


def machine_lines(missing: dict[str, str]) -> list[str]:
    try:
        import torch
        import transformers
    except Exception as err:  # the sections' own outputs say more
        return [f"- torch or transformers does not import: {type(err).__name__}: {err}"]
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU ({os.cpu_count()} cores, no CUDA)"
    lines = [f"- device: {device}" + (f", {torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB, CUDA {torch.version.cuda}" if torch.cuda.is_available() else ""),
             f"- python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}, host {platform.node()}"]
    lines += [f"- engine `{name}` left out: {why}" for name, why in missing.items()]
    return lines


def read_json(path: Path) -> dict | None:
    """A section's figures, or None where a stopped command left its file half written."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def generation_table(out: Path) -> list[str]:
    lines = ["| model | batch | engine | tokens/s | × hf | engine_kl |", "|---|---|---|---|---|---|"]
    for path in sorted(out.glob("generation-*.json"), key=lambda p: (p.stem.split("-")[1], int(p.stem.rsplit("-b", 1)[1]))):
        data = read_json(path)
        if data is None:
            lines.append(f"| {path.name}: unreadable | | | | | |")
            continue
        for row in data["engines"]:
            lines.append(f"| {Path(str(data['model'])).name} | {data['batch']} | {row['engine']} | {row['tokens_per_s']:.1f} | {row['ratio_to_hf']:.2f} | {row['engine_kl']:.2e} |")
        for engine, error in data.get("failed", {}).items():
            lines.append(f"| {Path(str(data['model'])).name} | {data['batch']} | {engine} | failed: {error[:200].replace('|', '/')} | | |")
    return lines if len(lines) > 2 else ["(no generation figures)"]


def training_lines(out: Path) -> list[str]:
    d = read_json(out / "training.json")
    if d is None:
        return ["(no training figures)"]
    return [f"- {d['model']}, {d['dtype']}, reading {d['train_read_tokens']} positions per row: **{d['train_tokens_per_s']:.0f} tokens/s**, "
            f"MFU {d['train_mfu_4n']} (4N) / {d['train_mfu_6n']} (6N convention), peak {d['train_peak_gib']:.2f} GiB; peak FLOP/s: {d['peak']}",
            f"- rollout (generate, fixed length): {d['rollout_tokens_per_s']:.0f} tokens/s, MFU {d['rollout_mfu']}",
            "", "Top operators and kernels of one training step, by self time (a GEMM shows as its aten operator and its kernel):", "", "```", (d.get("top_kernels") or "").strip(), "```"]


def write_report(plan: Plan, sections: list[Section], missing: dict[str, str], started: float) -> Path:
    lines = [f"# GPU check{' (dry run, tiny sizes)' if plan.dry_run else ''}", "",
             f"Command: `{shlex.join([sys.executable, *sys.argv])}`; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
             f"{time.monotonic() - started:.0f} s in all (budget {plan.budget:.0f} s).", "", "## Machine", "", *machine_lines(missing), "",
             "## Sections", "", "| section | command | status | seconds | last line of its output |", "|---|---|---|---|---|"]
    for section in sections:
        for r in section.results:
            command = shlex.join(r["command"]).replace(str(ROOT) + "/", "").replace(sys.executable, "python")
            lines.append(f"| {section.name} | `{command}` | {r['status']} | {r['seconds']:.0f} | {r['last'].replace('|', '/')} |")
    lines += ["", "## Generation (FrozenLake first prompts, response tokens/s)", "", *generation_table(plan.out), "",
              "## Training step", "", *training_lines(plan.out), "", "## Learning (PaW vs vanilla RL)", ""]
    results = plan.out / "learning" / "results.md"
    lines += [results.read_text().strip() if results.exists() else "(no learning runs finished)"]
    failed = [r for s in sections for r in s.results if r["status"] not in ("ok",)]
    if failed:
        lines += ["", "## Output of the sections that did not finish", ""]
        for r in failed:
            lines += [f"`{shlex.join(r['command'])}`: {r['status']}", "", "```", r["tail"].strip()[-2000:], "```", ""]
    report = plan.out / "gpu_check.md"
    report.write_text("\n".join(lines) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/gpu-check"), help="the report, the figures and the learning runs (default: runs/gpu-check)")
    parser.add_argument("--model", help="model.lm.name_or_path of the 135M (default: embedded; dry run: the tiny test model)")
    parser.add_argument("--budget", type=float, default=510.0, help="seconds for the whole check (default 510)")
    parser.add_argument("--jobs", type=int, default=8, help="learning runs at once on the GPU (default 8)")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on a CPU: checks the check")
    args = parser.parse_args(argv)
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    deadline = started + args.budget
    plan = Plan.make(args)
    engines, missing = available_engines(plan.dry_run)
    seeds = plan.jobs  # 2 × seeds runs: two rounds of --jobs; the deadline stops the rest
    sections = [Section("gpu tests", [[sys.executable, "-m", "pytest", "-m", "gpu", "-n", "0", "-p", "no:cacheprovider", "-q", *GPU_TESTS]], SHARES["gpu tests"] * plan.budget),
                generation_section(plan, engines), training_section(plan), Section("learning", [learning_command(plan, seeds)], math.inf)]  # the deadline stops it
    done: list[Section] = []
    for section in sections:
        # learning stops in time for its runs to stop (STOP_GRACE) and for the report (REPORT_ONLY)
        run_section(section, deadline - (STOP_GRACE + REPORT_ONLY if section.name == "learning" else 0))
        done.append(section)
        publish(plan, done, missing, started)
    learning = sections[-1]
    if learning.results and learning.results[-1]["status"] == "timed out":  # report the runs that finished
        report_only = [*learning_command(plan, seeds)[:2], "--report-only", "--out", str(plan.out / "learning")]
        try:
            subprocess.run(report_only, cwd=ROOT, capture_output=True, timeout=max(5.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print("learning.py --report-only did not finish by the deadline", flush=True)
        publish(plan, done, missing, started)
    return 0 if all(r["status"] == "ok" for s in sections for r in s.results) else 1


def publish(plan: Plan, sections: list[Section], missing: dict[str, str], started: float) -> None:
    """Write the report of the sections run so far and, on the device machine (``$OUT`` set),
    copy it and the learning curves where they come back."""
    report = write_report(plan, sections, missing, started)
    print(f"written: {report}", flush=True)
    if os.environ.get("OUT"):
        for path in (report, plan.out / "learning" / "learning_curves.png"):
            if path.exists():
                shutil.copy(path, os.environ["OUT"])


if __name__ == "__main__":
    sys.exit(main())
