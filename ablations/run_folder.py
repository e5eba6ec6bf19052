"""The output folder of a run: the config it was started with, the iteration records, the checkpoints.

A run in the folder is continued only with the config it was started with (`ablation.json`; where the
folder is, `output_dir`, aside). Records are appended a whole line at a time and flushed to disk; a line
without its newline was cut short by a stop and is left out. Rewrites replace the file in one rename.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
from pathlib import Path
from typing import Any, Iterator

from ablations.config import AblationConfig, AblationConfigError
from ablations.report_data import CONFIG_FILE, DATA_FILE

CHECKPOINTS = "checkpoints"
REPORT = "report.md"
LOCK = ".lock"
_ABSENT = object()


def _comparable(raw: Any) -> dict[str, Any]:
    config = json.loads(json.dumps(raw, sort_keys=True, default=str))
    config.pop("output_dir", None)
    return config


def _differences(ours: Any, theirs: Any, path: str = "") -> list[str]:
    """The key paths where two configs differ."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        keys = sorted(set(ours) | set(theirs))
        return [d for k in keys for d in _differences(ours.get(k, _ABSENT), theirs.get(k, _ABSENT), f"{path}.{k}")]
    return [] if ours == theirs else [path.lstrip(".") or "the whole config"]


@dataclasses.dataclass(frozen=True)
class RunFolder:
    path: Path

    @property
    def data(self) -> Path:
        return self.path / DATA_FILE

    @property
    def config_file(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    def holds_a_run(self) -> bool:
        return self.config_file.is_file() or self.checkpoints.exists() or (self.data.is_file() and
                                                                           self.data.stat().st_size > 0)

    def check_config(self, cfg: AblationConfig) -> None:
        try:
            theirs = json.loads(self.config_file.read_text())
        except ValueError:
            theirs = None
        if not isinstance(theirs, dict):
            raise AblationConfigError(f"{self.config_file} is not a config; pass --no-resume to start over")
        differ = _differences(_comparable(cfg.raw), _comparable(theirs))
        if differ:
            shown = ", ".join(differ[:3]) + (f" and {len(differ) - 3} more" if len(differ) > 3 else "")
            raise AblationConfigError(f"{self.path} holds a run started with another config ({shown} differ); "
                                      f"pass --no-resume to start over, or choose another --out")

    def start(self, cfg: AblationConfig) -> None:
        """Remove a run's files (no others) and write the config: a new run starts."""
        shutil.rmtree(self.checkpoints, ignore_errors=True)
        for name in (DATA_FILE, REPORT):
            (self.path / name).unlink(missing_ok=True)
        self.path.mkdir(parents=True, exist_ok=True)
        self.data.write_text("")
        self.config_file.write_text(json.dumps(cfg.raw, indent=2, sort_keys=True, default=str) + "\n")

    def read_records(self) -> tuple[list[dict[str, Any]], bool]:
        """The records, and whether a last line cut short was left out."""
        text = self.data.read_text() if self.data.is_file() else ""
        *lines, tail = text.split("\n")
        records = []
        for number, line in enumerate(lines, 1):
            try:
                records.append(json.loads(line))
            except ValueError:
                raise AblationConfigError(f"{self.data}: line {number} is not a record; pass --no-resume "
                                          f"to start over") from None
        return records, bool(tail)

    def append(self, *records: dict[str, Any]) -> None:
        with self.data.open("a") as f:
            f.write("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
            f.flush()
            os.fsync(f.fileno())

    def rewrite(self, records: list[dict[str, Any]]) -> None:
        part = self.data.with_name(self.data.name + ".part")
        with part.open("w") as f:
            f.write("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
            f.flush()
            os.fsync(f.fileno())
        os.replace(part, self.data)


def open_folder(cfg: AblationConfig, out_dir: str | Path, resume: bool) -> tuple[RunFolder, bool]:
    """The output folder and whether it holds a run to continue (`resume` and a run in it); a run of
    another config is refused. Otherwise the folder starts a new run."""
    folder = RunFolder(Path(out_dir))
    if resume and folder.config_file.is_file():
        folder.check_config(cfg)
        return folder, True
    if resume and folder.holds_a_run():
        raise AblationConfigError(f"{folder.path} holds run data but no {CONFIG_FILE}; pass --no-resume to "
                                  f"start over, or choose another --out")
    folder.start(cfg)
    return folder, False


@contextlib.contextmanager
def locked(out_dir: str | Path) -> Iterator[None]:
    """The folder to this process alone while the block lasts; a second run on it is refused."""
    path = Path(out_dir)
    path.mkdir(parents=True, exist_ok=True)
    with open(path / LOCK, "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise AblationConfigError(f"another run is writing to {path}; wait for it to end or choose another "
                                      f"--out") from None
        yield
