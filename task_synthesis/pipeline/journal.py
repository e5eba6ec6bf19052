"""The run's journal: one JSON line per decided candidate, fsynced, next to the output file.

The first line holds the settings the run was started with; a resume must use the same ones
(the count may grow). A crash loses only the candidates in flight: they were never written, and
the same (category, index) gives the same candidate again. A last line cut by the crash is ignored.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

JOURNAL_VERSION = 1


class JournalError(ValueError):
    """A journal that does not belong to this run; str() is one line."""


def journal_path(out: Path) -> Path:
    return out.with_name(out.name + ".journal.jsonl")


class Journal:
    def __init__(self, path: Path, settings: dict):
        self.path = Path(path)
        self.entries: list[dict] = []
        if self.path.exists():
            self._read(settings)
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._append({"kind": "header", "version": JOURNAL_VERSION, "settings": settings})

    def _read(self, settings: dict) -> None:
        lines = self.path.read_text().splitlines()
        records = []
        for i, line in enumerate(lines):
            try:
                records.append(json.loads(line))
            except ValueError:
                if i != len(lines) - 1:
                    raise JournalError(f"{self.path}: line {i + 1} is not JSON") from None
        if not records or records[0].get("kind") != "header":
            raise JournalError(f"{self.path}: no header line")
        theirs = records[0]["settings"]
        differ = sorted(k for k in set(theirs) | set(settings) if theirs.get(k) != settings.get(k))
        if differ:
            raise JournalError(f"{self.path} was written with other settings ({', '.join(differ)} differ); "
                               "use another --out or remove it")
        self.entries = [r for r in records[1:] if r.get("kind") == "candidate"]
        if lines and not lines[-1].endswith("}"):  # a line cut by a crash: rewrite the file without it
            self.path.write_text("\n".join(lines[:-1]) + "\n")

    def _append(self, record: dict) -> None:
        with open(self.path, "a") as handle:
            handle.write(json.dumps(record, sort_keys=True) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def add(self, entry: dict) -> None:
        entry = {"kind": "candidate", **entry}
        self._append(entry)
        self.entries.append(entry)
