"""Reference tasks: `Model`, `get_inputs`, `get_init_inputs` in one Python source.

Sources come from one `.py` file, a folder laid out like KernelBench (`level1/1_Name.py`, or
flat `*.py`), or a parquet file with a `code` column (CUDA-Agent-Ops-6K; rows are named from a
`name`, `problem_id`, `task_id` or `id` column, else from their class and a short hash of their
source). Loading checks what can be checked without running the task (syntax, the three
definitions); what needs running it (`get_inputs` raising, a wrong return type) is checked by
the reference child and reported as a `TaskError` with the same one-line form. A malformed
task never stops the other tasks.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

REQUIRED = ("Model", "get_inputs", "get_init_inputs")


class TaskError(Exception):
    """A task that cannot be used; str() is one line naming the task and the problem."""

    def __init__(self, task_name: str, problem: str):
        super().__init__(f"task {task_name}: {problem}")
        self.task_name = task_name
        self.problem = problem


@dataclasses.dataclass(frozen=True)
class Task:
    name: str
    source: str
    origin: str = ""  # file (and row) it came from

    @property
    def stem(self) -> str:
        """The last part of the name, which solutions are matched by (`level1/1_Foo` -> `1_Foo`)."""
        return self.name.rsplit("/", 1)[-1]


@dataclasses.dataclass
class TaskSet:
    tasks: list[Task]
    problems: list[TaskError]


def check_task_source(name: str, source: str) -> None:
    """Raise TaskError if the source does not parse or lacks Model / get_inputs / get_init_inputs."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise TaskError(name, f"syntax error at line {exc.lineno}: {exc.msg}") from None
    defined = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined.update((a.asname or a.name).split(".")[0] for a in node.names)
    missing = [n for n in REQUIRED if n not in defined]
    if missing:
        what = ", ".join(f"{n}()" if n != "Model" else "class Model" for n in missing)
        raise TaskError(name, f"missing {what}")


def _level_key(path: Path) -> tuple:
    numbers = [int(n) for n in re.findall(r"\d+", path.as_posix())]
    return (numbers, path.as_posix())


def _folder_sources(folder: Path) -> list[tuple[str, str, str]]:
    hidden = (".", "_")
    files = [p for p in folder.rglob("*.py")
             if p.name != "__init__.py" and not any(part.startswith(hidden) for part in p.relative_to(folder).parts)]
    out = []
    for path in sorted(files, key=lambda p: _level_key(p.relative_to(folder))):
        name = path.relative_to(folder).with_suffix("").as_posix()
        out.append((name, path.read_text(errors="replace"), str(path)))
    return out


_NAME_COLUMNS = ("name", "problem_id", "task_id", "id")


def _class_name(source: str) -> str:
    """The first top-level class the source defines (`Model` in a KernelBench task), or `task`."""
    match = re.search(r"^class\s+([A-Za-z_]\w*)", source, re.MULTILINE)
    return match.group(1) if match else "task"


def row_name(source: str) -> str:
    """A parquet row's name when the file has no name column: its class and a short hash of its source."""
    import hashlib

    return f"{_class_name(source)}_{hashlib.sha256(source.encode()).hexdigest()[:8]}"


def _unique(names: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}_{seen[name]}")
    return out


def _parquet_sources(path: Path) -> list[tuple[str, str, str]]:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    if "code" not in table.column_names:
        raise TaskError(path.name, "parquet file has no `code` column")
    codes = [code if isinstance(code, str) else "" for code in table.column("code").to_pylist()]
    column = next((c for c in _NAME_COLUMNS if c in table.column_names), None)
    if column:
        names = [str(v) for v in table.column(column).to_pylist()]
    else:
        names = [row_name(code) for code in codes]
    names = _unique(names if column else [f"{path.stem}/{name}" for name in names])
    return [(name, code, f"{path}#row{i}") for i, (name, code) in enumerate(zip(names, codes))]


def load_tasks(path: str | Path) -> TaskSet:
    """Load every task under `path` (.py file, KernelBench-style folder or parquet with a `code` column)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no such task file or folder: {path}")
    if path.is_dir():
        sources = _folder_sources(path)
    elif path.suffix == ".parquet":
        sources = _parquet_sources(path)
    elif path.suffix == ".py":
        sources = [(path.stem, path.read_text(errors="replace"), str(path))]
    else:
        raise TaskError(path.name, "expected a .py file, a folder of them or a .parquet file")
    tasks, problems = [], []
    for name, source, origin in sources:
        try:
            check_task_source(name, source)
        except TaskError as exc:
            problems.append(exc)
            continue
        tasks.append(Task(name=name, source=source, origin=origin))
    return TaskSet(tasks=tasks, problems=problems)


def exec_task(name: str, source: str, module_name: str = "model") -> dict:
    """Run a task's source as a fresh module (in a child process) and return its namespace."""
    import sys
    import types

    module = types.ModuleType(module_name)
    module.__file__ = f"<task {name}>"
    sys.modules[module_name] = module
    try:
        code = compile(source, f"<task {name}>", "exec")
        exec(code, module.__dict__)
    except SyntaxError as exc:
        raise TaskError(name, f"syntax error at line {exc.lineno}: {exc.msg}") from None
    except Exception as exc:
        raise TaskError(name, f"running the task source raised {type(exc).__name__}: {exc}") from None
    for required in REQUIRED:
        if required not in module.__dict__:
            raise TaskError(name, f"missing {required}")
    return module.__dict__


def degenerate_reason(outputs: list, rerun, atol: float, rtol: float) -> str | None:
    """Why a task's reference outputs make a useless benchmark (docs/cheats.md #17, docs/paper.md §9), or None.

    `outputs`: the reference outputs of several input sets (different seeds); `rerun`: the
    output of the first set computed a second time. Degenerate: random (the rerun disagrees) or
    constant across inputs. Outputs that are merely small are not degenerate: verify checks
    them at their own scale (verify.tensor_atol and the relative-norm check).
    """
    import torch

    from .verdict.verify import compare_outputs, _tensor_pairs

    def tensors(value) -> list:
        return [t for t, _ in _tensor_pairs(value, value)]

    if rerun is not None and outputs:
        meta = [{"cls": "Tensor", "device": "cpu"} for _ in tensors(rerun)]
        if compare_outputs(outputs[0], rerun, meta, "cpu", atol, rtol) is not None:
            return "random: two runs on the same inputs disagree"
    sets = [tensors(o) for o in outputs]
    if not sets or not sets[0] or any(len(t) != len(sets[0]) for t in sets):
        return None
    def same_as_first(ts) -> bool:
        return all(a.shape == b.shape and bool(torch.equal(a, b)) for a, b in zip(ts, sets[0]))

    if len(sets) > 1 and all(same_as_first(ts) for ts in sets[1:]):
        return "the output does not depend on the inputs"
    return None
