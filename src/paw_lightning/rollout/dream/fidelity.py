"""k-step fidelity: how far the world model's own predictions stay true along real trajectories.

For every step t of a real held-out trajectory (o_0, a_0, o_1, …, a_{T-1}, o_T) and k = 1 … H
with t + k ≤ T, the model predicts free-running:

    ô_{t+1} = WM(h_t, a_t),   ô_{t+j+1} = WM(ĥ_{t+j}, a_{t+j})  (j ≥ 1),

where h_t is the real prompt (its context is exactly the training sample's, so k = 1 is what
``val/wm_onpolicy/*`` measures, on every transition) and ĥ_{t+j} is the prompt of step t+j rendered with
the *predicted* observations ô_{t+1} … ô_{t+j} in place of the real ones (history and current
observation) and the *real* responses a_t … a_{t+j}. The prediction ô_{t+k} is scored against
the real o_{t+k} (:mod:`~paw_lightning.rollout.dream.measures`). Each prediction is as many
tokens as the real o_{t+k} (as ``val/wm_onpolicy/*``). A chain stops at the trajectory's end, after H
predictions, or before a transition the environment marks as no world-model target.

Simplification: the admissible actions in ĥ_{t+j} are the judge's for the predicted state when
it gives them (Sudoku), else the task's first ones (the reset's: constant for the grid games,
not ALFWorld's).
"""
from __future__ import annotations

from dataclasses import dataclass

from paw_lightning.rollout.collector import Trajectory
from paw_lightning.rollout.dream.imagine import Predict, Transition
from paw_lightning.rollout.dream.judge import Judge
from paw_lightning.rollout.prompts import PromptBuilder
from paw_lightning.scale import distributed


@dataclass
class FidelityRecord:
    """One scored prediction: k steps ahead, predicted and real o_{t+k}, and whether their states
    match (``None`` when the environment reads no states)."""

    k: int
    predicted: str
    real: str
    state_match: bool | None = None


@dataclass
class _Chain:
    traj: Trajectory
    start: int  # t
    predicted: list[str]  # ô_{t+1} … ô_{t+j}

    @property
    def step(self) -> int:  # the step whose next observation is predicted now: t + j
        return self.start + len(self.predicted)


def _executed(step) -> str:
    """What the history shows for a step: the parsed action, else the whole response (as the collector)."""
    return step.action if step.action is not None else step.response


def k_step_fidelity(trajectories: list[Trajectory], predict: Predict, prompt: PromptBuilder, judge: Judge, horizon: int,
                    first_actions: dict[int, list[str]]) -> list[FidelityRecord]:
    """Every k-step prediction of every chain of ``trajectories`` (see the module docstring);
    ``first_actions``: task seed → the reset's admissible actions. ``predict`` is called once per
    round on every rank (the same number of rounds), with an empty list where nothing is left."""
    chains = [_Chain(traj, t, []) for traj in trajectories for t, step in enumerate(traj.steps) if step.predictable]
    records: list[FidelityRecord] = []
    for _ in range(horizon):
        if not distributed.any_across_ranks(bool(chains)):
            break
        predicted = predict([_transition(c, prompt, judge, first_actions) for c in chains])
        alive = []
        for chain, obs in zip(chains, predicted):
            real = chain.traj.steps[chain.step].next_observation
            match = None
            if judge.reads_states:
                state = judge.state(obs)
                match = state is not None and state == judge.state(real)
            chain.predicted.append(obs)
            records.append(FidelityRecord(len(chain.predicted), obs, real.strip(), match))
            if chain.step < len(chain.traj.steps) and chain.traj.steps[chain.step].predictable:
                alive.append(chain)
        chains = alive
    return records


def _transition(chain: _Chain, prompt: PromptBuilder, judge: Judge, first_actions: dict[int, list[str]]) -> Transition:
    steps, s = chain.traj.steps, chain.step
    step = steps[s]
    if not chain.predicted:  # the real h_t: the training sample's context
        return Transition("", step.response, step.observation, _executed(step), step.prompt_ids, step.response_ids, step.next_observation)
    observation = chain.predicted[-1]
    shown = [steps[i].observation for i in range(chain.start + 1)] + chain.predicted[:-1]  # o_0 … o_t, ô_{t+1} … ô_{t+j-1}
    history = [(obs, _executed(steps[i])) for i, obs in enumerate(shown)]
    outcome = judge(observation)
    admissible = outcome.admissible_actions if outcome is not None and outcome.admissible_actions is not None else first_actions.get(chain.traj.task_seed, [])
    text = prompt(chain.traj.task or "", observation, history, admissible)
    return Transition(text, step.response, observation, _executed(step), None, step.response_ids, step.next_observation)
