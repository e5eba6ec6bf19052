"""`cuda-agent solve`, `rollout` and `train-loop` (imports stay light: everything heavy is inside the commands)."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import List, Optional

import typer

POLICIES = ("scripted", "cheat", "openai", "jax")
BACKEND_HELP = ("Evaluator backend: auto | cuda | host (default: the config's, auto in agent.yaml: cuda when a GPU "
                "is visible, else host).")


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=2)


def register(app: typer.Typer) -> None:
    """Add this package's commands to the root app."""
    app.command("solve")(solve)
    app.command("rollout")(rollout)
    app.command("train-loop")(train_loop)


def _task_files(specs: list[str]) -> list[Path]:
    files: list[Path] = []
    for spec in specs:
        path = Path(spec)
        if path.is_dir():
            files += sorted(p for p in path.glob("*.py") if not p.name.startswith("_"))
        elif path.is_file():
            files.append(path)
        else:
            _fail(f"task not found: {spec}")
    if not files:
        _fail("no task files given")
    return files


def _solution_dir(solutions: Path | None, backend: str, stem: str) -> Path | None:
    """DIR/<backend>/<stem> or DIR/<stem> (the bench's layout); default examples/solutions."""
    root = solutions or Path(__file__).resolve().parent.parent / "examples" / "solutions"
    for candidate in (root / backend / stem, root / stem):
        if (candidate / "model_new.py").is_file():
            return candidate
    return None


def load_chat_tokenizer(spec: str | None):
    """None: the built-in demo tokenizer; "workspace": the built-in tokenizer learnt from the example
    tasks' episode text; a directory: a Hugging Face model's tokenizer; a file: tokenizer.json."""
    from agent.chat import TokenizerAdapter

    if spec is None:
        from agent.demo_tokenizer import demo_tokenizer

        return TokenizerAdapter(demo_tokenizer())
    if spec == "workspace":
        from agent.demo_tokenizer import workspace_tokenizer

        return TokenizerAdapter(workspace_tokenizer())
    path = Path(spec)
    if path.is_dir():
        from policy_jax.tokenizer import load_tokenizer

        return TokenizerAdapter(load_tokenizer(path))
    if path.is_file():
        from tokenizers import Tokenizer

        return TokenizerAdapter(Tokenizer.from_file(str(path)))
    _fail(f"tokenizer not found: {spec}")


def _sampling(run_config: Path | None) -> dict:
    """The `sampling` section of a training run config (temperature, top_k, top_p), {} without one."""
    if run_config is None:
        return {}
    from policy_jax.run_config import RunConfigError, load_run_config

    try:
        sampling = load_run_config(run_config).sampling
    except (RunConfigError, FileNotFoundError) as error:
        _fail(f"{run_config}: {error}")
    return dataclasses.asdict(sampling)


def _make_policy_factory(policy: str, tokenizer, backend: str, solutions: Path | None, base_url: str | None, model: str | None, model_dir: str | None,
                         sampling: dict | None = None):
    from agent.policy import OpenAIChatPolicy, ScriptedPolicy
    from agent.scripted import cheating_turns, honest_solver_turns, read_solution_dir

    if policy == "scripted":
        def scripted(task, index):
            directory = _solution_dir(solutions, backend, task.name)
            if directory is None:
                _fail(f"no scripted solution for task {task.name} (looked in {solutions or 'examples/solutions'}/{backend}/{task.name})")
            return ScriptedPolicy(honest_solver_turns(read_solution_dir(directory)), tokenizer)

        return scripted
    if policy == "cheat":
        return lambda task, index: ScriptedPolicy(cheating_turns(task.source), tokenizer)
    if policy == "openai":
        if not base_url or not model:
            _fail("--policy openai needs --base-url and --model")
        return lambda task, index: OpenAIChatPolicy(base_url, model, tokenizer)
    if policy == "jax":
        if not model_dir:
            _fail("--policy jax needs --model-dir (a Hugging Face model directory)")
        from agent.policy_jax_backend import jax_sampler_policy

        shared = jax_sampler_policy(model_dir, tokenizer, **(sampling or {}))
        return lambda task, index: shared
    _fail(f"unknown policy {policy!r} (choose from {', '.join(POLICIES)})")


def _config(config_name: str, backend: Optional[str], max_turns: Optional[int], bridge: Optional[str] = None):
    """The agent config with the overrides, its backend resolved on this machine (`auto` -> cuda or host).

    With a local fleet (no --bridge) a backend this machine cannot run is refused up front; with a
    remote broker an explicit cuda is kept (the workers are elsewhere) and `auto` follows this machine.
    """
    from agent.config import load_agent_config
    from cuda_agent.contracts import BackendError, resolve_backend

    try:
        config = load_agent_config(config_name).with_overrides(backend=backend, max_turns=max_turns)
    except (FileNotFoundError, ValueError) as error:
        _fail(str(error))
    try:
        resolved = resolve_backend(config.backend)
    except BackendError as error:
        if bridge is None or config.backend != "cuda":
            _fail(str(error))
        resolved = config.backend
    return config.with_overrides(backend=resolved)


@contextlib.contextmanager
def _evaluator_client(bridge: Optional[str], backend: str, log_dir: Path):
    """A bridge client of the given broker, or of a local broker + workers started here."""
    from bridge.client import BridgeClient

    from agent.fleet import FleetError, local_fleet

    with contextlib.ExitStack() as stack:
        endpoint = bridge
        if endpoint is None:
            typer.echo(f"starting a local broker and {backend}-backend evaluator workers ...", err=True)
            try:
                endpoint = stack.enter_context(local_fleet(backend=backend, log_dir=log_dir))
            except FleetError as error:
                _fail(str(error))
        yield stack.enter_context(BridgeClient(endpoint))


async def _with_evaluator(bridge: Optional[str], backend: str, log_dir: Path, run):
    """Run `run(gateway)` against the given bridge, or a local broker + workers started here."""
    with _evaluator_client(bridge, backend, log_dir) as client:
        return await run(client)


def solve(
    task: str = typer.Argument(..., help="Task file (Model, get_inputs, get_init_inputs)."),
    policy: str = typer.Option("scripted", help="scripted | cheat | openai | jax"),
    solutions: Optional[Path] = typer.Option(None, help="Solutions for the scripted policy (DIR/<backend>/<stem>)."),
    out: Optional[Path] = typer.Option(None, help="Episode directory (workspace/, transcript.md, result.json, solution/)."),
    config: str = typer.Option("agent_tiny", help="Agent config name under configs/ or a YAML path."),
    backend: Optional[str] = typer.Option(None, help=BACKEND_HELP),
    bridge: Optional[str] = typer.Option(None, help="Broker endpoint; default: start a local broker and workers."),
    tokenizer: Optional[str] = typer.Option(None, help="Model directory, tokenizer.json or \"workspace\" (built in; default: the built-in demo tokenizer)."),
    base_url: Optional[str] = typer.Option(None, help="OpenAI-compatible endpoint, e.g. http://host:8000/v1"),
    model: Optional[str] = typer.Option(None, help="Model name at the endpoint."),
    model_dir: Optional[str] = typer.Option(None, help="Hugging Face model directory for --policy jax."),
    run_config: Optional[Path] = typer.Option(None, help="For --policy jax: a training run config whose `sampling` section (temperature, top_k, top_p) the sampler uses, as the trainer will when it scores these episodes."),
    max_turns: Optional[int] = typer.Option(None, help="Override the config's turn limit."),
) -> None:
    """Run one episode; leave the workspace and a readable transcript."""
    import asyncio
    import time

    from agent.episode import load_task, run_episode
    from agent.transcript import write_episode_outputs

    cfg = _config(config, backend, max_turns, bridge)
    try:
        the_task = load_task(task)
    except FileNotFoundError as error:
        _fail(str(error))
    chat_tokenizer = load_chat_tokenizer(tokenizer)
    make_policy = _make_policy_factory(policy, chat_tokenizer, cfg.backend, solutions, base_url, model, model_dir, _sampling(run_config))
    episode_dir = (out or Path(cfg.episodes_root) / f"{the_task.name}-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    if (episode_dir / "workspace").exists():
        _fail(f"{episode_dir}/workspace already exists; choose another --out")
    episode_dir.mkdir(parents=True, exist_ok=True)
    the_policy = make_policy(the_task, 0)

    async def run(gateway):
        return await run_episode(the_task, the_policy, chat_tokenizer, cfg, gateway, episode_dir / "workspace")

    result = asyncio.run(_with_evaluator(bridge, cfg.backend, episode_dir / "fleet-logs", run))
    write_episode_outputs(result, episode_dir)
    speedup = "n/a" if result.best_speedup_vs_compile is None else f"{result.best_speedup_vs_compile:.2f}x"
    typer.echo(
        f"{the_task.name}: reward {result.reward} ({result.final_status}), speed-up vs compile {speedup}, "
        f"{result.turns} turns ({result.end_reason}), {result.schema_violations} schema violations, {result.wall_seconds:.1f} s"
    )
    typer.echo(f"transcript: {episode_dir / 'transcript.md'}\nworkspace: {result.workspace}")
    if result.error:
        _fail(f"episode stopped early: {result.error}")


def rollout(
    tasks: List[str] = typer.Argument(..., help="Task files or directories of tasks."),
    out: Path = typer.Option(Path("trajectories.parquet"), help="Trajectory parquet file to write."),
    policy: str = typer.Option("scripted", help="scripted | cheat | openai | jax"),
    solutions: Optional[Path] = typer.Option(None, help="Solutions for the scripted policy."),
    episodes_per_task: int = typer.Option(1, help="Episodes per task."),
    concurrency: int = typer.Option(4, help="Episodes run at the same time."),
    episodes_dir: Optional[Path] = typer.Option(None, help="Where the workspaces go (default: from the config)."),
    config: str = typer.Option("agent", help="Agent config name under configs/ or a YAML path."),
    backend: Optional[str] = typer.Option(None, help=BACKEND_HELP),
    bridge: Optional[str] = typer.Option(None, help="Broker endpoint; default: start a local broker and workers."),
    tokenizer: Optional[str] = typer.Option(None, help="Model directory, tokenizer.json or \"workspace\" (built in; default: the built-in demo tokenizer)."),
    base_url: Optional[str] = typer.Option(None, help="OpenAI-compatible endpoint for --policy openai."),
    model: Optional[str] = typer.Option(None, help="Model name at the endpoint (--policy openai)."),
    model_dir: Optional[str] = typer.Option(None, help="Hugging Face model directory for --policy jax."),
    run_config: Optional[Path] = typer.Option(None, help="For --policy jax: a training run config whose `sampling` section (temperature, top_k, top_p) the sampler uses, as the trainer will when it scores these episodes."),
    max_turns: Optional[int] = typer.Option(None, help="Override the config's turn limit."),
    keep_workspaces: bool = typer.Option(False, help="Keep every episode's workspace (default: remove it once its trajectory is in memory)."),
    salt_per_episode: bool = typer.Option(
        True,
        "--salt-per-episode/--no-salt-per-episode",
        help="Give every episode its own evaluator salt (default: on). The broker evaluates byte-identical jobs "
        "with the same salt once and hands that one result to every episode that submits them; training episodes "
        "must each get their own evaluation (fresh random inputs, their own timings) even when two episodes write "
        "identical solutions. --no-salt-per-episode lets identical solutions share one evaluation (cheaper, e.g. "
        "for replaying known solutions).",
    ),
) -> None:
    """Run many episodes concurrently and write their trajectories (with a progress bar)."""
    import asyncio
    import time

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from agent.episode import load_task, run_episodes
    from agent.trajectory import write_trajectories

    cfg = _config(config, backend, max_turns, bridge)
    task_list = [load_task(p) for p in _task_files(tasks)] * max(1, episodes_per_task)
    chat_tokenizer = load_chat_tokenizer(tokenizer)
    make_policy = _make_policy_factory(policy, chat_tokenizer, cfg.backend, solutions, base_url, model, model_dir, _sampling(run_config))
    root = (episodes_dir or Path(cfg.episodes_root) / f"rollout-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    if root.exists() and any(root.iterdir()):
        _fail(f"episodes directory {root} is not empty")
    root.mkdir(parents=True, exist_ok=True)
    policies = [make_policy(t, i) for i, t in enumerate(task_list)]  # fail fast on a missing solution
    rewards: list[float] = []

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as progress:
        bar = progress.add_task("episodes", total=len(task_list))

        def done(result) -> None:
            if not keep_workspaces:
                import shutil

                shutil.rmtree(result.workspace, ignore_errors=True)
            if result.reward is not None:
                rewards.append(result.reward)
            mean = sum(rewards) / len(rewards) if rewards else float("nan")
            progress.update(bar, advance=1, description=f"episodes (mean reward {mean:+.2f})")

        async def run(gateway):
            return await run_episodes(
                task_list, lambda t, i: policies[i], chat_tokenizer, cfg, gateway, root, concurrency,
                on_done=done, salt_per_episode=salt_per_episode,
            )

        results = asyncio.run(_with_evaluator(bridge, cfg.backend, root / "fleet-logs", run))
    write_trajectories(results, out)
    statuses: dict[str, int] = {}
    for r in results:
        statuses[r.final_status] = statuses.get(r.final_status, 0) + 1
    typer.echo(f"wrote {len(results)} trajectories to {out}; statuses {statuses}; episodes in {root}")


def train_loop(
    tasks: List[str] = typer.Argument(..., help="Task files or directories of tasks the policy plays."),
    config: Path = typer.Option(..., help="Training run config (model, ppo, sampling; train.global_batch_size episodes per iteration), e.g. configs/tiny_loop.yaml."),
    iterations: int = typer.Option(2, help="On-policy iterations: rollouts with the current actor, then one PPO step."),
    agent_config: str = typer.Option("agent_loop", help="Agent config name under configs/ or a YAML path (episodes must fit train.seq_len)."),
    tokenizer: Optional[str] = typer.Option(None, help="Model directory, tokenizer.json or \"workspace\" (built in; default: the built-in demo tokenizer)."),
    init_from: Optional[str] = typer.Option(None, help="Hugging Face checkpoint the actor and critic start from (default: random)."),
    bridge: Optional[str] = typer.Option(None, help="Broker endpoint; default: start a local broker and workers."),
    episodes_dir: Optional[Path] = typer.Option(None, help="Where the workspaces go (default: a new folder under the agent config's episodes_root)."),
    concurrency: int = typer.Option(8, help="Episodes run at the same time."),
    log_file: Optional[Path] = typer.Option(None, help="Append every iteration's metrics as JSON lines."),
    tensorboard_dir: Optional[Path] = typer.Option(
        None, help="Also write every iteration's metrics as TensorBoard scalars here."),
    export_to: Optional[Path] = typer.Option(None, help="Write the final actor as a Hugging Face checkpoint here."),
    devices: Optional[int] = typer.Option(None, help="Run on the first N devices (default: all); the config's mesh is laid over those."),
) -> None:
    """On-policy PPO: the actor plays episodes with its current weights, then learns from them."""
    import json
    import time

    from agent.episode import load_task
    from agent.on_policy import run_on_policy
    from cuda_agent.metrics_sink import MetricsSink
    from policy_jax.run_config import RunConfigError, load_run_config
    from policy_jax.sharding import MeshConfigError, first_devices
    from policy_jax.stages import StageError

    try:
        cfg = load_run_config(config)
        chosen = first_devices(devices)
    except (RunConfigError, MeshConfigError) as error:
        _fail(str(error))
    agent_cfg = _config(agent_config, None, None, bridge)
    task_list = [load_task(p) for p in _task_files(tasks)]
    chat_tokenizer = load_chat_tokenizer(tokenizer)
    inner = getattr(chat_tokenizer, "inner", None)
    vocab = inner.get_vocab_size(with_added_tokens=True) if hasattr(inner, "get_vocab_size") else len(inner) if hasattr(inner, "__len__") else None
    if vocab is not None and vocab > cfg.model.vocab_size:
        _fail(f"the tokenizer has {vocab} tokens, more than the model's vocab_size={cfg.model.vocab_size}")
    root = (episodes_dir or Path(agent_cfg.episodes_root) / f"train-loop-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    earlier = sorted(root.glob("iteration-*")) if root.is_dir() else []
    if earlier:
        _fail(f"{root} already holds the episodes of a run ({earlier[0].name}); give an empty --episodes-dir")
    root.mkdir(parents=True, exist_ok=True)
    sink = MetricsSink(log_file, tensorboard_dir, step_key="iteration")

    def log(record):
        keys = ("iteration", "actor_version", "rollout/reward_mean", "rollout/pass_rate", "actor/loss", "critic/value_loss",
                "actor/entropy", "episodes_per_hour", "rollout_s", "train_s")
        typer.echo("  ".join(f"{k}={record[k]:.4g}" if isinstance(record.get(k), float) else f"{k}={record[k]}" for k in keys if k in record)
                   if "event" not in record else json.dumps(record))
        sink.write(record)

    try:
        with _evaluator_client(bridge, agent_cfg.backend, root / "fleet-logs") as client:
            states, _ = run_on_policy(cfg, agent_cfg, task_list, chat_tokenizer, client, iterations, root,
                                      init_from=init_from, concurrency=concurrency, log=log, devices=chosen)
    except (StageError, RuntimeError) as error:
        _fail(str(error))
    finally:
        sink.close()
    typer.echo(f"actor: {int(states.actor.step)} updates; episodes in {root}")
    if export_to is not None:
        from policy_jax.params_export import export_hf_checkpoint

        export_hf_checkpoint(states.actor.module(), export_to)
        typer.echo(f"wrote the actor to {export_to}")
