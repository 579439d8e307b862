"""WebShop (Yao et al. 2022) in text mode: a generated catalog offline, the official data when present.

- :mod:`~paw_lightning.envs.webshop.env`: ``WebShopEnv`` (the ``TextEnv``).
- :mod:`~paw_lightning.envs.webshop.generator`: seeded catalogs in the official file format.
- :mod:`~paw_lightning.envs.webshop.data`: the official-format loader (products, goals, splits).
- :mod:`~paw_lightning.envs.webshop.store`: the on-disk cache every worker shares read-only.
- :mod:`~paw_lightning.envs.webshop.search`: the BM25 search engine (bm25s).
- :mod:`~paw_lightning.envs.webshop.reward`: WebShop's reward; :mod:`~.pages`: pages and actions;
  :mod:`~.expert`: the walkthrough.

Reference: docs/reference/environments.md#webshop
"""
__all__ = ["WebShopEnv"]


def __getattr__(name: str):
    if name == "WebShopEnv":
        from paw_lightning.envs.webshop.env import WebShopEnv

        return WebShopEnv
    raise AttributeError(name)
