"""The world model as a simulator: imagined rollouts, and how far they stay true.

The same weights that act (the policy) also predict the next observation (the world model,
METHODS.md §1: the next observation as the next user turn after ``[h_t][a_t]``). A *dream*
replaces the environment by that prediction. Three measures (docs/reference/dream.md):

1. k-step fidelity (:mod:`.fidelity`): along the real held-out trajectories, the real actions
   are fed while the observations in the context are the model's own free-running predictions;
   the prediction k steps ahead is scored against the real observation (exact match, CER and,
   for an environment that reads states, state match).
2. success inside the model (:mod:`.imagine`): from a real task's first observation the policy
   acts and the world model answers, for up to H steps or until an observation the environment
   judges final (:mod:`.judge`); the share of imagined episodes that end won.
3. replay (:mod:`.replay`): the imagined actions executed in the real environment from the same
   reset: real success and the first step at which reality differs from the dream.

:mod:`.lm` adapts the rollout engine to the two callables the loops take (``act(prompts)`` and
``predict(transitions)``); :mod:`.measures` turns the records of every rank into the metrics;
:mod:`.play` runs all of it for the data module; :mod:`.settings` is ``data.evaluation.dream``.
"""
