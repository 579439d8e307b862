"""Read WebShop's data files (official or generated) into products and goals, as WebShop does.

``find_files(dir)`` picks ``items_shuffle*.json``, the ``items_ins_v2*.json`` of the same
suffix, ``items_human_ins.json`` and an optional ``reviews.json``. ``load_products`` cleans the
products as WebShop's ``engine.load_products`` (title, bullets, price, lower-cased options,
attributes); ``human_goals`` builds one goal per human instruction as ``get_human_goals``, with
the price bound drawn from a seeded RNG instead of the global one. ``split_goals``: generated
instructions carry a ``split`` key; the official ones use WebShop's split of the goals shuffled
with seed 233 (test ``[0, 500)``: our ``eval``; train ``[1500, …)``). Bad files: ``ValueError``.
Reference: docs/reference/environments.md#webshop
"""
from __future__ import annotations

import glob
import json
import os
import random
import re
from decimal import Decimal, InvalidOperation

SPLITS = ("train", "eval", "ood")
PRICE_RANGE = [10.0 * i for i in range(1, 100)]
OFFICIAL_SPLIT = {"eval": (0, 500), "train": (1500, None)}  # WebShop's test and train goal indices
NO_PRICE_BOUND = 1000000


def read_json(path: str):
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as err:
        raise ValueError(f"malformed WebShop data file {path}: {err}") from None


def find_files(data_dir: str) -> dict[str, str | None]:
    """``{"products", "attributes", "instructions", "reviews"}`` paths under ``data_dir``."""
    if not os.path.isdir(data_dir):
        raise ValueError(f"WebShop data directory {data_dir!r} does not exist")
    shuffles = sorted(glob.glob(os.path.join(data_dir, "items_shuffle*.json")))
    pairs = []
    for path in shuffles:
        suffix = os.path.basename(path)[len("items_shuffle"):]
        ins = os.path.join(data_dir, f"items_ins_v2{suffix}")
        if os.path.exists(ins):
            pairs.append((suffix != "_1000.json", path, ins))  # the 1000-product files first, as WebShop's default
    human = os.path.join(data_dir, "items_human_ins.json")
    if not pairs or not os.path.exists(human):
        raise ValueError(
            f"no WebShop data in {data_dir}: it needs items_shuffle<S>.json, items_ins_v2<S>.json (same suffix <S>)"
            " and items_human_ins.json (see docs/reference/environments.md#webshop)"
        )
    _, products, attributes = min(pairs)
    reviews = os.path.join(data_dir, "reviews.json")
    return {"products": products, "attributes": attributes, "instructions": human, "reviews": reviews if os.path.exists(reviews) else None}


def parse_pricing(pricing: str | None) -> list[float]:
    """WebShop's price list of a ``pricing`` string (``"$12.99"``, ``"$10.00 - $20.00"``); [100.0] if none."""
    if not pricing:
        return [100.0]
    try:
        values = [float(Decimal(re.sub(r"[^\d.]", "", p))) for p in pricing.split("$")[1:]]
    except InvalidOperation:
        raise ValueError(f"bad WebShop pricing {pricing!r}") from None
    return values[:2] or [100.0]


def product_price(asin: str, pricing: list[float]) -> float:
    """The product's price: the single price, else uniform in the range (seeded by the asin)."""
    return pricing[0] if len(pricing) == 1 else random.Random(f"price:{asin}").uniform(*pricing[:2])


def clean_product(p: dict, attributes: dict, reviews: dict) -> dict:
    """One product as WebShop's ``load_products`` leaves it (the keys the pages and the reward read)."""
    asin = p["asin"]
    pricing = parse_pricing(p.get("pricing"))
    options = {}
    for name, contents in (p.get("customization_options") or {}).items():
        if contents is not None:
            options[name.lower()] = [c["value"].strip().replace("/", " | ").lower() for c in contents]
    bullets = p["small_description"] if isinstance(p["small_description"], list) else [p["small_description"]]
    review_list, rating = reviews.get(asin, ([], "N.A."))
    return {
        "asin": asin, "category": p["category"], "query": p["query"].lower().strip(), "name": p["name"],
        "product_category": p["product_category"], "Title": p["name"], "Description": p["full_description"] or "",
        "BulletPoints": [b for b in bullets if b is not None], "pricing": pricing, "price": product_price(asin, pricing),
        "Price": f"${pricing[0]}" if len(pricing) == 1 else f"${pricing[0]} to ${pricing[1]}",
        "options": options, "Attributes": attributes.get(asin, {}).get("attributes") or ["DUMMY_ATTR"],
        "Rating": rating, "Reviews": review_list,
    }


def load_reviews(path: str | None) -> dict:
    if path is None:
        return {}
    out = {}
    for r in read_json(path):
        out[r["asin"]] = ([{"score": x.get("score", x.get("stars")), "body": x.get("body", x.get("review", ""))} for x in r["reviews"]], r.get("average_rating", "N.A."))
    return out


def load_products(files: dict) -> list[dict]:
    """The cleaned products in file order, skipping WebShop's bad asins and duplicates."""
    raw, attributes, reviews = read_json(files["products"]), read_json(files["attributes"]), load_reviews(files["reviews"])
    if not isinstance(raw, list) or not isinstance(attributes, dict):
        raise ValueError(f"{files['products']} must hold a list of products and {files['attributes']} a mapping asin -> attributes")
    products, seen = [], set()
    for p in raw:
        asin = str(p.get("asin"))
        if asin == "nan" or len(asin) > 10 or asin in seen:
            continue
        seen.add(asin)
        try:
            products.append(clean_product(p, attributes, reviews))
        except (KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"malformed WebShop product {asin} in {files['products']}: missing or bad field {err}") from None
    if not products:
        raise ValueError(f"no WebShop products in {files['products']}")
    return products


def price_bound(price: float, rng: random.Random) -> tuple[float, str]:
    """WebShop's goal price bound: the larger of two of the four round prices above ``price``."""
    price_range = [p for p in PRICE_RANGE if p > price][:4]
    if len(price_range) < 2:
        return NO_PRICE_BOUND, ""
    _, upper = sorted(rng.sample(price_range, 2))
    return upper, f", and price lower than {upper:.2f} dollars"


def human_goals(products: list[dict], instructions: dict, seed: int = 0) -> list[dict]:
    """One goal per instruction with attributes, in product order (WebShop's ``get_human_goals``)."""
    if not isinstance(instructions, dict):
        raise ValueError("items_human_ins.json must map asin -> list of instructions")
    goals = []
    for row, product in enumerate(products):
        for k, ins in enumerate(instructions.get(product["asin"], [])):
            try:
                attributes, options, text = ins["instruction_attributes"], ins["instruction_options"], ins["instruction"]
            except (KeyError, TypeError):
                raise ValueError(f"malformed WebShop instruction {k} of {product['asin']}: needs instruction, instruction_attributes, instruction_options") from None
            if not attributes:
                continue
            upper, price_text = price_bound(product["price"], random.Random(f"goal:{seed}:{product['asin']}:{k}"))
            goals.append({
                "asin": product["asin"], "row": row, "category": product["category"], "query": product["query"],
                "name": product["name"], "product_category": product["product_category"],
                "instruction_text": text.strip(".") + price_text, "attributes": attributes, "price_upper": upper,
                "goal_options": options, "split": ins.get("split"),
            })
    return goals


def split_goals(goals: list[dict], split: str) -> list[dict]:
    """The goals of ``split`` (see the module docstring)."""
    if split not in SPLITS:
        raise ValueError(f"unknown WebShop split {split!r}: choose one of {', '.join(SPLITS)}")
    if goals and all(g["split"] is not None for g in goals):
        return [g for g in goals if g["split"] == split]
    if split == "ood":
        raise ValueError("the official WebShop data has no OOD split (held-out product types): use the generated catalog")
    shuffled = list(goals)
    random.Random(233).shuffle(shuffled)
    start, stop = OFFICIAL_SPLIT[split]
    return shuffled[start:stop]
