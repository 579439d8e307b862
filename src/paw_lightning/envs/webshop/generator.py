"""A seeded WebShop catalog over the five categories, written in the official file format.

``generate(out_dir, config)`` writes ``items_shuffle.json`` (products), ``items_ins_v2.json``
(their attributes) and ``items_human_ins.json`` (instructions with their attributes, options
and a ``split`` key), so :mod:`~paw_lightning.envs.webshop.data` reads them like the real
files. Splits: one product type per category is held out (``ood``), the other instructions go
to ``eval`` with probability ``eval_fraction`` (by a hash), else ``train``. Every draw comes
from one ``random.Random`` of the config, so the files are identical for equal configs.
Reference: docs/reference/environments.md#webshop
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import string
from dataclasses import asdict, dataclass

GENERATOR_VERSION = 1
COLORS = ("black", "white", "navy blue", "gray", "red", "beige", "green", "pink", "brown", "purple")
SIZES = ("x-small", "small", "medium", "large", "x-large", "xx-large")
SHOE_SIZES = ("6", "6.5", "7", "7.5", "8", "8.5", "9", "9.5", "10", "11", "12")
SHADES = ("ivory", "natural beige", "sand", "caramel", "mocha", "espresso")
SCENTS = ("lavender", "vanilla", "citrus", "unscented", "rose", "coconut")
FLAVORS = ("chocolate", "peanut butter", "strawberry", "sea salt", "honey", "cinnamon")
COUNTS = ("pack of 1", "pack of 2", "pack of 3", "pack of 6", "pack of 12")
FINISHES = ("walnut", "oak", "espresso", "white", "black", "gray")
CAPACITY = ("32gb", "64gb", "128gb", "256gb")

# category -> [(query, product category path, title head, attributes, {option group: values}, (price low, high))]
PRODUCT_TYPES: dict[str, list[tuple]] = {
    "fashion": [
        ("men's running shoes", "Clothing, Shoes & Jewelry › Men › Shoes › Athletic › Running", "Men's Running Shoes",
         ("lace up", "rubber sole", "non slip", "breathable mesh", "arch support", "lightweight", "memory foam", "wide width"),
         {"color": COLORS, "size": SHOE_SIZES}, (30, 120)),
        ("women's jeans", "Clothing, Shoes & Jewelry › Women › Clothing › Jeans", "Women's Skinny Jeans",
         ("high waist", "button closure", "machine wash", "stretch denim", "slim fit", "butt lifting", "regular fit", "cotton spandex"),
         {"color": COLORS, "size": SIZES}, (20, 70)),
        ("men's hoodie", "Clothing, Shoes & Jewelry › Men › Clothing › Fashion Hoodies & Sweatshirts", "Men's Pullover Hoodie",
         ("long sleeve", "drawstring closure", "fleece lined", "machine wash", "kangaroo pocket", "soft cotton", "relaxed fit", "hand wash"),
         {"color": COLORS, "size": SIZES}, (18, 60)),
        ("women's dress", "Clothing, Shoes & Jewelry › Women › Clothing › Dresses", "Women's Summer Dress",
         ("short sleeve", "v neck", "elastic waist", "flowy hem", "polyester spandex", "hand wash", "knee length", "floral print"),
         {"color": COLORS, "size": SIZES}, (20, 80)),
        ("women's sandals", "Clothing, Shoes & Jewelry › Women › Shoes › Sandals", "Women's Platform Sandals",
         ("open toe", "ankle strap", "rubber sole", "non slip", "memory foam", "faux leather", "wedge heel", "adjustable buckle"),
         {"color": COLORS, "size": SHOE_SIZES}, (20, 90)),
        ("men's t-shirt", "Clothing, Shoes & Jewelry › Men › Clothing › Shirts › T-Shirts", "Men's Crew Neck T-Shirt",
         ("short sleeve", "crew neck", "moisture wicking", "machine wash", "regular fit", "soft cotton", "tagless collar", "quick dry"),
         {"color": COLORS, "size": SIZES}, (10, 35)),
        ("women's leggings", "Clothing, Shoes & Jewelry › Women › Clothing › Leggings", "Women's Yoga Leggings",
         ("high waist", "tummy control", "squat proof", "moisture wicking", "four way stretch", "side pockets", "ankle length", "butt lifting"),
         {"color": COLORS, "size": SIZES}, (15, 50)),
        ("men's winter jacket", "Clothing, Shoes & Jewelry › Men › Clothing › Jackets & Coats", "Men's Winter Puffer Jacket",
         ("water resistant", "zipper closure", "detachable hood", "windproof", "warm fleece", "long sleeve", "machine wash", "insulated lining"),
         {"color": COLORS, "size": SIZES}, (40, 160)),
    ],
    "makeup": [
        ("liquid foundation", "Beauty & Personal Care › Makeup › Face › Foundation", "Liquid Foundation",
         ("long lasting", "oil free", "full coverage", "cruelty free", "paraben free", "matte finish", "spf 15", "sensitive skin"),
         {"color": SHADES}, (8, 45)),
        ("matte lipstick", "Beauty & Personal Care › Makeup › Lips › Lipstick", "Matte Lipstick Set",
         ("long lasting", "waterproof", "cruelty free", "highly pigmented", "vegan formula", "non drying", "travel size", "smudge proof"),
         {"color": ("red", "pink", "nude", "berry", "coral", "plum")}, (6, 30)),
        ("mascara", "Beauty & Personal Care › Makeup › Eyes › Mascara", "Volumizing Mascara",
         ("waterproof", "smudge proof", "lengthening", "cruelty free", "easy remove", "clump free", "sensitive eyes", "long lasting"),
         {"color": ("black", "brown", "dark brown")}, (5, 25)),
        ("makeup brush set", "Beauty & Personal Care › Tools & Accessories › Makeup Brushes & Tools › Brush Sets", "Makeup Brush Set",
         ("synthetic bristles", "cruelty free", "easy clean", "travel case", "wooden handle", "dense bristles", "high quality", "soft bristles"),
         {"color": ("black", "pink", "rose gold", "white"), "count": COUNTS[:3]}, (8, 40)),
        ("nail polish", "Beauty & Personal Care › Foot, Hand & Nail Care › Nail Art & Polish › Nail Polish", "Gel Nail Polish",
         ("long lasting", "quick dry", "non toxic", "high gloss", "chip resistant", "vegan formula", "cruelty free", "easy apply"),
         {"color": COLORS, "count": COUNTS[:3]}, (5, 25)),
        ("eyeshadow palette", "Beauty & Personal Care › Makeup › Eyes › Eyeshadow", "Eyeshadow Palette",
         ("highly pigmented", "long lasting", "cruelty free", "blendable", "shimmer finish", "matte finish", "travel size", "waterproof"),
         {"color": ("nude", "smoky", "warm", "cool", "rainbow")}, (8, 40)),
        ("face moisturizer", "Beauty & Personal Care › Skin Care › Face › Creams & Moisturizers", "Daily Face Moisturizer",
         ("hyaluronic acid", "fragrance free", "oil free", "dry skin", "sensitive skin", "anti aging", "spf 30", "non comedogenic"),
         {"scent": SCENTS, "size": ("1.7 fl oz", "3.4 fl oz", "6.8 fl oz")}, (10, 50)),
        ("body lotion", "Beauty & Personal Care › Skin Care › Body › Moisturizers › Lotions", "Moisturizing Body Lotion",
         ("shea butter", "dry skin", "paraben free", "natural ingredients", "long lasting", "non greasy", "fast absorbing", "fragrance free"),
         {"scent": SCENTS, "size": ("8 fl oz", "16 fl oz", "32 fl oz")}, (6, 30)),
    ],
    "electronics": [
        ("wireless earbuds", "Electronics › Headphones, Earbuds & Accessories › Earbuds", "Wireless Bluetooth Earbuds",
         ("noise cancelling", "long battery life", "fast charging", "water resistant", "touch control", "built in microphone", "charging case", "high fidelity"),
         {"color": ("black", "white", "blue", "pink")}, (20, 150)),
        ("phone case", "Cell Phones & Accessories › Cases, Holsters & Sleeves › Basic Cases", "Shockproof Phone Case",
         ("shock absorbing", "slim fit", "wireless charging compatible", "scratch resistant", "raised edges", "clear back", "easy install", "anti slip"),
         {"color": COLORS[:6], "size": ("iphone 13", "iphone 14", "iphone 15", "galaxy s23")}, (8, 30)),
        ("usb c charger", "Electronics › Accessories & Supplies › Chargers & Adapters", "USB C Wall Charger",
         ("fast charging", "foldable plug", "compact design", "overcharge protection", "dual port", "travel friendly", "high speed", "easy use"),
         {"color": ("black", "white"), "count": COUNTS[:3]}, (10, 45)),
        ("bluetooth speaker", "Electronics › Portable Audio & Video › Portable Speakers & Docks", "Portable Bluetooth Speaker",
         ("waterproof", "long battery life", "deep bass", "hands free", "easy carry", "high fidelity", "stereo pairing", "built in microphone"),
         {"color": ("black", "blue", "red", "gray")}, (20, 120)),
        ("hdmi cable", "Electronics › Accessories & Supplies › Audio & Video Accessories › Cables › HDMI Cables", "High Speed HDMI Cable",
         ("gold plated", "high speed", "braided cord", "4k support", "plug and play", "ethernet support", "durable connectors", "easy install"),
         {"size": ("3 feet", "6 feet", "10 feet", "15 feet"), "count": COUNTS[:3]}, (6, 30)),
        ("wireless mouse", "Electronics › Computers & Accessories › Computer Accessories & Peripherals › Mice", "Wireless Optical Mouse",
         ("ergonomic design", "silent click", "long battery life", "plug and play", "adjustable dpi", "usb receiver", "portable size", "high precision"),
         {"color": ("black", "white", "gray", "blue")}, (8, 40)),
        ("memory card", "Electronics › Computers & Accessories › Data Storage › Memory Cards", "Micro SD Memory Card",
         ("high speed", "water resistant", "shock proof", "full hd video", "adapter included", "reliable storage", "temperature proof", "easy transfer"),
         {"size": CAPACITY}, (6, 60)),
        ("security camera", "Electronics › Camera & Photo › Video Surveillance › Surveillance Cameras", "Indoor Security Camera",
         ("night vision", "motion detection", "two way audio", "easy install", "cloud storage", "1080p hd", "wifi connectivity", "pan tilt"),
         {"color": ("white", "black"), "count": COUNTS[:2]}, (20, 110)),
    ],
    "furniture": [
        ("coffee table", "Home & Kitchen › Furniture › Living Room Furniture › Tables › Coffee Tables", "Wooden Coffee Table",
         ("solid wood", "easy assembly", "storage shelf", "mid century", "living room", "sturdy frame", "rustic style", "space saving"),
         {"color": FINISHES}, (50, 250)),
        ("office chair", "Home & Kitchen › Furniture › Home Office Furniture › Home Office Chairs", "Ergonomic Office Chair",
         ("lumbar support", "adjustable height", "mesh back", "easy assembly", "swivel base", "padded armrests", "high back", "smooth wheels"),
         {"color": ("black", "gray", "white", "blue")}, (60, 300)),
        ("bookshelf", "Home & Kitchen › Furniture › Living Room Furniture › Bookcases", "Tall Bookshelf",
         ("easy assembly", "open shelves", "engineered wood", "space saving", "anti tip", "industrial style", "metal frame", "living room"),
         {"color": FINISHES, "size": ("3 tier", "4 tier", "5 tier")}, (40, 200)),
        ("bed frame", "Home & Kitchen › Furniture › Bedroom Furniture › Beds, Frames & Bases › Bed Frames", "Metal Platform Bed Frame",
         ("easy assembly", "noise free", "under bed storage", "heavy duty", "no box spring needed", "wood slats", "sturdy frame", "modern style"),
         {"color": ("black", "white", "gray"), "size": ("twin", "full", "queen", "king")}, (90, 400)),
        ("bar stool", "Home & Kitchen › Furniture › Game & Recreation Room Furniture › Home Bar Furniture › Barstools", "Swivel Bar Stool",
         ("adjustable height", "swivel seat", "footrest", "faux leather", "easy clean", "set of two", "back support", "kitchen counter"),
         {"color": ("black", "white", "gray", "brown"), "count": COUNTS[:2]}, (40, 180)),
        ("tv stand", "Home & Kitchen › Furniture › Living Room Furniture › Television Stands & Entertainment Centers", "Modern TV Stand",
         ("cable management", "storage cabinet", "easy assembly", "engineered wood", "living room", "open shelves", "sturdy frame", "mid century"),
         {"color": FINISHES, "size": ("47 inch", "55 inch", "65 inch")}, (60, 280)),
        ("nightstand", "Home & Kitchen › Furniture › Bedroom Furniture › Nightstands", "Bedside Nightstand",
         ("drawer storage", "easy assembly", "solid wood", "charging station", "open shelf", "bedroom decor", "compact size", "rustic style"),
         {"color": FINISHES}, (30, 150)),
        ("floor lamp", "Home & Kitchen › Lighting & Ceiling Fans › Lamps & Shades › Floor Lamps", "LED Floor Lamp",
         ("dimmable light", "energy saving", "remote control", "living room", "easy assembly", "modern style", "adjustable head", "foot switch"),
         {"color": ("black", "white", "gold", "silver")}, (30, 140)),
    ],
    "food": [
        ("granola bars", "Grocery & Gourmet Food › Snacks & Sweets › Bars › Granola Bars", "Granola Bars",
         ("gluten free", "non gmo", "high protein", "low sugar", "whole grain", "individually wrapped", "kosher certified", "plant based"),
         {"flavor": FLAVORS, "count": COUNTS}, (5, 30)),
        ("ground coffee", "Grocery & Gourmet Food › Beverages › Coffee, Tea & Cocoa › Coffee › Ground Coffee", "Ground Coffee",
         ("medium roast", "dark roast", "fair trade", "usda organic", "single origin", "low acid", "rich flavor", "kosher certified"),
         {"flavor": ("original", "hazelnut", "french vanilla", "mocha", "caramel"), "size": ("12 ounce", "24 ounce", "32 ounce")}, (7, 35)),
        ("green tea", "Grocery & Gourmet Food › Beverages › Coffee, Tea & Cocoa › Tea › Green", "Green Tea Bags",
         ("usda organic", "caffeine free", "non gmo", "natural ingredients", "individually wrapped", "rich in antioxidants", "sugar free", "kosher certified"),
         {"flavor": ("jasmine", "mint", "lemon", "ginger", "honey"), "count": COUNTS}, (4, 25)),
        ("beef jerky", "Grocery & Gourmet Food › Meat & Seafood › Jerky & Dried Meats › Jerky", "Beef Jerky",
         ("high protein", "low fat", "gluten free", "keto friendly", "no added sugar", "grass fed", "resealable bag", "ready to eat"),
         {"flavor": ("original", "teriyaki", "peppered", "sweet and spicy", "hickory"), "count": COUNTS[:4]}, (8, 40)),
        ("dark chocolate", "Grocery & Gourmet Food › Snacks & Sweets › Chocolate › Chocolate Bars", "Dark Chocolate Bars",
         ("fair trade", "non gmo", "dairy free", "vegan friendly", "low sugar", "gluten free", "individually wrapped", "gift box"),
         {"flavor": ("sea salt", "almond", "mint", "orange", "raspberry"), "count": COUNTS[:4]}, (5, 35)),
        ("olive oil", "Grocery & Gourmet Food › Pantry Staples › Cooking Oils › Olive Oil", "Extra Virgin Olive Oil",
         ("cold pressed", "usda organic", "non gmo", "first cold press", "glass bottle", "rich flavor", "kosher certified", "gluten free"),
         {"size": ("16.9 fl oz", "25.3 fl oz", "33.8 fl oz", "101 fl oz")}, (8, 45)),
        ("protein powder", "Health & Household › Diet & Sports Nutrition › Sports Nutrition › Protein › Whey", "Whey Protein Powder",
         ("high protein", "low carb", "gluten free", "easy mix", "no artificial flavors", "keto friendly", "muscle recovery", "sugar free"),
         {"flavor": ("chocolate", "vanilla", "strawberry", "cookies and cream"), "size": ("2 pound", "5 pound")}, (20, 80)),
        ("trail mix", "Grocery & Gourmet Food › Snacks & Sweets › Snack Foods › Trail Mix", "Trail Mix Snack Packs",
         ("individually wrapped", "gluten free", "non gmo", "high protein", "resealable bag", "no added sugar", "plant based", "heart healthy"),
         {"flavor": ("classic", "tropical", "dark chocolate", "honey nut"), "count": COUNTS}, (6, 30)),
    ],
}
CATEGORIES = tuple(PRODUCT_TYPES)
SPLIT_NAMES = ("train", "eval", "ood")
_ADJECTIVES = ("Premium", "Classic", "Essential", "Everyday", "Deluxe", "Original", "Signature", "Pro")
_SYLLABLES = ("zen", "nor", "val", "lu", "mi", "ka", "ro", "tex", "sol", "vio", "ber", "qua", "dra", "fen", "pax", "tor")


@dataclass(frozen=True)
class CatalogConfig:
    """What a generated catalog depends on (its hash names the cache directory).

    Args:
        num_products: products in the catalog.
        instructions_per_product: instructions written from each product.
        seed: the generator's master seed.
        eval_fraction: share of the in-distribution instructions held out for ``eval``.
        ood_types: product queries held out for ``ood`` (None: one per category, drawn by seed).
    """

    num_products: int = 1000
    instructions_per_product: int = 2
    seed: int = 0
    eval_fraction: float = 0.1
    ood_types: tuple[str, ...] | None = None

    def __post_init__(self):
        if self.num_products < 1 or self.instructions_per_product < 1:
            raise ValueError(f"num_products and instructions_per_product must be >= 1, got {self.num_products}, {self.instructions_per_product}")
        if not 0.0 <= self.eval_fraction < 1.0:
            raise ValueError(f"eval_fraction must be in [0, 1), got {self.eval_fraction}")
        queries = {t[0] for types in PRODUCT_TYPES.values() for t in types}
        unknown = set(self.ood_types or ()) - queries
        if unknown:
            raise ValueError(f"unknown WebShop product types {sorted(unknown)} in ood_types: choose among {sorted(queries)}")

    def key(self) -> str:
        blob = json.dumps([GENERATOR_VERSION, asdict(self)], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:10]

    def held_out(self) -> tuple[str, ...]:
        """The held-out (OOD) product queries."""
        if self.ood_types is not None:
            return tuple(sorted(self.ood_types))
        rng = random.Random(f"webshop-ood:{self.seed}")
        return tuple(sorted(rng.choice(types)[0] for types in PRODUCT_TYPES.values()))


def _brand(rng: random.Random) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()


def _asin(rng: random.Random, taken: set[str]) -> str:
    while True:
        asin = "B0" + "".join(rng.choice(string.ascii_uppercase + string.digits) for _ in range(8))
        if asin not in taken:
            taken.add(asin)
            return asin


def make_product(rng: random.Random, category: str, spec: tuple, asin: str) -> tuple[dict, list[str]]:
    """One product in ``items_shuffle`` format, and its attributes."""
    query, path, head, pool, option_groups, (low, high) = spec
    attributes = rng.sample(pool, rng.randint(3, 5))
    brand = _brand(rng)
    shown = [a.title() for a in attributes[:2]]
    title = f"{brand} {rng.choice(_ADJECTIVES)} {head} - {', '.join(shown)}"
    options = {}
    for group, values in option_groups.items():
        chosen = sorted(rng.sample(values, rng.randint(2, min(5, len(values)))), key=values.index)
        options[group] = [{"value": v, "image": None} for v in chosen]
    bullets = [f"{a.upper()}: {brand} {head.lower()} with {a} for everyday use." for a in attributes]
    description = f"The {brand} {head.lower()} is {', '.join(attributes[:-1])} and {attributes[-1]}. Designed for {category} lovers."
    product = {
        "asin": asin, "category": category, "query": query, "name": title, "product_category": path,
        "full_description": description, "small_description": bullets, "pricing": f"${rng.uniform(low, high):.2f}",
        "customization_options": options, "images": [""],
    }
    return product, attributes


def make_instruction(rng: random.Random, product: dict, attributes: list[str], head: str, split: str) -> dict:
    """One instruction in ``items_human_ins`` format: some of the product's attributes, one value
    of each option group."""
    head = head.lower()
    chosen = rng.sample(attributes, rng.randint(1, min(3, len(attributes))))
    options = {group: rng.choice(values)["value"] for group, values in product["customization_options"].items()}
    phrases = [f"in {v} color" if g == "color" else f"in size {v}" if g == "size" else f"with {v} {g}" for g, v in options.items()]
    attrs = " and ".join(chosen)
    text = rng.choice((
        f"i am looking for {head} that are {attrs}",
        f"i need {attrs} {head}",
        f"find me {head}, {attrs}",
        f"i want to buy {attrs} {head}",
    ))
    if phrases:
        text += " " + " and ".join(phrases)
    return {"instruction": text, "instruction_attributes": chosen, "instruction_options": list(options.values()), "split": split}


def generate_files(config: CatalogConfig) -> tuple[list[dict], dict, dict]:
    """(items_shuffle, items_ins_v2, items_human_ins) contents of the catalog of ``config``."""
    rng = random.Random(f"paw-webshop:v{GENERATOR_VERSION}:{config.key()}")
    held_out = set(config.held_out())
    types = [(c, spec) for c in CATEGORIES for spec in PRODUCT_TYPES[c]]
    products, attributes, instructions, taken = [], {}, {}, set()
    for i in range(config.num_products):
        category, spec = types[i % len(types)] if i < len(types) else rng.choice(types)
        product, attrs = make_product(rng, category, spec, _asin(rng, taken))
        asin = product["asin"]
        products.append(product)
        attributes[asin] = {"attributes": attrs}
        rows = []
        for k in range(config.instructions_per_product):
            bucket = int(hashlib.sha256(f"{config.seed}:{asin}:{k}".encode()).hexdigest(), 16) % 10_000
            split = "ood" if spec[0] in held_out else "eval" if bucket < config.eval_fraction * 10_000 else "train"
            rows.append(make_instruction(rng, product, attrs, spec[2], split))
        instructions[asin] = rows
    order = list(range(len(products)))
    rng.shuffle(order)  # items_shuffle: products in random order, as the official file
    return [products[i] for i in order], attributes, instructions


def generate(out_dir: str, config: CatalogConfig) -> str:
    """Write the catalog of ``config`` into ``out_dir`` (atomically, file by file); ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    contents = dict(zip(("items_shuffle.json", "items_ins_v2.json", "items_human_ins.json"), generate_files(config)))
    contents["generator.json"] = {"generator_version": GENERATOR_VERSION, **asdict(config), "held_out": config.held_out()}
    for name, content in contents.items():
        tmp = os.path.join(out_dir, f"{name}.tmp{os.getpid()}")
        with open(tmp, "w") as f:
            json.dump(content, f)
        os.replace(tmp, os.path.join(out_dir, name))
    return out_dir
