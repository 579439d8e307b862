"""Retrieval engines shared by the environments that search a corpus.

- :mod:`~paw_lightning.retrieval.bm25`: BM25 (bm25s), built once and memory-mapped (WebShop, Search QA).
- :mod:`~paw_lightning.retrieval.dense`: sentence embeddings with an exact inner-product index.
- :mod:`~paw_lightning.retrieval.http`: a client of Search-R1's retrieval server (``POST /retrieve``).
- :mod:`~paw_lightning.retrieval.base`: ``Passage``, ``RetrievalError`` and the per-(query, k) cache.

Reference: docs/reference/environments.md#search-qa
"""
