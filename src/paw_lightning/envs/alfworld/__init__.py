"""ALFWorld: official games and an offline procedural generator, played through textworld.

- :mod:`~paw_lightning.envs.alfworld.env`: ``AlfWorldEnv`` (the ``TextEnv``).
- :mod:`~paw_lightning.envs.alfworld.generator`: PDDL games from alfworld's floor plans,
  verified solvable, cached in the official layout (``GameStore``).
- :mod:`~paw_lightning.envs.alfworld.generate`: ``python -m paw_lightning.envs.alfworld.generate``.
- :mod:`~paw_lightning.envs.alfworld.engine`: alfworld's textworld wrapper chain.
- :mod:`~paw_lightning.envs.alfworld.layouts`: floor plans and ALFRED's object rules.

Importing this package does not import textworld or alfworld; its submodules do.
"""
__all__ = ["AlfWorldEnv"]


def __getattr__(name: str):
    if name == "AlfWorldEnv":
        from paw_lightning.envs.alfworld.env import AlfWorldEnv

        return AlfWorldEnv
    raise AttributeError(name)
