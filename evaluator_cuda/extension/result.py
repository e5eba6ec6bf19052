"""The outcome of one build, whichever path built it."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class BuildResult:
    status: str  # "built" | "compile_error" | "infra_error"
    diagnostics: list[dict]
    so_path: str | None
    build_seconds: float
    cache_hit: bool
    key: str = ""
    log: str = ""
    path: str = ""  # "fast" or "torch": which build made it (or failed)
    fast_fallback: str | None = None  # why the fast build handed over to the torch build
