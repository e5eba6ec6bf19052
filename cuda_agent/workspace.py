"""The layout of a CUDA-Agent workspace, shared by the agent and the evaluator: standard library only.

    DIR/model.py              the task (read-only)
    DIR/model_new.py          a starting ModelNew with Model's constructor signature
    DIR/kernels/              where the agent's *.cu / *.cpp kernels and *_binding.cpp go
    DIR/binding.cpp, DIR/binding_registry.h   the harness's binding machinery (read-only, for reading;
                              the evaluator always builds its own copies, from templates/ here)
    DIR/SKILL.md              the rules (docs/paper.md §3)
The grader itself (compile/verify/profile) stays in the evaluator, not in the workspace.
`cuda-agent workspace init TASK DIR` lays one out; the agent makes one per episode.
"""

from __future__ import annotations

import ast
import os
import shutil
import stat
from pathlib import Path

from cuda_agent.contracts import WORKSPACE_ENTRY

TEMPLATES = Path(__file__).parent / "templates"
TASK_FILE = "model.py"
KERNELS_DIR = "kernels"
HARNESS_FILES = ("binding.cpp", "binding_registry.h")  # compiled from TEMPLATES, never from a workspace
SKILL_FILE = "SKILL.md"
TEMPLATE_FILES = (*HARNESS_FILES, SKILL_FILE)
READ_ONLY = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH


class WorkspaceError(Exception):
    """One line for the user."""


def _signature(source: str, method: str) -> str:
    """The parameter list of Model.<method> (without self), as written in the task."""
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == method:
                    args = ast.unparse(item.args)
                    parts = [p.strip() for p in args.split(",")] if args else []
                    return ", ".join(parts[1:]) if parts and parts[0] == "self" else args
    return "*args" if method == "forward" else ""


def starter_model_new(task_source: str) -> str:
    init_args = _signature(task_source, "__init__")
    forward_args = _signature(task_source, "forward")
    return f'''import torch
import torch.nn as nn

import cuda_extension  # built by the evaluator from kernels/ (see SKILL.md)


class ModelNew(nn.Module):
    """Same constructor as Model in model.py, so Model's state_dict loads strictly."""

    def __init__(self{", " + init_args if init_args else ""}):
        super().__init__()
        # Create exactly the parameters and buffers Model creates, with the same names.

    def forward(self{", " + forward_args if forward_args else ""}):
        # Only tensor creation, properties and cuda_extension calls here (no torch compute).
        raise NotImplementedError("call your cuda_extension functions here")
'''


def init_workspace(task_source: str, folder: str | Path) -> Path:
    """Create the workspace for a task's source; refuses a folder that exists and is not empty."""
    folder = Path(folder)
    if folder.exists() and any(folder.iterdir()):
        raise WorkspaceError(f"workspace {folder} exists and is not empty")
    (folder / KERNELS_DIR).mkdir(parents=True, exist_ok=True)
    (folder / TASK_FILE).write_text(task_source)
    (folder / WORKSPACE_ENTRY).write_text(starter_model_new(task_source))
    for name in HARNESS_FILES:
        shutil.copy(TEMPLATES / name, folder / name)
    skill = TEMPLATES / SKILL_FILE
    if not skill.exists():
        raise WorkspaceError("cuda_agent/templates/SKILL.md is missing from this installation")
    shutil.copy(skill, folder / SKILL_FILE)
    for name in (TASK_FILE, *TEMPLATE_FILES):
        os.chmod(folder / name, READ_ONLY)
    return folder
