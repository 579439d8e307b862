"""Search-R1's turn protocol: one ``<search>query</search>`` or ``<answer>…</answer>`` per response.

``parse`` reads the response with the framework's parser (:func:`paw_lightning.envs.actions.parse_action`
with the ``search`` prompt style's tags), so the environment and the collector's invalid count always agree: the
first well-formed span of either tag decides, and an empty one, like none, is an invalid
response (Search-R1 would end the episode at an empty ``<answer></answer>`` with EM 0).
``information`` renders retrieved passages as Search-R1 does (``Doc i(Title: t) text``).
"""
from __future__ import annotations

import re

from paw_lightning.envs.actions import ACTION_TAGS, parse_action
from paw_lightning.retrieval.base import Passage

TAGS = ACTION_TAGS["search"]  # ("search", "answer")
INVALID = ("My previous action is invalid. If I want to search, I should put the query between <search> and "
           "</search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. "
           "Let me try again.")
_SPAN = re.compile(r"<(\w+)>(.*)</\1>", re.DOTALL)


def parse(response: str) -> tuple[str, str] | None:
    """``("search", query)`` or ``("answer", text)`` from a response (or its parsed span), else None."""
    span = parse_action(response, TAGS)
    if span is None:
        return None
    match = _SPAN.fullmatch(span)
    return match.group(1), match.group(2).strip()


def information(passages: list[Passage]) -> str:
    """``<information>Doc 1(Title: …) …\\nDoc 2(…) …</information>`` (Search-R1's layout)."""
    docs = "\n".join(f"Doc {i + 1}(Title: {p.title}) {p.text}" for i, p in enumerate(passages))
    return f"<information>{docs}</information>"
