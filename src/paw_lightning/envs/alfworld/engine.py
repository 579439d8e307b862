"""The textworld engine exactly as alfworld's text environment builds it, plus a translation cache.

``make_text_env`` builds the wrapper chain of ``AlfredTWEnv.init_env`` (alfworld 0.4):
``GenericEnvironment`` -> ``AlfredDemangler(shuffle=False)`` -> ``AlfredInfos`` -> ``Filter``;
``reset()`` gives ``(observation, infos)``, ``step(cmd)`` ``(observation, score, done, infos)``.
Inside ``engine_speedups()`` two caches that change no output are active (ours): PDDL → SAS
translations served from an in-process LRU cache, and memoised parses of textworld's command
templates and grammar conditions (~2x more steps per second).

"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import sys
from collections import OrderedDict

_CACHE: OrderedDict[tuple, tuple] = OrderedDict()
CACHE_SIZE = 16  # translations kept (a kitchen's unoptimised SAS text is ~1.3 MB)
_PARSES: OrderedDict[tuple, object] = OrderedDict()
PARSE_CACHE_SIZE = 4096


def _lru_put(cache: OrderedDict, key, value, size: int) -> None:
    cache[key] = value
    while len(cache) > size:
        cache.popitem(last=False)


@contextlib.contextmanager
def engine_speedups():
    """Within the block, textworld's translation and template parsing are memoised (module docstring)."""
    import fast_downward
    from textworld.envs.pddl import textgen
    from textworld.logic import Rule

    original_translate = fast_downward.pddl2sas
    original_parse = textgen._parse_and_convert
    original_query = Rule.__dict__["parse_conjunctive_query"]
    parse_query = Rule.parse_conjunctive_query

    def translate(domain: str, problem: str, verbose: bool = False, optimize: bool = False):
        key = (hashlib.sha1(domain.encode()).digest(), hashlib.sha1(problem.encode()).digest(), bool(optimize))
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
        saved = list(sys.argv)
        try:
            result = original_translate(domain, problem, verbose=verbose, optimize=optimize)
        finally:
            sys.argv[:] = saved
        _lru_put(_CACHE, key, result, CACHE_SIZE)
        return result

    def parse(*args, **kwargs):
        key = ("symbols", args, tuple(sorted(kwargs.items())))
        if key not in _PARSES:
            _lru_put(_PARSES, key, original_parse(*args, **kwargs), PARSE_CACHE_SIZE)
        return copy.deepcopy(_PARSES[key])

    def query(cls, expression: str):
        key = ("query", expression)
        if key not in _PARSES:
            _lru_put(_PARSES, key, parse_query(expression), PARSE_CACHE_SIZE)
        return _PARSES[key]

    fast_downward.pddl2sas, textgen._parse_and_convert = translate, parse
    Rule.parse_conjunctive_query = classmethod(query)
    try:
        yield
    finally:
        fast_downward.pddl2sas, textgen._parse_and_convert = original_translate, original_parse
        Rule.parse_conjunctive_query = original_query


def make_text_env(extra_infos: tuple[str, ...] = ()):
    """alfworld's text-env wrapper chain (module docstring); ``extra_infos`` adds EnvInfos flags."""
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
    from textworld.envs.wrappers import Filter, GenericEnvironment

    request_infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
    for name in extra_infos:
        setattr(request_infos, name, True)
    env = GenericEnvironment(request_infos)
    for wrapper in (AlfredDemangler(shuffle=False), AlfredInfos, Filter):
        env = wrapper(env)
    return env


def make_pddl_env(**infos):
    """``PddlEnv`` + ``AlfredDemangler`` as ``alfworld-generate`` uses them; loads dicts too."""
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
    from textworld.envs.pddl import PddlEnv

    return AlfredDemangler(PddlEnv(textworld.EnvInfos(**infos)), shuffle=False)


def replan(env) -> list[str]:
    """The bundled planner's command sequence from the current state of a wrapped ``PddlEnv``."""
    inner = env.unwrapped
    return list(inner._pddl_state.replan(inner._entity_infos) or [])
