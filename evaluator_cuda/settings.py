"""Settings of one evaluation, with the paper's and KernelBench's values as named defaults.

Paper (CUDA Agent, docs/paper.md §4-§6): 5 correctness checks, `assert_close(atol=1e-2, rtol=1e-2)`,
5 warm-up and 10 timed calls, `torch.compile` in its default mode, a 5% milestone margin.
KernelBench: 3 warm-ups, 100 trials, a 256 MiB L2 flush before each trial.
We keep the paper's check count, tolerances and margin, and time more than the paper
(median of several repeats) on CUDA; the host backend times fewer calls because it is
a functional stand-in on small CPUs, not a benchmark of record.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from cuda_agent.contracts import AUTO_BACKEND, BACKEND_CHOICES, PAPER_MARGIN, resolve_backend as resolve_named

PAPER_CHECKS = 5
PAPER_ATOL = 1e-2
PAPER_RTOL = 1e-2
PAPER_WARMUP = 5
KERNELBENCH_L2_FLUSH_BYTES = 256 * 1024 * 1024
H200_PEAK_BANDWIDTH = 4.3e12  # HBM bytes/s measured on an H200 (docs/paper.md §12)
DEFAULT_ARCH_LIST = "9.0"  # Hopper (H100/H200/H20)
CHILD_FILE_SIZE_BYTES = 8 * 1024**3  # RLIMIT_FSIZE of a child: the largest file it may write
CHILD_OPEN_FILES = 4096  # RLIMIT_NOFILE of a child
# The host backend's milestone margin. The candidate and eager are timed in two processes, and on a CPU
# the same code's median differs between two processes by up to about 20 % while each is precise to
# 2.5 %, so at the paper's 5 % the unchanged reference was scored faster than itself (docs/evaluation.md,
# "The host's margin"). The medians' precision bound stays the paper's (PAPER_MARGIN / 2).
HOST_MARGIN = 0.25


def cache_root() -> Path:
    """Where builds, baselines and torch's own extension cache live ($CUDA_AGENT_CACHE or ~/.cache/cuda-agent)."""
    root = os.environ.get("CUDA_AGENT_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "cuda-agent"


def resolve_backend(backend: str | None) -> str:
    """`auto` -> cuda when torch sees a GPU, else host; cuda without one is a BackendError (one line)."""
    import torch

    return resolve_named(backend, gpu_count=torch.cuda.device_count)


def host_cache_flush_bytes(cpu_cache_root: str = "/sys/devices/system/cpu/cpu0/cache") -> int:
    """Bytes to zero before each timed call on the host: twice the CPU's last-level cache, so that the
    baselines and the candidate each start from memory, as a GPU's L2 flush makes them. Without it,
    a sub-millisecond memory-bound task measured 2-4x faster in a loop of baseline calls than between
    the candidate's requests. 64 MiB where the cache size cannot be read; at most 256 MiB."""
    sizes = []
    for index in Path(cpu_cache_root).glob("index*"):
        try:
            text = (index / "size").read_text().strip().upper()
            sizes.append(int(text.rstrip("KMG")) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1))
        except (OSError, ValueError):
            continue
    if not sizes:
        return 64 << 20
    return min(256 << 20, max(8 << 20, 2 * max(sizes)))


NEXT_CHILDREN_STARTS = ("after_timing", "at_start", "overlapping")  # settings.next_children_start
MAX_STANDBY_PAIRS = 4  # settings.standby_pairs: each pair holds two processes (and on a GPU two contexts)
KERNEL_TRACE_STARTS = ("after_context", "before_context")  # settings.kernel_trace_start
HOST_TIMING_ROUNDS_S = 2.0  # settings.timing_rounds_budget_s on the host
COMMIT_OUTPUT_BYTES = 4 << 20  # settings.commit_output_bytes on cuda (for_backend); the host sends every output


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    """Everything that decides how one candidate is built, checked, timed and rewarded."""

    backend: str = "cuda"  # "cuda" or "host" (C++ kernels on the CPU, same workspace machinery)
    arch_list: str = DEFAULT_ARCH_LIST  # TORCH_CUDA_ARCH_LIST, always set explicitly
    checks: int = PAPER_CHECKS
    atol: float = PAPER_ATOL
    rtol: float = PAPER_RTOL
    margin: float = PAPER_MARGIN
    warmup: int = PAPER_WARMUP
    repeats: int = 30  # timed calls per measurement (paper 10, KernelBench 100)
    l2_flush_bytes: int = KERNELBENCH_L2_FLUSH_BYTES  # zeroed before every call; host: twice the CPU's last cache
    compile_mode: str = "default"  # torch.compile mode of the compile baseline (paper: default)
    # Inductor's compile workers in the reference child. 1: its kernels are compiled in that process;
    # 0: torch's default, a pool of one process per CPU (up to 32) started anew by every evaluation.
    compile_threads: int = 1
    profile: bool = True  # time the candidate and the baselines (False: verdict only, reward None)
    block_torch: bool = True  # refuse torch compute outside the extension while the candidate runs
    compile_timeout_s: float = 300.0
    child_timeout_s: float = 300.0  # per request to a verify/profile child (torch.compile can be slow)
    # The candidate's own limits (docs/cheats.md): its load (import of model_new.py, extension load) and
    # constructor, and each call: call_timeout_factor x the reference's measured call + call_timeout_extra_s
    # (the first call first_call_extra_s more: lazy module loading, library handles), never above child_timeout_s.
    import_timeout_s: float = 60.0
    call_timeout_factor: float = 100.0
    call_timeout_extra_s: float = 5.0
    first_call_extra_s: float = 10.0
    cache_dir: str | None = None  # None: cache_root()
    static_checks: bool = True  # reject sources that use threads, processes, sockets, introspection, torch in C++ ...
    norm_rtol: float = PAPER_RTOL  # scale-aware check: ||out-ref||/||ref|| per tensor (docs/cheats.md #2)
    timed_checks: int = 4  # outputs of timed calls checked, a random sample the candidate cannot see
    fresh_input_bytes: int = 1024**3  # budget for distinct timed input sets; beyond it the sets rotate
    # The candidate child makes each call's input set from the call's seed (roles/inputs.py) instead of
    # receiving its bytes, when the reference child finds the task's get_inputs makes the same set twice:
    # no input bytes cross a channel, and every timed call has a set of its own (no byte budget, no rotation).
    inputs_from_seeds: bool = True
    # Outputs of this many bytes or more stay in the candidate child, which answers with their digest;
    # the bytes cross only for checked calls (isolation/commitment.py). None: every output is sent.
    # for_backend sets COMMIT_OUTPUT_BYTES on cuda (a 64 MiB call's round trip 14 ms instead of about
    # 80, docs/figures.md); on the host hashing costs about what the socket does, so None there.
    commit_output_bytes: int | None = None
    # CUDA: compare the outputs on the GPU in the verdict process (False: on its CPU, seconds for large outputs)
    judge_on_device: bool = True
    reject_precision_downgrade: bool = False  # flag (False) or reject (True) outputs below the dtype's precision
    peak_bandwidth: float = H200_PEAK_BANDWIDTH  # the speed-of-light bound of a call (docs/cheats.md #18)
    # CUDA: CUPTI records every GPU activity of the candidate's calls (verdict/attribution.py). Work
    # outside the candidate's extension is rejected; copies, fills and memsets may take this share of it.
    kernel_attribution: bool = True
    # When a warm candidate child starts its trace: "after_context" (its CUDA context made first) or
    # "before_context" (CUPTI enabled before any context exists). On the H200 the trace's start took
    # 3.5-5.8 s after the context (docs/figures.md): the order is kept as a setting to measure it.
    kernel_trace_start: str = "after_context"
    # Host timing (timing/host_pin.py): torch's threads in both children, all on one CPU per evaluation.
    host_threads: int = 1
    host_pin_cpu: bool = True
    # Host: eager timed call by call beside the candidate's timed calls, the speed-up's eager time
    # (evaluation/calls.py); False: the baseline's (cached or measured) eager time.
    pair_host_eager: bool = True
    # A time earns a speed-up reward only when its median is known well enough for the margin: the
    # median's relative standard error (about 0.93 * IQR / median / sqrt(n)) at most this (None: margin / 2).
    # Baselines are re-timed in rounds until they meet it or `baseline_budget_s` is spent; unmet: not cached.
    timing_se_bound: float | None = None
    baseline_budget_s: float = 4.0
    # The cached baselines are not read: measured anew, and the entry replaced when they are precise enough.
    refresh_baselines: bool = False
    # The baselines timed one request per call, as the candidate's calls come (timing/host_baselines.py),
    # instead of in a loop within the reference child. None: per request on the host, a loop on CUDA.
    baselines_per_request: bool | None = None
    # GPU cycles of the busy-wait queued before each timed call's start event, on both sides (None:
    # timing/profile.py LAUNCH_PAD_CYCLES, about 2 ms).
    launch_pad_cycles: int | None = None
    # The candidate's timed calls continue in rounds of `repeats` on fresh input sets while its median (and
    # the host's paired eager median) is above that bound, for at most this many seconds (host: 2.0).
    timing_rounds_budget_s: float = 0.0
    data_movement_share: float = 0.5
    # The speed-up reward is withheld (reward 1 at most) when the traced GPU work of the timed calls
    # spans longer than their events by more than this fraction plus slack (docs/cheats.md #23).
    span_tolerance: float = 0.10
    span_slack_us: float = 5.0
    child_memory_bytes: int | None = None  # RLIMIT_AS of candidate/build children; None: 32 GiB on host, none on CUDA
    # RLIMIT_NPROC: jailed, of the child's own uid (every process and thread it starts counts); unjailed,
    # above the user's current count (which the kernel does not enforce for root)
    child_max_processes: int = 256
    child_cpu_seconds: int = 3600  # RLIMIT_CPU of a child
    child_file_size_bytes: int = CHILD_FILE_SIZE_BYTES  # RLIMIT_FSIZE of candidate/build children
    child_open_files: int = CHILD_OPEN_FILES  # RLIMIT_NOFILE of candidate/build children
    isolate_network: bool = True  # unjailed children: a network namespace when `unshare -n` works
    # The candidate and build children run in cuda_agent.jail's jail (own uid and namespaces, seccomp,
    # a file-system view of system folders, Python, the evaluator's code and their own folders).
    # None or True: jailed (both backends); False: the unjailed path (rlimits and a network namespace),
    # kept to measure what the jail costs.
    jail_children: bool | None = None
    require_jail: bool | None = None  # a machine that cannot build the jail: refuse (None: True as root on Linux)
    # Each jailed child and each build claims its own uid in [jail_uid_base, jail_uid_base + 100000)
    # (cuda_agent.jail.uids): RLIMIT_NPROC and file access are per uid. Agent episodes use 200000 up.
    jail_uid_base: int = 300_000
    jail_tmp_bytes: int = 1024**3  # the jail's private /tmp (tmpfs: memory, used only as filled)
    # evaluator_cuda.extension.fast first (slim headers, ~1 s); the torch build when it cannot decide
    fast_build: bool = True
    # When a long-lived caller keeps children warm (evaluation.keep_children_warm), when the next
    # evaluation's pair starts: "after_timing" once this one's timed calls are over; "at_start" as soon as
    # this one has taken its own pair, its timed work (eager bracket, calls, rounds) waiting until the new
    # pair is warm, so that no child starts while anything is timed; "overlapping" as "at_start" without the
    # wait (kept to measure what a starting pair does to the times).
    next_children_start: str = "after_timing"
    # How many pairs are kept warming ahead when kept warm. A pair's start on a GPU (its CUDA context and
    # kernel trace) takes longer than an evaluation: back to back, each pair has this many evaluations' time.
    standby_pairs: int = 1

    def __post_init__(self):
        for field, choices in (("kernel_trace_start", KERNEL_TRACE_STARTS), ("next_children_start", NEXT_CHILDREN_STARTS)):
            if getattr(self, field) not in choices:
                raise ValueError(f"{field} must be one of {', '.join(choices)}, not {getattr(self, field)!r}")
        pairs = self.standby_pairs
        if isinstance(pairs, bool) or not isinstance(pairs, int) or not 1 <= pairs <= MAX_STANDBY_PAIRS:
            raise ValueError(f"standby_pairs must be an integer from 1 to {MAX_STANDBY_PAIRS}, not {pairs!r}")

    def cache_path(self) -> Path:
        return Path(self.cache_dir).expanduser() if self.cache_dir else cache_root()

    def device_type(self) -> str:
        return "cuda" if self.backend == "cuda" else "cpu"

    def time_baselines_per_request(self) -> bool:
        return self.device_type() == "cpu" if self.baselines_per_request is None else self.baselines_per_request

    @classmethod
    def for_backend(cls, backend: str, **overrides) -> "EvalSettings":
        """Defaults for a backend (`auto` resolved here): on cuda large outputs committed by digest; the host
        backend times fewer calls (2 warm-ups, 5 timed) and rewards a speed-up beyond HOST_MARGIN."""
        if backend not in BACKEND_CHOICES:
            raise ValueError(f"unknown backend {backend!r} (expected one of {', '.join(BACKEND_CHOICES)})")
        if backend == AUTO_BACKEND:
            backend = resolve_backend(backend)
        base = {"backend": backend}
        if backend == "cuda":
            base.update(commit_output_bytes=COMMIT_OUTPUT_BYTES)
        if backend == "host":
            base.update(warmup=2, repeats=5, l2_flush_bytes=host_cache_flush_bytes(), margin=HOST_MARGIN,
                        timing_se_bound=PAPER_MARGIN / 2, timing_rounds_budget_s=HOST_TIMING_ROUNDS_S)
        base.update(overrides)
        return cls(**base)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict | None) -> "EvalSettings":
        values = dict(values or {})
        backend = values.pop("backend", "cuda")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown settings: {', '.join(unknown)}")
        return cls.for_backend(backend, **values)
