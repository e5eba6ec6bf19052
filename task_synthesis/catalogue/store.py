"""The catalogue on disk: a versioned JSON file, one operator or failure per line for readable diffs."""

from __future__ import annotations

import json
from pathlib import Path

DEFAULT_PATH = Path(__file__).resolve().parent.parent / "data" / "seed_operators.json"


class CatalogueError(ValueError):
    """A missing or malformed catalogue file; str() is one line."""


def save(catalogue: dict, path: str | Path = DEFAULT_PATH) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    head = {k: v for k, v in catalogue.items() if k not in ("operators", "failures")}
    lines = ["{"]
    lines += [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
    lines.append(' "operators": [')
    lines.append(",\n".join(f"  {json.dumps(op, sort_keys=True)}" for op in catalogue["operators"]))
    lines.append(" ],")
    lines.append(' "failures": {')
    lines.append(",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in catalogue["failures"].items()))
    lines.append(" }")
    lines.append("}")
    path.write_text("\n".join(lines) + "\n")
    return path


def load(path: str | Path | None = None) -> dict:
    path = Path(path or DEFAULT_PATH)
    if not path.is_file():
        raise CatalogueError(f"no seed-operator catalogue at {path} (make one with `cuda-agent data crawl`)")
    try:
        catalogue = json.loads(path.read_text())
    except ValueError as exc:
        raise CatalogueError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(catalogue, dict) or not isinstance(catalogue.get("operators"), list):
        raise CatalogueError(f"{path}: no `operators` list")
    return catalogue
