"""On-disk cache of the eager and torch.compile baseline times of a task.

Baselines are per-task constants: a key covers the task source, the device name, the torch
version, the compile mode and the timing protocol (warm-up, repeats, L2 flush), so each task's
baselines are measured once per machine type and torch release.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from ..isolation.integrity import intact, seal


def baseline_key(task_source: str, device_name: str, torch_version: str, compile_mode: str, protocol: dict) -> str:
    blob = json.dumps(
        {"task": hashlib.sha256(task_source.encode()).hexdigest(), "device": device_name, "torch": torch_version,
         "compile_mode": compile_mode, "protocol": protocol},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


class BaselineCache:
    """JSON files `<root>/<key>.json` holding {"eager": stats, "compile": stats|None, ...}."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def path(self, key: str) -> Path:
        return self.root / f"{key}.json"

    def get(self, key: str) -> dict | None:
        """The entry when it matches the digest the harness wrote beside it (isolation/integrity.py);
        a tampered or unsealed entry is removed and measured again."""
        if not self.path(key).exists() or not intact(self.path(key)):
            return None
        try:
            data = json.loads(self.path(key).read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) and isinstance(data.get("eager"), dict) else None

    def put(self, key: str, baselines: dict) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.root, suffix=".tmp")
        with os.fdopen(fd, "w") as handle:
            json.dump(baselines, handle, indent=1)
        seal(Path(tmp))
        os.replace(tmp + ".sha256", str(self.path(key)) + ".sha256")
        os.replace(tmp, self.path(key))
