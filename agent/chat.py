"""The conversation as tokens: ChatML (Qwen2-style) rendering built incrementally.

An episode's token sequence is the concatenation of segments:

    environment  <|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{task}<|im_end|>\n<|im_start|>assistant\n
    agent        {exactly the ids the policy sampled, ending with <|im_end|>}
    environment  \n<|im_start|>user\n<tool_response>\n{out 1}\n</tool_response>\n<tool_response>\n{out 2}\n</tool_response><|im_end|>\n<|im_start|>assistant\n
    agent        ...

Environment segments are tokenised on their own and appended (mask 0, log-prob 0); agent
segments are the sampled ids themselves (mask 1, the sampler's log-probs), so what the
trainer sees is exactly what the policy saw and produced: no re-tokenisation drift. Every
environment segment starts and ends at a special token or after the agent's `<|im_end|>`,
so tokenising it alone gives the same ids as the full text would there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"


class ChatTokenizer(Protocol):
    """The three things the agent needs from a tokenizer."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...

    def token_id(self, token: str) -> int: ...


class TokenizerAdapter:
    """Wrap a `tokenizers.Tokenizer`, a transformers tokenizer, or anything with encode/decode.

    `encode` never adds BOS/EOS; special tokens written in the text (`<|im_start|>`) map to
    their ids.
    """

    def __init__(self, tokenizer: Any):
        self.inner = tokenizer

    def encode(self, text: str) -> list[int]:
        try:
            encoded = self.inner.encode(text, add_special_tokens=False)
        except TypeError:
            encoded = self.inner.encode(text)
        ids = getattr(encoded, "ids", encoded)
        return [int(i) for i in ids]

    def decode(self, token_ids: list[int]) -> str:
        try:
            return self.inner.decode(list(token_ids), skip_special_tokens=False)
        except TypeError:
            return self.inner.decode(list(token_ids))

    def token_id(self, token: str) -> int:
        for method in ("token_to_id", "convert_tokens_to_ids"):
            fn = getattr(self.inner, method, None)
            if fn is not None:
                value = fn(token)
                if value is not None and value != getattr(self.inner, "unk_token_id", -1):
                    return int(value)
        ids = self.encode(token)
        if len(ids) != 1:
            raise ValueError(f"the tokenizer has no single token for {token!r}")
        return ids[0]


def as_chat_tokenizer(tokenizer: Any) -> ChatTokenizer:
    if isinstance(tokenizer, TokenizerAdapter):
        return tokenizer
    return TokenizerAdapter(tokenizer)


def render_prompt_text(system: str, user: str) -> str:
    """The environment text that opens an episode, up to the first `<|im_start|>assistant\\n`."""
    return f"{IM_START}system\n{system}{IM_END}\n{IM_START}user\n{user}{IM_END}\n{IM_START}assistant\n"


def render_tool_responses_text(responses: list[str], agent_closed_turn: bool) -> str:
    """The environment text after an agent turn: tool outputs as one user turn, then the next assistant header.

    If the agent's turn was cut before it produced `<|im_end|>`, the environment closes it.
    """
    closing = "" if agent_closed_turn else IM_END
    body = "".join(f"\n<tool_response>\n{text}\n</tool_response>" for text in responses)
    return f"{closing}\n{IM_START}user{body}{IM_END}\n{IM_START}assistant\n"


def render_user_text(text: str, agent_closed_turn: bool) -> str:
    """A plain user message after an agent turn (e.g. a nudge when no tool was called)."""
    closing = "" if agent_closed_turn else IM_END
    return f"{closing}\n{IM_START}user\n{text}{IM_END}\n{IM_START}assistant\n"


@dataclass
class TokenTrajectory:
    """Tokens of one episode with the agent mask and the rollout log-probs, aligned 1:1.

    tokens[i], loss_mask[i] (1 = sampled by the policy), rollout_logprobs[i] (0 where mask 0).
    `messages` is the same conversation as role/content dicts (for transcripts and checks).
    """

    tokens: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    rollout_logprobs: list[float] = field(default_factory=list)
    messages: list[dict[str, str]] = field(default_factory=list)
    segments: list[tuple[int, int, bool]] = field(default_factory=list)  # (start, end, is_agent)

    def __len__(self) -> int:
        return len(self.tokens)

    def add_environment(self, token_ids: list[int]) -> None:
        start = len(self.tokens)
        self.tokens += token_ids
        self.loss_mask += [0] * len(token_ids)
        self.rollout_logprobs += [0.0] * len(token_ids)
        self.segments.append((start, len(self.tokens), False))

    def add_agent(self, token_ids: list[int], logprobs: list[float]) -> None:
        if len(logprobs) != len(token_ids):
            raise ValueError(f"{len(token_ids)} sampled tokens but {len(logprobs)} log-probs")
        start = len(self.tokens)
        self.tokens += token_ids
        self.loss_mask += [1] * len(token_ids)
        self.rollout_logprobs += [float(x) for x in logprobs]
        self.segments.append((start, len(self.tokens), True))

    @property
    def agent_tokens(self) -> int:
        return sum(self.loss_mask)


class ChatRenderer:
    """Builds a `TokenTrajectory` turn by turn with one tokenizer."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = as_chat_tokenizer(tokenizer)
        self.im_end_id = self.tokenizer.token_id(IM_END)

    def start(self, system: str, user: str) -> TokenTrajectory:
        trajectory = TokenTrajectory()
        trajectory.add_environment(self.tokenizer.encode(render_prompt_text(system, user)))
        trajectory.messages += [{"role": "system", "content": system}, {"role": "user", "content": user}]
        return trajectory

    def add_agent_turn(self, trajectory: TokenTrajectory, token_ids: list[int], logprobs: list[float], text: str) -> bool:
        """Append the sampled ids; returns whether the turn ended with `<|im_end|>`."""
        trajectory.add_agent(list(token_ids), list(logprobs))
        trajectory.messages.append({"role": "assistant", "content": text})
        return bool(token_ids) and token_ids[-1] == self.im_end_id

    def environment_ids_for_tools(self, responses: list[str], agent_closed_turn: bool) -> list[int]:
        return self.tokenizer.encode(render_tool_responses_text(responses, agent_closed_turn))

    def add_tool_responses(
        self, trajectory: TokenTrajectory, responses: list[str], agent_closed_turn: bool, token_ids: list[int] | None = None
    ) -> None:
        """Append the tool outputs (`token_ids`: their ids if already computed)."""
        if token_ids is None:
            token_ids = self.environment_ids_for_tools(responses, agent_closed_turn)
        trajectory.add_environment(token_ids)
        trajectory.messages += [{"role": "tool", "content": text} for text in responses]

    def add_user_message(self, trajectory: TokenTrajectory, text: str, agent_closed_turn: bool) -> None:
        trajectory.add_environment(self.tokenizer.encode(render_user_text(text, agent_closed_turn)))
        trajectory.messages.append({"role": "user", "content": text})

    def close_cut_turn(self, trajectory: TokenTrajectory) -> None:
        """End the conversation cleanly when the last agent turn was cut without `<|im_end|>`."""
        trajectory.add_environment([self.im_end_id])
