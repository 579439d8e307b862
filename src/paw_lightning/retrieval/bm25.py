"""BM25 with bm25s (Lucene's variant, pyserini's k1 = 0.9, b = 0.4): tokenizer, index build, search.

Tokens: words of two or more characters, English stop words removed, Harman's S-stemmer
(plurals) in place of Lucene's Porter stemmer. ``build`` writes the index once; ``BM25Index``
loads it memory-mapped, so worker processes share its arrays through the page cache.
Reference: docs/reference/environments.md#webshop, docs/reference/environments.md#search-qa
"""
from __future__ import annotations

import re

import bm25s
import numpy as np
from bm25s.stopwords import STOPWORDS_EN

K1, B = 0.9, 0.4  # pyserini's BM25 defaults
_WORD = re.compile(r"(?u)\b\w\w+\b")
_STOP = frozenset(STOPWORDS_EN)


def s_stem(word: str) -> str:
    """Harman's S-stemmer: ``-ies`` → ``-y``, ``-es`` → ``-e``, ``-s`` → ``""`` (with its exceptions)."""
    if word.endswith("ies") and not word.endswith(("eies", "aies")):
        return word[:-3] + "y"
    if word.endswith("es") and not word.endswith(("aes", "ees", "oes")):
        return word[:-1]
    if word.endswith("s") and not word.endswith(("us", "ss")):
        return word[:-1]
    return word


def tokenize(text: str) -> list[str]:
    return [s_stem(w) for w in _WORD.findall(text.lower()) if w not in _STOP]


def build(documents: list[str], out_dir: str) -> None:
    """Index ``documents`` (row i = document i) into ``out_dir``."""
    retriever = bm25s.BM25(k1=K1, b=B, method="lucene")
    retriever.index([tokenize(d) for d in documents], show_progress=False)
    retriever.save(out_dir, show_progress=False)


class BM25Index:
    """A saved index, memory-mapped; ``search(query, k)`` → rows, best first."""

    def __init__(self, index_dir: str) -> None:
        self.retriever = bm25s.BM25.load(index_dir, mmap=True, show_progress=False)
        self.vocab = self.retriever.vocab_dict

    def scored(self, query: str, k: int) -> list[tuple[int, float]]:
        """Up to ``k`` (row, score) pairs with a positive score (ties: lower row first)."""
        tokens = [t for t in tokenize(query) if t in self.vocab]
        if not tokens:
            return []
        scores = self.retriever.get_scores(tokens)
        k = min(k, int((scores > 0).sum()))
        if k == 0:
            return []
        top = np.argpartition(-scores, k - 1)[:k]
        return [(int(i), float(scores[i])) for i in top[np.lexsort((top, -scores[top]))]]

    def search(self, query: str, k: int) -> list[int]:
        """Rows of the up to ``k`` best documents with a positive score."""
        return [row for row, _ in self.scored(query, k)]
