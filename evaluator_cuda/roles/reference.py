"""The reference child: runs the task's `Model`, never any candidate code.

It builds the reference model from the task source, makes the input sets from the seeds the
parent chose, computes the reference outputs from untouched inputs, and times the eager and
`torch.compile` baselines. Everything it sends goes to the parent only.
"""

from __future__ import annotations

import secrets
import time

from ..tasks import TaskError, exec_task
from .errors import HandlerError, one_line
from .inputs import checked_inputs, inputs_from_seed, nbytes, same_inputs


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def to_device(values, device: str):
    """Move the tensors of a list/tuple of inputs to `device`; other values pass through."""
    import torch

    return [v.to(device) if isinstance(v, torch.Tensor) else v for v in values]


def device_name(device: str) -> str:
    """The GPU's name, or the CPU model for the host backend."""
    import torch

    if device == "cuda":
        return torch.cuda.get_device_name()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return "cpu: " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return "cpu: " + (platform.processor() or platform.machine())


def _disagree(first, again) -> bool:
    """Two runs of the reference on the same inputs differ beyond atol/rtol (a random operator)."""
    import torch

    from ..verdict.verify import compare_outputs

    def cpu(value):
        if isinstance(value, torch.Tensor):
            return value.detach().cpu()
        if isinstance(value, (list, tuple)):
            return type(value)(cpu(v) for v in value)
        if isinstance(value, dict):
            return {k: cpu(v) for k, v in value.items()}
        return value

    first, again = cpu(first), cpu(again)
    meta = [{"cls": "Tensor", "device": "cpu"}] * 100_000  # one per output tensor (compare_outputs pops them)
    return compare_outputs(first, again, meta, "cpu", 1e-2, 1e-2) is not None


class ReferenceRole:
    def __init__(self):
        self.namespace = None
        self.model = None
        self.device = "cpu"
        self.timing_inputs = None
        self.flush = None  # zeroed before each baseline call timed one per request (host)
        self.compiled = None  # torch.compile of the model, for the per-call host baselines
        self.block_sizes: list[int] = []  # output sizes of the baseline calls timed one per request (poisoned next)
        self.timed_outputs: dict = {}  # seed -> reference output of a timed input set
        self.generate_on_device = True
        self.sets_by_seed = False  # the candidate child makes its sets from seeds (granted in do_reference)

    def _task_call(self, what: str, fn):
        try:
            return fn()
        except TaskError:
            raise
        except Exception as exc:
            raise TaskError(self.task_name, f"{what} raised {one_line(exc)}") from None

    def do_load(self, req: dict) -> dict:
        import torch

        self.task_name = req["task_name"]
        self.task_source = req["task_source"]
        self.device = req["device"]
        l2_reset = None  # CUDA: whether every baseline call demotes persisting L2 lines, as every candidate call does
        if self.device == "cuda":  # as the candidate child binds them: the same reset before every timed call
            from ..timing import profile

            profile.bind_cuda_timing()
            l2_reset = profile.persisting_l2_reset_bound()
        if req.get("host_threads"):
            from ..timing import host_pin

            host_pin.pin(req["host_threads"], req.get("host_cpu"))
        try:
            self.namespace = exec_task(self.task_name, req["task_source"])
            init_inputs = checked_inputs(self.task_name, "get_init_inputs",
                                        self._task_call("get_init_inputs()", self.namespace["get_init_inputs"]))
            torch.manual_seed(int(req["init_seed"]))
            model = self._task_call("Model(*get_init_inputs())", lambda: self.namespace["Model"](*init_inputs))
            if not isinstance(model, torch.nn.Module):
                raise TaskError(self.task_name, "Model is not a torch.nn.Module")
            self.model = model.eval().to(self.device)
        except TaskError as exc:
            raise HandlerError("task", str(exc)) from None
        return {
            "init_inputs": init_inputs,
            "state_dict": dict(self.model.state_dict()),
            "device_name": device_name(self.device),
            "torch_version": torch.__version__,
            "cuda_version": torch.version.cuda,
            "persisting_l2_reset": l2_reset,
        }

    def do_reference(self, req: dict) -> dict:
        """The check sets' reference outputs, from inputs made from the seeds, and whether the first set's
        forward gives the same output twice (a random task). With `by_seed`, a candidate child may make its
        own sets from the seeds when the first set comes out the same, to the bit, from a fresh run of the
        task's source (`by_seed` in the reply); the inputs are sent only when it may not."""
        import torch

        input_sets, outputs = [], []
        on_device_before = self.generate_on_device
        try:
            for seed in req["seeds"]:
                inputs = self._inputs_from_seed(seed)
                device_inputs = to_device(inputs, self.device)
                with torch.no_grad():
                    out = self._task_call("the reference forward", lambda: self.model(*device_inputs))
                _sync(self.device)
                if self.timing_inputs is None:
                    self.timing_inputs = device_inputs
                input_sets.append(inputs)
                outputs.append(out)
            rerun = None
            if req.get("rerun") and req["seeds"]:  # the first set once more, RNG not reseeded: random ops show
                first = to_device(input_sets[0], self.device)
                with torch.no_grad():
                    rerun = self._task_call("the reference forward", lambda: self.model(*first))
                _sync(self.device)
            refused = None
            if req.get("by_seed") and req["seeds"]:  # every set made in one place, and made again alike
                if self.generate_on_device != on_device_before:
                    refused = "get_inputs() failed on the device while the check sets were made"
                elif not self._remade_alike(req["seeds"][0], input_sets[0]):
                    refused = "the task's get_inputs() did not make the same set twice from one seed"
            by_seed = self.sets_by_seed = bool(req.get("by_seed")) and bool(req["seeds"]) and refused is None
        except TaskError as exc:
            raise HandlerError("task", str(exc)) from None
        generated_on = "cuda" if self.device == "cuda" and self.generate_on_device else "cpu"
        answer = {"outputs": outputs, "random": rerun is not None and _disagree(outputs[0], rerun),
                  "generated_on": generated_on, "by_seed": by_seed, "by_seed_refused": refused,
                  "input_bytes": nbytes(input_sets[0]) if input_sets else 0}
        if not by_seed:
            answer["inputs"] = input_sets
        return answer

    def _remade_alike(self, seed: int, made: list) -> bool:
        """Whether a fresh run of the task's source makes the same set from `seed`, to the bit: what a
        candidate child that makes its sets from seeds needs (no unseeded randomness, no state the
        reference's own run of the source left behind)."""
        fresh = exec_task(self.task_name, self.task_source, module_name="task_remade")["get_inputs"]
        on_device = self.device == "cuda" and self.generate_on_device
        try:
            again = inputs_from_seed(self.task_name, fresh, seed, on_device)
        except Exception:
            return False
        return same_inputs(made, again)

    def _inputs_from_seed(self, seed: int) -> list:
        """get_inputs() after seeding (roles/inputs.py), on the device when it can. A task whose
        get_inputs() fails that way (or returns something the device cannot hold) is generated on the
        host as written, this set and every later one, so that all sets match in kind."""
        get_inputs = self.namespace["get_inputs"]
        if self.device == "cuda" and self.generate_on_device:
            try:
                return inputs_from_seed(self.task_name, get_inputs, seed, on_device=True)
            except Exception as exc:
                if self.sets_by_seed:  # the candidate child makes its sets on the device: this one must be too
                    raise TaskError(self.task_name, f"get_inputs() on the device raised {one_line(exc)} for one "
                                                    "seed after it had made the check sets there") from None
                self.generate_on_device = False
        return self._task_call("get_inputs()", lambda: inputs_from_seed(self.task_name, get_inputs, seed, False))

    def do_inputs(self, req: dict) -> dict:
        """Input sets for timed calls. Their reference outputs are computed now, from the
        untouched inputs, and kept here: the parent asks for the ones it checks after the calls."""
        import torch

        inputs = []
        try:
            for seed in req["seeds"]:
                values = self._inputs_from_seed(seed)
                device_inputs = to_device(values, self.device)
                with torch.no_grad():
                    self.timed_outputs[int(seed)] = self._task_call(
                        "the reference forward", lambda: self.model(*device_inputs))
                _sync(self.device)
                inputs.append(values)
        except TaskError as exc:
            raise HandlerError("task", str(exc)) from None
        return {"inputs": inputs}

    def do_prepare_compiled(self, req: dict) -> dict:
        """torch.compile of the task's model, called once (the per-call host baselines time it next)."""
        import torch

        try:
            self.compiled = _compiled(self.model, req)
            begin = time.perf_counter()
            with torch.no_grad():
                self.compiled(*self.timing_inputs)
            return {"first_call_s": time.perf_counter() - begin}
        except Exception as exc:
            self.compiled = None
            return {"error": one_line(exc)}

    def do_time_call(self, req: dict) -> dict:
        """One baseline call the way the candidate child makes each of its calls (timing/host_baselines.py):
        fresh copies of the inputs, freed blocks poisoned, the caches flushed, then the timed call alone."""
        import torch

        from ..timing.profile import flush_buffer, flush_l2, poison_sizes, requested_pad, tensor_sizes, time_one_call

        model = self.model if req["which"] == "eager" else self.compiled
        calls = CandidateLikeCalls(model, self.timing_inputs, self.device, block_sizes=self.block_sizes)
        calls.prepare(int(req.get("poison", 0)))
        if self.flush is None:
            self.flush = flush_buffer(int(req.get("l2_flush_bytes", 0)), self.device)
        flush_l2(self.flush)
        with torch.no_grad():
            out, time_us, _ = time_one_call(calls, self.device, pad_cycles=requested_pad(req))
        # The output is freed on return, as the candidate child frees its own once it is copied out.
        self.block_sizes = poison_sizes(calls.block_sizes, tensor_sizes(out))
        return {"time_us": time_us}

    def do_outputs(self, req: dict) -> dict:
        """Reference outputs of timed input sets: kept since do_inputs, or (sets a candidate child made from
        their seeds) computed now from the set made again."""
        import torch

        try:
            for seed in req["seeds"]:
                if int(seed) not in self.timed_outputs:
                    device_inputs = to_device(self._inputs_from_seed(int(seed)), self.device)
                    with torch.no_grad():
                        self.timed_outputs[int(seed)] = self._task_call(
                            "the reference forward", lambda: self.model(*device_inputs))
            _sync(self.device)
        except TaskError as exc:
            raise HandlerError("task", str(exc)) from None
        return {"outputs": [self.timed_outputs[int(seed)] for seed in req["seeds"]]}

    def _fresh_set_maker(self, req: dict):
        """With the protocol's `inputs: made_per_call`, what makes each baseline call's set: a fresh seed's set,
        made as the candidate child makes its own (only where it does)."""
        if req.get("inputs") != "made_per_call":
            return None
        if not self.sets_by_seed:
            raise HandlerError("internal", "baselines on sets made per call, but sets are not made from seeds")

        def make() -> list:
            try:
                return to_device(self._inputs_from_seed(secrets.randbits(31)), self.device)
            except TaskError as exc:
                raise HandlerError("task", str(exc)) from None

        return make

    def do_baselines(self, req: dict) -> dict:
        import torch

        from ..timing.profile import requested_pad

        args = self.timing_inputs
        kwargs = dict(warmup=int(req["warmup"]), repeats=int(req["repeats"]), device_type=self.device,
                      l2_flush_bytes=int(req["l2_flush_bytes"]), pad_cycles=requested_pad(req))
        bound, budget = req.get("se_bound"), float(req.get("budget_s") or 0.0)
        make = self._fresh_set_maker(req)
        eager = _timed_until_stable(CandidateLikeCalls(self.model, args, self.device, make_inputs=make), kwargs, bound,
                                    budget / 2)
        result = {"eager": eager, "compile": None, "compile_error": None}
        if req.get("eager_only"):
            return result
        try:
            compiled = _compiled(self.model, req)
            begin = time.perf_counter()
            with torch.no_grad():
                compiled(*args)
            _sync(self.device)
            result["compile_first_call_s"] = time.perf_counter() - begin
            result["compile"] = _timed_until_stable(CandidateLikeCalls(compiled, args, self.device, make_inputs=make),
                                                    kwargs, bound, budget / 2)
        except Exception as exc:
            result["compile_error"] = one_line(exc)
        return result


def _compiled(model, req: dict):
    """torch.compile of `model` in the request's mode, inductor compiling with its `compile_threads`
    (1: in this process; 0: torch's default pool of worker processes)."""
    import torch
    import torch._inductor.config as inductor_config

    threads = int(req.get("compile_threads", 1))
    if threads > 0:
        inductor_config.compile_threads = threads
    mode = req.get("compile_mode") or "default"
    return torch.compile(model, mode=None if mode == "default" else mode)


class CandidateLikeCalls:
    """A baseline's calls, each prepared as the candidate child prepares each of its calls (candidate.py
    do_call): fresh copies of the inputs, freed blocks of the outputs' sizes poisoned, and on a GPU
    the persisting L2 lines demoted. The traces that work leaves in the caches then weigh on both sides:
    measured without it, the candidate's calls alone paid for them (0.3-1.3 µs a call on the H100, up to
    9 % of a 15 µs kernel, docs/figures.md)."""

    def __init__(self, model, inputs: list, device: str, block_sizes=(), make_inputs=None):
        self.model, self.inputs, self.device = model, list(inputs), device
        self.args, self.output, self.block_sizes = list(inputs), None, list(block_sizes)
        self.make_inputs = make_inputs  # each call's own fresh set (sets made from seeds), else `inputs` cloned

    def prepare(self, position: int) -> None:
        """Untimed, before the call at `position` (its parity picks the poison pattern)."""
        import torch

        from ..timing.profile import poison_allocator, poison_sizes, reset_persisting_l2, tensor_sizes

        self.block_sizes = poison_sizes(self.block_sizes, tensor_sizes(self.output))
        # The last call's copies and output are freed before the new copies are made, as the candidate
        # child's are (the locals of its call end with it), so both sides allocate in the same order.
        self.output, self.args = None, []
        if self.make_inputs is not None:  # the last call's set freed first, as the candidate child's is
            self.inputs = []
            self.inputs = self.make_inputs()
        self.args = [a.clone() if isinstance(a, torch.Tensor) else a for a in self.inputs]
        poison_allocator(self.block_sizes, position % 2, self.device)
        if self.device == "cuda":
            reset_persisting_l2()

    def __call__(self):
        """The timed call itself: nothing but the model's (the sizes are read in the next prepare)."""
        self.output = self.model(*self.args)
        return self.output


def _timed_until_stable(calls: CandidateLikeCalls, kwargs: dict, bound: float | None, budget_s: float) -> dict:
    """Times of `calls` in rounds of `repeats` until the median's relative standard error is at most
    `bound` or `budget_s` is spent; the summary says how many rounds it took."""
    from ..timing.profile import summarize_times, time_forward

    kwargs = {**kwargs, "prepare": calls.prepare}
    pairs = kwargs["device_type"] == "cuda"  # summarized as the candidate's calls are (evaluation/times.py valid_times)
    begin = time.perf_counter()
    samples, _ = time_forward(calls, **kwargs)
    rounds = 1
    while bound is not None and (summarize_times(samples, pairs)["median_rel_se"] or 0.0) > bound \
            and time.perf_counter() - begin < budget_s:
        more, _ = time_forward(calls, **{**kwargs, "warmup": 0})
        samples += more
        rounds += 1
    return {**summarize_times(samples, pairs), "rounds": rounds}
