"""Many concurrent episodes, one batched sampler: requests are gathered into batches.

`BatchedSamplerPolicy` implements the policy interface over a synchronous batch function

    sample_batch(prompts: list[list[int]], max_new_tokens: list[int], stop_token_ids: list[int])
        -> list[tuple[list[int], list[float]]]        # per prompt: sampled ids, their log-probs

(the local JAX sampler, policy_jax_backend.py). Episodes await `generate`; a collector task
waits up to `window_s` for up to `max_batch` requests, runs the batch in a thread (so tools of
other episodes keep running), and hands each episode its own continuation.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from agent.chat import as_chat_tokenizer
from agent.policy import Generation

SampleBatch = Callable[[list[list[int]], list[int], list[int]], list[tuple[list[int], list[float]]]]


@dataclass
class _Request:
    prompt: list[int]
    max_new_tokens: int
    future: asyncio.Future


class BatchedSamplerPolicy:
    def __init__(self, sample_batch: SampleBatch, tokenizer: Any, max_batch: int = 64, window_s: float = 0.05):
        self.sample_batch = sample_batch
        self.tokenizer = as_chat_tokenizer(tokenizer)
        self.max_batch = max_batch
        self.window_s = window_s
        self._queue: asyncio.Queue[_Request] | None = None
        self._collector: asyncio.Task | None = None
        self._stop_ids: list[int] = []
        self.batch_sizes: list[int] = []  # for throughput reports

    async def generate(self, prompt_token_ids: Sequence[int], max_new_tokens: int, stop_token_ids: Sequence[int], messages=None) -> Generation:
        if self._queue is None:
            self._queue = asyncio.Queue()
            self._collector = asyncio.ensure_future(self._collect())
        self._stop_ids = list(stop_token_ids)
        future = asyncio.get_running_loop().create_future()
        await self._queue.put(_Request(list(prompt_token_ids), int(max_new_tokens), future))
        ids, logprobs = await future
        stopped = bool(ids) and ids[-1] in self._stop_ids
        text = self.tokenizer.decode(ids[:-1] if stopped else ids)
        return Generation(list(ids), list(logprobs), text, stopped)

    async def _collect(self) -> None:
        assert self._queue is not None
        while True:
            batch = [await self._queue.get()]
            deadline = asyncio.get_running_loop().time() + self.window_s
            while len(batch) < self.max_batch:
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(self._queue.get(), timeout=left))
                except asyncio.TimeoutError:
                    break
            self.batch_sizes.append(len(batch))
            try:
                outputs = await asyncio.to_thread(
                    self.sample_batch, [r.prompt for r in batch], [r.max_new_tokens for r in batch], list(self._stop_ids)
                )
                if len(outputs) != len(batch):
                    raise RuntimeError(f"sampler returned {len(outputs)} results for {len(batch)} prompts")
            except Exception as error:
                for request in batch:
                    if not request.future.done():
                        request.future.set_exception(error)
                continue
            for request, (ids, logprobs) in zip(batch, outputs):
                if len(ids) > request.max_new_tokens:
                    ids, logprobs = ids[: request.max_new_tokens], logprobs[: request.max_new_tokens]
                if not request.future.done():
                    request.future.set_result((list(ids), list(logprobs)))

    async def close(self) -> None:
        if self._collector is not None:
            self._collector.cancel()
            try:
                await self._collector
            except (asyncio.CancelledError, Exception):
                pass
            self._collector = None
            self._queue = None
