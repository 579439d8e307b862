"""Dense retrieval: unit-norm sentence embeddings of the passages, exact inner-product search.

``build`` embeds every passage once (``SentenceEmbedder``: the embedded all-MiniLM-L6-v2 or any
Hugging Face encoder) into ``embeddings.npy`` (float32); ``DenseIndex`` memory-maps it, so the
worker processes share it, and scores a query against all rows with one matrix product (or
``faiss.IndexFlatIP`` when faiss is importable and ``use_faiss``; faiss is not a dependency).
The product runs in torch, on the embedder's thread pool: numpy's BLAS pool beside torch's
(still spinning after the query's embedding) made a query against 100k rows 9× slower on 2
cores (p50 111 vs 12.6 ms, ``benchmarks/search_qa_retrieval.py``).
Reference: docs/reference/environments.md#search-qa
"""
from __future__ import annotations

import os
import warnings

import numpy as np
import torch

EMBEDDINGS = "embeddings.npy"


def build(documents: list[str], out_dir: str, embedder) -> None:
    """Embed ``documents`` (row i = document i) with ``embedder`` into ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    vectors = embedder(documents).numpy().astype(np.float32) if documents else np.zeros((0, 1), np.float32)
    np.save(os.path.join(out_dir, EMBEDDINGS), vectors)


def faiss_available() -> bool:
    try:
        import faiss  # noqa: F401
    except ImportError:
        return False
    return True


class DenseIndex:
    """A saved embedding matrix; ``scored(query, k)`` → (row, cosine) pairs, best first."""

    def __init__(self, index_dir: str, embedder, use_faiss: bool = False) -> None:
        self.vectors = np.load(os.path.join(index_dir, EMBEDDINGS), mmap_mode="r")
        with warnings.catch_warnings():  # read-only memory map: torch only reads it
            warnings.simplefilter("ignore", UserWarning)
            self._matrix = torch.from_numpy(np.asarray(self.vectors))
        self.embedder = embedder
        self.faiss = None
        if use_faiss and faiss_available():
            import faiss

            self.faiss = faiss.IndexFlatIP(self.vectors.shape[1])
            self.faiss.add(np.ascontiguousarray(self.vectors))

    def scored(self, query: str, k: int) -> list[tuple[int, float]]:
        k = min(k, len(self.vectors))
        if k == 0:
            return []
        q = self.embedder([query]).float()
        if self.faiss is not None:
            scores, rows = self.faiss.search(q.numpy(), k)
            return [(int(r), float(s)) for r, s in zip(rows[0], scores[0])]
        scores = (self._matrix @ q[0]).numpy()
        top = np.argpartition(-scores, k - 1)[:k]
        return [(int(i), float(scores[i])) for i in top[np.lexsort((top, -scores[top]))]]
