"""The language model behind a dream's two callables, through the rollout engine.

:class:`PolicyActor` is ``act``: the engine's :meth:`~paw_lightning.rollout.engine.GenerationEngine.generate`
at the evaluation's temperature, one seed per call. :class:`WorldModelPredictor` is ``predict``:
each context is ``[h_t][a_t]`` followed by the world-model segment's head (the end of the
assistant turn and the next user turn's header, :class:`~paw_lightning.rollout.samples.ChatSegments`),
exactly the tokens before the observation in a training sample, continued greedily by
:func:`generate_observations`, which ``val/wm_onpolicy/*``'s free-running predictions use as well.
"""
from __future__ import annotations

from paw_lightning.rollout.collector import derive_seed
from paw_lightning.rollout.dream.imagine import Transition
from paw_lightning.rollout.engine import Generation, GenerationEngine, chat_prompt_ids
from paw_lightning.rollout.samples import ChatSegments
from paw_lightning.scale import distributed


def generate_observations(engine: GenerationEngine, tokenizer, contexts: list[list[int]], lengths: list[int]) -> list[str]:
    """Greedy continuations of ``contexts``, row i cut to ``lengths[i]`` tokens and decoded
    (stripped). The model is never trained on where an observation ends (the template's
    end-of-turn tokens are outside ``obs_mask``), so a prediction is bounded by a length the
    caller chooses. Every rank generates with the same budget, the longest of all ranks (synced
    forwards under FSDP2); a rank with no context still takes part."""
    budget = distributed.max_across_ranks(max([1, *lengths]))
    predicted = engine.generate_ids(contexts, temperature=0.0, seed=0, max_new_tokens=budget, stop=None)
    return [tokenizer.decode(p[:n], skip_special_tokens=True).strip() for p, n in zip(predicted, lengths)]


class PolicyActor:
    """``act(prompts)``: the policy's responses, sampled by ``engine`` at ``temperature`` and ending
    after ``stop``; call c uses the seed ``derive_seed(seed, c)``."""

    def __init__(self, engine: GenerationEngine, temperature: float, seed: int, stop: str | tuple[str, ...]):
        self.engine, self.temperature, self.seed, self.stop = engine, temperature, seed, stop
        self.calls = 0

    def __call__(self, prompts: list[str]) -> list[Generation]:
        seed, self.calls = derive_seed(self.seed, self.calls), self.calls + 1
        return self.engine.generate(prompts, self.temperature, seed, stop=self.stop)


class WorldModelPredictor:
    """``predict(transitions)``: ô_{t+1} for each transition, greedy, as many tokens as its
    ``length_of`` text (see :class:`~paw_lightning.rollout.dream.imagine.Transition`)."""

    def __init__(self, engine: GenerationEngine, tokenizer):
        self.engine, self.tokenizer = engine, tokenizer
        self.segments = ChatSegments(tokenizer)

    def context(self, transition: Transition) -> list[int]:
        """``[h_t][a_t][end of turn, next user header]``: a training sample's tokens before o_{t+1}."""
        tok = self.tokenizer
        prompt_ids = transition.prompt_ids if transition.prompt_ids is not None else chat_prompt_ids(tok, transition.prompt)
        response_ids = transition.response_ids if transition.response_ids is not None else tok.encode(transition.response, add_special_tokens=False)
        head, _ = self.segments.world_model_segment(response_ids, "", 0)
        return list(prompt_ids) + list(response_ids) + head

    def __call__(self, transitions: list[Transition]) -> list[str]:
        contexts = [self.context(t) for t in transitions]
        lengths = [max(1, len(self.tokenizer.encode(t.length_of, add_special_tokens=False))) for t in transitions]
        return generate_observations(self.engine, self.tokenizer, contexts, lengths)
