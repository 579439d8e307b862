"""WebShop: search tokens, pages and admissible actions, the expert through the environment, the
generated catalog (deterministic, read by the official-format loader), the real-data loader on a
fixture in the official format, bad input, and the pool of worker processes. The reward's
hand-computed cases are in test_webshop_reward.py."""
from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest

from paw_lightning.envs import EnvError, EnvPool, make_env_factory
from paw_lightning.envs.webshop import data, generator
from paw_lightning.envs.webshop.env import WebShopEnv
from paw_lightning.envs.webshop.search import s_stem, tokenize

FIXTURE = Path(__file__).parent / "fixtures" / "webshop"


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("webshop_cache"))


def test_search_tokens_stem_plurals():
    assert [s_stem(w) for w in ("shoes", "batteries", "glass", "cactus", "toes")] == ["shoe", "battery", "glass", "cactus", "toe"]
    assert tokenize("The Running Shoes, for men") == ["running", "shoe", "men"]


def test_pages_and_admissible_actions(cache):
    env = WebShopEnv(cache_dir=cache)
    obs, info = env.reset(0)
    assert obs.startswith("WebShop [SEP] Instruction: [SEP] ") and obs.endswith(" [SEP] Search")
    assert info["admissible_actions"] == ["search[<your query>]"] and info["task"] in obs and not info["won"]
    # a click on the search page is not recognised and changes nothing
    assert env.step("click[buy now]")[1:] == (0.0, False, {**info, "action_recognised": False})
    obs, reward_, done, info = env.step("search[machine wash]")
    assert obs.startswith("Back to Search [SEP] Page 1 (Total results: 50) [SEP] Next > [SEP] ")
    actions = info["admissible_actions"]
    assert actions[:2] == ["click[back to search]", "click[next >]"] and len(actions) == 12 and info["action_recognised"]
    obs, *_ , info = env.step("click[next >]")
    assert "Page 2 (Total results: 50) [SEP] < Prev [SEP] Next >" in obs and info["admissible_actions"][1:3] == ["click[< prev]", "click[next >]"]
    env.step("search[shoes]")  # the search bar is on the search page only
    asin = info["admissible_actions"][3]
    obs, *_, info = env.step(asin.upper().replace("CLICK", "click"))  # buttons are case-insensitive
    item = info["admissible_actions"]
    assert item[:2] == ["click[back to search]", "click[< prev]"] and item[-4:] == ["click[description]", "click[features]", "click[reviews]", "click[buy now]"]
    option = item[2][len("click["):-1]
    obs, *_, info = env.step(f"click[{option}]")
    assert obs.startswith(f"You have clicked {option}. [SEP] Back to Search") and "Selected: " in obs
    obs, *_, info = env.step("click[features]")
    assert obs.startswith("Back to Search [SEP] < Prev [SEP] ") and info["admissible_actions"] == ["click[back to search]", "click[< prev]"]
    obs, *_, info = env.step("click[< prev]")
    assert "Selected: " in obs  # back on the item, the chosen option kept
    env.step("click[< prev]")
    obs, *_, info = env.step("click[back to search]")
    assert info["admissible_actions"] == ["search[<your query>]"]
    assert env.step("search[zzzqqq]")[0] == "Back to Search [SEP] Page 1 (Total results: 0)"


def test_buying_ends_the_episode_with_the_score(cache):
    env = WebShopEnv(cache_dir=cache)
    env.reset(3)
    plan = env.walkthrough()
    for action in plan[:-1]:
        assert env.step(action)[1:3] == (0.0, False)
    obs, r, done, info = env.step(plan[-1])
    assert (r, done, info["won"], info["score"]) == (10.0, True, True, 1.0) and obs.endswith("Your score (min 0.0, max 1.0): 1.00")
    with pytest.raises(EnvError):
        env.step("click[buy now]")
    _, info = env.reset(3)
    to_item = plan[: plan.index(f"click[{info['asin'].lower()}]") + 1]  # search, page on, open the target
    for action in to_item:
        env.step(action)
    obs, r, done, info = env.step("click[buy now]")  # no option chosen: r < 1, the reward is 0
    assert done and r == 0.0 and 0 < info["score"] < 1 and not info["won"]
    dense = WebShopEnv(cache_dir=cache, dense_reward=True)
    dense.reset(3)
    for action in to_item:
        dense.step(action)
    assert dense.step("click[buy now]")[1] == pytest.approx(10 * info["score"])


@pytest.mark.parametrize("split", ["train", "eval", "ood"])
def test_the_expert_wins_generated_instructions(cache, split):
    env = WebShopEnv(split=split, cache_dir=cache)
    n, won = 60, 0
    for seed in range(n):
        env.reset(seed)
        plan = env.walkthrough()
        assert len(plan) <= 15
        for action in plan:
            obs, r, done, info = env.step(action)
        won += info["won"]
    assert won / n >= 0.95


def test_generated_catalog_is_deterministic_and_splits_hold_out_product_types(tmp_path):
    config = generator.CatalogConfig(num_products=120, seed=3)
    first = generator.generate(str(tmp_path / "a"), config)
    second = generator.generate(str(tmp_path / "b"), config)
    for name in ("items_shuffle.json", "items_ins_v2.json", "items_human_ins.json"):
        assert (Path(first) / name).read_bytes() == (Path(second) / name).read_bytes()
    other = generator.generate_files(generator.CatalogConfig(num_products=120, seed=4))
    assert other[0] != json.loads((Path(first) / "items_shuffle.json").read_text())
    products = data.load_products(data.find_files(first))
    goals = data.human_goals(products, data.read_json(str(Path(first) / "items_human_ins.json")))
    assert len(products) == 120 and len(goals) == 240
    held_out = set(config.held_out())
    assert len(held_out) == 5 and {g["query"] for g in data.split_goals(goals, "ood")} == held_out
    in_dist = data.split_goals(goals, "train") + data.split_goals(goals, "eval")
    assert not held_out & {g["query"] for g in in_dist} and len(in_dist) + len(data.split_goals(goals, "ood")) == 240
    assert {p["category"] for p in products} == set(generator.CATEGORIES)


def test_official_fixture_is_read_as_webshop_does():
    files = data.find_files(str(FIXTURE))
    assert Path(files["products"]).name == "items_shuffle_1000.json" and Path(files["reviews"]).name == "reviews.json"
    products = data.load_products(files)
    assert [p["asin"] for p in products] == ["B000000001", "B000000002", "B000000003"]  # duplicate and "nan" skipped
    deo, shoes, table = products
    assert deo["query"] == "deodorant" and deo["Price"] == "$10.99" and deo["price"] == 10.99
    assert deo["options"] == {"scent": ["bright citrus", "calming lavender | mint"], "size": ["3 ounce (pack of 1)", "3 ounce (pack of 2)"]}
    assert deo["Rating"] == 4.5 and deo["Reviews"] == [{"score": 5, "body": "Smells great and lasts all day."}]
    assert shoes["pricing"] == [45.0, 60.0] and shoes["Price"] == "$45.0 to $60.0" and 45.0 <= shoes["price"] <= 60.0
    assert table["Attributes"] == ["DUMMY_ATTR"] and table["BulletPoints"] == ["Easy assembly"] and table["price"] == 100.0
    goals = data.human_goals(products, data.read_json(files["instructions"]))
    assert [g["asin"] for g in goals] == ["B000000001", "B000000002"]  # the instruction without attributes is skipped
    assert goals[0]["instruction_text"].startswith("i need a long lasting and aluminum free deodorant for sensitive skin in bright citrus scent, and price lower than ")
    assert goals[0]["price_upper"] in (20.0, 30.0, 40.0, 50.0)
    with pytest.raises(ValueError, match="no OOD split"):
        data.split_goals(goals, "ood")


def test_official_data_through_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("WEBSHOP_DATA", str(FIXTURE))
    env = WebShopEnv(split="eval", cache_dir=str(tmp_path))
    assert env.source == "official" and env.n_goals == 2  # both goals fall in WebShop's test indices [0, 500)
    for seed in range(2):
        env.reset(seed)
        for action in env.walkthrough():
            *_, info = env.step(action)
        assert info["won"]
    with pytest.raises(ValueError, match="no 'train' split|has no goals"):
        WebShopEnv(split="train", cache_dir=str(tmp_path)).reset(0)


def test_bad_input_is_a_clear_value_error(tmp_path, monkeypatch):
    monkeypatch.delenv("WEBSHOP_DATA", raising=False)
    with pytest.raises(ValueError, match="unknown WebShop split 'test'"):
        WebShopEnv(split="test")
    with pytest.raises(ValueError, match="does not exist"):
        WebShopEnv(data_path=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="no WebShop data in"):
        WebShopEnv(data_path=str(tmp_path))
    with pytest.raises(ValueError, match="needs data_path or"):
        WebShopEnv(source="official")
    with pytest.raises(ValueError, match="unknown WebShop product types"):
        WebShopEnv(ood_types=["spaceship"])
    bad = tmp_path / "bad"
    shutil.copytree(FIXTURE, bad)
    (bad / "items_human_ins.json").write_text("{not json")
    with pytest.raises(ValueError, match="malformed WebShop data file .*items_human_ins.json"):
        WebShopEnv(data_path=str(bad), cache_dir=str(tmp_path / "c")).reset(0)
    with pytest.raises(ValueError, match="env_kwargs.splitt: not an argument of the webshop environment"):
        make_env_factory("webshop", splitt="train")


@pytest.mark.slow
def test_pool_workers_share_the_store(cache):
    factory = make_env_factory("webshop", cache_dir=cache)
    assert pickle.loads(pickle.dumps(factory))().split == "train"
    local = factory()
    local.reset(5)
    plan = local.walkthrough()
    pool = EnvPool(factory, size=2, num_workers=2, timeout=120)
    try:
        resets = pool.reset_many([(0, 5, 0), (1, 5, 1)])
        assert resets[0] == resets[1] and "error" not in resets[0][1]
        for action in plan:
            results = pool.step_many([(0, action), (1, action)])
        assert all(r[2] and r[3]["won"] and r[1] == 10.0 for r in results)
    finally:
        pool.close()
