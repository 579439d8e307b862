"""A client of Search-R1's retrieval server, so a cluster's E5 + Wikipedia server plugs in unchanged.

Request: ``POST {url}`` (``…/retrieve``) with ``{"queries": [q], "topk": k, "return_scores": true}``;
response: ``{"result": [[{"document": {"id", "contents"}, "score"}, …]]}`` (one list per query; a
document without ``contents`` may carry ``title`` and ``text``). Any failure (connection, HTTP
status, timeout, malformed JSON) raises ``RetrievalError``: the environment ends the episode.
Reference: docs/reference/environments.md#search-qa
"""
from __future__ import annotations

import json
import urllib.error
import urllib.request

from paw_lightning.retrieval.base import Passage, RetrievalError


def parse_result(body: dict) -> list[list[Passage]]:
    """The passages of each query in a ``/retrieve`` response body."""
    lists = []
    for hits in body["result"]:
        passages = []
        for hit in hits:
            doc, score = (hit["document"], float(hit.get("score", 0.0))) if "document" in hit else (hit, 0.0)
            contents = doc.get("contents") or f"{doc.get('title', '')}\n{doc.get('text', '')}"
            passages.append(Passage(str(doc.get("id", "")), contents, score))
        lists.append(passages)
    return lists


class RemoteRetriever:
    """``retrieve(query, k)`` through the server at ``url`` (``http://host:port/retrieve``)."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self.url, self.timeout = url, timeout

    def retrieve(self, query: str, k: int) -> list[Passage]:
        payload = json.dumps({"queries": [query], "topk": k, "return_scores": True}).encode()
        request = urllib.request.Request(self.url, data=payload, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return parse_result(json.loads(response.read()))[0][:k]
        except urllib.error.HTTPError as err:
            raise RetrievalError(f"retrieval server {self.url} answered HTTP {err.code}") from None
        except (urllib.error.URLError, TimeoutError, OSError) as err:
            raise RetrievalError(f"retrieval server {self.url} failed: {getattr(err, 'reason', err)}") from None
        except (ValueError, KeyError, IndexError, TypeError) as err:
            raise RetrievalError(f"retrieval server {self.url} sent a malformed response: {err!r}") from None
