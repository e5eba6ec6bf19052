"""One episode of the agent loop (paper Figure 2), and many of them concurrently.

The policy acts in its workspace with tools until it stops calling tools, hits the turn limit
or the context budget. The final solution is the one in the trajectory with the best speed-up
against torch.compile among correct evaluations (the paper's evaluation rule); when the
policy never profiled a correct solution, the episode's last solution (and the last one it
verified as correct, if different) is profiled once at the end. The episode's reward is that
solution's milestone reward; infrastructure failures give no reward (None), never -1.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from cuda_agent.contracts import WORKSPACE_ENTRY, evaluation_job, record_reward, record_speedup

from agent.chat import IM_END, ChatRenderer, TokenTrajectory
from agent.config import AgentConfig
from agent.evaluator_report import files_digest, is_correct, is_infra_error
from agent.policy import Policy
from agent.prompts import system_prompt, task_message
from agent.tool_calls import ToolCall, parse_tool_calls
from agent.toolbox import Toolbox
from agent.tools import default_tools
from agent.tools.base import EvaluationRecord, EvaluatorGateway, Tool, ToolContext
from agent.tools.evaluator import evaluator_settings, submit_to_evaluator
from agent.workspace import Workspace, WorkspaceError, create_workspace


@dataclass(frozen=True)
class Task:
    """A task: its name and the Python source defining Model, get_inputs, get_init_inputs."""

    name: str
    source: str


def load_task(path: str | Path) -> Task:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"task file not found: {path}")
    return Task(name=path.stem, source=path.read_text())


@dataclass
class EpisodeResult:
    task: str
    trajectory: TokenTrajectory
    turns: int
    end_reason: str  # agent_finished | turn_limit | context_budget | cut_without_call | policy_error
    tool_calls: int
    tool_counts: dict[str, int]
    tool_failures: int
    schema_violations: int
    redundant_loop: bool
    final_status: str  # the evaluator status of the final solution, or no_solution / not_evaluated / policy_error
    reward: float | None
    best_speedup_vs_compile: float | None
    best_speedup_vs_eager: float | None
    final_solution: dict[str, bytes]
    final_record: dict[str, Any] | None
    evaluations: list[EvaluationRecord]
    workspace: Path
    wall_seconds: float
    policy_seconds: float
    tool_seconds: float
    evaluator_seconds: float
    error: str | None = None
    timings: dict[str, float] = field(default_factory=dict)


def best_correct_evaluation(evaluations: Sequence[EvaluationRecord]) -> EvaluationRecord | None:
    """The correct, timed evaluation with the best speed-up vs torch.compile (ties: the earliest)."""
    best, best_speedup = None, None
    for item in evaluations:
        if not is_correct(item.record):
            continue
        speedup = record_speedup(item.record, "compile")
        if speedup is None:
            continue
        if best_speedup is None or speedup > best_speedup:
            best, best_speedup = item, speedup
    return best


def _repeats_in_a_row(keys: Sequence[str]) -> int:
    longest = run = 0
    previous = None
    for key in keys:
        run = run + 1 if key == previous else 1
        previous = key
        longest = max(longest, run)
    return longest


async def _final_evaluations(context: ToolContext) -> list[EvaluationRecord]:
    """Profile the last solution and the last verified-correct one when no correct profile exists."""
    snapshots: list[dict[str, bytes]] = []
    try:
        final_files = context.workspace.solution_files()
    except WorkspaceError:
        final_files = {}
    if WORKSPACE_ENTRY in final_files:
        snapshots.append(final_files)
    verified = [e for e in context.evaluations if is_correct(e.record)]
    if verified and (not snapshots or files_digest(verified[-1].files) != files_digest(snapshots[0])):
        snapshots.append(verified[-1].files)
    results = []
    for files in snapshots:
        job = evaluation_job(
            context.workspace.task_name,
            context.workspace.task_source,
            files,
            evaluator_settings(context, True),
            artifact=context.artifacts.get(files_digest(files)),
        )
        record, seconds = await submit_to_evaluator(context, "evaluate", job)
        results.append(EvaluationRecord(tool="final", files=files, record=record, seconds=seconds))
        if is_correct(record):
            break
    return results


@dataclass
class _Loop:
    """What the turn loop leaves behind: how it ended, and its counts."""

    turns: int = 0
    end_reason: str = "agent_finished"
    error: str | None = None
    policy_seconds: float = 0.0
    call_keys: list[str] = field(default_factory=list)


async def _act(trajectory: TokenTrajectory, renderer: ChatRenderer, policy: Policy, toolbox: Toolbox,
               context: ToolContext, config: AgentConfig) -> _Loop:
    """The policy's turns, each answered by the tools, until it stops calling tools or a limit ends it."""
    loop = _Loop()
    while True:
        if loop.turns >= config.max_turns:
            loop.end_reason = "turn_limit"
            return loop
        room = config.context_budget_tokens - len(trajectory)
        if room <= 0:
            loop.end_reason = "context_budget"
            return loop
        t0 = time.monotonic()
        try:
            generation = await policy.generate(list(trajectory.tokens), min(config.max_new_tokens_per_turn, room),
                                               [renderer.im_end_id], messages=list(trajectory.messages))
        except Exception as failure:  # the policy backend, not the agent, failed
            loop.end_reason, loop.error = "policy_error", f"{type(failure).__name__}: {failure}"
            return loop
        loop.policy_seconds += time.monotonic() - t0
        loop.turns += 1
        closed = renderer.add_agent_turn(trajectory, generation.token_ids, generation.logprobs, generation.text)
        items, _ = parse_tool_calls(generation.text)
        if not items:
            loop.end_reason = "agent_finished" if closed else "cut_without_call"
            if not closed:
                renderer.close_cut_turn(trajectory)
            return loop
        responses = []
        for item in items:
            if isinstance(item, ToolCall):
                loop.call_keys.append(item.key())
            responses.append(await toolbox.execute(item, context))
        env_ids = renderer.environment_ids_for_tools(responses, closed)
        if len(trajectory) + len(env_ids) > config.context_budget_tokens:
            loop.end_reason = "context_budget"
            if not closed:
                renderer.close_cut_turn(trajectory)
            return loop
        renderer.add_tool_responses(trajectory, responses, closed, token_ids=env_ids)


async def _final_solution(context: ToolContext) -> tuple[dict | None, dict[str, bytes], list[EvaluationRecord]]:
    """(record, files, evaluations made at the end): the best correct profile of the episode, else the
    last solution (and the last verified one) profiled now, when there is an evaluator."""
    final_evaluations: list[EvaluationRecord] = []
    best = best_correct_evaluation(context.evaluations)
    if best is None and context.evaluator is not None:
        final_evaluations = await _final_evaluations(context)
        best = best_correct_evaluation(final_evaluations)
    if best is not None:
        return best.record, best.files, final_evaluations
    if final_evaluations:
        return final_evaluations[0].record, final_evaluations[0].files, final_evaluations
    return None, {}, final_evaluations


def _final_status_and_reward(final_record: dict | None, evaluated: bool, end_reason: str) -> tuple[str, float | None]:
    """The episode's status and reward: infrastructure and policy failures are not scored (None)."""
    if end_reason == "policy_error":
        # The policy backend failed, not the agent: the episode is not scored (its partial
        # solution is still graded, for the transcript).
        return "policy_error", None
    if final_record is None:
        return ("no_solution", -1.0) if evaluated else ("not_evaluated", None)
    if is_infra_error(final_record):
        return "infra_error", None
    reward = record_reward(final_record)
    if reward is None and not is_correct(final_record):
        reward = -1.0
    return str(final_record.get("status", "unknown")), reward


async def run_episode(
    task: Task,
    policy: Policy,
    tokenizer: Any,
    config: AgentConfig,
    evaluator: EvaluatorGateway | None,
    workspace_dir: str | Path,
    tools: list[Tool] | None = None,
    evaluator_salt: str | None = None,
) -> EpisodeResult:
    """Run one episode in a fresh workspace at `workspace_dir` and grade its final solution.

    `evaluator_salt` (bridge clients only): identical jobs with the same salt are evaluated once.
    """
    start = time.monotonic()
    tools = tools if tools is not None else default_tools()
    workspace: Workspace = create_workspace(workspace_dir, task.name, task.source, uid_base=config.sandbox.uid_base)
    context = ToolContext(workspace=workspace, config=config, evaluator=evaluator, evaluator_salt=evaluator_salt)
    toolbox = Toolbox(tools)
    renderer = ChatRenderer(tokenizer)
    trajectory = renderer.start(system_prompt(tools), task_message(task.name, config.backend))
    try:
        loop = await _act(trajectory, renderer, policy, toolbox, context, config)
    finally:
        for job in list(context.background.values()):
            await job.kill()
        context.background.clear()
        workspace.release()

    final_record, final_solution, final_evaluations = await _final_solution(context)
    final_status, reward = _final_status_and_reward(final_record, evaluator is not None, loop.end_reason)
    correct = final_record is not None and is_correct(final_record)
    return EpisodeResult(
        task=task.name,
        trajectory=trajectory,
        turns=loop.turns,
        end_reason=loop.end_reason,
        tool_calls=toolbox.stats.calls,
        tool_counts=dict(toolbox.stats.per_tool),
        tool_failures=toolbox.stats.failures,
        schema_violations=toolbox.stats.schema_violations,
        redundant_loop=_repeats_in_a_row(loop.call_keys) >= config.redundant_repeat_limit,
        final_status=final_status,
        reward=reward,
        best_speedup_vs_compile=record_speedup(final_record, "compile") if correct else None,
        best_speedup_vs_eager=record_speedup(final_record, "eager") if correct else None,
        final_solution=final_solution,
        final_record=final_record,
        evaluations=context.evaluations + final_evaluations,
        workspace=workspace.root,
        wall_seconds=time.monotonic() - start,
        policy_seconds=loop.policy_seconds,
        tool_seconds=toolbox.stats.seconds,
        evaluator_seconds=context.evaluator_seconds,
        error=loop.error,
        timings={
            "evaluator_agent_side_s": context.evaluator_seconds,
            "evaluator_worker_side_s": context.evaluator_worker_seconds,
            "bridge_overhead_s": max(0.0, context.evaluator_seconds - context.evaluator_worker_seconds),
        },
    )


async def run_episodes(
    tasks: Sequence[Task],
    make_policy: Callable[[Task, int], Policy],
    tokenizer: Any,
    config: AgentConfig,
    evaluator: EvaluatorGateway | None,
    episodes_dir: str | Path,
    concurrency: int = 8,
    on_done: Callable[[EpisodeResult], None] | None = None,
    salt_per_episode: bool = False,
) -> list[EpisodeResult]:
    """Run one episode per task (tasks may repeat), at most `concurrency` at a time, in task order.

    `salt_per_episode`: every episode gets its own evaluations even of byte-identical solutions.
    Its salt names the batch (the directory's name and a random id drawn per call, so that a
    broker's stored results of an earlier batch never answer this one) and the episode's index.
    """
    episodes_dir = Path(episodes_dir)
    gate = asyncio.Semaphore(max(1, concurrency))
    batch_id = uuid.uuid4().hex[:12]

    async def one(index: int, task: Task) -> EpisodeResult:
        async with gate:
            result = await run_episode(
                task,
                make_policy(task, index),
                tokenizer,
                config,
                evaluator,
                episodes_dir / f"{index:05d}_{task.name}" / "workspace",
                evaluator_salt=f"{episodes_dir.name}/{batch_id}/{index}" if salt_per_episode else None,
            )
        if on_done is not None:
            on_done(result)
        return result

    return list(await asyncio.gather(*(one(i, task) for i, task in enumerate(tasks))))


__all__ = ["Task", "load_task", "EpisodeResult", "run_episode", "run_episodes", "best_correct_evaluation", "IM_END"]
