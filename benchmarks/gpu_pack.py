"""Pack what the GPU check needs for a GPU machine that reaches no network, in carries of ≤ 60 MiB.

    python benchmarks/gpu_pack.py              # writes .gpu/1, .gpu/2, … and prints the calls

The device machine (docs/guides/gpus.md#the-gpu-check) has torch, Lightning, peft and an older
transformers, and takes at most 64 MiB per call. The check needs, beyond that image:

- the wheels of this project's dependencies that the image lacks (MLflow, jsonargparse, gguf,
  …) and of transformers at this machine's version (continuous batching; the image's is older),
  for CPython 3.12 on manylinux x86-64, resolved by ``pip download``; the environments the check
  does not play (ALFWorld's TextWorld, WebShop's search) are left out;
- the embedded SmolLM2-135M GGUF (98 MB), cut into parts.

Files are packed into numbered folders (``.gpu/<i>``, each at most ``--limit-mib``); ``.gpu/`` is
added to ``.git/info/exclude``. One ``run`` per folder carries it; the first ones move their
files into ``.gpu/keep/`` (ignored, so a warm machine keeps it between calls: make the calls
back to back), and the last one also joins the model, installs the wheels and runs
benchmarks/gpu_check.py. The calls are printed, and written to ``.gpu/calls.json``.
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

ROOT = Path(__file__).resolve().parents[1]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"]
# what the check imports beyond the device image (benchmarks/gpu_check.py's sections play FrozenLake only)
NEEDED = ["transformers", "jsonargparse", "docstring-parser", "typeshed-client", "omegaconf", "mlflow", "gguf", "hydra-core", "rapidfuzz"]
# the device image's packages (the device library's KINDS.md, read 2026-11-17); their wheels are not carried
IMAGE = set("""absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi charset-normalizer
chex click cloudpickle cmake colorama contourpy coverage cycler cython einops etils execnet filelock flatbuffers fonttools fsspec
grpcio h11 h5py hf-xet httpcore httpx huggingface-hub idna imageio iniconfig jinja2 joblib kiwisolver lightning lightning-utilities
lxml markdown markdown-it-py markupsafe matplotlib mdurl ml-dtypes mpmath msgpack multidict networkx ninja numpy packaging pandas
pathspec peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pygments pyparsing pytest pytest-timeout
pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich safetensors scikit-learn scipy sentencepiece setuptools six
sympy tabulate tokenizers toolz torch torchmetrics tqdm triton typing-extensions urllib3 werkzeug wheel wrapt yarl zipp""".split())
KEEP = {"transformers", "huggingface-hub", "tokenizers", "safetensors"}  # carried at this machine's versions: the new transformers needs them
BUILT_HERE = ["antlr4-python3-runtime==4.9.3"]  # omegaconf's and Hydra's pin, published as a source archive only
MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"


def project(wheel: str) -> str:
    """A wheel file's normalised project name: ``Jinja2-3.1.4-py3-none-any.whl`` → ``jinja2``."""
    return re.sub(r"[-_.]+", "-", wheel.split("-")[0]).lower()


def requirements() -> list[str]:
    """``NEEDED`` pinned to the versions installed here (constraints.txt's)."""
    return [f"{name}=={metadata.version(name)}" for name in NEEDED]


def download(folder: Path) -> list[Path]:
    """The wheels of ``requirements()`` and their dependencies for the device's Python, minus
    the ones the image has."""
    folder.mkdir(parents=True, exist_ok=True)
    for sdist in BUILT_HERE:  # a pure-Python wheel built here satisfies the download's pin
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(folder), sdist], check=True)
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
                    *platforms, "--find-links", str(folder), "-d", str(folder), *requirements()], check=True)
    wheels = sorted(folder.glob("*.whl"))
    for wheel in wheels:
        if project(wheel.name) in IMAGE and project(wheel.name) not in KEEP:
            wheel.unlink()
    return sorted(folder.glob("*.whl"))


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


def calls(count: int, check_args: str = "") -> list[dict]:
    """The device calls that carry bundles 1…``count`` and run the check after the last."""
    keep = "mkdir -p .gpu/keep && mv .gpu/{i}/* .gpu/keep/ && ls .gpu/keep | wc -l"
    last = (f"{keep} && cat .gpu/keep/{MODEL}.part* > /tmp/{MODEL} && "
            "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/keep/*.whl && "
            f"export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 && python3 benchmarks/gpu_check.py --model /tmp/{MODEL} {check_args}".strip())
    return [{"carry": [f".gpu/{i}"], "command": (last if i == count else keep).format(i=i), "timeout_s": 600 if i == count else 60}
            for i in range(1, count + 1)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=ROOT / ".gpu")
    parser.add_argument("--limit-mib", type=float, default=60.0, help="the most one carry holds (the device takes 64 MiB with the working tree)")
    parser.add_argument("--check-args", default="", help="more arguments of gpu_check.py in the last call")
    args = parser.parse_args(argv)
    from paw_lightning.model import _embedded_gguf

    shutil.rmtree(args.dir, ignore_errors=True)
    staging = args.dir / "staging"
    staging.mkdir(parents=True)
    exclude = ROOT / ".git" / "info" / "exclude"
    if exclude.exists() and "/.gpu/" not in exclude.read_text().split():
        exclude.write_text(exclude.read_text().rstrip("\n") + "\n/.gpu/\n")
    limit = int(args.limit_mib * 2**20)
    files = download(staging) + split(_embedded_gguf(), staging, limit // 2)
    packed = bundles(files, limit)
    for i, bundle in enumerate(packed, 1):
        (args.dir / str(i)).mkdir()
        for f in bundle:
            f.rename(args.dir / str(i) / f.name)
    staging.rmdir()
    plan = calls(len(packed), args.check_args)
    (args.dir / "calls.json").write_text(json.dumps(plan, indent=1))
    for i, (bundle, call) in enumerate(zip(packed, plan), 1):
        print(f"call {i}: {len(bundle)} files, {sum((args.dir / str(i) / f.name).stat().st_size for f in bundle) / 2**20:.1f} MiB; {json.dumps(call)}")


if __name__ == "__main__":
    main()
