"""Subcommand `placement`: does where a call's tensors lie in GPU memory change its time?

The self-check times the task's own Model twice, in two processes (the reference child for the eager
baseline, the candidate child for "ours"), and on kernels of 7-20 µs the two can differ by a few per cent
while each median is precise to a fraction of one. One candidate cause is placement: the two processes'
allocators put the inputs, intermediates and outputs at different addresses. This measures it in one
process, with the evaluator's own timed-call path (timing/profile.py `time_forward`: a 256 MiB cache flush
and a launch pad before each call):
  - input offset: each input copied into a fresh buffer at a byte offset (0 up to just under 2 MiB);
  - held block: a block of that many bytes kept allocated before the calls, so the model's own
    intermediates and outputs land elsewhere in the allocator's pools.
For every task the table gives each offset's median and its ratio to offset 0; the spread across offsets
is what placement alone can do to a self-check's ratio.

With --paths, the same process instead times each task through four ways of preparing a call, in
interleaved rounds: the baseline's (roles/reference.py `CandidateLikeCalls`: the last call's copies and
output freed before new copies are made), the same as it was before (new copies made while the last are
held), and the candidate child's (roles/candidate.py `do_call`: the input set kept on the device, copies
made after the last call's tensors were all freed, pristine inputs held through the call). If the
candidate's way is slower here too, the allocation order of the two children, not their being two
processes, is what separates a self-check's times. A fourth way is the baseline's with one poison pattern
for every call instead of the two that alternate with the call's parity. Each way's even and odd calls are
also given apart: a way whose calls alternate between two states shows two medians.

With --sets, the same interleaved rounds compare where each call's input set comes from: the baseline's way
with one set cloned for every call and with a fresh set made from a seed for each call (`inputs:
made_per_call`), and the candidate's way with each call's set sent (copied in from host memory) and made
from the call's seed on the device (settings.inputs_from_seeds). On the GPU the reductions' self-check
is 9-11 % slow with made sets while the baselines' calls get faster with them; if the candidate's made
way is slower here too, the way its calls are prepared is what costs, not its process.

Exit status 0 when every case ran, 1 when one failed, 2 without a GPU or for a missing task file.
With $OUT set, writes $OUT/bench_evaluator_placement.json.
"""

from __future__ import annotations

import statistics
import sys

from evaluator_bench.common import REPO, gpu_missing, load_task, write_out
from evaluator_bench.report import Clock, fmt

LEVEL1 = REPO / "examples" / "kernelbench_level1" / "level1"
DEFAULT_TASKS = ["6_Swish", "14_MSE_loss", "13_Conv2d_square_input", "9_Sum_reduction_over_a_dimension",
                 "3_ReLU"]
OFFSETS = [0, 4096, 65536, 512 * 1024, 1024 * 1024, 1536 * 1024, 2 * 1024 * 1024 - 4096]
FLUSH_BYTES = 256 * 1024 * 1024


def add_arguments(parser) -> None:
    parser.add_argument("--tasks", nargs="*", default=DEFAULT_TASKS, help="task stems under " + str(LEVEL1))
    parser.add_argument("--repeats", type=int, default=60, help="timed calls per offset")
    parser.add_argument("--budget-s", type=float, default=240.0, help="skip the remaining tasks past this")
    parser.add_argument("--paths", action="store_true",
                        help="time each task through the baseline's and the candidate's preparation instead")
    parser.add_argument("--sets", action="store_true",
                        help="time each task with its input sets cloned, sent or made from seeds on each side instead")
    parser.add_argument("--rounds", type=int, default=8, help="--paths, --sets: interleaved rounds of 10 calls per way")


def main(args) -> int:
    def rows_of(clock: Clock, stem: str) -> list[dict]:
        if args.paths or args.sets:
            return (_set_rows if args.sets else _path_rows)(clock, stem, args.rounds)
        return _task_rows(clock, stem, args.repeats)

    return each_task(args, "placement", rows_of, _print_paths if args.paths or args.sets else _print_table)


def each_task(args, subcommand: str, rows_of, print_rows) -> int:
    """Rows of every task of args.tasks (on the GPU, within args.budget_s; a failed task reported and the
    others run), their table, and $OUT/bench_evaluator_<subcommand>.json. Exit status 0, 1 when a task
    failed, 2 without a GPU or for a missing task file."""
    import torch

    if gpu_missing(subcommand):
        return 2
    from evaluator_cuda.timing import profile

    profile.bind_cuda_timing()  # every way's prepare demotes persisting L2 lines, as both children's calls do
    missing = [stem for stem in args.tasks if not (LEVEL1 / f"{stem}.py").exists()]
    if missing:
        print(f"no task file for {', '.join(missing)} under {LEVEL1}", file=sys.stderr)
        return 2
    clock = Clock(args.budget_s)
    rows, failed = [], 0
    for stem in args.tasks:
        if clock.remaining() <= 0:
            clock.say(f"budget spent: {stem} skipped")
            continue
        try:
            rows.extend(rows_of(clock, stem))
        except Exception as exc:  # one failed task is reported, the others still run
            failed += 1
            clock.say(f"{stem}: failed: {type(exc).__name__}: {exc}")
    print_rows(rows)
    write_out(f"bench_evaluator_{subcommand}.json", {"rows": rows, "device": torch.cuda.get_device_name()})
    return 1 if failed else 0


def _task_rows(clock: Clock, stem: str, repeats: int) -> list[dict]:
    import torch

    namespace = load_task(LEVEL1 / f"{stem}.py")
    with torch.device("cuda"):
        model = namespace["Model"](*namespace["get_init_inputs"]()).eval()
        inputs = namespace["get_inputs"]()
    rows = []
    for mode in ("input offset", "held block"):
        base = None
        for offset in OFFSETS:
            median = _median_at(model, inputs, offset, mode, repeats)
            base = base or median
            rows.append({"task": stem, "mode": mode, "offset": offset, "median_us": median, "ratio": median / base})
            clock.say(f"{stem}: {mode} {offset:>8d} B: {median:.2f} µs ({median / base:.3f} of offset 0)")
    return rows


def _median_at(model, inputs, offset: int, mode: str, repeats: int) -> float:
    import torch

    from evaluator_cuda.timing.profile import time_forward

    held = torch.empty(max(offset, 1), dtype=torch.uint8, device="cuda") if mode == "held block" else None
    args = [_placed(x, offset) if mode == "input offset" else x for x in inputs]
    samples, _ = time_forward(lambda: model(*args), warmup=5, repeats=repeats, device_type="cuda",
                              l2_flush_bytes=FLUSH_BYTES)
    del held
    return statistics.median(samples)


def _placed(value, offset: int):
    """A copy of a tensor starting `offset` bytes into a fresh buffer (other values as they are)."""
    import torch

    if not isinstance(value, torch.Tensor):
        return value
    nbytes = value.numel() * value.element_size()
    buffer = torch.empty(offset + nbytes + 512, dtype=torch.uint8, device=value.device)
    start = offset - offset % value.element_size()
    view = buffer[start:start + nbytes].view(value.dtype).view(value.shape)
    view.copy_(value)
    return view


def _print_table(rows: list[dict]) -> None:
    print(f"{'task':36s} {'mode':12s} {'offset B':>9s} {'median us':>9s} {'/ offset 0':>10s}")
    for row in rows:
        print(f"{row['task']:36s} {row['mode']:12s} {row['offset']:>9d} {fmt(row['median_us'], 2):>9s} "
              f"{fmt(row['ratio'], 3):>10s}")
    for task in dict.fromkeys(row["task"] for row in rows):
        ratios = [row["ratio"] for row in rows if row["task"] == task]
        print(f"{task}: ratios to offset 0 span {min(ratios):.3f}-{max(ratios):.3f}")




class _CandidateWay:
    """A call prepared as the candidate child prepares one: the set kept on the device (allocated once),
    the last call's copies, pristine views and output already freed, fresh copies, the output-sized blocks
    poisoned, the persisting L2 lines demoted. With `make_set`, each call's set is made anew by it (sent with
    the call, or made from the call's seed) after the last one was freed, instead of kept."""

    def __init__(self, model, inputs: list, device: str, make_set=None):
        self.model, self.device, self.make_set = model, device, make_set
        self.kept = [x.clone() if hasattr(x, "clone") else x for x in inputs]
        self.args, self.pristine, self.output, self.block_sizes = [], [], None, []

    def prepare(self, position: int) -> None:
        import torch

        from evaluator_cuda.timing.profile import poison_allocator, poison_sizes, reset_persisting_l2, tensor_sizes

        self.block_sizes = poison_sizes(self.block_sizes, tensor_sizes(self.output))
        self.args, self.pristine, self.output = [], [], None  # do_call's locals end with the call
        self.pristine = list(self.kept) if self.make_set is None else self.make_set()
        self.args = [a.clone() if isinstance(a, torch.Tensor) else a for a in self.pristine]
        poison_allocator(self.block_sizes, position % 2, self.device)
        if self.device == "cuda":
            reset_persisting_l2()

    def __call__(self):
        self.output = self.model(*self.args)
        return self.output


class _CopiesKept:
    """The baseline's preparation as it was before 2026-12-06 (evening): the new input copies made while the
    last call's are still held, so that copies and output can swap two blocks from one call to the next."""

    def __init__(self, calls):
        self.calls = calls

    def prepare(self, position: int) -> None:
        import torch

        from evaluator_cuda.timing.profile import poison_allocator, poison_sizes, reset_persisting_l2, tensor_sizes

        calls = self.calls
        calls.block_sizes = poison_sizes(calls.block_sizes, tensor_sizes(calls.output))
        calls.output = None
        calls.args = [a.clone() if isinstance(a, torch.Tensor) else a for a in calls.inputs]  # the last freed after
        poison_allocator(calls.block_sizes, position % 2, calls.device)
        if calls.device == "cuda":
            reset_persisting_l2()

    def __call__(self):
        return self.calls()


class _OnePoison:
    """The baseline's preparation with one poison pattern for every call, where the evaluator alternates two
    by the call's parity: if the even/odd split of the other ways is gone here, the pattern made it."""

    def __init__(self, calls):
        self.calls = calls

    def prepare(self, position: int) -> None:
        self.calls.prepare(0)

    def __call__(self):
        return self.calls()


def _path_rows(clock: Clock, stem: str, rounds: int, device: str = "cuda") -> list[dict]:
    """Each way of preparing a call: its median over `rounds` interleaved rounds of 10 timed calls (`device`
    "cpu": a dry run)."""
    from evaluator_cuda.roles.reference import CandidateLikeCalls

    model, inputs, _ = _task(stem, device)
    ways = {"baseline": CandidateLikeCalls(model, inputs, device),
            "baseline, copies kept": _CopiesKept(CandidateLikeCalls(model, inputs, device)),
            "baseline, one poison": _OnePoison(CandidateLikeCalls(model, inputs, device)),
            "candidate": _CandidateWay(model, inputs, device)}
    return _interleaved(clock, stem, ways, rounds, device)


def _set_rows(clock: Clock, stem: str, rounds: int, device: str = "cuda") -> list[dict]:
    """Each side's way with each source of its input sets, as _path_rows."""
    import secrets

    from evaluator_cuda.roles.inputs import inputs_from_seed
    from evaluator_cuda.roles.reference import CandidateLikeCalls, to_device

    model, inputs, get_inputs = _task(stem, device)
    host_set = [x.cpu() if hasattr(x, "cpu") else x for x in inputs]

    def made() -> list:  # as both children make a set from a seed (roles/inputs.py)
        return inputs_from_seed(stem, get_inputs, secrets.randbits(31), on_device=device == "cuda")

    ways = {"baseline": CandidateLikeCalls(model, inputs, device),
            "baseline, made per call": CandidateLikeCalls(model, inputs, device, make_inputs=made),
            "candidate, sent per call": _CandidateWay(model, inputs, device, lambda: to_device(host_set, device)),
            "candidate, made per call": _CandidateWay(model, inputs, device, made)}
    return _interleaved(clock, stem, ways, rounds, device)


def _task(stem: str, device: str):
    """(model, one input set, get_inputs) of a level-1 task, made on `device`."""
    import torch

    namespace = load_task(LEVEL1 / f"{stem}.py")
    with torch.device(device):
        model = namespace["Model"](*namespace["get_init_inputs"]()).eval()
        inputs = namespace["get_inputs"]()
    return model, inputs, namespace["get_inputs"]


def _interleaved(clock: Clock, stem: str, ways: dict, rounds: int, device: str) -> list[dict]:
    """Rows of each way's median over `rounds` rounds of 10 timed calls, the ways' order reversed every
    other round; ratios to the first way."""
    from evaluator_cuda.timing.profile import time_forward

    names = tuple(ways)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(rounds):
        for name in names if round_index % 2 == 0 else tuple(reversed(names)):
            way = ways[name]
            times, _ = time_forward(way, warmup=3, repeats=10, device_type=device,
                                    l2_flush_bytes=FLUSH_BYTES if device == "cuda" else 0, prepare=way.prepare)
            samples[name] += times
    base = statistics.median(samples[names[0]])
    rows = []
    for name in names:
        median = statistics.median(samples[name])
        # Even and odd calls apart: a way that swaps two blocks between its input copy and its output from
        # one call to the next shows two placements here, one that keeps them shows one.
        even, odd = statistics.median(samples[name][0::2]), statistics.median(samples[name][1::2])
        rows.append({"task": stem, "path": name, "median_us": median, "ratio": median / base, "n": len(samples[name]),
                     "even_us": even, "odd_us": odd})
        clock.say(f"{stem}: {name}: {median:.2f} µs ({median / base:.3f} of the {names[0]}'s way; even calls "
                  f"{even:.2f}, odd {odd:.2f})")
    return rows


def _print_paths(rows: list[dict]) -> None:
    print(f"{'task':36s} {'path':30s} {'median us':>9s} {'/ baseline':>10s} {'even us':>8s} {'odd us':>8s}")
    for row in rows:
        print(f"{row['task']:36s} {row['path']:30s} {fmt(row['median_us'], 2):>9s} {fmt(row['ratio'], 3):>10s} "
              f"{fmt(row['even_us'], 2):>8s} {fmt(row['odd_us'], 2):>8s}")
