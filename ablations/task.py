"""The stand-in task: addition with an exact-match reward, over a vocabulary of its own.

Prompt: BOS a + b =  (operands in decimal digits); the answer is a + b in digits followed by EOS.
Reward: 1 for exactly the answer then EOS; 0.5 for the answer followed by neither EOS nor another
digit (cut at the length limit, or trailing symbols); 0 otherwise. A model that has never seen the task finds a rewarded
answer by chance (one digit among the vocabulary), so rewards are sparse at first and the
policy gradient has something to climb, in minutes on a small model.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

PAD, BOS, EOS, PLUS, EQUALS = 0, 1, 2, 3, 4
DIGIT0 = 5
TASK_VOCAB = DIGIT0 + 10  # the ids the task uses; the model's vocabulary may be larger


@dataclasses.dataclass(frozen=True)
class Problem:
    prompt: tuple[int, ...]
    answer: tuple[int, ...]


def digits(n: int) -> tuple[int, ...]:
    return tuple(DIGIT0 + int(c) for c in str(n))


@dataclasses.dataclass(frozen=True)
class AdditionTask:
    """Sums of two operands in [0, max_operand]; answers must come within `max_new_tokens` tokens."""

    max_operand: int = 4
    max_new_tokens: int = 4

    def __post_init__(self):
        if self.max_operand < 1:
            raise ValueError(f"task.max_operand must be >= 1, got {self.max_operand}")
        if self.max_new_tokens < len(digits(2 * self.max_operand)) + 1:
            raise ValueError(f"task.max_new_tokens={self.max_new_tokens} leaves no room for the answer and EOS")

    def problems(self, rng: np.random.Generator, count: int) -> list[Problem]:
        pairs = rng.integers(0, self.max_operand + 1, size=(count, 2))
        return [Problem((BOS, *digits(a), PLUS, *digits(b), EQUALS), digits(a + b)) for a, b in pairs.tolist()]

    @property
    def longest_prompt(self) -> int:
        return 3 + 2 * len(digits(self.max_operand))

    @property
    def longest_row(self) -> int:
        return self.longest_prompt + self.max_new_tokens


def answer_reward(response: Sequence[int], answer: Sequence[int]) -> float:
    """1.0 for answer + EOS exactly; 0.5 for the answer then neither EOS nor a digit; 0.0 otherwise."""
    response, answer = list(response), list(answer)
    if response == [*answer, EOS]:
        return 1.0
    if response[:len(answer)] != answer:
        return 0.0
    following = response[len(answer):len(answer) + 1]
    return 0.0 if following and (following[0] == EOS or DIGIT0 <= following[0] < DIGIT0 + 10) else 0.5
