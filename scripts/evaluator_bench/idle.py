"""Subcommand `idle`: does the GPU's idle time between calls change a small kernel's time?

In the GPU self-check the candidate child is slower than the baselines by 0.2-1.5 µs a call on the 7-15 µs
kernels of examples/kernelbench_level1, while in one process the two ways of preparing a call agree within
2 % (`placement --paths`). One thing differs between the two processes and not within one: the baselines'
calls run back to back (the GPU idles a fraction of a millisecond between them), while each of the candidate's
calls is a round trip through the channel (3.5-6.5 ms a call, of which the GPU is busy for the cache flush and
the 2 ms launch pad): the GPU idles 1.5-4 ms before every call. If the GPU slows a kernel that follows an idle
stretch (its clocks, its power state), that is enough to explain the gap.

Each task's Model is timed in one process with the baseline's preparation (roles/reference.py
`CandidateLikeCalls`, timing/profile.py `time_forward`), in interleaved rounds of 10 calls, five ways:
  back to back       as the baselines are timed today;
  idle 2 ms, 4 ms    the host waits that long before preparing each call, the GPU idle meanwhile;
  idle 4 ms, pad x4  the same wait, with a launch pad four times as long before each call;
  busy 4 ms          the same wait, with the GPU kept spinning through it;
  idle 4 ms, sent    the same wait, then the input set copied from host memory to the device before the
                     copies for the call are made (the candidate child receives each set that way).
The table gives each way's median and its ratio to back to back. Exit status 0 when every task ran, 1 when
one failed, 2 without a GPU or for a missing task file. With $OUT set, writes $OUT/bench_evaluator_idle.json.
"""

from __future__ import annotations

import contextlib
import statistics
import time

from evaluator_bench.common import load_task
from evaluator_bench.placement import DEFAULT_TASKS, FLUSH_BYTES, LEVEL1, each_task
from evaluator_bench.report import Clock, fmt

# name: (host wait before each call in ms, launch pad multiple, GPU kept busy through the wait, inputs sent
# from host memory before each call)
WAYS = {
    "back to back": (0.0, 1, False, False),
    "idle 2 ms": (2.0, 1, False, False),
    "idle 4 ms": (4.0, 1, False, False),
    "idle 4 ms, pad x4": (4.0, 4, False, False),
    "busy 4 ms": (4.0, 1, True, False),
    "idle 4 ms, sent": (4.0, 1, False, True),
}
SPIN_CYCLES_PER_MS = 1_700_000  # torch.cuda._sleep counts GPU cycles; an H100/H200 runs at about 1.7-2 GHz


def add_arguments(parser) -> None:
    parser.add_argument("--tasks", nargs="*", default=DEFAULT_TASKS, help="task stems under " + str(LEVEL1))
    parser.add_argument("--rounds", type=int, default=8, help="interleaved rounds of 10 timed calls per way")
    parser.add_argument("--budget-s", type=float, default=240.0, help="skip the remaining tasks past this")


def main(args) -> int:
    return each_task(args, "idle", lambda clock, stem: idle_rows(clock, stem, args.rounds), print_rows)


class _Waiting:
    """The baseline's preparation of a call, after the host waits `wait_ms` (the GPU spinning through the
    wait when `busy`); with `sent`, the input set first copied anew from host memory to the device."""

    def __init__(self, calls, wait_ms: float, busy: bool, device: str, sent: bool = False):
        self.calls, self.wait_ms, self.busy, self.device = calls, wait_ms, busy, device
        self.host_inputs = [x.cpu() if hasattr(x, "cpu") else x for x in calls.inputs] if sent else None

    def prepare(self, position: int) -> None:
        if self.wait_ms > 0:
            if self.busy and self.device == "cuda":
                import torch

                torch.cuda._sleep(int(self.wait_ms * SPIN_CYCLES_PER_MS))
            time.sleep(self.wait_ms / 1000.0)
        if self.host_inputs is not None:
            self.calls.inputs = [x.to(self.device, copy=True) if hasattr(x, "to") else x for x in self.host_inputs]
        self.calls.prepare(position)

    def __call__(self):
        return self.calls()


@contextlib.contextmanager
def _pad(multiple: int):
    """The launch pad of time_forward, `multiple` times as long for the duration."""
    from evaluator_cuda.timing import profile

    saved = profile.LAUNCH_PAD_CYCLES
    profile.LAUNCH_PAD_CYCLES = saved * multiple
    try:
        yield
    finally:
        profile.LAUNCH_PAD_CYCLES = saved


def idle_rows(clock: Clock, stem: str, rounds: int, device: str = "cuda", wait_scale: float = 1.0) -> list[dict]:
    """Each way's median over `rounds` interleaved rounds of 10 timed calls (`device` "cpu" and a small
    `wait_scale`: a dry run)."""
    import torch

    from evaluator_cuda.roles.reference import CandidateLikeCalls
    from evaluator_cuda.timing.profile import time_forward

    namespace = load_task(LEVEL1 / f"{stem}.py")
    with torch.device(device):
        model = namespace["Model"](*namespace["get_init_inputs"]()).eval()
        inputs = namespace["get_inputs"]()
    ways = {name: _Waiting(CandidateLikeCalls(model, inputs, device), wait * wait_scale, busy, device, sent)
            for name, (wait, _, busy, sent) in WAYS.items()}
    samples: dict[str, list[float]] = {name: [] for name in WAYS}
    for round_index in range(rounds):
        order = list(WAYS) if round_index % 2 == 0 else list(reversed(WAYS))
        for name in order:
            way = ways[name]
            with _pad(WAYS[name][1]):
                times, _ = time_forward(way, warmup=3, repeats=10, device_type=device,
                                        l2_flush_bytes=FLUSH_BYTES if device == "cuda" else 0, prepare=way.prepare)
            samples[name] += times
    base = statistics.median(samples["back to back"])
    rows = []
    for name in WAYS:
        median = statistics.median(samples[name])
        rows.append({"task": stem, "way": name, "median_us": median, "ratio": median / base, "n": len(samples[name])})
        clock.say(f"{stem}: {name}: {median:.2f} µs ({median / base:.3f} of back to back)")
    return rows


def print_rows(rows: list[dict]) -> None:
    print(f"{'task':36s} {'way':20s} {'median us':>9s} {'/ back to back':>14s}")
    for row in rows:
        print(f"{row['task']:36s} {row['way']:20s} {fmt(row['median_us'], 2):>9s} {fmt(row['ratio'], 3):>14s}")
