"""`cuda-agent train` and `cuda-agent train-demo-data` (imports stay light: JAX is imported inside the commands)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=2)


def register(app: typer.Typer) -> None:
    """Add this package's commands to the root app."""
    app.command("train")(train)
    app.command("train-demo-data")(train_demo_data)
    app.command("export-hf")(export_hf)


def _short(record: dict) -> str:
    keys = ("loss", "value_loss", "grad_norm", "entropy", "explained_variance", "clip_frac_low", "clip_frac_high",
            "kl_k3", "rollout/prob_pearson", "rollout/chi2", "rollout/reward_mean")
    parts = [f"{record.get('stage')} step {record.get('step')}"]
    for key in keys:
        for name, value in record.items():
            if (name == key or name.endswith("/" + key)) and isinstance(value, float):
                parts.append(f"{name}={value:.4g}")
    return "  ".join(parts)


def train(
    stage: Optional[str] = typer.Option(None, help="rft | value | ppo (default: every stage of the config's `stages`)"),
    config: Path = typer.Option(..., help="run config YAML (configs/tiny.yaml, configs/h200_0p5b.yaml, ...)"),
    data: Optional[Path] = typer.Option(None, help="trajectory parquet (columns tokens, loss_mask, rollout_logprobs, "
                                        "reward); with --stage"),
    steps: Optional[int] = typer.Option(None, help="total updates (PPO: iterations) for this stage; default train.steps"),
    init_from: Optional[str] = typer.Option(None, help="Hugging Face checkpoint directory for fresh models"),
    actor_from: Optional[str] = typer.Option(None, help="checkpoint directory whose actor parameters start this stage"),
    critic_from: Optional[str] = typer.Option(None, help="checkpoint directory whose critic parameters start this stage"),
    checkpoint_dir: Optional[str] = typer.Option(None, help="overrides checkpoint.directory"),
    resume: bool = typer.Option(True, help="continue from this stage's latest checkpoint when there is one"),
    log_file: Optional[Path] = typer.Option(None, help="append every step's metrics as JSON lines"),
    tensorboard_dir: Optional[Path] = typer.Option(
        None, help="also write every step's metrics as TensorBoard scalars here"),
    devices: Optional[int] = typer.Option(None, help="run on the first N devices (default: all); the config's mesh "
                                          "is laid over those"),
) -> None:
    """Train one stage (RFT, value pretraining or PPO) on a trajectory file, or, without --stage, the
    stages the config lists in order (a finished stage is skipped, an interrupted one resumes)."""
    from cuda_agent.metrics_sink import MetricsSink
    from policy_jax.checkpoint import CheckpointError
    from policy_jax.model_config import ModelConfigError
    from policy_jax.params_import import CheckpointError as ImportCheckpointError
    from policy_jax.run_config import RunConfigError, load_run_config
    from policy_jax.sharding import MeshConfigError, first_devices
    from policy_jax.stages import StageError, read_trajectory_rows
    from policy_jax.train_run import json_line, run_pipeline, run_stage

    expected = (RunConfigError, ModelConfigError, MeshConfigError, StageError, CheckpointError, ImportCheckpointError)
    try:
        cfg = load_run_config(config)
        chosen = first_devices(devices)
        if stage is not None and data is None:
            raise StageError("--stage needs --data")
        rows = read_trajectory_rows(data) if stage is not None else None
        sink = MetricsSink(log_file, tensorboard_dir, step_key="step")

        def log(record):
            typer.echo(_short(record) if "event" not in record else json_line(record))
            sink.write(record)

        try:
            if stage is None:
                if steps is not None or actor_from or critic_from or not resume:
                    raise StageError("--steps, --actor-from, --critic-from and --no-resume go with --stage")
                latest = run_pipeline(cfg, init_from=init_from, checkpoint_root=checkpoint_dir, log=log,
                                      devices=chosen)
                for role, directory in latest.items():
                    typer.echo(f"{role}: {directory}")
                return
            states = run_stage(cfg, stage, rows, steps if steps is not None else cfg.train.steps,
                               init_from=init_from, actor_from=actor_from, critic_from=critic_from,
                               checkpoint_root=checkpoint_dir, resume=resume, log=log, devices=chosen)
        finally:
            sink.close()
    except expected as e:
        _fail(str(e))
    for role, state in states.items():
        typer.echo(f"{role}: {int(state.step)} updates")


def train_demo_data(
    out: Path = typer.Option(..., help="parquet file to write"),
    rows: int = typer.Option(32, help="number of trajectories"),
    vocab_size: int = typer.Option(512, help="token ids are drawn below this"),
    max_len: int = typer.Option(64, help="longest trajectory in tokens"),
    seed: int = typer.Option(0, help="Random seed of the generated trajectories."),
) -> None:
    """Write a synthetic trajectory table (random tokens; agent and tool spans; rewards in {-1, 1, 2, 3}) for CPU demos."""
    from policy_jax.demo_data import write_demo_trajectories

    if rows < 1 or max_len < 4 or vocab_size < 2:
        _fail("need rows >= 1, max_len >= 4 and vocab_size >= 2")
    path = write_demo_trajectories(out, rows, vocab_size, max_len, seed)
    typer.echo(f"wrote {rows} trajectories to {path}")


def export_hf(
    config: Path = typer.Option(..., help="the run config the checkpoint was trained with"),
    from_dir: str = typer.Option(..., "--from", help="an actor checkpoint directory, e.g. <checkpoint.directory>/rft/actor"),
    out: Path = typer.Option(..., help="the Hugging Face checkpoint directory to write (new or empty)"),
    dtype: Optional[str] = typer.Option(None, help="stored dtype: float32 | bfloat16 | float16 (default: the parameters')"),
    tokenizer: Optional[Path] = typer.Option(None, help="a folder whose tokenizer files are copied along"),
) -> None:
    """Write a trained actor as a Hugging Face checkpoint (config.json, model.safetensors, tokenizer)."""
    from policy_jax.checkpoint import CheckpointError
    from policy_jax.model_config import ModelConfigError
    from policy_jax.params_import import CheckpointError as ExportError
    from policy_jax.run_config import RunConfigError, load_run_config
    from policy_jax.sharding import MeshConfigError
    from policy_jax.train_run import export_actor

    typer.echo(f"exporting the actor of {from_dir} to {out}")
    try:
        written = export_actor(load_run_config(config), from_dir, out, dtype, str(tokenizer) if tokenizer else None)
    except (RunConfigError, ModelConfigError, MeshConfigError, CheckpointError, ExportError, FileNotFoundError) as e:
        _fail(str(e))
    typer.echo(f"wrote {written} (loads with transformers.AutoModelForCausalLM and `--policy jax --model-dir`)")
