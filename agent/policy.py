"""Policies behind one interface: given the prompt's token ids, sample the next agent turn.

    await policy.generate(prompt_token_ids, max_new_tokens, stop_token_ids, messages=...)
        -> Generation(token_ids, logprobs, text, stopped)

`token_ids` are exactly what the trajectory records as the agent turn (ending with the stop
token when the policy stopped), `logprobs` one per id. Backends:
  - ScriptedPolicy: replays a list of turn texts (tests, demos, throughput figures);
  - OpenAIChatPolicy: any OpenAI-compatible /v1/chat/completions endpoint (external models,
    evaluated in the same loop); tokens come from the local tokenizer;
  - agent.policy_jax_backend.jax_sampler_policy: the local JAX sampler (imported lazily).
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

from agent.chat import IM_END, as_chat_tokenizer


@dataclass(frozen=True)
class Generation:
    token_ids: list[int]
    logprobs: list[float]
    text: str
    stopped: bool  # True when the turn ended with a stop token (included in token_ids)


class Policy(Protocol):
    async def generate(
        self,
        prompt_token_ids: Sequence[int],
        max_new_tokens: int,
        stop_token_ids: Sequence[int],
        messages: list[dict[str, str]] | None = None,
    ) -> Generation: ...


class PolicyError(Exception):
    """The policy backend failed (endpoint unreachable, malformed reply)."""


def _text_to_generation(tokenizer, text: str, max_new_tokens: int, stop_id: int, logprobs: list[float] | None) -> Generation:
    """Tokenise a turn's text, append the stop token, cut at max_new_tokens."""
    ids = tokenizer.encode(text) + [stop_id]
    lps = list(logprobs) if logprobs is not None and len(logprobs) == len(ids) else [0.0] * len(ids)
    if len(ids) > max_new_tokens:
        ids, lps = ids[:max_new_tokens], lps[:max_new_tokens]
        return Generation(ids, lps, tokenizer.decode(ids), stopped=False)
    return Generation(ids, lps, text, stopped=True)


class ScriptedPolicy:
    """Replays fixed turn texts in order; after the last one it answers `final_text` (no tool call).

    Log-probs are synthetic but distinct per sampled token (-(k+1)/1000 for the k-th token of
    the episode), so tests can check that they line up with the agent tokens.
    """

    def __init__(self, turns: Sequence[str], tokenizer: Any, final_text: str = "Done."):
        self.turns = list(turns)
        self.tokenizer = as_chat_tokenizer(tokenizer)
        self.final_text = final_text
        self.stop_id = self.tokenizer.token_id(IM_END)
        self._next = 0
        self._sampled = 0
        self.generated: list[Generation] = []  # every turn it produced, in order

    async def generate(self, prompt_token_ids, max_new_tokens, stop_token_ids, messages=None) -> Generation:
        text = self.turns[self._next] if self._next < len(self.turns) else self.final_text
        self._next += 1
        n = len(self.tokenizer.encode(text)) + 1
        logprobs = [-(self._sampled + k + 1) / 1000.0 for k in range(n)]
        self._sampled += n
        generation = _text_to_generation(self.tokenizer, text, max_new_tokens, self.stop_id, logprobs)
        self.generated.append(generation)
        return generation


class OpenAIChatPolicy:
    """An OpenAI-compatible chat endpoint (vLLM, SGLang, a hosted model).

    The endpoint sees the conversation as messages (tool outputs as user turns wrapped in
    <tool_response>, the same text the local template renders). Its reply text is tokenised
    with the local tokenizer; per-token log-probs are kept when the endpoint returns exactly
    one per local token, else they are 0 (an external model's trajectories are for evaluation,
    not for PPO).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        tokenizer: Any,
        api_key: str | None = None,
        temperature: float = 1.0,
        request_timeout: float = 600.0,
    ):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.tokenizer = as_chat_tokenizer(tokenizer)
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY", "")
        self.temperature = temperature
        self.request_timeout = request_timeout
        self.stop_id = self.tokenizer.token_id(IM_END)

    @staticmethod
    def endpoint_messages(messages: list[dict[str, str]]) -> list[dict[str, str]]:
        """Our roles mapped to plain chat roles: tool outputs become user turns in <tool_response> tags."""
        out: list[dict[str, str]] = []
        for message in messages:
            if message["role"] == "tool":
                block = f"<tool_response>\n{message['content']}\n</tool_response>"
                if out and out[-1]["role"] == "user" and out[-1].get("_tool"):
                    out[-1]["content"] += "\n" + block
                else:
                    out.append({"role": "user", "content": block, "_tool": True})
            else:
                out.append({"role": message["role"], "content": message["content"]})
        return [{"role": m["role"], "content": m["content"]} for m in out]

    def _post(self, payload: dict) -> dict:
        request = urllib.request.Request(
            self.url,
            data=json.dumps(payload).encode(),
            headers={"Content-Type": "application/json", **({"Authorization": f"Bearer {self.api_key}"} if self.api_key else {})},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.request_timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as error:
            raise PolicyError(f"endpoint {self.url} answered HTTP {error.code}: {error.read()[:300]!r}") from None
        except (urllib.error.URLError, OSError) as error:
            raise PolicyError(f"endpoint {self.url} unreachable: {error}") from None
        except json.JSONDecodeError:
            raise PolicyError(f"endpoint {self.url} returned a reply that is not JSON") from None

    async def generate(self, prompt_token_ids, max_new_tokens, stop_token_ids, messages=None) -> Generation:
        if messages is None:
            raise PolicyError("the chat endpoint needs the conversation as messages")
        payload = {
            "model": self.model,
            "messages": self.endpoint_messages(messages),
            "max_tokens": int(max_new_tokens),
            "temperature": self.temperature,
            "logprobs": True,
        }
        reply = await asyncio.to_thread(self._post, payload)
        try:
            choice = reply["choices"][0]
            text = choice["message"]["content"] or ""
        except (KeyError, IndexError, TypeError):
            raise PolicyError(f"endpoint {self.url} returned no choice") from None
        logprobs = None
        content = (choice.get("logprobs") or {}).get("content") if isinstance(choice.get("logprobs"), dict) else None
        if isinstance(content, list):
            logprobs = [float(item.get("logprob", 0.0)) for item in content] + [0.0]
        generation = _text_to_generation(self.tokenizer, text, max_new_tokens, self.stop_id, logprobs)
        if choice.get("finish_reason") == "length" and generation.stopped:
            # The endpoint cut the turn: do not pretend the model chose to stop.
            ids = generation.token_ids[:-1]
            return Generation(ids, generation.logprobs[:-1], text, stopped=False)
        return generation
