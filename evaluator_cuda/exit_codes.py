"""Exit codes of `cuda-agent bench` and `cuda-agent evaluate`.

    0  every evaluation ended in a verdict and every candidate is correct
    1  a verdict failure: some candidate is not correct (compile_error, runtime_error, incorrect)
    2  a usage error: a bad option, a missing file, a backend this machine cannot run
    3  a refused task: a task file is malformed or its reference is degenerate (task_error)
    4  an infrastructure failure: the harness itself failed (infra_error)

When several apply, the highest wins: an infrastructure failure hides the rest.
"""

from __future__ import annotations

OK = 0
VERDICT_FAILURE = 1
USAGE_ERROR = 2
TASK_REFUSED = 3
INFRA_FAILURE = 4

HELP = ("Exit codes: 0 all correct; 1 a candidate failed its verdict; 2 usage error; "
        "3 a task was refused; 4 infrastructure failure (the harness failed).")


def exit_code(statuses: list[str], refused_tasks: int = 0) -> int:
    """The exit code of a run whose evaluations ended in `statuses`, with `refused_tasks` refused tasks."""
    if "infra_error" in statuses:
        return INFRA_FAILURE
    if refused_tasks or "task_error" in statuses:
        return TASK_REFUSED
    if any(status != "correct" for status in statuses):
        return VERDICT_FAILURE
    return OK
