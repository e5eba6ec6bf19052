"""Synthetic trajectory tables in the agent loop's format, for CPU demos and tests of the stages.

Each row: a prompt span (loss_mask 0), then alternating agent spans (loss_mask 1, with sampler
log-probs) and tool-output spans (loss_mask 0); reward from the paper's levels {-1, 1, 2, 3};
some rows carry a schema violation or a redundant loop, and one in sixteen an infrastructure
failure (NaN reward), so RFT's filter has something to reject.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def demo_rows(rows: int, vocab_size: int, max_len: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(rows):
        length = int(rng.integers(max(4, max_len // 2), max_len + 1))
        tokens = rng.integers(1, vocab_size, length).astype(int).tolist()
        mask = np.zeros(length, np.int8)
        t = int(rng.integers(2, max(3, length // 4)))
        agent = True
        while t < length:
            span = int(rng.integers(2, 8))
            if agent:
                mask[t:t + span] = 1
            t += span
            agent = not agent
        logprobs = np.where(mask == 1, np.log(rng.uniform(0.01, 1.0, length)), 0.0).astype(np.float32)
        reward = float(rng.choice([-1.0, 1.0, 2.0, 3.0]))
        out.append({
            "tokens": tokens,
            "loss_mask": mask.tolist(),
            "rollout_logprobs": logprobs.tolist(),
            "reward": float("nan") if i % 16 == 15 else reward,
            "schema_violations": int(i % 7 == 3),
            "redundant_loop": bool(i % 11 == 5),
        })
    return out


def write_demo_trajectories(path: str | Path, rows: int, vocab_size: int, max_len: int, seed: int = 0) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    schema = pa.schema([
        ("tokens", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.int8())),
        ("rollout_logprobs", pa.list_(pa.float32())),
        ("reward", pa.float64()),
        ("schema_violations", pa.int32()),
        ("redundant_loop", pa.bool_()),
    ])
    pq.write_table(pa.Table.from_pylist(demo_rows(rows, vocab_size, max_len, seed), schema=schema), path)
    return path
