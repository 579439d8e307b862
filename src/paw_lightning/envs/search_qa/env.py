"""``SearchQAEnv``: Search-R1's search-then-answer protocol behind the ``TextEnv`` protocol.

``reset(seed)`` asks question ``seed % n`` of the split; the observation is the question. Each
``step`` takes the whole response (prompt style ``search``): ``<search>q</search>`` returns the
top-k passages as ``<information>…</information>``, ``<answer>a</answer>`` ends the episode with
reward EM(a, gold) ∈ {0, 1}; neither is invalid (``action_recognised`` False; the collector adds
the −0.01). At most ``max_turns`` turns. A retrieval failure ends the episode with
``info["error"]``. ``task_type``: the question's type (generated) or its dataset (real data).
Reference: docs/reference/environments.md#search-qa
"""
from __future__ import annotations

import os
from typing import Literal, get_args

from paw_lightning.envs.base import EnvError
from paw_lightning.envs.search_qa import data, expert, generator, index, protocol
from paw_lightning.envs.search_qa.answers import exact_match
from paw_lightning.retrieval.base import Cached, RetrievalError
from paw_lightning.retrieval.http import RemoteRetriever
from paw_lightning.ranges import NonNegativeInt, PositiveFloat, PositiveInt, UnitIntervalClosedOpen

Retriever = Literal["bm25", "dense", "http"]
RETRIEVERS = get_args(Retriever)
Split = Literal[data.SPLITS]


class SearchQAEnv:
    """Search-augmented QA (see the module docstring).

    Args:
        split: ``train``, ``eval`` or ``ood`` (held-out templates) of the generated questions.
        questions_path: Search-R1 ``.parquet`` / ``.jsonl`` question file(s); None: generated.
        corpus_path: a JSONL corpus (``id``, ``contents``); None: the generated encyclopedia.
        retriever: ``bm25``, ``dense`` (``embedder``: ``embedded`` MiniLM or an HF encoder) or
            ``http`` (Search-R1's server at ``retriever_url``, ``timeout`` seconds).
        topk, max_turns: passages per search, turns per episode (Search-R1: 3 and 4).
        people, places, organisations, works, generator_seed, eval_fraction: the generated corpus.
        cache_dir: corpus caches and indexes (None: ``$PAW_LIGHTNING_CACHE/search_qa``).
    """

    max_return = 1.0  # R_max (METHODS.md §1: QA)

    def __init__(
        self,
        split: Split = "train",
        questions_path: str | list[str] | None = None,
        corpus_path: str | None = None,
        retriever: Retriever = "bm25",
        retriever_url: str | None = None,
        embedder: str = "embedded",
        use_faiss: bool = False,
        topk: PositiveInt = 3,
        max_turns: PositiveInt = 4,
        timeout: PositiveFloat = 10.0,
        people: PositiveInt = 160,
        places: PositiveInt = 40,
        organisations: PositiveInt = 60,
        works: PositiveInt = 80,
        generator_seed: NonNegativeInt = 0,
        eval_fraction: UnitIntervalClosedOpen = 0.1,
        cache_dir: str | None = None,
    ) -> None:
        if split not in data.SPLITS:
            raise ValueError(f"unknown Search QA split {split!r}: choose one of {', '.join(data.SPLITS)}")
        if retriever not in RETRIEVERS:
            raise ValueError(f"retriever must be one of {', '.join(RETRIEVERS)}, got {retriever!r}")
        if retriever == "http" and not retriever_url:
            raise ValueError("retriever 'http' needs retriever_url (e.g. http://127.0.0.1:8000/retrieve)")
        if questions_path is not None and corpus_path is None and retriever != "http":
            raise ValueError("questions from files need corpus_path (or retriever 'http'): the generated corpus cannot answer them")
        self.split, self.retriever_kind, self.retriever_url, self.embedder = split, retriever, retriever_url, embedder
        self.questions_path = [questions_path] if isinstance(questions_path, str) else questions_path
        self.corpus_path, self.use_faiss, self.timeout = corpus_path, use_faiss, timeout
        self.topk, self.max_turns = topk, max_turns
        self.config = generator.CorpusConfig(people, places, organisations, works, generator_seed, eval_fraction)
        self.cache_dir = cache_dir or index.default_cache_dir()
        self._questions: list[dict] | None = None
        self._question: dict = {}
        self._turn, self._done, self._won = 0, True, False

    # ----------------------------------------------------------------- data
    def prepare(self) -> None:
        """Generate (or read) the questions and corpus and open the retriever (indexes cached)."""
        if self._questions is not None:
            return
        corpus_path = self.corpus_path
        if self.questions_path is None:
            folder = os.path.join(self.cache_dir, f"generated-{self.config.key()}")
            with index.locked(folder):
                if not os.path.exists(os.path.join(folder, "questions.jsonl")):
                    passages, questions = generator.generate(self.config)
                    os.makedirs(folder, exist_ok=True)
                    data.write_jsonl(os.path.join(folder, "corpus.jsonl"), passages)
                    data.write_jsonl(os.path.join(folder, "questions.jsonl"), questions)
            questions = [q for q in data.read_jsonl(os.path.join(folder, "questions.jsonl")) if q["split"] == self.split]
            corpus_path = corpus_path or os.path.join(folder, "corpus.jsonl")
        else:
            questions = [q for path in self.questions_path for q in data.read_questions(path)]
        if not questions:
            raise ValueError(f"the Search QA {self.split!r} split has no questions")
        if self.retriever_kind == "http":
            self.retriever = Cached(RemoteRetriever(self.retriever_url, self.timeout))
        else:
            local = index.LocalRetriever(index.ensure_corpus(corpus_path, self.cache_dir), self.retriever_kind, self.embedder, self.use_faiss)
            local.prepare()
            self.retriever = Cached(local)
        self._questions = questions

    @property
    def n_questions(self) -> int:
        self.prepare()
        return len(self._questions)

    # ------------------------------------------------------------- protocol
    def reset(self, seed: int, episode: int = 0) -> tuple[str, dict]:
        self.prepare()
        self._question = self._questions[seed % len(self._questions)]
        self._turn, self._done, self._won = 0, False, False
        return self._question["question"], self._info()

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        if self._done:
            raise EnvError("Search QA episode is not running: call reset() first")
        self._turn += 1
        parsed = protocol.parse(action)
        if parsed is None:
            self._done = self._turn >= self.max_turns
            return protocol.INVALID, 0.0, self._done, {**self._info(recognised=False), "world_model_target": False}
        kind, text = parsed
        if kind == "answer":
            self._done, self._won = True, exact_match(text, self._question["golden_answers"]) == 1.0
            return f"Your answer is {'correct' if self._won else 'incorrect'}.", float(self._won), True, {**self._info(recognised=True), "world_model_target": False}
        try:
            passages = self.retriever.retrieve(text, self.topk)
        except RetrievalError as err:
            self._done = True
            return protocol.information([]), 0.0, True, {**self._info(recognised=True), "error": str(err), "world_model_target": False}
        self._done = self._turn >= self.max_turns
        return protocol.information(passages), 0.0, self._done, self._info(recognised=True)

    def walkthrough(self) -> list[str]:
        """The expert's action spans for the current question (generated questions only)."""
        if not self._question:
            raise EnvError("Search QA has no question: call reset() first")
        if "plan" not in self._question:
            raise EnvError("the Search QA expert needs generated questions (real datasets carry no plan)")
        return expert.walkthrough(self._question, self.retriever.retrieve, self.topk)

    def _info(self, recognised: bool | None = None) -> dict:
        info = {"task": self._question["question"], "admissible_actions": [], "won": self._won,
                "task_type": self._question.get("type"), "turn": self._turn}
        if recognised is not None:
            info["action_recognised"] = recognised
        return info
