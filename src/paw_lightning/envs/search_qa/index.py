"""The on-disk cache of a corpus and its indexes, and the local retrievers over it.

``<cache>/search_qa/corpus-<key>/``, the key hashing the corpus file's size and its first and
last MiB (its content; the whole file when small): ``offsets.npy`` (line starts of the JSONL
corpus, memory-mapped), ``bm25/`` and ``dense-<encoder>/embeddings.npy`` (built on first use,
memory-mapped), ``meta.json`` (build times). A lock file makes one process build; the pool's
workers then share the arrays read-only through the page cache.
Reference: docs/reference/environments.md#search-qa
"""
from __future__ import annotations

import hashlib
import json
import os
import time

import numpy as np

from paw_lightning.envs.files import JsonLines, locked
from paw_lightning.retrieval import bm25, dense
from paw_lightning.retrieval.base import Passage

CACHE_VERSION = 1
_MIB = 1 << 20


def default_cache_dir() -> str:
    """``$PAW_LIGHTNING_CACHE/search_qa`` (default ``~/.cache/paw_lightning/search_qa``)."""
    return os.path.join(os.path.expanduser(os.environ.get("PAW_LIGHTNING_CACHE", "~/.cache/paw_lightning")), "search_qa")


def corpus_key(path: str) -> str:
    size = os.path.getsize(path)
    digest = hashlib.sha256(f"{CACHE_VERSION}/{size}/".encode())
    with open(path, "rb") as f:
        digest.update(f.read(2 * _MIB))
        if size > 2 * _MIB:
            f.seek(size - _MIB)
            digest.update(f.read())
    return digest.hexdigest()[:12]


class Corpus(JsonLines):
    """The passages of a JSONL corpus, one row at a time (memory-mapped line offsets)."""

    def passage(self, row: int, score: float = 0.0) -> Passage:
        doc = self[row]
        contents = doc.get("contents") or f"{doc.get('title', '')}\n{doc.get('text', '')}"
        return Passage(str(doc["id"]), contents, score)


def ensure_corpus(corpus_path: str, cache_dir: str | None = None) -> str:
    """The cache directory of ``corpus_path`` with its line offsets (written now if missing)."""
    corpus_path = os.path.abspath(os.path.expanduser(corpus_path))
    root = os.path.join(cache_dir or default_cache_dir(), f"corpus-{corpus_key(corpus_path)}")
    if os.path.exists(os.path.join(root, "meta.json")):
        return root
    with locked(root):
        if not os.path.exists(os.path.join(root, "meta.json")):
            os.makedirs(root, exist_ok=True)
            offsets, position = [], 0
            with open(corpus_path, "rb") as f:
                for line in f:
                    if line.strip():
                        offsets.append(position)
                    position += len(line)
            np.save(os.path.join(root, "offsets.npy"), np.asarray(offsets, dtype=np.int64))
            _write_meta(root, {"version": CACHE_VERSION, "corpus": corpus_path, "passages": len(offsets)})
    return root


def _write_meta(root: str, update: dict) -> None:
    path = os.path.join(root, "meta.json")
    meta = read_meta(root) if os.path.exists(path) else {}
    meta.update(update)
    with open(f"{path}.tmp", "w") as f:
        json.dump(meta, f)
    os.replace(f"{path}.tmp", path)


def read_meta(root: str) -> dict:
    with open(os.path.join(root, "meta.json")) as f:
        return json.load(f)


def open_corpus(root: str) -> Corpus:
    return Corpus(read_meta(root)["corpus"], os.path.join(root, "offsets.npy"))


def ensure_index(root: str, kind: str, embedder_name: str = "embedded", embedder=None) -> str:
    """The directory of the ``bm25`` or ``dense`` index of the corpus at ``root`` (built now if missing)."""
    name = "bm25" if kind == "bm25" else f"dense-{hashlib.sha256(embedder_name.encode()).hexdigest()[:8]}"
    out = os.path.join(root, name)
    if os.path.exists(os.path.join(out, "done")):
        return out
    with locked(out):
        if not os.path.exists(os.path.join(out, "done")):
            corpus = open_corpus(root)
            texts = [corpus.passage(i).contents for i in range(len(corpus))]
            start = time.perf_counter()
            if kind == "bm25":
                bm25.build(texts, out)
            else:
                dense.build(texts, out, embedder if embedder is not None else _embedder(embedder_name))
            _write_meta(root, {f"{name}_build_s": time.perf_counter() - start})
            open(os.path.join(out, "done"), "w").close()
    return out


def _embedder(name: str):
    from paw_lightning.embedding import SentenceEmbedder

    return SentenceEmbedder(name)


class LocalRetriever:
    """``retrieve(query, k)`` with BM25 or dense retrieval over a cached corpus (opened lazily)."""

    def __init__(self, root: str, kind: str = "bm25", embedder: str = "embedded", use_faiss: bool = False) -> None:
        if kind not in ("bm25", "dense"):
            raise ValueError(f"a local retriever is 'bm25' or 'dense', got {kind!r}")
        self.root, self.kind, self.embedder_name, self.use_faiss = root, kind, embedder, use_faiss
        self._index = None

    def prepare(self) -> None:
        """Build (once, cached) and open the index."""
        if self._index is None:
            self.corpus = open_corpus(self.root)
            if self.kind == "bm25":
                self._index = bm25.BM25Index(ensure_index(self.root, "bm25"))
            else:
                embedder = _embedder(self.embedder_name)
                self._index = dense.DenseIndex(ensure_index(self.root, "dense", self.embedder_name, embedder), embedder, self.use_faiss)

    def retrieve(self, query: str, k: int) -> list[Passage]:
        self.prepare()
        return [self.corpus.passage(row, score) for row, score in self._index.scored(query, k)]
