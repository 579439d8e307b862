"""The WebShop cache every environment reads: built once per catalog, read lazily per worker.

``<cache>/webshop/index-<key>/``, the key hashing the data files' paths, sizes and mtimes (a
changed catalog gets a new index): ``products.jsonl`` (cleaned products, one per row),
``goals.jsonl`` (every goal, its split inside), ``*.offsets.npy`` (line starts, memory-mapped),
``bm25/`` (the search index, memory-mapped) and ``meta.json``. ``Store`` reads one line per
lookup, so a worker holds only what it touched; a lock file makes one process build.
Reference: docs/reference/environments.md#webshop
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import time

import numpy as np

from paw_lightning.envs.files import JsonLines, locked
from paw_lightning.envs.webshop import data, search

STORE_VERSION = 1


def default_cache_dir() -> str:
    """``$PAW_LIGHTNING_CACHE/webshop`` (default ``~/.cache/paw_lightning/webshop``)."""
    return os.path.join(os.path.expanduser(os.environ.get("PAW_LIGHTNING_CACHE", "~/.cache/paw_lightning")), "webshop")


def files_key(files: dict) -> str:
    stats = [(k, os.path.abspath(p), os.path.getsize(p), os.path.getmtime(p)) for k, p in sorted(files.items()) if p]
    return hashlib.sha256(json.dumps([STORE_VERSION, stats]).encode()).hexdigest()[:12]


def write_jsonl(path: str, rows) -> None:
    offsets, position = [], 0
    with open(path, "wb") as f:
        for row in rows:
            line = (json.dumps(row) + "\n").encode()
            offsets.append(position)
            f.write(line)
            position += len(line)
    np.save(path.replace(".jsonl", ".offsets.npy"), np.asarray(offsets, dtype=np.int64))


def build(files: dict, root: str, seed: int = 0) -> dict:
    """Write the store of ``files`` into ``root`` (through a temporary directory); its meta."""
    start = time.perf_counter()
    products = data.load_products(files)
    goals = data.human_goals(products, data.read_json(files["instructions"]), seed)
    tmp = f"{root}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    write_jsonl(os.path.join(tmp, "products.jsonl"), products)
    assigned = {}
    for name in data.SPLITS:
        try:
            assigned[name] = data.split_goals(goals, name)
        except ValueError:
            continue  # the official data has no OOD split
    for name, rows in assigned.items():
        for g in rows:
            g["split"] = name
    splits = {name: len(rows) for name, rows in assigned.items()}
    write_jsonl(os.path.join(tmp, "goals.jsonl"), _ordered(goals))
    search_start = time.perf_counter()
    search.build([search.document(p) for p in products], os.path.join(tmp, "bm25"))
    meta = {"version": STORE_VERSION, "files": files, "products": len(products), "splits": splits,
            "index_build_s": time.perf_counter() - search_start, "build_s": time.perf_counter() - start}
    meta["index_bytes"] = sum(os.path.getsize(os.path.join(tmp, "bm25", n)) for n in os.listdir(os.path.join(tmp, "bm25")))
    with open(os.path.join(tmp, "meta.json"), "w") as f:
        json.dump(meta, f)
    os.replace(tmp, root)
    return meta


def _ordered(goals: list[dict]) -> list[dict]:
    """Goals grouped by split (stable), so each split is one contiguous range of rows."""
    order = {name: k for k, name in enumerate(data.SPLITS)}
    return sorted((g for g in goals if g["split"] in order), key=lambda g: order[g["split"]])


def ensure(files: dict, cache_dir: str | None = None, seed: int = 0) -> str:
    """The store directory of ``files``, built now if missing (one process builds, others wait)."""
    base = cache_dir or default_cache_dir()
    root = os.path.join(base, f"index-{files_key(files)}-s{seed}")
    if os.path.exists(os.path.join(root, "meta.json")):
        return root
    with locked(root):
        if not os.path.exists(os.path.join(root, "meta.json")):
            build(files, root, seed)
    return root


class Store:
    """A built store: ``product(row)``, ``goals(split)`` (row range), ``goal(split, i)``, ``search``."""

    def __init__(self, root: str) -> None:
        with open(os.path.join(root, "meta.json")) as f:
            self.meta = json.load(f)
        self.root = root
        self.products = JsonLines(os.path.join(root, "products.jsonl"))
        self.goal_rows = JsonLines(os.path.join(root, "goals.jsonl"))
        self.index = search.SearchIndex(os.path.join(root, "bm25"))
        self.product = functools.lru_cache(maxsize=2048)(self.products.__getitem__)

    def split_range(self, split: str) -> tuple[int, int]:
        if split not in self.meta["splits"]:
            data.split_goals([], split)  # an unknown name raises its ValueError
            raise ValueError(f"the WebShop data of {self.meta['files']['products']} has no {split!r} split")
        start = sum(self.meta["splits"][s] for s in data.SPLITS if s in self.meta["splits"] and data.SPLITS.index(s) < data.SPLITS.index(split))
        return start, start + self.meta["splits"][split]

    def num_goals(self, split: str) -> int:
        start, stop = self.split_range(split)
        return stop - start

    def goal(self, split: str, index: int) -> dict:
        start, stop = self.split_range(split)
        if stop == start:
            raise ValueError(f"the WebShop {split!r} split has no goals")
        return self.goal_rows[start + index % (stop - start)]

    def search(self, query: str) -> list[int]:
        return self.index.search(query)
