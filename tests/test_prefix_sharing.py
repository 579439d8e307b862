"""Shared prompt prefixes (paw_lightning.rollout.prefix): the plan, by hand, and generation with
it against the plain left-padded layout."""
import pytest
import torch

from paw_lightning.model import LMConfig, load_model, load_tokenizer
from paw_lightning.rollout.engine import GenerationEngine
from paw_lightning.rollout.prefix import PrefixPlan, plan_shared_prefixes, shared_prefix_length


A = list(range(100, 140))  # a 40-token prompt head
B = list(range(200, 240))


def test_plan_shares_each_groups_prefix_and_leaves_one_token_per_row():
    rows = [A + [1, 2], B + [3], A + [4], B, B]  # B twice whole: its last token stays with the rows
    plan = plan_shared_prefixes(rows)
    assert plan == PrefixPlan(prefixes=[B[:39], A], cluster_of=[1, 0, 1, 0, 0])


def test_plan_picks_the_split_that_saves_most_tokens():
    # three rows share 40 tokens, a fourth shares 30 of them: one cluster of 4 × 30 saves 3·30 = 90
    # tokens, the 3 rows alone 2·40 = 80
    rows = [A + [1], A + [2], A + [3], A[:30] + [4]]
    assert plan_shared_prefixes(rows).prefixes == [A[:30]]
    # with a 36-token overlap instead, 3·36 = 108 beats 2·40 = 80 and stays one cluster
    assert plan_shared_prefixes([A + [1], A + [2], A + [3], A[:36] + [4]]).prefixes == [A[:36]]
    # with 10 shared tokens: 2·40 = 80 (the fourth row alone, all but its last token prefilled) beats 3·10 = 30
    plan = plan_shared_prefixes([A + [1], A + [2], A + [3], A[:10] + [4]])
    assert plan == PrefixPlan(prefixes=[A, A[:10]], cluster_of=[0, 0, 0, 1])


def test_plan_is_declined_when_it_saves_too_little():
    assert plan_shared_prefixes([A, B]) is None  # nothing shared
    assert plan_shared_prefixes([A + [1]]) is None  # one row
    assert plan_shared_prefixes([[5], [5]]) is None  # no token would be left to generate from
    # 4 rows of 42 tokens sharing 10: U·W_p + B·W_s = 1·10 + 4·32 = 138 of 168 padded tokens, 18% saved
    rows = [A[:10] + list(range(i * 40, i * 40 + 32)) for i in range(4)]
    assert plan_shared_prefixes(rows) is None
    assert plan_shared_prefixes(rows, min_saving=0.15) is not None


def test_shared_prefix_length_of_a_call_leaves_one_token_per_row():
    assert shared_prefix_length([A + [1], A + [2], A + [3]]) == 40
    assert shared_prefix_length([A, A, A]) == 39  # identical rows: the last token stays with each
    assert shared_prefix_length([A + [1], A[:12] + B]) == 12
    assert shared_prefix_length([A, B]) == 0 and shared_prefix_length([A]) == 0 and shared_prefix_length([[5], [5]]) == 0


@pytest.fixture(scope="module")
def tiny_lm(tiny_model_dir):
    cfg = LMConfig(name_or_path=str(tiny_model_dir), dtype="float32")
    return load_model(cfg).eval(), load_tokenizer(cfg)


def group_prompts(tokenizer) -> list[list[int]]:
    """A step of two task groups: prompts that agree up to where their histories part."""
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)
    head = encode("you are in a room. your task is to: put a mug in the sink. steps so far: 3.")
    other = encode("you are in a room. your task is to: heat an egg. steps so far: 1.")
    return [head + encode(" go to desk"), head + encode(" open drawer 2, take mug"), other + encode(" look"),
            head + encode(" go to desk"), other + encode(" go to fridge 1")]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_shared_prefixes_sample_what_the_plain_layout_samples(tiny_lm, temperature):
    lm, tokenizer = tiny_lm
    prompts = group_prompts(tokenizer)
    assert plan_shared_prefixes(prompts) is not None
    results = {}
    for share in (False, True):
        stats = []
        tokens = GenerationEngine(lm, tokenizer, 24, share_prefixes=share).generate_ids(prompts, temperature, seed=7, stop="e", token_stats=stats)
        results[share] = tokens, stats
    (plain, plain_stats), (shared, shared_stats) = results[False], results[True]
    assert shared == plain  # the same seeded samples, cut at the same stop string
    for (logp_plain, entropy_plain), (logp_shared, entropy_shared) in zip(plain_stats, shared_stats):
        assert torch.allclose(torch.tensor(logp_shared), torch.tensor(logp_plain), atol=1e-4)
        assert torch.allclose(torch.tensor(entropy_shared), torch.tensor(entropy_plain), atol=1e-4)


def test_a_groups_first_step_prefills_its_prompt_once(tiny_lm):
    """G identical prompts of L tokens: the first forwards take L − 1 tokens (the prefix, once)
    and then G (each row's last prompt token) instead of G·L."""
    lm, tokenizer = tiny_lm
    prompt = group_prompts(tokenizer)[0]
    length, group = len(prompt), 4
    forwarded = []
    hook = lm.get_input_embeddings().register_forward_hook(lambda module, args, out: forwarded.append(tuple(args[0].shape)))
    try:
        for share in (False, True):
            forwarded.clear()
            GenerationEngine(lm, tokenizer, 3, share_prefixes=share).generate_ids([prompt] * group, 1.0, seed=0, stop=None)
            assert forwarded[:2] == ([(1, length - 1), (group, 1)] if share else [(group, length), (group, 1)])
    finally:
        hook.remove()
