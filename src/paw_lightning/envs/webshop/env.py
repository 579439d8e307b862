"""``WebShopEnv``: WebShop's text pages behind the ``TextEnv`` protocol.

Data: the official files when ``data_path`` (or ``$WEBSHOP_DATA``) holds them, else a generated
catalog (``source`` chooses). ``reset(seed)`` plays goal ``seed % n`` of the split (WebShop is
deterministic: ``episode`` changes nothing). Reward (METHODS.md §1): 10 when the purchase scores
r = 1, else 0 (``dense_reward``: 10·r), r by the ``reward`` rule (:mod:`~.reward`: ``webshop``,
the released one, or ``strict``); ``info["score"]`` is r (0 before buying), ``task_type`` the
goal's category. The store is opened at the first reset, so a factory pickles cheaply.
Reference: docs/reference/environments.md#webshop
"""
from __future__ import annotations

import os
from typing import Literal

from paw_lightning.envs.base import EnvError
from paw_lightning.envs.webshop import data, expert, generator, pages, reward, store
from paw_lightning.envs.webshop.reward import option_rule
from paw_lightning.ranges import NonNegativeInt, PositiveInt, UnitIntervalClosedOpen

Split = Literal[data.SPLITS]
Source = Literal["auto", "official", "generated"]

WIN_REWARD = 10.0


class WebShopEnv:
    """WebShop (see the module docstring).

    Args:
        split: ``train``, ``eval`` or ``ood`` (held-out product types; generated data only).
        data_path: a directory of official WebShop files; None reads ``$WEBSHOP_DATA``.
        source: ``auto`` (official when found, else generated), ``official`` or ``generated``.
        num_products, instructions_per_product, generator_seed, eval_fraction, ood_types:
            the generated catalog (``generator.CatalogConfig``).
        dense_reward: reward 10·r on buying instead of 10 on r = 1 only.
        reward: how chosen options match the goal's: ``webshop`` (WebShop's released ``goal.py``,
            behind the papers' numbers) or ``strict`` (exact sizes, text fallback per chosen option).
        type_nouns: ``heuristic`` or an installed spaCy pipeline (``en_core_web_sm``: the original).
        cache_dir: generated catalogs and indexes (None: ``$PAW_LIGHTNING_CACHE/webshop``).
    """

    max_return = WIN_REWARD  # R_max of METHODS.md §3c
    tagged_kwargs = ("reward",)  # run tag env.reward, and named in every evaluation report (envs/base.py)

    def __init__(
        self,
        split: Split = "train",
        data_path: str | None = None,
        source: Source = "auto",
        num_products: PositiveInt = 1000,
        instructions_per_product: PositiveInt = 2,
        generator_seed: NonNegativeInt = 0,
        eval_fraction: UnitIntervalClosedOpen = 0.1,
        ood_types: list[str] | None = None,
        dense_reward: bool = False,
        reward: str = "webshop",
        type_nouns: str = "heuristic",
        cache_dir: str | None = None,
    ) -> None:
        if split not in data.SPLITS:
            raise ValueError(f"unknown WebShop split {split!r}: choose one of {', '.join(data.SPLITS)}")
        if source not in ("auto", "official", "generated"):
            raise ValueError(f"source must be 'auto', 'official' or 'generated', got {source!r}")
        path = data_path if data_path is not None else os.environ.get("WEBSHOP_DATA")
        if source == "official" and not path:
            raise ValueError("source 'official' needs data_path or $WEBSHOP_DATA (see docs/reference/environments.md#webshop)")
        option_rule(reward)  # an unknown rule fails here, not at the first purchase
        self.split, self.cache_dir, self.dense_reward = split, cache_dir or store.default_cache_dir(), dense_reward
        self.reward_rule = reward
        self.type_nouns = type_nouns
        self.catalog = generator.CatalogConfig(num_products, instructions_per_product, generator_seed, eval_fraction,
                                               tuple(ood_types) if ood_types is not None else None)
        self.source = "official" if path and source != "generated" else "generated"
        self.data_dir = os.path.expanduser(os.path.expandvars(path)) if self.source == "official" else None
        if self.data_dir is not None:
            data.find_files(self.data_dir)  # a missing file fails here, not in a worker
        if self.source == "generated" and split == "ood" and not self.catalog.held_out():
            raise ValueError("the ood split needs held-out product types (ood_types)")
        self._store: store.Store | None = None
        self._page: pages.Page | None = None
        self._goal: dict = {}

    # ----------------------------------------------------------------- data
    def prepare(self) -> store.Store:
        """Generate the catalog and build its index now (cached), and open them."""
        if self._store is None:
            data_dir = self.data_dir
            if data_dir is None:
                data_dir = os.path.join(self.cache_dir, f"generated-{self.catalog.key()}")
                with store.locked(data_dir):
                    if not os.path.exists(os.path.join(data_dir, "generator.json")):
                        generator.generate(data_dir, self.catalog)
            self._store = store.Store(store.ensure(data.find_files(data_dir), self.cache_dir, self.catalog.seed))
            self._nouns = reward.noun_finder(self.type_nouns)
        return self._store

    @property
    def n_goals(self) -> int:
        return self.prepare().num_goals(self.split)

    # ------------------------------------------------------------- protocol
    def reset(self, seed: int, episode: int = 0) -> tuple[str, dict]:
        self._goal = self.prepare().goal(self.split, seed)
        self._page, self._score = pages.Page(), 0.0
        return self._render(), self._info()

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        if self._page is None or self._page.kind == "done":
            raise EnvError("WebShop episode is not running: call reset() first")
        product, asins = self._view()
        page = pages.transition(self._page, action, product, asins, self._store.search)
        if page is None:
            return self._render(), 0.0, False, self._info(recognised=False)
        self._page = page
        if page.kind != "done":
            return self._render(), 0.0, False, self._info(recognised=True)
        self._score, parts = reward.reward(product, self._goal, product["price"], page.options, self._nouns, self.reward_rule)
        won = self._score == 1.0
        r = WIN_REWARD * self._score if self.dense_reward else WIN_REWARD * won
        chosen = ", ".join(f"{k}: {v}" for k, v in page.options.items()) or "none"
        obs = pages.SEP.join(["Thank you for shopping with us!", "Purchased", product["asin"], product["Title"],
                              f"Options: {chosen}", f"Your score (min 0.0, max 1.0): {self._score:.2f}"])
        return obs, r, True, {**self._info(recognised=True), "reward_parts": parts}

    def walkthrough(self) -> list[str]:
        """The expert's actions for the current goal, from the search page."""
        if not self._goal:
            raise EnvError("WebShop has no goal: call reset() first")
        return expert.walkthrough(self._goal, self._store.product(self._goal["row"]), self._store.search)

    # -------------------------------------------------------------- helpers
    def _view(self) -> tuple[dict | None, list[str]]:
        """The open product and the asins shown on the current results page."""
        page = self._page
        product = self._store.product(page.row) if page.row is not None else None
        asins = [self._store.product(r)["asin"] for r in pages.shown_rows(page)] if page.kind == "results" else []
        return product, asins

    def _render(self) -> str:
        product, _ = self._view()
        shown = [self._store.product(r) for r in pages.shown_rows(self._page)] if self._page.kind == "results" else []
        return pages.render(self._page, product, shown, self._goal["instruction_text"])

    def _info(self, recognised: bool | None = None) -> dict:
        product, asins = self._view()
        actions = pages.admissible(self._page, product, asins) if self._page.kind != "done" else []
        info = {"task": self._goal["instruction_text"], "admissible_actions": actions, "won": self._score == 1.0,
                "score": self._score, "task_type": self._goal["category"], "asin": self._goal["asin"]}
        if recognised is not None:
            info["action_recognised"] = recognised
        return info
