"""Search-augmented QA (Search-R1's protocol): search a corpus, then answer; reward = exact match.

- :mod:`~paw_lightning.envs.search_qa.env`: ``SearchQAEnv`` (the ``TextEnv``).
- :mod:`~paw_lightning.envs.search_qa.answers`: SQuAD answer normalisation and exact match.
- :mod:`~paw_lightning.envs.search_qa.protocol`: ``<search>``/``<answer>`` parsing, ``<information>``.
- :mod:`~paw_lightning.envs.search_qa.generator`: the seeded fictional encyclopedia and its questions.
- :mod:`~paw_lightning.envs.search_qa.data`: Search-R1 parquet / JSONL loaders, splits.
- :mod:`~paw_lightning.envs.search_qa.index`: the on-disk corpus + index cache and the retrievers.
- :mod:`~paw_lightning.envs.search_qa.expert`: the walkthrough.

Reference: docs/reference/environments.md#search-qa
"""
__all__ = ["SearchQAEnv"]


def __getattr__(name: str):
    if name == "SearchQAEnv":
        from paw_lightning.envs.search_qa.env import SearchQAEnv

        return SearchQAEnv
    raise AttributeError(name)
