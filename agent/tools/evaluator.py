"""compile, verify and profile: the workspace's solution goes to the evaluator fleet.

The agent never runs the grader: these tools send `model_new.py` and `kernels/**` through the
evaluator gateway (the bridge client) with the task source the episode was given, and return
the evaluator's report as text. Every verify/profile record is kept for the final-solution rule.
"""

from __future__ import annotations

import time
from typing import Any

from cuda_agent.contracts import evaluation_job

from agent.evaluator_report import files_digest, format_compile_report, format_evaluation_report
from agent.tools.base import EvaluationRecord, Tool, ToolContext, ToolFailure
from cuda_agent.contracts import WORKSPACE_ENTRY


def evaluator_settings(context: ToolContext, profile: bool) -> dict[str, Any]:
    return {**context.config.evaluator_settings, "backend": context.config.backend, "profile": profile}


async def submit_to_evaluator(context: ToolContext, service: str, job: dict) -> tuple[dict, float]:
    """Send one job; a gateway failure becomes an infra_error record (never a verdict)."""
    if context.evaluator is None:
        raise ToolFailure("no evaluator is connected to this episode")
    start = time.monotonic()
    try:
        timeout = context.config.evaluator_timeout_seconds
        if context.evaluator_salt is None:
            record = await context.evaluator.submit(service, job, timeout=timeout)
        else:
            record = await context.evaluator.submit(service, job, timeout=timeout, salt=context.evaluator_salt)
    except Exception as error:  # the bridge's failures (timeout, broker gone) are infrastructure
        record = {"status": "infra_error", "diagnostics": [{"message": f"evaluator unavailable: {type(error).__name__}: {error}"}]}
    seconds = time.monotonic() - start
    context.evaluator_seconds += seconds
    if not isinstance(record, dict):
        record = {"status": "infra_error", "diagnostics": [{"message": "evaluator returned a malformed reply"}]}
    context.evaluator_worker_seconds += worker_seconds(record)
    return record, seconds


def worker_seconds(record: dict) -> float:
    """The evaluator's own time for a job: its total wall time, or the build time of a compile."""
    wall = record.get("wall_s")
    if isinstance(wall, dict) and isinstance(wall.get("total"), (int, float)):
        return float(wall["total"])
    build = record.get("build_seconds")
    if record.get("cache_hit") or not isinstance(build, (int, float)):
        return 0.0  # a cache hit reports the original build's time, not this lookup's
    return float(build)


def _solution(context: ToolContext) -> dict[str, bytes]:
    files = context.workspace.solution_files()
    if WORKSPACE_ENTRY not in files:
        raise ToolFailure(f"{WORKSPACE_ENTRY} does not exist yet")
    return files


_NO_ARGUMENTS = {"type": "object", "properties": {}, "required": []}


class CompileTool(Tool):
    name = "compile"
    description = "Build the workspace's kernels (kernels/*) into the cuda_extension module on the evaluator; returns compiler diagnostics."
    parameters = _NO_ARGUMENTS

    async def run(self, context: ToolContext, arguments: dict[str, Any]) -> str:
        files = _solution(context)
        job = evaluation_job(context.workspace.task_name, context.workspace.task_source, files, evaluator_settings(context, False))
        record, _ = await submit_to_evaluator(context, "compile", job)
        artifact = record.get("artifact")
        if record.get("status") == "built" and isinstance(artifact, (bytes, bytearray)):
            context.artifacts[files_digest(files)] = bytes(artifact)
        return format_compile_report(record)


class _EvaluateTool(Tool):
    profile = False

    async def run(self, context: ToolContext, arguments: dict[str, Any]) -> str:
        files = _solution(context)
        job = evaluation_job(
            context.workspace.task_name,
            context.workspace.task_source,
            files,
            evaluator_settings(context, self.profile),
            artifact=context.artifacts.get(files_digest(files)),
        )
        record, seconds = await submit_to_evaluator(context, "evaluate", job)
        context.evaluations.append(EvaluationRecord(tool=self.name, files=files, record=record, seconds=seconds))
        return format_evaluation_report(record, profiled=self.profile)


class VerifyTool(_EvaluateTool):
    name = "verify"
    description = "Check model_new.py + kernels against the reference model.py on fresh random inputs (builds first if needed)."
    parameters = _NO_ARGUMENTS
    profile = False


class ProfileTool(_EvaluateTool):
    name = "profile"
    description = "Verify, then time the solution against PyTorch eager and torch.compile; returns times, speed-ups and the milestone reward."
    parameters = _NO_ARGUMENTS
    profile = True
