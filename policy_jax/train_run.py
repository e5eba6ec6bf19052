"""One training stage from a run config, start to finish: models, mesh, data, resume, steps, checkpoints.

`run_stage` is what `cuda-agent train` calls. Checkpoints live under
`<checkpoint.directory>/<stage>/{actor,critic}`; a stage whose directory already holds a checkpoint
resumes from it (state and data position) and runs until `steps` updates in total.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
from flax import nnx

from policy_jax.checkpoint import TrainCheckpointer
from policy_jax.distributed import maybe_initialize_distributed
from policy_jax.run_config import RunConfig
from policy_jax.sharding import init_sharded, make_mesh
from policy_jax.stages import (
    BatchIterator,
    PPOStates,
    StageError,
    rft_filter,
    run_ppo,
    run_rft,
    run_value_pretraining,
    trainable_rows,
)
from policy_jax.train_state import TrainState, create_train_state, make_optimizer

STAGES = ("rft", "value", "ppo")


def init_model(kind: str, cfg: RunConfig, mesh, init_from: str | None, seed: int) -> nnx.Module:
    """A CausalLM ("actor") or Critic ("critic"), from a Hugging Face checkpoint directory or random."""
    from policy_jax.transformer import CausalLM, Critic

    if init_from:
        from policy_jax.params_import import load_critic_from_hf, load_hf_checkpoint

        load = load_hf_checkpoint if kind == "actor" else load_critic_from_hf
        return load(init_from, cfg.model, mesh)
    cls = CausalLM if kind == "actor" else Critic
    return init_sharded(lambda: cls(cfg.model, rngs=nnx.Rngs(seed)), mesh)


def new_state(kind: str, cfg: RunConfig, mesh, init_from: str | None, total_steps: int) -> TrainState:
    opt = cfg.actor_optimizer if kind == "actor" else cfg.critic_optimizer
    seed = cfg.train.seed + (0 if kind == "actor" else 1)
    return create_train_state(init_model(kind, cfg, mesh, init_from, seed), make_optimizer(opt, total_steps), mesh)


def checkpoint_dir(cfg: RunConfig, stage: str, kind: str, override: str | None = None) -> str:
    base = override or cfg.checkpoint.directory
    return f"{base.rstrip('/')}/{stage}/{kind}" if "://" in base else str(Path(base).expanduser() / stage / kind)


def _params_from(directory: str, template: TrainState) -> TrainState:
    """`template` with the parameters of the latest checkpoint in `directory` (fresh optimiser, step 0)."""
    with TrainCheckpointer(directory) as ck:
        restored, _ = ck.restore(template)
    return template.replace(params=restored.params, rest=restored.rest)


def export_actor(cfg: RunConfig, from_dir: str, out: str | Path, dtype: str | None = None,
                 tokenizer_dir: str | None = None) -> Path:
    """Write the actor of the latest checkpoint in `from_dir` as a Hugging Face checkpoint at `out`."""
    from policy_jax.params_export import export_hf_checkpoint

    mesh = make_mesh(cfg.mesh)
    state = _params_from(from_dir, new_state("actor", cfg, mesh, None, 1))
    return export_hf_checkpoint(state.module(), out, dtype=dtype, tokenizer_dir=tokenizer_dir)


def common_step(checkpointers) -> int | None:
    """The latest step every role saved: a stop between the actor's save and the critic's leaves
    the actor one step ahead, and a resume takes both from the step they share (None: start over)."""
    shared = set.intersection(*(set(ck.all_steps()) for ck in checkpointers))
    return max(shared) if shared else None


def drop_steps_after(step: int | None, checkpointers, stage: str, log) -> None:
    """Delete the saves of a role that ran ahead of `step` (None: every save); they are trained again."""
    for ck in checkpointers:
        for ahead in [s for s in ck.all_steps() if step is None or s > step]:
            ck.delete(ahead)
            log({"stage": stage, "event": "dropped", "directory": ck.directory, "step": ahead})


def run_stage(
    cfg: RunConfig,
    stage: str,
    rows: Sequence[dict[str, Any]],
    steps: int,
    *,
    init_from: str | None = None,
    actor_from: str | None = None,
    critic_from: str | None = None,
    checkpoint_root: str | None = None,
    resume: bool = True,
    log: Callable[[dict[str, Any]], None] = lambda record: None,
    devices: Sequence | None = None,
) -> dict[str, TrainState]:
    """Train `stage` ("rft", "value" or "ppo") for `steps` updates in total on trajectory `rows`.

    init_from: a Hugging Face checkpoint directory for fresh models (default: random init).
    actor_from / critic_from: checkpoint directories of earlier stages (e.g. RFT's actor, value
    pretraining's critic) whose parameters start this stage. devices: the mesh's devices (default: all).
    Returns the final states by role.
    """
    if stage not in STAGES:
        raise StageError(f"unknown stage {stage!r}: expected one of {STAGES}")
    maybe_initialize_distributed(cfg.distributed)
    mesh = make_mesh(cfg.mesh, devices)
    if stage == "rft":
        rows, rejected = rft_filter(rows, cfg.rft)
        log({"stage": "rft", "event": "filter", "kept": len(rows), **{f"rejected_{k}": v for k, v in rejected.items()}})
    else:
        rows = trainable_rows(rows)
    roles = ("actor",) if stage == "rft" else ("critic",) if stage == "value" else ("actor", "critic")
    states: dict[str, TrainState] = {}
    checkpointers: dict[str, TrainCheckpointer] = {}
    position = None
    batch_size = cfg.train.global_batch_size
    updates_per_step = 1
    if stage == "ppo":
        updates_per_step = (batch_size // min(cfg.ppo.mini_batch_size, batch_size)) * cfg.ppo.epochs
    try:
        for role in roles:
            checkpointers[role] = TrainCheckpointer(checkpoint_dir(cfg, stage, role, checkpoint_root),
                                                    max_to_keep=cfg.checkpoint.max_to_keep,
                                                    save_every=cfg.checkpoint.save_every)
        resume_step = common_step(checkpointers.values()) if resume else None
        if resume:
            drop_steps_after(resume_step, checkpointers.values(), stage, log)
        for role in roles:
            state = new_state(role, cfg, mesh, init_from, steps * updates_per_step)
            source = actor_from if role == "actor" else critic_from
            ck = checkpointers[role]
            if resume_step is not None:
                state, position = ck.restore(state, resume_step)
                log({"stage": stage, "event": "resumed", "role": role, "step": int(state.step), "position": position})
            elif source:
                state = _params_from(source, state)
                log({"stage": stage, "event": "initialised", "role": role, "from": source})
            states[role] = state
        batches = BatchIterator(rows, batch_size, cfg.train.seq_len, cfg.train.seed,
                                {k: v for k, v in (position or {}).items() if k in ("epoch", "index")})
        done = int(jax.device_get(states[roles[0]].step)) // updates_per_step
        remaining = max(steps - done, 0)
        if stage == "rft":
            states["actor"] = run_rft(states["actor"], batches, cfg, mesh, remaining, checkpointers["actor"], log)
        elif stage == "value":
            states["critic"] = run_value_pretraining(states["critic"], batches, cfg, mesh, remaining, checkpointers["critic"], log)
        else:
            out = run_ppo(PPOStates(states["actor"], states["critic"]), batches, cfg, mesh, remaining,
                          (checkpointers["actor"], checkpointers["critic"]), log)
            states = {"actor": out.actor, "critic": out.critic}
        for role, ck in checkpointers.items():
            step = int(jax.device_get(states[role].step))
            if remaining and step not in ck.all_steps():
                ck.save(states[role], {"stage": stage, **batches.current_position()})
    finally:
        for ck in checkpointers.values():
            ck.close()
    return states


def json_line(record: dict[str, Any]) -> str:
    return json.dumps(record, sort_keys=True, default=float)


def _done_marker(cfg: RunConfig, stage: str, checkpoint_root: str | None) -> Path:
    base = checkpoint_root or cfg.checkpoint.directory
    return Path(base).expanduser() / stage / "DONE.json"


def run_pipeline(cfg: RunConfig, *, init_from: str | None = None, checkpoint_root: str | None = None,
                 rows_of: Callable[[str], Sequence[dict[str, Any]]] | None = None,
                 log: Callable[[dict[str, Any]], None] = lambda record: None,
                 devices: Sequence | None = None) -> dict[str, str]:
    """Run the config's `stages` in order; returns the checkpoint directory of the last actor and critic.

    A stage whose DONE.json marker exists (written when it finished) is skipped; an interrupted one
    resumes from its latest checkpoint (parameters, optimiser, step and data position; the batch order
    follows from train.seed and that position). Each stage starts its actor and critic from the latest
    earlier stage that trained them. Local checkpoint directories only (the marker is a local file).
    """
    from policy_jax.stages import read_trajectory_rows

    if not cfg.stages:
        raise StageError("the config has no `stages` list (or give --stage and --data)")
    rows_of = rows_of or read_trajectory_rows
    latest: dict[str, str] = {}
    for spec in cfg.stages:
        steps = spec.steps if spec.steps is not None else cfg.train.steps
        marker = _done_marker(cfg, spec.stage, checkpoint_root)
        roles = ("actor",) if spec.stage == "rft" else ("critic",) if spec.stage == "value" else ("actor", "critic")
        if marker.is_file():
            log({"stage": spec.stage, "event": "skipped", "reason": "finished", **json.loads(marker.read_text())})
        else:
            log({"stage": spec.stage, "event": "start", "data": spec.data, "steps": steps})
            states = run_stage(cfg, spec.stage, rows_of(spec.data), steps, init_from=init_from,
                               actor_from=latest.get("actor"), critic_from=latest.get("critic"),
                               checkpoint_root=checkpoint_root, log=log, devices=devices)
            marker.write_text(json.dumps({"steps": steps, **{r: int(s.step) for r, s in states.items()}}))
        for role in roles:
            latest[role] = checkpoint_dir(cfg, spec.stage, role, checkpoint_root)
    return latest
