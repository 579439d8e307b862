"""Search QA: answer normalisation, <search>/<answer> parsing, the prompt style, the generated
encyclopedia, BM25 and dense retrieval, the file loaders, the environment, the expert and its
demonstrations, and the collector's invalid count."""
from __future__ import annotations

import pytest

from paw_lightning.demonstrations import REASON, collect_demonstrations
from paw_lightning.envs import EnvPool, make_env_factory
from paw_lightning.envs.actions import parse_action
from paw_lightning.envs.search_qa import data, generator, index, protocol
from paw_lightning.envs.search_qa.answers import exact_match, normalize
from paw_lightning.envs.search_qa.env import SearchQAEnv
from paw_lightning.model import LMConfig, load_tokenizer
from paw_lightning.retrieval.base import Cached, Passage
from paw_lightning.rollout.collector import Collector
from paw_lightning.rollout.engine import Generation
from paw_lightning.rollout.prompts import PromptBuilder
from paw_lightning.rollout.samples import build_buffer
from paw_lightning.testing import build_tiny_tokenizer

from helpers import ROOT

FIXTURES = ROOT / "tests/fixtures/search_qa"


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("search_qa_cache"))


def fixture_env(cache, **kwargs) -> SearchQAEnv:
    return SearchQAEnv(questions_path=str(FIXTURES / "questions.jsonl"), corpus_path=str(FIXTURES / "corpus.jsonl"), cache_dir=cache, **kwargs)


# ------------------------------------------------------------ answers and tags
def test_squad_normalisation_and_exact_match():
    assert normalize("  The Grey-Sea! ") == "greysea"  # punctuation dropped, not spaced
    assert normalize("An apple a day") == "apple day"
    assert normalize("Theatre") == "theatre"  # articles only as whole words
    assert exact_match("grey sea", ["Red Sea", "the Grey Sea"]) == 1.0
    assert exact_match("1872.", "1872") == 1.0
    assert exact_match("Grey", ["Grey Sea"]) == 0.0
    assert exact_match("", ["Grey"]) == 0.0 and exact_match("the", ["an"]) == 1.0  # both normalise to "" (as SQuAD)


@pytest.mark.parametrize("response, span", [
    ("<think>x</think><search> Orlen clock </search>", "<search>Orlen clock</search>"),
    ("<answer>a</answer><search>b</search>", "<answer>a</answer>"),  # the first span decides
    ("<search>a</answer> then <answer>b</answer>", "<answer>b</answer>"),  # a mismatched pair is no span
    ("<search>q</answer>", None),
    ("<search></search>", None),  # empty
    ("<search>q", None),  # unclosed
    ("<Search>q</Search>", None),  # tags are case-sensitive
    ("<action>go</action>", None),
])
def test_search_style_parses_the_first_well_formed_span(response, span):
    assert parse_action(response, ("search", "answer")) == span
    assert protocol.parse(response) == (None if span is None else (span[1:7], span[8:-9]))


def test_single_tag_parsing_is_unchanged():
    assert parse_action("<think>t</think><action> go north </action>") == "go north"
    assert parse_action("<answer>x</answer>", "answer") == "x"
    assert parse_action("<action></action>") is None


def test_search_prompt_style_keeps_the_whole_history_and_stops_at_either_tag():
    prompt = PromptBuilder("search_qa", history_length=4, style="search")
    assert prompt.stop_strings == ["</search>", "</answer>"] and prompt.sends_response
    assert PromptBuilder("x").stop_strings == ["</action>"] and not PromptBuilder("x").sends_response
    history = [("Who?", "<search>a</search>"), ("<information>A</information>", "<search>b</search>")]
    text = prompt("Who?", "<information>B</information>", history, [])
    tail = "Question: Who?\n<search>a</search>\n<information>A</information>\n<search>b</search>\n<information>B</information>"
    assert text.endswith(tail) and text.startswith("Answer the given question.")
    assert prompt("Who?", "Who?", [], []).endswith("<answer> Beijing </answer>.\nQuestion: Who?")
    assert PromptBuilder("search_qa", history_length=1, style="search")("Who?", "<information>B</information>", history, []).endswith(
        "Question: Who?\n<information>A</information>\n<search>b</search>\n<information>B</information>")


def test_information_block_is_search_r1s_layout():
    passages = [Passage("1", "Orlen\nA market town."), Passage("2", "no title line")]
    assert protocol.information(passages) == "<information>Doc 1(Title: Orlen) A market town.\nDoc 2(Title: no title line) no title line</information>"


# ------------------------------------------------------------ generator and retrieval
def test_generator_is_seeded_and_splits_hold_out_templates():
    passages, questions = generator.generate(generator.CorpusConfig())
    assert (passages, questions) == generator.generate(generator.CorpusConfig())
    assert generator.generate(generator.CorpusConfig(seed=1))[0] != passages
    ids = {p["id"] for p in passages}
    assert all(set(q["supporting"]) <= ids for q in questions)
    by_split = {s: {q["template"] for q in questions if q["split"] == s} for s in data.SPLITS}
    assert by_split["ood"] == set(generator.OOD_TEMPLATES) and not by_split["ood"] & (by_split["train"] | by_split["eval"])
    assert {q["type"] for q in questions if q["split"] == "train"} == {"single_hop", "bridge", "comparison"}
    assert 0.05 < sum(q["split"] == "eval" for q in questions) / sum(q["split"] != "ood" for q in questions) < 0.15
    texts = {p["id"]: p["contents"] for p in passages}
    for q in questions[:50]:  # the answer is stated in the last supporting passage (or is a compared entity)
        assert q["golden_answers"][0].lower() in (texts[q["supporting"][-1]] + q["question"]).lower()


@pytest.mark.parametrize("kind", ["bm25", "dense"])
def test_retrieval_finds_the_supporting_passage_of_single_hop_questions(kind, cache):
    env = SearchQAEnv(cache_dir=cache)
    env.prepare()
    questions = [q for q in env._questions if q["type"] == "single_hop"]
    root = index.ensure_corpus(env.retriever.retriever.corpus.path, cache)
    retriever = index.LocalRetriever(root, kind)
    top3 = [q["supporting"][0] in [p.id for p in retriever.retrieve(q["question"], 3)] for q in questions]
    assert len(questions) > 400 and sum(top3) / len(top3) >= 0.9  # measured: 1.0 for both


def test_cache_is_keyed_by_corpus_content(cache, tmp_path):
    copy = tmp_path / "corpus.jsonl"
    copy.write_text((FIXTURES / "corpus.jsonl").read_text())
    root = index.ensure_corpus(str(FIXTURES / "corpus.jsonl"), cache)
    assert index.ensure_corpus(str(copy), cache) == root  # same content, same cache
    copy.write_text(copy.read_text() + '{"id": "6", "contents": "Extra\\nAnother passage."}\n')
    other = index.ensure_corpus(str(copy), cache)
    assert other != root and index.read_meta(other)["passages"] == 6 and index.read_meta(root)["passages"] == 5
    assert index.open_corpus(other).passage(5) == Passage("6", "Extra\nAnother passage.")


def test_cached_retriever_retrieves_each_query_and_k_once():
    calls = []

    class Counting:
        def retrieve(self, query, k):
            calls.append((query, k))
            return [Passage(query, "t\nx")] * k

    cached = Cached(Counting(), size=2)
    for query, k in [("a", 3), ("a", 3), ("a", 1), ("b", 3), ("a", 3), ("c", 3), ("a", 1)]:
        assert len(cached.retrieve(query, k)) == k
    # ("a", 1) was evicted by ("c", 3) (LRU of 2: after "c" it holds ("a", 3), ("c", 3))
    assert calls == [("a", 3), ("a", 1), ("b", 3), ("a", 3), ("c", 3), ("a", 1)] and (cached.hits, cached.misses) == (1, 6)


# ------------------------------------------------------------ real-data loaders
def test_parquet_and_jsonl_loaders_read_search_r1_rows():
    nq = data.read_questions(str(FIXTURES / "nq_small.parquet"))
    assert nq[1] == {"question": "What is orlen famous for?", "golden_answers": ["its clock tower", "clock tower"], "type": "nq"}
    assert [q["golden_answers"] for q in nq][2] == ["Tass", "the Tass", "River Tass"]
    rows = data.read_questions(str(FIXTURES / "questions.jsonl"))
    assert rows[0] == {"question": "Who designed the velmora bridge?", "golden_answers": ["Anselm Ruedi"], "type": "questions"}
    assert rows[1]["type"] == "hotpotqa"  # data_source names the dataset (per-dataset success rates)
    with pytest.raises(ValueError, match="parquet or .jsonl"):
        data.read_questions("questions.csv")


# ------------------------------------------------------------ the environment
def test_environment_searches_answers_and_scores_exact_match(cache):
    env = fixture_env(cache)
    obs, info = env.reset(0)
    assert obs == info["task"] == "Who designed the velmora bridge?" and info["task_type"] == "questions"
    obs, reward, done, info = env.step("<think>I should look it up.</think><search>velmora bridge designed</search>")
    assert obs == ("<information>Doc 1(Title: Anselm Ruedi) Anselm Ruedi was the engineer who designed the Velmora Bridge.\n"
                   "Doc 2(Title: Velmora Bridge) The Velmora Bridge is a stone arch bridge over the river Tass, completed in 1872."
                   "</information>")  # BM25 returns only passages that share a term with the query: 2 of the top 3
    assert (reward, done, info["action_recognised"]) == (0.0, False, True)
    obs, reward, done, info = env.step("<think>Found it.</think><answer> anselm ruedi. </answer>")
    assert (obs, reward, done, info["won"]) == ("Your answer is correct.", 1.0, True, True)
    env.reset(1)
    obs, reward, done, info = env.step("<answer>The Red Sea</answer>")
    assert (reward, done, info["won"], info["task_type"]) == (0.0, True, False, "hotpotqa")
    assert SearchQAEnv.max_return == 1.0


def test_invalid_responses_use_a_turn_and_the_episode_ends_after_four(cache):
    env = fixture_env(cache)
    env.reset(0)
    for turn in range(1, 5):
        obs, reward, done, info = env.step("I think the answer is Anselm." if turn % 2 else "<search></search>")
        assert (obs, reward, info["action_recognised"], info["turn"], done) == (protocol.INVALID, 0.0, False, turn, turn == 4)
    env.reset(0)
    for _ in range(3):
        assert not env.step("<search>orlen</search>")[2]
    assert env.step("<search>orlen</search>")[2]  # the fourth turn ends the episode, answered or not


def test_registry_builds_the_environment_lazily():
    factory = make_env_factory("search_qa", split="eval", topk=2)
    assert factory.func is SearchQAEnv
    with pytest.raises(ValueError, match="env_kwargs.top_k: not an argument of the search_qa environment"):
        make_env_factory("search_qa", top_k=2)
    with pytest.raises(ValueError, match="retriever_url"):
        SearchQAEnv(retriever="http")
    with pytest.raises(ValueError, match="corpus_path"):
        SearchQAEnv(questions_path=str(FIXTURES / "questions.jsonl"))


@pytest.mark.parametrize("split", ["eval", "ood"])
def test_expert_answers_at_least_95_percent_through_the_environment(split, cache):
    env = SearchQAEnv(split=split, cache_dir=cache)
    wins, turns = 0, []
    for seed in range(env.n_questions):
        env.reset(seed)
        for t, action in enumerate(env.walkthrough(), 1):
            _, reward, done, info = env.step(f"<think>{REASON}</think>{action}")
            if done:
                break
        wins += info["won"]
        turns.append(t)
    assert wins / env.n_questions >= 0.95  # measured: 1.0 on train, eval and ood
    assert max(turns) == 3 and min(turns) == 2  # two searches at most, then the answer


def test_expert_demonstrations_are_valid_search_r1_responses(cache, tiny_model_dir):
    tokenizer = load_tokenizer(LMConfig(name_or_path=str(tiny_model_dir)))
    prompt = PromptBuilder("search_qa", history_length=4, style="search")
    factory = make_env_factory("search_qa", cache_dir=cache)
    demos = collect_demonstrations(factory, tokenizer, prompt, [0, 1, 2])
    assert demos and all(d.won for d in demos)
    for d in demos:
        assert d.response == f"<think>{REASON}</think>{d.action}" and parse_action(d.response, prompt.action_tag) == d.action
        assert tokenizer.decode(d.input_ids[d.action_mask]) == d.action
    last = [d for d in demos if d.task_seed == 0]
    assert last[-1].action.startswith("<answer>") and all(d.action.startswith("<search>") for d in last[:-1])
    assert last[-1].prompt.count("<information>Doc 1") == len(last) - 1  # the whole history is in the prompt


def test_collector_counts_invalid_responses_and_adds_the_qa_penalty(cache):
    factory = make_env_factory("search_qa", questions_path=str(FIXTURES / "questions.jsonl"),
                               corpus_path=str(FIXTURES / "corpus.jsonl"), cache_dir=cache)
    script = ["<think>hm</think> Anselm?", "<think>a</think><search>velmora bridge designed</search> trailing",
              "<think>b</think><answer>Anselm Ruedi</answer>"]
    stops = []

    class Scripted:
        def generate(self, prompts, temperature, seed, stop="</action>"):
            stops.append(stop)
            return [Generation([0], [1], script[len(stops) - 1]) for _ in prompts]

    prompt = PromptBuilder("search_qa", history_length=4, style="search")
    (traj,) = Collector(EnvPool(factory, 1), Scripted(), prompt, max_steps=4, invalid_penalty=-0.01).collect([(0, 0)], 1, 1.0, 0, progress=False)
    assert stops == [("</search>", "</answer>")] * 3
    assert [s.action for s in traj.steps] == [None, "<search>velmora bridge designed</search>", "<answer>Anselm Ruedi</answer>"]
    assert [s.reward for s in traj.steps] == [-0.01, 0.0, 1.0] and traj.invalid_steps == 1 and traj.won
    assert traj.task_type == "questions" and traj.total_return == pytest.approx(0.99)
    # the world model predicts retrieved passages only: not the verdict after an answer, not an invalid turn's reminder
    assert [s.predictable for s in traj.steps] == [False, True, False]
    buffer = build_buffer([traj], build_tiny_tokenizer(), world_model=True)
    assert [bool(m.any()) for m in buffer.obs_mask] == [False, True, False]


def test_engine_stops_at_the_first_of_several_stop_strings(tiny_model_dir):
    from paw_lightning.rollout.engine import GenerationEngine, stop_criterion, stop_strings, stopped

    assert stop_strings(None) == () and stop_strings("</action>") == ("</action>",)
    assert stopped("q</search>", ("</search>", "</answer>")) and not stopped("q</sear", ("</search>", "</answer>"))
    tokenizer = load_tokenizer(LMConfig(name_or_path=str(tiny_model_dir)))
    engine = GenerationEngine(None, tokenizer, 8)
    ids = tokenizer.encode("<search>q</search><answer>", add_special_tokens=False)
    assert tokenizer.decode(engine._cut(ids, ("</search>", "</answer>"))) == "<search>q</search>"
    assert tokenizer.decode(engine._cut(ids, "</answer>")) == "<search>q</search><answer>"  # never completed: kept whole
    assert stop_criterion(tokenizer, ("</search>", "</answer>")) is stop_criterion(tokenizer, ["</search>", "</answer>"])
