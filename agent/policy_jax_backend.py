"""The local JAX sampler (policy_jax.sampler) as the agent's policy, batched across episodes.

`sampler_batch_function(lm, ...)` turns the sampler into the batch function that
`BatchedSamplerPolicy` calls: prompts of different lengths are padded (left, mask False) into
one [b, t] batch; b, t and the number of new tokens are rounded up to powers of two so the
compiled prefill/decode are reused across turns. Imported only when `--policy jax` is used.
"""

from __future__ import annotations

from typing import Any

from agent.batching import BatchedSamplerPolicy, SampleBatch


def _bucket(n: int, minimum: int) -> int:
    size = minimum
    while size < n:
        size *= 2
    return size


def sampler_batch_function(
    lm: Any,
    pad_id: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 0,
    logits_precision: str = "compute",
    min_prompt_bucket: int = 64,
    min_new_bucket: int = 16,
) -> SampleBatch:
    """A `sample_batch(prompts, max_new_tokens, stop_ids)` over `policy_jax.sampler.generate`."""
    import jax
    import numpy as np

    from policy_jax.sampler import SamplingParams, generate

    state = {"key": jax.random.PRNGKey(seed)}
    max_positions = int(lm.config.max_position_embeddings)

    def sample_batch(prompts: list[list[int]], max_new_tokens: list[int], stop_token_ids: list[int]):
        longest = max(len(p) for p in prompts)
        t = min(_bucket(longest, min_prompt_bucket), max_positions - 1)
        if longest > t:
            raise ValueError(f"prompt of {longest} tokens does not fit the model's {max_positions} positions")
        n = min(_bucket(max(max_new_tokens), min_new_bucket), max_positions - t)
        b = _bucket(len(prompts), 1)
        tokens = np.full((b, t), pad_id, np.int32)
        mask = np.zeros((b, t), bool)
        for row in range(b):
            prompt = prompts[row] if row < len(prompts) else prompts[0][-1:]  # filler rows: one token
            tokens[row, t - len(prompt):] = prompt
            mask[row, t - len(prompt):] = True
        params = SamplingParams(
            max_new_tokens=n, temperature=temperature, top_k=top_k, top_p=top_p,
            stop_token_ids=tuple(stop_token_ids), logits_precision=logits_precision,
        )
        state["key"], key = jax.random.split(state["key"])
        out = generate(lm, tokens, mask, params, key, pad_id=pad_id)
        ids, logps, lengths = np.asarray(out.tokens), np.asarray(out.logprobs), np.asarray(out.lengths)
        results = []
        for row, limit in enumerate(max_new_tokens):
            length = min(int(lengths[row]), int(limit))
            results.append(([int(x) for x in ids[row, :length]], [float(x) for x in logps[row, :length]]))
        return results

    return sample_batch


def model_sampler_policy(lm: Any, tokenizer: Any, max_batch: int = 64, **sampling: Any) -> BatchedSamplerPolicy:
    """A batched policy over a CausalLM as it is now (its arrays, no copy on disk)."""
    pad_id = getattr(getattr(tokenizer, "inner", tokenizer), "pad_id", None)
    return BatchedSamplerPolicy(sampler_batch_function(lm, 0 if pad_id is None else int(pad_id), **sampling), tokenizer, max_batch=max_batch)


def jax_sampler_policy(model_dir: str, tokenizer: Any, dtype: str | None = None, max_batch: int = 64, **sampling: Any) -> BatchedSamplerPolicy:
    """A batched policy over a Hugging Face checkpoint loaded into policy_jax."""
    from policy_jax.params_import import load_hf_checkpoint

    return model_sampler_policy(load_hf_checkpoint(model_dir, dtype=dtype), tokenizer, max_batch, **sampling)
