"""The contract module: the reward rule by hand, the job settings a client may set, the record
accessors, the derived time limits, and the import directions between the packages."""

from pathlib import Path

import pytest

from cuda_agent import contracts
from cuda_agent.contracts import JobError, Status, Timeouts, check_job_settings, milestone_reward

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "correct,t,eager,compiled,reward",
    [
        (False, 1.0, 100.0, 100.0, -1),  # wrong: -1 whatever the time
        (True, None, 100.0, 100.0, 1),  # verify only: the correctness milestone
        (True, 96.0, 100.0, 100.0, 1),  # 4 % faster: inside the 5 % margin
        (True, 94.0, 100.0, 100.0, 3),  # 6 % faster than both
        (True, 94.0, 100.0, 95.0, 2),  # faster than eager by 6 %, than compile by 1 %
        (True, 94.0, 100.0, None, 2),  # no compile baseline: at most 2
        (True, 50.0, 0.0, 100.0, 1),  # a zero baseline is never beaten
    ],
)
def test_milestone_reward_by_hand(correct, t, eager, compiled, reward):
    assert milestone_reward(correct, t, eager, compiled) == reward


def test_scored_and_unscored_statuses_partition_the_statuses():
    assert contracts.SCORED | contracts.UNSCORED == set(Status)
    assert not contracts.SCORED & contracts.UNSCORED
    assert contracts.is_scored("incorrect") and not contracts.is_scored("infra_error") and not contracts.is_scored(None)


def test_a_job_may_carry_only_the_clients_settings():
    assert check_job_settings({"backend": "host", "profile": False, "repeats": 3}) == {"backend": "host", "profile": False, "repeats": 3}
    with pytest.raises(JobError, match="not settable per job: block_torch, cache_dir, static_checks"):
        check_job_settings({"backend": "cuda", "cache_dir": "/tmp/x", "static_checks": False, "block_torch": False})
    with pytest.raises(JobError, match="unknown backend 'gpu'"):
        check_job_settings({"backend": "gpu"})
    job = contracts.evaluation_job("t", "src", {"model_new.py": b"x"}, {"backend": "host"})
    assert job == {"task": {"name": "t", "source": "src"}, "solution": {"format": "workspace", "files": {"model_new.py": b"x"}}, "settings": {"backend": "host"}}


def test_record_accessors_read_the_evaluators_fields_and_nothing_else():
    record = {"status": "correct", "reward": 3, "times_us": {"candidate": {"median_us": 10.0}, "eager": {"median_us": 25.0}, "compile": None},
              "speedup": {"eager": 2.5, "compile": None}}
    assert contracts.record_time_us(record, "candidate") == 10.0 and contracts.record_time_us(record, "compile") is None
    assert contracts.record_speedup(record, "eager") == 2.5 and contracts.record_speedup(record, "compile") is None
    assert contracts.record_reward(record) == 3.0
    assert contracts.record_reward({"status": "infra_error", "reward": -1}) is None  # never scored
    assert contracts.record_speedup({"speedup_vs_eager": 2.0}, "eager") is None  # a shape the evaluator never writes


def test_time_limits_nest_inner_to_outer():
    limits = Timeouts(compile_s=300.0, child_s=300.0)
    assert limits.evaluation_s == 900.0
    assert limits.evaluation_s < limits.worker_job_s < limits.agent_wait_s
    from agent.config import AgentConfig, load_agent_config
    from bridge.settings import BridgeSettings

    assert BridgeSettings().time_limit_s == Timeouts().worker_job_s
    assert AgentConfig().evaluator_timeout_seconds == Timeouts().agent_wait_s
    for name in ("agent", "agent_eval", "agent_tiny"):
        assert load_agent_config(name).evaluator_timeout_seconds > BridgeSettings().time_limit_s


def test_read_solution_job_matches_the_examples_on_disk(tmp_path):
    workspace = REPO / "examples" / "solutions" / "host" / "row_softmax"
    job = contracts.read_solution_job(workspace)
    assert job["format"] == "workspace" and job["entry"] == "model_new.py"
    on_disk = {p.relative_to(workspace).as_posix() for p in workspace.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert set(job["files"]) == on_disk
    single = tmp_path / "candidate.py"
    single.write_text("class ModelNew: pass\n")
    assert contracts.read_solution_job(single) == {"format": "kernelbench", "files": {"candidate.py": single.read_bytes()}, "entry": "candidate.py"}
    with pytest.raises(JobError, match="no model_new.py"):
        contracts.read_solution_job(tmp_path)


# --- import directions ------------------------------------------------------------------------

# Which first-party packages each package may import (the README's table). The console root,
# cuda_agent/cli.py, registers every package's commands and may import them all. The contract
# modules (standard library only) are the contracts, the workspace layout and the jail.
# The metric sink (JSON lines and TensorBoard files, standard library only) serves both training commands;
# the stop-signal scope serves every long run that stops on SIGTERM or Ctrl-C.
CONTRACTS = ("cuda_agent.contracts", "cuda_agent.workspace", "cuda_agent.jail", "cuda_agent.metrics_sink",
             "cuda_agent.stop_signals")
ALLOWED = {
    "evaluator_cuda": {*CONTRACTS},
    "bridge": {"cuda_agent.contracts"},
    "policy_jax": {"cuda_agent.contracts", "cuda_agent.metrics_sink"},
    "agent": {"bridge", "policy_jax", *CONTRACTS},
    "task_synthesis": {"evaluator_cuda", *CONTRACTS},  # it filters tasks through the evaluator's API
    "ablations": {"policy_jax", "agent", *CONTRACTS},  # experiments over the training code
    "cuda_agent": set(),
}
FIRST_PARTY = set(ALLOWED)
# Known exceptions still to remove, each named with its file (none now).
PENDING: set = set()


_LIST_IMPORTS = """
import ast, json, sys
out = {}
for path in sys.argv[1:]:
    names = []
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    out[path] = names
print(json.dumps(out))
"""


def _imports_of(paths: list[Path]) -> dict[Path, list[str]]:
    """The absolute imports of each file, parsed in a fresh interpreter (CPython 3.11's parser can
    raise SystemError after other tests have run in this process)."""
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _LIST_IMPORTS, *map(str, paths)], capture_output=True, text=True, timeout=120, check=True)
    return {Path(k): v for k, v in json.loads(done.stdout).items()}


def test_packages_import_only_in_the_stated_directions():
    found = set()
    imports = _imports_of(sorted(p for package in ALLOWED for p in (REPO / package).rglob("*.py")))
    for package, allowed in ALLOWED.items():
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel == "cuda_agent/cli.py":
                continue
            for module in imports[path]:
                top = module.split(".")[0]
                if top not in FIRST_PARTY or top == package:
                    continue
                target = next((c for c in CONTRACTS if module == c or module.startswith(c + ".")), top)
                if target not in allowed:
                    found.add((rel, target))
    assert found == PENDING, f"imports against the stated direction: {sorted(found - PENDING)}; fixed, remove from PENDING: {sorted(PENDING - found)}"


@pytest.mark.parametrize("name,allowed", [("cuda_agent.contracts", set()), ("cuda_agent.workspace", {"cuda_agent.contracts"}),
                                          ("cuda_agent.jail", set()), ("cuda_agent.metrics_sink", set()),
                                          ("cuda_agent.stop_signals", set())])
def test_the_contract_modules_need_only_the_standard_library(name, allowed):
    import sys

    stdlib = set(sys.stdlib_module_names)
    package = REPO / name.replace(".", "/")
    paths = sorted(package.glob("*.py")) if package.is_dir() else [package.with_suffix(".py")]
    found = _imports_of(paths)
    imports = {m for path in paths for m in found[path] if m != name and not m.startswith(name + ".")}
    first_party = {m for m in imports if m.split(".")[0] == "cuda_agent"}
    assert first_party <= allowed, first_party
    used = {m.split(".")[0] for m in imports - first_party}
    assert used <= stdlib | {"__future__"}, used - stdlib


# --- no import cycle inside the evaluator -----------------------------------------------------

_LIST_PACKAGE_IMPORTS = """
import ast, json, sys
out = {}
for path, module, is_package in json.loads(sys.argv[1]):
    base = module.split(".") if is_package else module.split(".")[:-1]
    names = []
    for node in ast.walk(ast.parse(open(path).read())):  # module-level and function-level imports alike
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            parent = base[: len(base) - node.level + 1] if node.level else []
            stem = ".".join(parent + ([node.module] if node.module else []))
            names += [stem] + [stem + "." + alias.name for alias in node.names]
    out[module] = names
print(json.dumps(out))
"""


def _module_graph(package: str) -> dict[str, set[str]]:
    """module -> the modules of `package` it imports, relative imports resolved (parsed in a fresh interpreter)."""
    import json
    import subprocess
    import sys

    files = []
    for path in sorted((REPO / package).rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        files.append((str(path), ".".join(parts[:-1] if is_package else parts), is_package))
    done = subprocess.run([sys.executable, "-c", _LIST_PACKAGE_IMPORTS, json.dumps(files)], capture_output=True, text=True,
                          timeout=120, check=True)
    imports = json.loads(done.stdout)
    return {module: {name for name in names if name in imports and name != module} for module, names in imports.items()}


def _a_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of the graph as [a, b, ..., a], or None."""
    state: dict[str, str] = {}  # "open" while on the path, "done" after

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = "open"
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                return path[path.index(target):] + [target]
            if target not in state:
                found = visit(target, path + [target])
                if found:
                    return found
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state:
            found = visit(module, [module])
            if found:
                return found
    return None


def test_the_evaluator_has_no_import_cycle():
    graph = _module_graph("evaluator_cuda")
    assert "evaluator_cuda.isolation.wire" in graph["evaluator_cuda.roles.child"]  # relative imports resolved
    assert _a_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]  # the check finds one
    cycle = _a_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
