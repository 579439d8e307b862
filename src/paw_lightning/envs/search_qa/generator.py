"""A seeded fictional encyclopedia and questions over it (the offline default; docs/reference/environments.md#search-qa).

Entities: people, places (cities), organisations, works, with invented names so a model must
search rather than remember. Each entity has 1–3 paragraphs (one passage each, Search-R1's
``title\\ntext``); facts link entities (born in a city, works for an organisation, founded by a
person, written by a person). Questions: single-hop, two-hop bridge and comparison, each with
its gold answer, supporting passage ids and the expert's plan (queries and relations). The
templates of ``OOD_TEMPLATES`` are held out of train/eval into the ``ood`` split.
"""
from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass

SYLLABLES = ("ka", "lo", "ven", "tar", "mi", "sol", "dra", "quen", "bel", "or", "zan", "thi", "mor", "ela", "rin",
             "vos", "pel", "ur", "gal", "ith", "nor", "esk", "ral", "tem", "fa", "bri", "dun", "ael", "ho", "sem")
OCCUPATIONS = ("painter", "engineer", "poet", "physician", "architect", "botanist", "composer", "cartographer")
ORG_KINDS = ("Institute", "Foundation", "Company", "Guild", "Society", "Observatory")
GENRES = ("novel", "play", "poem cycle", "treatise", "opera")
ADJECTIVES = ("Silent", "Amber", "Hollow", "Northern", "Glass", "Crimson", "Last", "Wandering")
NOUNS = ("Harbour", "Lantern", "Orchard", "Tide", "Archive", "Meadow", "Bridge", "Garden")
COUNTRIES = ("Veldoria", "Kessar", "Ombria", "Taluvia", "Norrath", "Castemer")
FILLER = ("{name} is often mentioned in regional histories.", "Little else is recorded about the early years of {name}.",
          "Accounts of {name} differ in minor details.", "Several archives hold letters concerning {name}.")

# template → (kind, relation hints); relation hints are the words the fact's sentence contains
TEMPLATES = {
    "birth_city": "In which city was {e} born?",
    "occupation": "What is the occupation of {e}?",
    "employer": "Which organisation does {e} work for?",
    "founded_year": "In what year was {e} founded?",
    "headquarters": "In which city is {e} headquartered?",
    "author": "Who wrote {e}?",
    "country": "In which country is {e}?",
    "published_year": "In what year was {e} published?",
    "bridge_author_birth_city": "In which city was the author of {e} born?",
    "bridge_employer_headquarters": "In which city is the organisation that {e} works for headquartered?",
    "bridge_founder_occupation": "What is the occupation of the founder of {e}?",
    "compare_founded": "Which was founded earlier, {e} or {f}?",
    "compare_born": "Who was born earlier, {e} or {f}?",
}
OOD_TEMPLATES = ("country", "published_year", "bridge_founder_occupation", "compare_born")
# relation → (query hint the expert adds to the entity, regex of the fact; {e} = the entity's name)
RELATIONS = {
    "birth_city": ("born", r"{e} is an? \w+ born in ([A-Z][\w ]+?) in \d{{4}}\."),
    "birth_year": ("born", r"{e} is an? \w+ born in [A-Z][\w ]+? in (\d{{4}})\."),
    "occupation": ("born", r"{e} is an? (\w+) born in"),
    "employer": ("works for", r"{e} works for (the [A-Z][\w ]+?)\."),
    "founded_year": ("founded", r"{e} was founded in (\d{{4}}) by"),
    "founder": ("founded by", r"{e} was founded in \d{{4}} by ([A-Z][\w ]+?)\."),
    "headquarters": ("headquarters", r"The headquarters of {e} are in ([A-Z][\w ]+?)\."),
    "author": ("written by", r"{e} is an? [\w ]+? written by ([A-Z][\w ]+?) and published"),
    "country": ("city in", r"{e} is a city in ([A-Z]\w+)"),
    "published_year": ("published", r"{e} is an? [\w ]+? written by [A-Z][\w ]+? and published in (\d{{4}})\."),
}


@dataclass(frozen=True)
class CorpusConfig:
    """Sizes and seed of a generated encyclopedia (``key`` names its cache directory)."""

    people: int = 160
    places: int = 40
    organisations: int = 60
    works: int = 80
    seed: int = 0
    eval_fraction: float = 0.1

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]

    @classmethod
    def with_passages(cls, n: int, seed: int = 0) -> CorpusConfig:
        """A config of about ``n`` passages (about 2 per entity), the default proportions."""
        scale = n / 591
        return cls(round(160 * scale), round(40 * scale), round(60 * scale), round(80 * scale), seed)


class _Names:
    def __init__(self, rng: random.Random) -> None:
        self.rng, self.used = rng, set()

    def word(self) -> str:
        return "".join(self.rng.choice(SYLLABLES) for _ in range(self.rng.randint(2, 3))).capitalize()

    def unique(self, make) -> str:
        while True:
            name = make()
            if name not in self.used:
                self.used.add(name)
                return name


def generate(config: CorpusConfig) -> tuple[list[dict], list[dict]]:
    """(passages ``{id, contents}``, questions) of ``config``; questions carry ``split``."""
    rng = random.Random(config.seed)
    names = _Names(rng)
    places = [{"name": names.unique(names.word), "country": rng.choice(COUNTRIES), "year": rng.randint(900, 1700),
               "population": rng.randint(2, 900) * 1000} for _ in range(config.places)]
    people = [{"name": names.unique(lambda: f"{names.word()} {names.word()}"), "occupation": rng.choice(OCCUPATIONS),
               "city": rng.choice(places)["name"], "year": rng.randint(1800, 1990)} for _ in range(config.people)]
    orgs = [{"name": names.unique(lambda: f"the {names.word()} {rng.choice(ORG_KINDS)}"), "year": rng.randint(1750, 2000),
             "founder": rng.choice(people)["name"], "city": rng.choice(places)["name"]} for _ in range(config.organisations)]
    for person in people:  # about two in three people have an employer (their second paragraph)
        person["employer"] = rng.choice(orgs)["name"] if orgs and rng.random() < 0.67 else None
    works = [{"name": names.unique(lambda: f"The {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)} of {names.word()}"),
              "genre": rng.choice(GENRES), "author": rng.choice(people)["name"], "year": rng.randint(1820, 2010)}
             for _ in range(config.works)]
    passages, support = [], {}
    first_work = {}
    for w in works:
        first_work.setdefault(w["author"], w["name"])

    def add(entity: str, paragraphs: list[str], facts: list[list[str]]) -> None:
        for text, rels in zip(paragraphs, facts):
            pid = f"d{len(passages)}"
            passages.append({"id": pid, "contents": f"{_title(entity)}\n{text}"})
            for rel in rels:
                support[(entity, rel)] = pid

    for p in places:
        extra = [f"{p['name']} lies on a river and has about {p['population']} inhabitants."] if rng.random() < 0.5 else []
        add(p["name"], [f"{p['name']} is a city in {p['country']}. It was first settled in {p['year']}.", *extra], [["country"], []])
    for p in people:
        paragraphs = [f"{p['name']} is a{'n' if p['occupation'][0] in 'aeiou' else ''} {p['occupation']} born in {p['city']} in {p['year']}. "
                      + rng.choice(FILLER).format(name=p["name"])]
        facts = [["birth_city", "birth_year", "occupation"]]
        if p["employer"]:
            paragraphs.append(f"{p['name']} works for {p['employer']}. " + rng.choice(FILLER).format(name=p["name"]))
            facts.append(["employer"])
        if p["name"] in first_work:
            paragraphs.append(f"Among the works of {p['name']} is {first_work[p['name']]}.")
            facts.append([])
        add(p["name"], paragraphs, facts)
    for o in orgs:
        name = o["name"][0].upper() + o["name"][1:]
        add(o["name"], [f"{name} was founded in {o['year']} by {o['founder']}.",
                        f"The headquarters of {o['name']} are in {o['city']}."], [["founded_year", "founder"], ["headquarters"]])
    for w in works:
        article = "an" if w["genre"][0] in "aeiou" else "a"
        add(w["name"], [f"{w['name']} is {article} {w['genre']} written by {w['author']} and published in {w['year']}."],
            [["author", "published_year"]])
    questions = _questions(rng, people, orgs, works, places, support)
    for q in questions:
        q["split"] = "ood" if q["template"] in OOD_TEMPLATES else ("eval" if _unit(q["question"]) < config.eval_fraction else "train")
    return passages, questions


def _title(entity: str) -> str:
    return entity[0].upper() + entity[1:]


def _unit(text: str) -> float:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little") / 2**32


def _question(template: str, answer: str, hops: list[tuple[str | None, str]], support: list[str], kind: str, e: str, f: str = "") -> dict:
    """``hops``: (entity or None for "the previous hop's answer", relation) per search."""
    return {"question": TEMPLATES[template].format(e=_title(e) if template.startswith("compare") else e, f=f),
            "golden_answers": [answer], "template": template, "type": kind,
            "plan": [list(h) for h in hops], "supporting": support}


def _questions(rng, people, orgs, works, places, support) -> list[dict]:
    by_name = {p["name"]: p for p in people}
    org_by_name = {o["name"]: o for o in orgs}
    qs = []
    for p in people:
        n = p["name"]
        qs.append(_question("birth_city", p["city"], [(n, "birth_city")], [support[(n, "birth_city")]], "single_hop", n))
        qs.append(_question("occupation", p["occupation"], [(n, "occupation")], [support[(n, "occupation")]], "single_hop", n))
        if p["employer"]:
            qs.append(_question("employer", p["employer"], [(n, "employer")], [support[(n, "employer")]], "single_hop", n))
            o = org_by_name[p["employer"]]
            qs.append(_question("bridge_employer_headquarters", o["city"], [(n, "employer"), (None, "headquarters")],
                                [support[(n, "employer")], support[(o["name"], "headquarters")]], "bridge", n))
    for o in orgs:
        n = o["name"]
        qs.append(_question("founded_year", str(o["year"]), [(n, "founded_year")], [support[(n, "founded_year")]], "single_hop", n))
        qs.append(_question("headquarters", o["city"], [(n, "headquarters")], [support[(n, "headquarters")]], "single_hop", n))
        f = by_name[o["founder"]]
        qs.append(_question("bridge_founder_occupation", f["occupation"], [(n, "founder"), (None, "occupation")],
                            [support[(n, "founder")], support[(f["name"], "occupation")]], "bridge", n))
    for w in works:
        n = w["name"]
        qs.append(_question("author", w["author"], [(n, "author")], [support[(n, "author")]], "single_hop", n))
        qs.append(_question("published_year", str(w["year"]), [(n, "published_year")], [support[(n, "published_year")]], "single_hop", n))
        a = by_name[w["author"]]
        qs.append(_question("bridge_author_birth_city", a["city"], [(n, "author"), (None, "birth_city")],
                            [support[(n, "author")], support[(a["name"], "birth_city")]], "bridge", n))
    for c in places:
        qs.append(_question("country", c["country"], [(c["name"], "country")], [support[(c["name"], "country")]], "single_hop", c["name"]))
    for pool, template, rel, key in ((orgs, "compare_founded", "founded_year", "year"), (people, "compare_born", "birth_year", "year")):
        for a in pool:
            b = rng.choice(pool)
            if b is a or a[key] == b[key]:
                continue
            first = a if a[key] < b[key] else b
            qs.append(_question(template, _title(first["name"]), [(a["name"], rel), (b["name"], rel)],
                                [support[(a["name"], rel)], support[(b["name"], rel)]], "comparison", a["name"], _title(b["name"])))
    return qs
