"""Episodes of the task, sampled by the agent's JAX sampler (agent/policy_jax_backend.py) from the
actor as it is now, as rows of the agent loop's trajectory table (tokens, loss_mask,
rollout_logprobs, reward) that the PPO code trains on."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from ablations.task import EOS, PAD, AdditionTask, Problem, answer_reward


@dataclasses.dataclass
class Episodes:
    rows: list[dict[str, Any]]
    stopped: list[bool]

    @property
    def reward_mean(self) -> float:
        return float(np.mean([r["reward"] for r in self.rows]))

    @property
    def exact_match(self) -> float:
        return float(np.mean([r["reward"] == 1.0 for r in self.rows]))


def episode_row(problem: Problem, response: Sequence[int], logprobs: Sequence[float]) -> dict[str, Any]:
    """One single-turn trajectory: the prompt (environment tokens), the response (agent tokens), its reward."""
    n = len(problem.prompt)
    return {"tokens": [*problem.prompt, *response], "loss_mask": [0] * n + [1] * len(response),
            "rollout_logprobs": [0.0] * n + [float(x) for x in logprobs],
            "reward": answer_reward(response, problem.answer)}


def sample_episodes(lm, problems: Sequence[Problem], task: AdditionTask, logits_precision: str, seed: int,
                    temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> Episodes:
    """One response per problem from `lm` (a CausalLM), with the sampler's own log-probs."""
    from agent.policy_jax_backend import sampler_batch_function

    sample = sampler_batch_function(lm, PAD, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                                    logits_precision=logits_precision, min_prompt_bucket=8,
                                    min_new_bucket=task.max_new_tokens)
    outputs = sample([list(p.prompt) for p in problems], [task.max_new_tokens] * len(problems), [EOS])
    rows = [episode_row(p, ids, logps) for p, (ids, logps) in zip(problems, outputs)]
    return Episodes(rows, [bool(ids) and ids[-1] == EOS for ids, _ in outputs])
