"""How a response carries its action: the tag of each prompt style and the parser that reads it.

Shared by both sides of the turn: the collector (:mod:`paw_lightning.rollout.collector`) parses
each response with :func:`parse_action` and the prompt's :data:`ACTION_TAGS` entry (none: an
*invalid* response), and an environment that reads the response itself (Search QA's
:mod:`paw_lightning.envs.search_qa.protocol`) uses the same function and tags, so the two always
agree. It lives with the environments because they sit below the rollout: an environment
imports nothing of ``paw_lightning.rollout``.
"""
from __future__ import annotations

import re

# prompt style → the tag its action is in; the other styles: "action". A tuple: the action is the
# first span of any of these tags, kept whole
ACTION_TAGS: dict[str, str | tuple[str, ...]] = {"spa": "answer", "rwml": "next_state", "search": ("search", "answer")}


def parse_action(response: str, tag: str | tuple[str, ...] = "action") -> str | None:
    """The text inside the first ``<tag>…</tag>`` pair (``action``; SPA's format: ``answer``),
    stripped; ``None`` if there is no well-formed, non-empty tag (an *invalid* response).
    With a tuple of tags: the first well-formed span of any of them, whole, its content
    stripped (``<search>q</search>``), so the environment knows which tag it was."""
    tags = (tag,) if isinstance(tag, str) else tag
    match = re.search("<(" + "|".join(map(re.escape, tags)) + r")>(.*?)</\1>", response, re.DOTALL)
    if match is None:
        return None
    action = match.group(2).strip()
    if not action:
        return None
    return action if isinstance(tag, str) else f"<{match.group(1)}>{action}</{match.group(1)}>"
