"""The system prompt (rules + tool schemas + call format) and the task message of an episode."""

from __future__ import annotations

import json

from agent.tools.base import Tool
from cuda_agent.contracts import AUTO_BACKEND, resolve_backend

SYSTEM_INTRO = """You are an expert CUDA engineer working in a kernel workspace.
Your job: make `ModelNew` in model_new.py compute exactly what `Model` in model.py computes, using
your own kernels in kernels/, and make it faster than torch.compile. Read SKILL.md first; its rules
are enforced by the evaluator (no torch compute in model_new.py, no torch:: compute in C++, do not
edit model.py or the harness files). Use compile, verify and profile to build, check and time your
solution on the evaluator; iterate until it is correct and fast. When you are finished, reply without
any tool call."""

CALL_FORMAT = """To use a tool, write a JSON object with the tool's name and its arguments between
<tool_call> and </tool_call> tags, for example:
<tool_call>
{"name": "Read", "arguments": {"file_path": "model.py"}}
</tool_call>
You may make several calls in one turn; their results come back in <tool_response> tags."""


def tools_section(tools: list[Tool]) -> str:
    """The tool schemas, one JSON object per line, inside <tools> tags."""
    lines = "\n".join(json.dumps(tool.schema()) for tool in tools)
    return f"Available tools:\n<tools>\n{lines}\n</tools>"


def system_prompt(tools: list[Tool]) -> str:
    return f"{SYSTEM_INTRO}\n\n{tools_section(tools)}\n\n{CALL_FORMAT}"


def task_message(task_name: str, backend: str) -> str:
    if backend == AUTO_BACKEND:
        backend = resolve_backend(backend)
    target = "an NVIDIA GPU (kernels/*.cu)" if backend == "cuda" else "the CPU host backend (kernels/*.cpp)"
    return (
        f"Task `{task_name}`: the reference operator is in model.py. Write model_new.py and the kernels "
        f"for {target}, following SKILL.md. Then compile, verify and profile."
    )


