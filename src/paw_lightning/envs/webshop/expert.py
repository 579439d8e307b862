"""The WebShop expert: search with the instruction's key terms, open the target, choose its options, buy.

The query is the instruction without its price clause; when the target is not among the 50
hits, the target's title is tried next. The plan pages forward (``next >``) to the target's
results page, clicks it, clicks the goal's option values that the target offers (one per
option group) and buys. It reaches r = 1 whenever the target's own reward is 1 (measured:
docs/reference/environments.md#webshop).
"""
from __future__ import annotations

import re

from paw_lightning.envs.webshop.pages import PRODUCT_WINDOW

_PRICE = re.compile(r",? and price lower than [\d.]+ dollars$")


def key_terms(instruction: str) -> str:
    """The instruction without WebShop's price clause."""
    return _PRICE.sub("", instruction.strip()).strip()


def target_options(product: dict, goal_options) -> list[str]:
    """The goal's option values the product offers, at most one per option group, in group order."""
    wanted = list(goal_options.values()) if isinstance(goal_options, dict) else list(goal_options)
    return [next(v for v in values if v in wanted) for values in product["options"].values() if any(v in wanted for v in values)]


def walkthrough(goal: dict, product: dict, search) -> list[str]:
    """The expert's actions from the search page for ``goal`` (target ``product`` at row ``goal["row"]``)."""
    queries = [key_terms(goal["instruction_text"]), product["Title"].lower()]
    for query in queries:
        rows = search(query)
        if goal["row"] in rows:
            position = rows.index(goal["row"])
            pages = ["click[next >]"] * (position // PRODUCT_WINDOW)
            clicks = [f"click[{v}]" for v in target_options(product, goal["goal_options"])]
            return [f"search[{query}]", *pages, f"click[{product['asin'].lower()}]", *clicks, "click[buy now]"]
    return [f"search[{queries[0]}]"]  # the target cannot be found: the plan ends on the results page
