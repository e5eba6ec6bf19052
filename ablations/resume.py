"""What a resumed run starts from: its records brought in line with its checkpoints.

An iteration's checkpoint is saved before its record is appended, so after a stop the records of an arm
and seed are those of the iterations its checkpoint holds, less perhaps the last one (then taken from the
checkpoint's data), plus perhaps lines of an iteration whose checkpoint was not saved (then dropped). A
run that ended on a non-finite loss or parameters ends with a `stopped` line and is kept as it is.
"""

from __future__ import annotations

from typing import Any, Callable

from ablations.checkpoints import arm_progress
from ablations.config import AblationConfig, AblationConfigError
from ablations.run_folder import RunFolder

Records = dict[tuple[str, int], list[dict[str, Any]]]  # (arm, seed) -> records in iteration order


def finished(records: list[dict[str, Any]], iterations: int) -> bool:
    return bool(records) and (bool(records[-1].get("stopped")) or len(records) == iterations)


def arm_records(found: list[dict[str, Any]], done: int, last: dict[str, Any] | None,
                label: str = "an arm") -> list[dict[str, Any]]:
    """One arm and seed's records in line with its checkpoint (`done` iterations, `last` the last record)."""
    found = sorted(found, key=lambda r: r["iteration"])
    if found and found[-1].get("stopped"):
        return found
    kept = [r for r in found if r["iteration"] < done]
    if last is not None and len(kept) == done - 1:
        kept.append(last)
    if [r["iteration"] for r in kept] != list(range(done)):
        raise AblationConfigError(f"the records of {label} do not match its checkpoint of "
                                  f"{done} iterations; pass --no-resume to start over")
    return kept


def records_in_line(folder: RunFolder, cfg: AblationConfig, say: Callable[[str], None]) -> Records:
    """Every arm and seed's records; the file is rewritten when it held more, fewer or a cut line."""
    found, cut = folder.read_records()
    by_run: Records = {}
    for record in found:
        by_run.setdefault((record["arm"], record["seed"]), []).append(record)
    kept: Records = {}
    for arm in cfg.arms:
        for seed in cfg.seeds:
            done, last = arm_progress(folder.checkpoints, arm, seed)
            kept[(arm.name, seed)] = arm_records(by_run.get((arm.name, seed), []), done, last,
                                                 f"arm {arm.name} seed {seed}")
    lines = [r for records in kept.values() for r in records]
    if cut or lines != found:
        say(f"{folder.data.name}: {len(found)} records{' and a line cut short' if cut else ''} brought in line "
            f"with the checkpoints, {len(lines)} records")
        folder.rewrite(lines)
    return kept
