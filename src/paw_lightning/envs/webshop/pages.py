"""WebShop's pages in its simple text mode (fields joined by `` [SEP] ``) and their buttons.

Pages: ``search`` → ``results`` (10 per page of the 50 hits, ``next >`` / ``< prev``) →
``item`` (option values, ``description`` / ``features`` / ``reviews`` tabs, ``buy now``) → a tab
(``< prev`` back to the item). ``back to search`` leaves any page but the search page. Actions
are ``search[query]`` (search page only, as verl-agent's admissible list) and ``click[button]``
with a button of the page, lower case (WebShop's clickables). ``transition`` is pure: it
returns the next ``Page`` or ``None`` for an action the page does not recognise.
Reference: docs/reference/environments.md#webshop
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

PRODUCT_WINDOW = 10
SEP = " [SEP] "
TABS = ("description", "features", "reviews")
SEARCH_TEMPLATE = "search[<your query>]"
_ACTION = re.compile(r"^\s*(search|click)\s*\[(.*)\]\s*$", re.IGNORECASE | re.DOTALL)


@dataclass(frozen=True)
class Page:
    """Where the agent is: the page kind, the last search, its results page and the open item."""

    kind: str = "search"  # search | results | item | description | features | reviews | done
    query: str = ""
    results: tuple[int, ...] = ()  # product rows of the last search, best first
    page: int = 1
    row: int | None = None  # the open product
    options: dict = field(default_factory=dict)  # chosen {option name: value}
    clicked: str = ""  # the option value clicked last (shown once)


def parse(action: str) -> tuple[str, str] | None:
    """``(name, argument)`` of ``search[…]`` / ``click[…]`` (argument stripped, lower case)."""
    match = _ACTION.match(action)
    return (match[1].lower(), match[2].strip().lower()) if match else None


def buttons(page: Page, product: dict | None, asins: list[str]) -> list[str]:
    """The clickable buttons of ``page`` (``asins``: the results shown on a results page)."""
    if page.kind == "search":
        return []
    if page.kind == "results":
        more = page.page * PRODUCT_WINDOW < len(page.results)
        return ["back to search", *(["< prev"] if page.page > 1 else []), *(["next >"] if more else []), *(a.lower() for a in asins)]
    if page.kind == "item":
        values = [v for vs in product["options"].values() for v in vs]
        return ["back to search", "< prev", *values, *TABS, "buy now"]
    return ["back to search", "< prev"] if page.kind in TABS else []


def admissible(page: Page, product: dict | None, asins: list[str]) -> list[str]:
    """verl-agent's available actions: the search template on the search page, else the clicks."""
    if page.kind == "search":
        return [SEARCH_TEMPLATE]
    return [f"click[{b}]" for b in buttons(page, product, asins)]


def shown_rows(page: Page) -> tuple[int, ...]:
    return page.results[(page.page - 1) * PRODUCT_WINDOW : page.page * PRODUCT_WINDOW]


def transition(page: Page, action: str, product: dict | None, asins: list[str], search) -> Page | None:
    """The page after ``action`` (``search(query)`` → rows), ``None`` if not recognised here.
    ``buy now`` returns a ``done`` page; the caller computes the reward."""
    parsed = parse(action)
    if parsed is None:
        return None
    name, arg = parsed
    if name == "search":
        return Page("results", arg, tuple(search(arg))) if page.kind == "search" and arg and arg != "<your query>" else None
    if arg not in buttons(page, product, asins):
        return None
    if arg == "back to search":
        return Page()
    if page.kind == "results":
        if arg in ("next >", "< prev"):
            return replace(page, page=page.page + (1 if arg == "next >" else -1))
        return replace(page, kind="item", row=shown_rows(page)[[a.lower() for a in asins].index(arg)], options={}, clicked="")
    if page.kind == "item":
        if arg == "< prev":
            return replace(page, kind="results", row=None, options={}, clicked="")
        if arg in TABS:
            return replace(page, kind=arg, clicked="")
        if arg == "buy now":
            return replace(page, kind="done", clicked="")
        group = next(g for g, vs in product["options"].items() if arg in vs)
        return replace(page, options={**page.options, group: arg}, clicked=arg)
    return replace(page, kind="item", clicked="")  # "< prev" on a tab


def render(page: Page, product: dict | None, shown: list[dict], instruction: str) -> str:
    """The page's text (``shown``: the products of a results page)."""
    if page.kind == "search":
        return SEP.join(["WebShop", "Instruction:", instruction, "Search"])
    if page.kind == "results":
        parts = ["Back to Search", f"Page {page.page} (Total results: {len(page.results)})"]
        parts += (["< Prev"] if page.page > 1 else []) + (["Next >"] if page.page * PRODUCT_WINDOW < len(page.results) else [])
        for p in shown:
            parts += [p["asin"], p["Title"], p["Price"]]
        return SEP.join(parts)
    if page.kind == "item":
        parts = [f"You have clicked {page.clicked}."] if page.clicked else []
        parts += ["Back to Search", "< Prev"]
        for name, values in product["options"].items():
            parts += [name, *values]
        parts += [product["Title"], f"Price: {product['Price']}", f"Rating: {product['Rating']}"]
        if page.options:
            parts.append("Selected: " + ", ".join(f"{k}: {v}" for k, v in page.options.items()))
        return SEP.join([*parts, "Description", "Features", "Reviews", "Buy Now"])
    if page.kind == "description":
        return SEP.join(["Back to Search", "< Prev", product["Description"]])
    if page.kind == "features":
        return SEP.join(["Back to Search", "< Prev", *product["BulletPoints"]])
    if page.kind == "reviews":
        reviews = [f"{r.get('score')} stars: {r.get('body', '')}" for r in product["Reviews"]] or ["No reviews yet."]
        return SEP.join(["Back to Search", "< Prev", *reviews])
    raise ValueError(f"no text for page {page.kind!r}")
