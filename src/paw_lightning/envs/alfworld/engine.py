"""The textworld engine exactly as alfworld's text environment builds it, plus a translation cache.

``make_text_env`` builds the wrapper chain of ``AlfredTWEnv.init_env`` (alfworld 0.4):
``GenericEnvironment(request_infos)`` (which starts textworld's ``PddlEnv`` for a
``.tw-pddl`` file) -> ``AlfredDemangler(shuffle=False)`` -> ``AlfredInfos`` -> ``Filter``,
with ``request_infos = EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])``.
``Filter.reset()`` gives ``(observation, infos)`` and ``Filter.step(cmd)`` gives
``(observation, score, done, infos)``, as ``textworld.gym`` does.

Speed-up that does not change any output (ours): ``PddlEnv.load`` and ``PddlEnv.reset``
each translate the PDDL domain + problem to SAS twice with fast-downward's Python
translator (0.1 s for a bathroom, ~0.8 s per translation for a kitchen). The translation
is a pure function of (domain, problem, optimize), so ``memoized_translation`` serves
repeats from a small in-process LRU cache: a load + reset translates twice instead of
four times, and resetting a game again (the G episodes of a group) translates nothing.
The cache also keeps fast-downward's translator from overwriting ``sys.argv``.
"""
from __future__ import annotations

import contextlib
import hashlib
import sys
from collections import OrderedDict

_CACHE: OrderedDict[tuple, tuple] = OrderedDict()
CACHE_SIZE = 16  # translations kept (a kitchen's unoptimised SAS text is ~1.3 MB)


@contextlib.contextmanager
def memoized_translation():
    """Within the block, fast-downward's ``pddl2sas`` is served from the LRU cache."""
    import fast_downward

    original = fast_downward.pddl2sas

    def cached(domain: str, problem: str, verbose: bool = False, optimize: bool = False):
        key = (hashlib.sha1(domain.encode()).digest(), hashlib.sha1(problem.encode()).digest(), bool(optimize))
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
        saved = list(sys.argv)
        try:
            result = original(domain, problem, verbose=verbose, optimize=optimize)
        finally:
            sys.argv[:] = saved
        _CACHE[key] = result
        while len(_CACHE) > CACHE_SIZE:
            _CACHE.popitem(last=False)
        return result

    fast_downward.pddl2sas = cached
    try:
        yield
    finally:
        fast_downward.pddl2sas = original


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
