"""One schedule for all of a candidate's calls, so that checks and timed calls look alike.

Every call, checked or timed, takes the same path through the candidate child. The check sets
sit at secret random positions among the warm-up and timed calls, and a secret sample of the
timed calls is checked as well (docs/cheats.md #10, #11). An input set crosses the channel with
its first call, never ahead, so no future input is in the candidate's process; a set that later
calls reuse (rotating timed sets) is kept there under an opaque id and named, not sent again.
When any set is reused, every set is kept, check sets too, so that first calls all look alike.
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
    """The request of each call of a schedule: its input set sent with its first call, or named
    by the opaque id the candidate child keeps it under."""

    def __init__(self, schedule: list[Call], check_inputs: list, timed_inputs: list, l2_flush_bytes: int,
                 launch_pad_cycles: int | None = None):
        self.keep_sets = len(set(schedule)) < len(schedule)
        self.kept: dict = {}
        self.inputs = {"check": check_inputs, "timed": timed_inputs}
        self.l2_flush_bytes = l2_flush_bytes
        self.launch_pad_cycles = launch_pad_cycles

    def request(self, position: int, call: Call) -> dict:
        message = {"cmd": "call", "poison": position % 2, "l2_flush_bytes": self.l2_flush_bytes,
                   "launch_pad_cycles": self.launch_pad_cycles}
        if call in self.kept:
            message["set"] = self.kept[call]
        else:
            kind, index = call
            message["inputs"] = self.inputs[kind][index]
            if self.keep_sets:
                self.kept[call] = message["keep_as"] = secrets.token_hex(8)
        return message
