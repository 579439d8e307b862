"""WebShop's search engine: BM25 (bm25s, Lucene's variant and pyserini's k1 = 0.9, b = 0.4).

A product's document is WebShop's: title, description, first bullet and option text, lower
case. Tokens: words of two or more characters, English stop words removed, Harman's S-stemmer
(plurals) in place of Lucene's Porter stemmer. The BM25 code is shared with Search QA
(:mod:`paw_lightning.retrieval.bm25`); ``SearchIndex`` loads the index memory-mapped.
Reference: docs/reference/environments.md#webshop
"""
from __future__ import annotations

from paw_lightning.retrieval.bm25 import B, K1, BM25Index, build, s_stem, tokenize

__all__ = ["B", "K1", "SEARCH_RETURN_N", "SearchIndex", "build", "document", "s_stem", "tokenize"]
SEARCH_RETURN_N = 50  # WebShop's number of results of a search


def document(product: dict) -> str:
    """The indexed text of a cleaned product (WebShop's ``convert_product_file_format``)."""
    option_text = ", and ".join(f"{name}: {', '.join(values)}" for name, values in product["options"].items())
    first_bullet = product["BulletPoints"][0] if product["BulletPoints"] else ""
    return " ".join([product["Title"], product["Description"], first_bullet, option_text]).lower()


class SearchIndex(BM25Index):
    """WebShop's saved index, memory-mapped; ``search(query)`` → up to 50 product rows, best first."""

    def search(self, query: str, k: int = SEARCH_RETURN_N) -> list[int]:
        return super().search(query, k)
