"""What goes into a build: the workspace files each backend compiles, one rule for both build
paths. The harness files are always the templates' (cuda_agent/templates), never a workspace copy."""

from __future__ import annotations

from pathlib import Path

from cuda_agent.workspace import HARNESS_FILES

HEADER_SUFFIXES = (".h", ".cuh", ".hpp", ".inl")


def select_sources(files: dict[str, bytes], backend: str) -> dict[str, bytes]:
    """The workspace files that go into the build on `backend` (relpaths under kernels/)."""
    chosen = {}
    for rel, data in files.items():
        path = Path(rel)
        if not path.parts or path.parts[0] != "kernels" or path.name in HARNESS_FILES:
            continue
        if path.is_absolute() or ".." in path.parts or "\\" in rel:
            continue  # a path that would leave the staging folder is never written, let alone compiled
        is_binding = path.name.endswith("_binding.cpp")
        if path.suffix in HEADER_SUFFIXES or is_binding:
            chosen[rel] = data
        elif backend == "cuda" and path.suffix == ".cu":
            chosen[rel] = data
        elif backend == "host" and path.suffix == ".cpp":
            chosen[rel] = data
    return chosen
