"""The candidate child: the only process that loads candidate code.

It loads the built extension as `cuda_extension`, imports `ModelNew` (workspace
`model_new.py`, a KernelBench single file, or the task's own `Model` for a harness
self-check), runs it on clones of the inputs the parent sends while torch compute outside the
extension is refused, and times it. It never sees a seed or a reference output.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import traceback
from pathlib import Path

from .child import HandlerError, one_line
from .tasks import TaskError, exec_task

BUILD_ERROR_MARKER = "Error building extension"


def load_extension_module(so_path: str, fast_cache_dir: str | None = None):
    """Import a built extension file as the module `cuda_extension` (torch-built or fast-built)."""
    if fast_cache_dir is not None:
        from .fastbuild.runtime import is_fast_extension, load_fast_extension

        if is_fast_extension(so_path):
            return load_fast_extension(so_path, "cuda_extension", fast_cache_dir)
    loader = importlib.machinery.ExtensionFileLoader("cuda_extension", so_path)
    spec = importlib.util.spec_from_file_location("cuda_extension", so_path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules["cuda_extension"] = module
    return module


def _import_file(module_name: str, path: Path):
    spec = importlib.util.spec_from_file_location(module_name, str(path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def _candidate_traceback(exc: BaseException) -> str:
    """The traceback without the harness's own frames (what the agent needs to fix its code)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "evaluator_cuda" not in f.filename and "torch/" not in f.filename]
    lines = traceback.format_list(frames) + traceback.format_exception_only(type(exc), exc)
    return "".join(lines)


def _unsendable(value, depth: int = 0) -> str | None:
    """Why an output cannot be an answer (None if it can): tensors, scalars and containers only."""
    import torch

    if depth > 8:
        return "a structure nested too deeply"
    if value is None or isinstance(value, (bool, int, float, str, torch.Tensor)):
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
        self.profile_args = None

    def do_load(self, req: dict) -> dict:
        self.device = req["device"]
        self.block_torch = bool(req["block_torch"])
        solution_dir = Path(req["solution_dir"])
        sys.path.insert(0, str(solution_dir))
        import torch  # noqa: F401  (torch before any extension)

        if req.get("extension_path"):
            try:
                load_extension_module(req["extension_path"], req.get("fast_cache_dir"))
            except Exception as exc:
                raise HandlerError("compile", f"the built extension does not import: {one_line(exc)}", traceback.format_exc()) from None
        fmt = req["format"]
        try:
            if fmt == "reference":
                namespace = exec_task(req["task_name"], req["task_source"], module_name="reference_task")
                self.model_class = namespace["Model"]
                return {}
            path = solution_dir / req["entry"]
            module = _import_file("model_new", path)
        except TaskError as exc:
            raise HandlerError("task", str(exc)) from None
        except SyntaxError as exc:
            raise HandlerError("syntax", f"{Path(exc.filename or req['entry']).name}:{exc.lineno}: {exc.msg}", f"{req['entry']}\n{exc.lineno}\n{exc.msg}") from None
        except Exception as exc:
            text = str(exc)
            if BUILD_ERROR_MARKER in text:
                raise HandlerError("compile", one_line(exc), text) from None
            raise HandlerError("runtime", f"importing {req['entry']} raised {one_line(exc)}", _candidate_traceback(exc)) from None
        model_class = getattr(module, "ModelNew", None)
        if model_class is None:
            raise HandlerError("runtime", f"{req['entry']} defines no ModelNew")
        self.model_class = model_class
        return {}

    def do_check(self, req: dict) -> dict:
        import torch

        from .child_reference import to_device
        from .torch_guard import ForbiddenTorchCompute, refuse_torch_compute

        try:
            model = self.model_class(*req["init_inputs"])
            model = model.eval().to(self.device)
        except Exception as exc:
            raise HandlerError("runtime", f"ModelNew(*get_init_inputs()) raised {one_line(exc)}", _candidate_traceback(exc)) from None
        try:
            model.load_state_dict(req["state_dict"], strict=True)
        except Exception as exc:
            raise HandlerError("state_dict", f"ModelNew does not take the reference's state_dict: {one_line(exc)}") from None
        self.model = model
        outputs = []
        for index, inputs in enumerate(req["inputs"]):
            args = [a.clone() if isinstance(a, torch.Tensor) else a for a in to_device(inputs, self.device)]
            try:
                with torch.no_grad(), refuse_torch_compute(self.block_torch):
                    out = model(*args)
                if self.device == "cuda":
                    torch.cuda.synchronize()
            except ForbiddenTorchCompute as exc:
                raise HandlerError("forbidden", str(exc), _candidate_traceback(exc)) from None
            except Exception as exc:
                raise HandlerError("runtime", f"forward on input set {index} raised {one_line(exc)}", _candidate_traceback(exc)) from None
            problem = _unsendable(out)
            if problem:
                raise HandlerError("incorrect", f"forward on input set {index} returned {problem}")
            outputs.append(out)
            if index == 0:
                self.profile_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in to_device(inputs, self.device)]
        return {"outputs": outputs}

    def do_profile(self, req: dict) -> dict:
        from .profile import summarize_times, time_forward

        model, args = self.model, self.profile_args
        try:
            samples, last = time_forward(
                lambda: model(*args),
                warmup=int(req["warmup"]),
                repeats=int(req["repeats"]),
                device_type=self.device,
                l2_flush_bytes=int(req["l2_flush_bytes"]),
            )
        except Exception as exc:
            raise HandlerError("runtime", f"forward while profiling raised {one_line(exc)}", _candidate_traceback(exc)) from None
        return {"times": summarize_times(samples), "output": last}
