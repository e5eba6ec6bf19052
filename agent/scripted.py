"""Scripts for the scripted policy: an honest solver that replays a known-good solution, and a cheater.

The honest script reads the task and the rules, writes the solution's files, compiles,
verifies and profiles, then stops. The cheating scripts: one tries to edit the reference, then
submits a ModelNew that inherits the reference's torch forward (no kernel of its own); the
other ships real kernels but computes the forward with torch anyway.
"""

from __future__ import annotations

from pathlib import Path

from agent.tool_calls import format_tool_call
from cuda_agent.contracts import WORKSPACE_ENTRY
from cuda_agent.workspace import KERNELS_DIR


def read_solution_dir(solution_dir: str | Path) -> dict[str, str]:
    """model_new.py and kernels/** of a workspace-format solution directory, as text."""
    root = Path(solution_dir)
    if not (root / WORKSPACE_ENTRY).is_file():
        raise FileNotFoundError(f"no {WORKSPACE_ENTRY} in solution directory {root}")
    files = {WORKSPACE_ENTRY: (root / WORKSPACE_ENTRY).read_text()}
    for path in sorted((root / KERNELS_DIR).rglob("*")) if (root / KERNELS_DIR).is_dir() else []:
        if path.is_file():
            files[path.relative_to(root).as_posix()] = path.read_text()
    return files


def honest_solver_turns(solution_files: dict[str, str]) -> list[str]:
    """Turn texts that solve a task by writing a known-good solution and checking it."""
    writes = "\n".join(format_tool_call("Write", {"file_path": path, "content": text}) for path, text in solution_files.items())
    return [
        "Let me read the reference and the rules.\n"
        + format_tool_call("Read", {"file_path": "model.py"})
        + "\n"
        + format_tool_call("Bash", {"command": "ls -la && head -n 20 SKILL.md"}),
        "I will write the kernels, their binding and model_new.py.\n" + writes,
        "Build it.\n" + format_tool_call("compile", {}),
        "Check correctness.\n" + format_tool_call("verify", {}),
        "Time it against eager and torch.compile.\n" + format_tool_call("profile", {}),
    ]


def cheating_turns(task_source: str) -> list[str]:
    """Turn texts of a policy that tries to win without writing a kernel."""
    inherited = task_source + "\n\nclass ModelNew(Model):\n    pass\n"
    return [
        "Make the reference trivially match.\n"
        + format_tool_call("Write", {"file_path": "model.py", "content": "# emptied\n"})
        + "\n"
        + format_tool_call("Bash", {"command": "chmod u+w model.py; echo '# emptied' > model.py; cat model.py | head -n 3"}),
        "Reuse the reference's forward.\n" + format_tool_call("Write", {"file_path": WORKSPACE_ENTRY, "content": inherited}),
        format_tool_call("verify", {}),
    ]


def torch_fallback_turns(task_source: str, solution_files: dict[str, str]) -> list[str]:
    """Turn texts of a policy that builds honest kernels but never calls them (torch computes)."""
    kernels = {path: text for path, text in solution_files.items() if path != WORKSPACE_ENTRY}
    model_new = task_source + "\n\nimport cuda_extension  # built, never used\n\nclass ModelNew(Model):\n    pass\n"
    writes = "\n".join(format_tool_call("Write", {"file_path": p, "content": t}) for p, t in {**kernels, WORKSPACE_ENTRY: model_new}.items())
    return [writes, format_tool_call("compile", {}), format_tool_call("profile", {})]
