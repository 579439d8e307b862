"""The Search QA expert: search the question's key entity (then the bridge entity), read the answer
off the retrieved passages.

A generated question carries its plan: (entity, relation) per hop, the entity of a bridge hop
being the previous hop's answer. Each hop searches ``"{entity} {hint}"`` (the relation's words,
``generator.RELATIONS``) and extracts the fact with the relation's sentence pattern from any
retrieved passage; a comparison answers the entity with the earlier year. Measured EM:
docs/reference/environments.md#search-qa.
"""
from __future__ import annotations

import re

from paw_lightning.envs.search_qa.generator import RELATIONS

UNKNOWN = "unknown"


def extract(passages, entity: str, relation: str) -> str | None:
    """The value of ``relation`` for ``entity`` stated in the first passage that states it."""
    pattern = re.compile(RELATIONS[relation][1].format(e=f"(?i:{re.escape(entity)})"))
    for p in passages:
        match = pattern.search(p.text)
        if match:
            return match.group(1)
    return None


def walkthrough(question: dict, retrieve, k: int) -> list[str]:
    """The expert's responses' action spans: one ``<search>`` per hop, then the ``<answer>``."""
    actions, values, previous = [], [], None
    for entity, relation in question["plan"]:
        entity = entity if entity is not None else previous
        query = f"{entity} {RELATIONS[relation][0]}"
        actions.append(f"<search>{query}</search>")
        previous = extract(retrieve(query, k), entity, relation)
        values.append(previous)
        if previous is None:
            break
    if question["type"] == "comparison" and None not in values and len(values) == 2:
        (a, _), (b, _) = question["plan"]
        answer = a if int(values[0]) < int(values[1]) else b
        answer = answer[0].upper() + answer[1:]
    else:
        answer = values[-1] if values and values[-1] is not None else UNKNOWN
    return [*actions, f"<answer>{answer}</answer>"]
