"""One schedule for all of a candidate's calls, so that checks and timed calls look alike.

Every call, checked or timed, takes the same path through the candidate child. The check sets
sit at secret random positions among the warm-up and timed calls, and a secret sample of the
timed calls is checked as well (docs/cheats.md #10, #11). An input set reaches the candidate's
process with its first call, never ahead, so no future input is there: as the seed the candidate
child makes it from (every call a fresh seed), or, when sets are sent, as its bytes; a sent set
that later calls reuse (rotating timed sets) is kept there under an opaque id and named, not sent
again. When any set is reused, every set is kept, check sets too, so that first calls all look alike.
"""

from __future__ import annotations

import secrets

Call = tuple[str, int]  # ("check" or "timed", index of its input set)


def call_schedule(checks: int, timed_calls: int, timed_sets: int, checked_timed: int) -> tuple[list[Call], set[int]]:
    """The calls in order, and the positions of the timed calls whose outputs are checked too."""
    rng = secrets.SystemRandom()
    schedule = [("check", i) for i in range(checks)] + [("timed", j % max(timed_sets, 1)) for j in range(timed_calls)]
    rng.shuffle(schedule)
    timed_positions = [k for k, (kind, _) in enumerate(schedule) if kind == "timed"]
    sampled = set(rng.sample(timed_positions, min(checked_timed, len(timed_positions))))
    return schedule, sampled


class CallRequests:
    """The request of each call of a schedule: the seed its input set is made from in the candidate
    child (`seeds` given: {"check": [...], "timed": [...]}, the sets made where `generated_on` says), or
    the set itself sent with its first call, or named by the opaque id the candidate child keeps it under."""

    def __init__(self, schedule: list[Call], check_inputs: list, timed_inputs: list, l2_flush_bytes: int,
                 launch_pad_cycles: int | None = None, seeds: dict | None = None, generated_on: str | None = None):
        self.seeds, self.generated_on = seeds, generated_on
        self.keep_sets = seeds is None and len(set(schedule)) < len(schedule)
        self.kept: dict = {}
        self.inputs = {"check": check_inputs, "timed": timed_inputs}
        self.l2_flush_bytes = l2_flush_bytes
        self.launch_pad_cycles = launch_pad_cycles

    def request(self, position: int, call: Call) -> dict:
        message = {"cmd": "call", "poison": position % 2, "l2_flush_bytes": self.l2_flush_bytes,
                   "launch_pad_cycles": self.launch_pad_cycles}
        if self.seeds is not None:
            kind, index = call
            message.update(seed=self.seeds[kind][index], generated_on=self.generated_on)
        elif call in self.kept:
            message["set"] = self.kept[call]
        else:
            kind, index = call
            message["inputs"] = self.inputs[kind][index]
            if self.keep_sets:
                self.kept[call] = message["keep_as"] = secrets.token_hex(8)
        return message
