"""The candidate child: the only process that loads candidate code.

It loads the built extension as `cuda_extension`, imports `ModelNew` (workspace
`model_new.py`, a KernelBench single file, or the task's own `Model` for a harness
self-check), runs it on clones of the inputs the parent sends while torch compute outside the
extension is refused, and times it. It never sees a reference output, nor any seed but that of
the call it is making: a call names either its input set's bytes or the seed to make it from with
the task's own `get_inputs` (roles/inputs.py), never ahead of the call.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
import traceback
from pathlib import Path

from ..isolation.commitment import start_workers, value_digest
from ..isolation.guard_lock import lock_guard_switches, precision_settings
from ..isolation.torch_guard import ForbiddenGuardSwitch, ForbiddenTorchCompute, prime_guard, take_refusals
from ..isolation.wire import describe_tensors, host_copy
from ..tasks import TaskError, exec_task
from ..timing import host_pin
from ..timing import profile as _profile  # noqa: F401  (binds the harness clock before candidate code loads)
from ..timing.kernel_trace import discard_trace
from .errors import HandlerError, one_line
from .inputs import inputs_from_seed

BUILD_ERROR_MARKER = "Error building extension"


def load_extension_module(so_path: str, fast_cache_dir: str | None = None):
    """Import a built extension file as the module `cuda_extension` (torch-built or fast-built)."""
    if fast_cache_dir is not None:
        from ..extension.fast.binding_runtime import is_fast_extension, load_fast_extension

        if is_fast_extension(so_path):
            return load_fast_extension(so_path, "cuda_extension", fast_cache_dir)
    loader = importlib.machinery.ExtensionFileLoader("cuda_extension", so_path)
    spec = importlib.util.spec_from_file_location("cuda_extension", so_path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules["cuda_extension"] = module
    return module


def _lock_guard() -> None:
    """Lock the guard's off switches before any candidate code loads (a harness failure if it cannot)."""
    try:
        lock_guard_switches()
    except Exception as exc:
        raise HandlerError("internal", f"locking the torch-compute guard failed: {one_line(exc)}",
                           traceback.format_exc()) from None


def _import_file(module_name: str, path: Path):
    spec = importlib.util.spec_from_file_location(module_name, str(path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def _candidate_traceback(exc: BaseException) -> str:
    """The traceback without the harness's own frames (what the agent needs to fix its code)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if "evaluator_cuda" not in f.filename and "torch/" not in f.filename]
    lines = traceback.format_list(frames) + traceback.format_exception_only(type(exc), exc)
    return "".join(lines)


def _unsendable(value, depth: int = 0) -> str | None:
    """Why an output cannot be an answer (None if it can): tensors, scalars and containers only."""
    import torch

    if depth > 8:
        return "a structure nested too deeply"
    if isinstance(value, torch.Tensor):
        if type(value) is not torch.Tensor:
            return f"a tensor of class {type(value).__name__} (expected exactly torch.Tensor)"
        if value.is_meta or (value.numel() and value.untyped_storage().nbytes() == 0):
            return "a tensor without real storage"
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return None
    if isinstance(value, (list, tuple)):
        return next((p for p in (_unsendable(v, depth + 1) for v in value) if p), None)
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return next((p for p in (_unsendable(v, depth + 1) for v in value.values()) if p), None)
    return f"a value of type {type(value).__name__}"


class CandidateRole:
    def __init__(self):
        self.model_class = None
        self.model = None
        self.device = "cpu"
        self.block_torch = True
        self.threads_at_start: set = set()
        self.block_sizes: list[int] = []
        self.flush = None
        self.extension_calls = [0]
        self.require_extension = False
        self.stored: dict = {}  # id -> (device values, values as received) of sets that later calls reuse
        self.l2_resets = 0  # calls before which the driver demoted persisting L2 lines (CUDA)
        self.precision_at_start: dict = {}  # torch's precision settings before candidate code loaded
        self.timing_state: tuple = ()  # host: torch's threads and this thread's CPUs, set at load
        self.commit_from: int | None = None  # outputs of this many bytes or more answer with their digest
        self.kept_output = None  # the last call's output, while only its digest has been sent
        self.task_name = "the task"
        self.get_inputs = None  # the task's get_inputs, from a run of its source before any candidate code
        take_refusals()  # a role starts with no refusal on record (one role per process in a child)

    def do_load(self, req: dict) -> dict:
        self.device = req["device"]
        self.block_torch = bool(req["block_torch"])
        self.commit_from = req.get("commit_output_bytes")
        solution_dir = Path(req["solution_dir"])
        sys.path.insert(0, str(solution_dir))
        import torch  # noqa: F401  (torch before any extension)

        if self.block_torch:  # the guard's modes built from torch as imported, before any candidate code loads
            prime_guard()
        if req.get("host_threads"):  # before any candidate code: threads and CPU of the timed calls
            self.timing_state = host_pin.pin(req["host_threads"], req.get("host_cpu"))
        if self.device == "cuda":
            _profile.bind_cuda_timing()  # before any candidate code can rebind torch.cuda's timing functions
        self.task_name, self.get_inputs = req.get("task_name") or "the task", _task_get_inputs(req)

        self.require_extension = req["format"] != "reference" and self.block_torch
        if req["format"] == "kernelbench":  # it builds its own extension (torch.utils.cpp_extension is slow to import)
            _count_built_extensions(self.extension_calls)
        if req.get("binding_runtime"):  # the runtime's copy beside the extension (the cache is not in view)
            from ..extension.fast.binding_runtime import RUNTIME_ENV

            os.environ[RUNTIME_ENV] = req["binding_runtime"]
        if req.get("extension_path"):
            try:
                count_extension_calls(load_extension_module(req["extension_path"], req.get("fast_cache_dir")),
                                      self.extension_calls)
            except Exception as exc:
                raise HandlerError("compile", f"the built extension does not import: {one_line(exc)}",
                                   traceback.format_exc()) from None
        fmt = req["format"]
        if self.block_torch and fmt != "reference":
            _lock_guard()
        self.precision_at_start = precision_settings()
        try:
            if fmt == "reference":
                discard_trace()  # evaluate() starts a self-check untraced; a child started traced stops here
                namespace = exec_task(req["task_name"], req["task_source"], module_name="reference_task")
                self.model_class = namespace["Model"]
                return {"makes_inputs": self.get_inputs is not None}
            path = solution_dir / req["entry"]
            module = _import_file("model_new", path)
        except TaskError as exc:
            raise HandlerError("task", str(exc)) from None
        except SyntaxError as exc:
            raise HandlerError("syntax", f"{Path(exc.filename or req['entry']).name}:{exc.lineno}: {exc.msg}",
                               f"{req['entry']}\n{exc.lineno}\n{exc.msg}") from None
        except Exception as exc:
            self._check_guard(exc)
            text = str(exc)
            if BUILD_ERROR_MARKER in text:
                raise HandlerError("compile", one_line(exc), text) from None
            raise HandlerError("runtime", f"importing {req['entry']} raised {one_line(exc)}",
                               _candidate_traceback(exc)) from None
        model_class = getattr(module, "ModelNew", None)
        if model_class is None:
            raise HandlerError("runtime", f"{req['entry']} defines no ModelNew")
        self.model_class = model_class
        self._check_guard(None)
        return {"makes_inputs": self.get_inputs is not None}

    def do_prepare(self, req: dict) -> dict:
        """Build ModelNew with the reference's constructor arguments and weights."""
        import threading

        try:
            model = self.model_class(*req["init_inputs"])
            model = model.eval().to(self.device)
        except Exception as exc:
            self._check_guard(exc)
            raise HandlerError("runtime", f"ModelNew(*get_init_inputs()) raised {one_line(exc)}",
                               _candidate_traceback(exc)) from None
        try:
            model.load_state_dict(req["state_dict"], strict=True)
        except Exception as exc:
            self._check_guard(exc)
            raise HandlerError("state_dict",
                               f"ModelNew does not take the reference's state_dict: {one_line(exc)}") from None
        self._check_guard(None)
        self.model = model
        if self.commit_from is not None:
            start_workers()  # harness threads, started before the count every call is checked against
        self.threads_at_start = {t.ident for t in threading.enumerate()}
        return {}

    def do_call(self, req: dict) -> dict:
        """One call of the candidate: every call (checked or timed) takes exactly this path.

        Fresh device copies of an input set (sent with the call, or kept from an earlier call
        under an id), poisoned allocator blocks, L2 flushed, torch compute refused, timed,
        synchronised; the output is copied out at once and the inputs compared with pristine
        copies. A set arrives with its first call, never earlier: no future input is ever in
        this process (a candidate cannot do the work of later calls ahead, docs/cheats.md #10).
        """
        import torch

        from ..isolation.torch_guard import refuse_torch_compute
        from ..timing.kernel_trace import call_range
        from ..timing.profile import (flush_buffer, flush_l2, poison_allocator, poison_sizes, requested_pad,
                                      reset_persisting_l2, tensor_sizes, time_one_call)

        if self.model is None:
            raise HandlerError("internal", "call before prepare")
        split = _Split()
        on_device, values = self._input_set(req)
        split.mark("inputs")
        pristine = [a if isinstance(a, torch.Tensor) else None for a in on_device]
        args = [a.clone() if a is not None else v for a, v in zip(pristine, values)]  # the candidate gets clones only
        poison_allocator(self.block_sizes, int(req.get("poison", 0)), self.device)
        if self.flush is None:
            self.flush = flush_buffer(int(req.get("l2_flush_bytes", 0)), self.device)
        if self.device == "cuda":
            self.l2_resets += reset_persisting_l2()
        flush_l2(self.flush)
        split.mark("setup")
        calls_before = self.extension_calls[0]
        model = self.model
        try:
            with torch.no_grad(), refuse_torch_compute(self.block_torch):
                out, time_us, wall_us = time_one_call(lambda: model(*args), self.device,
                                                      call_range(int(req.get("position", 0))),
                                                      requested_pad(req))
        except ForbiddenTorchCompute as exc:
            self._check_guard(exc)
            raise HandlerError("forbidden", str(exc), _candidate_traceback(exc)) from None
        except Exception as exc:
            self._check_guard(exc)
            raise HandlerError("runtime", f"forward raised {one_line(exc)}", _candidate_traceback(exc)) from None
        split.mark("call")
        self._check_guard(None)
        if self.timing_state and host_pin.state() != self.timing_state:
            raise HandlerError("timing_setting", "candidate code changed the thread count or CPU affinity "
                                                 f"of the timed calls ({self.timing_state} -> {host_pin.state()})")
        self._check_call(out, args, pristine, calls_before)
        split.mark("checks")
        described = describe_tensors(out)  # class and device as forward returned them, before the host copy
        copied = _copy_out(out)
        split.mark("copy_out")
        sizes = tensor_sizes(out)
        answer = self._output_or_digest(copied, sum(sizes))
        split.mark("digest")
        self.block_sizes = poison_sizes(self.block_sizes, sizes)
        return {**answer, "output_meta": described, "time_us": time_us, "wall_us": wall_us,
                "l2_resets": self.l2_resets, "split_us": split.spans}

    def _output_or_digest(self, copied, nbytes: int) -> dict:
        """The call's output, or, from `commit_output_bytes` on, its digest with the output kept for
        a fetch (isolation/commitment.py)."""
        self.kept_output = None
        if self.commit_from is None or nbytes < self.commit_from:
            return {"output": copied}
        self.kept_output = copied
        return {"output_digest": value_digest(copied)}

    def do_output(self, req: dict) -> dict:
        """The output of the last call, kept under its digest; once."""
        if self.kept_output is None:
            raise HandlerError("internal", "no output kept from the last call")
        output, self.kept_output = self.kept_output, None
        return {"output": output}

    def do_kernel_trace(self, req: dict) -> dict:
        """What ran on the GPU during each call (timing/kernel_trace.py); ends the trace."""
        from ..timing.kernel_trace import collect

        return {"trace": collect()}

    def _check_guard(self, raised: BaseException | None) -> None:
        """Reject what candidate code did to the guard, whatever it caught: an off switch it reached for
        (guard_switch, precision_switch), a refusal it swallowed (fallback), a precision setting changed."""
        for refusal in take_refusals():
            if isinstance(refusal, ForbiddenGuardSwitch):
                raise HandlerError(refusal.reason, str(refusal), _candidate_traceback(refusal))
            if raised is not None and refusal is not raised:
                raise HandlerError("forbidden", str(refusal), _candidate_traceback(refusal))
            if raised is None:
                raise HandlerError("fallback", f"{refusal} (the candidate caught the refusal and went on)",
                                   _candidate_traceback(refusal))
        changed = {k: v for k, v in precision_settings().items() if self.precision_at_start.get(k) != v}
        if changed:
            raise HandlerError("precision_switch", f"candidate code changed torch's precision settings: {changed}")

    def _input_set(self, req: dict) -> tuple[list, list]:
        """(device values, values as received or made) of the call's input set: made from the call's
        seed, sent with it, or kept under an id from an earlier call."""
        from .reference import to_device

        if "seed" in req:
            values = self._made(req)
            return to_device(values, self.device), values
        if "set" in req:
            if str(req["set"]) not in self.stored:
                raise HandlerError("internal", f"no kept input set {req['set']!r}")
            return self.stored[str(req["set"])]
        values = list(req["inputs"])
        on_device = to_device(values, self.device)
        if req.get("keep_as"):  # the parent will name this set again in a later call
            self.stored[str(req["keep_as"])] = (on_device, values)
        return on_device, values

    def _made(self, req: dict) -> list:
        """The set made from the call's seed where the reference child made its own (`generated_on`).
        Candidate code shares this process and may meddle with it: its outputs then answer other
        inputs than the reference's, and the checked calls find them wrong."""
        if self.get_inputs is None:
            raise HandlerError("internal", "a call by seed, but the task's get_inputs was not loaded")
        try:
            return inputs_from_seed(self.task_name, self.get_inputs, int(req["seed"]), req.get("generated_on") == "cuda")
        except Exception as exc:
            self._check_guard(exc)
            raise HandlerError("runtime", f"making the call's inputs from its seed raised {one_line(exc)}",
                               _candidate_traceback(exc)) from None

    def _check_call(self, out, args: list, pristine: list, calls_before: int) -> None:
        """What a call may not do, checked after it: an output that cannot be sent, no call into the
        extension, a new thread, a changed input."""
        import threading

        problem = _unsendable(out)
        if problem:
            raise HandlerError("incorrect", f"forward returned {problem}")
        if self.require_extension and self.extension_calls[0] == calls_before:
            raise HandlerError("no_kernel",
                               "forward never called the custom extension (a real kernel must run on every call)")
        new_threads = {t.ident for t in threading.enumerate()} - self.threads_at_start
        if new_threads:
            raise HandlerError("threads",
                               f"the candidate started {len(new_threads)} thread(s); background work is not allowed")
        mutated = [i for i, (a, p) in enumerate(zip(args, pristine)) if p is not None and not _same_tensor(a, p)]
        if mutated:
            raise HandlerError("mutated_inputs", f"forward modified its input(s) {mutated}")


def _task_get_inputs(req: dict):
    """The task's get_inputs from a run of its source of its own, before any candidate code loads; None
    without a task source or when the source does not run here (the parent then sends every set)."""
    if not req.get("task_source"):
        return None
    try:
        return exec_task(req["task_name"], req["task_source"], module_name="task_inputs")["get_inputs"]
    except TaskError:
        return None


class _Split:
    """Where one call's time in this child goes: microseconds between named marks (harness
    bookkeeping for the record; the reward never reads it)."""

    def __init__(self):
        import time

        self._clock = time.perf_counter
        self._last = self._clock()
        self.spans: dict[str, float] = {}

    def mark(self, name: str) -> None:
        now = self._clock()
        self.spans[name] = round((now - self._last) * 1e6, 1)
        self._last = now


def _same_tensor(a, b) -> bool:
    import torch

    return isinstance(a, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype and bool(
        torch.equal(a, b)
        or (a.is_floating_point() and torch.equal(a.isnan(), b.isnan())
            and torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))))


def _copy_out(value):
    """A harness-owned copy of an output, made right after the call (later calls cannot alter it)."""
    import torch

    if isinstance(value, torch.Tensor):
        return host_copy(value) if value.device.type == "cuda" else value.detach().to("cpu", copy=True)
    if isinstance(value, list):
        return [_copy_out(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_copy_out(v) for v in value)
    if isinstance(value, dict):
        return {k: _copy_out(v) for k, v in value.items()}
    return value


def count_extension_calls(module, counter: list) -> None:
    """Replace each public callable of the extension module by a wrapper that counts calls."""
    import functools

    for name in dir(module):
        fn = getattr(module, name)
        if name.startswith("_") or not callable(fn) or isinstance(fn, type):
            continue

        def wrapper(*args, __fn=fn, **kwargs):
            counter[0] += 1
            return __fn(*args, **kwargs)

        functools.update_wrapper(wrapper, fn) if hasattr(fn, "__name__") else None
        setattr(module, name, wrapper)


def _count_built_extensions(counter: list) -> None:
    """Make extensions a KernelBench file builds itself (load_inline / load) count their calls too."""
    from torch.utils import cpp_extension

    for name in ("load_inline", "load"):
        original = getattr(cpp_extension, name)

        def loader(*args, __original=original, **kwargs):
            module = __original(*args, **kwargs)
            if module is not None and not isinstance(module, str):
                count_extension_calls(module, counter)
            return module

        setattr(cpp_extension, name, loader)
