"""Children started ahead of their evaluation (sandbox.StandbySlots, evaluation.keep_children_warm):
a warm slot is handed out once, only for the environment and protections it was started with,
never when a child died; its processes and folder go away when it closes; evaluations that use
warm children still never share a process."""

import os
import signal
import time

from evaluator_cuda import evaluation
from evaluator_cuda.extension.torch_build import build_env
from evaluator_cuda.isolation.sandbox import StandbySlots, child_guard
from evaluator_cuda.settings import EvalSettings

from evaluator_helpers import AXPY_TASK, build_cache, host, model_new_with, workspace  # noqa: F401


def _gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:  # a zombie of ours counts as gone
            if open(f"/proc/{pid}/stat").read().split()[2] == "Z":
                return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


def _env_guard(tmp_path, **overrides):
    settings = EvalSettings.for_backend("host", cache_dir=str(tmp_path / "cache"), **overrides)
    return build_env(settings), child_guard(settings)


def test_a_standby_slot_is_handed_out_once_and_only_for_its_own_environment(tmp_path):
    slots = StandbySlots()
    env, guard = _env_guard(tmp_path)
    try:
        first = slots.take(env, guard, "cpu")
        assert (slots.hits, slots.misses) == (0, 1)
        first.used = True
        slots.refill(env, guard, "cpu")
        standby = slots.peek()
        assert standby is not None and standby is not first and standby.alive()
        pids = {standby.reference.proc.pid, standby.candidate.proc.pid}
        assert not pids & {first.reference.proc.pid, first.candidate.proc.pid}
        slots.refill(env, guard, "cpu")  # already warming for this environment: nothing new
        assert slots.peek() is standby
        second = slots.take(env, guard, "cpu")
        assert second is standby and (slots.hits, slots.misses) == (1, 1)
        assert slots.peek() is None  # handed out once
        third = slots.take(env, guard, "cpu")
        assert third is not second and (slots.hits, slots.misses) == (1, 2)
        for slot in (first, second, third):
            slot.close()

        # a standby started for other settings (another cache, other limits) is not handed out, and is killed
        slots.refill(env, guard, "cpu")
        stale = slots.peek()
        other_env, other_guard = _env_guard(tmp_path / "other", child_cpu_seconds=77)
        fresh = slots.take(other_env, other_guard, "cpu")
        assert fresh is not stale and slots.misses == 3
        assert _gone(stale.reference.proc.pid) and _gone(stale.candidate.proc.pid)
        assert not stale.workdir.exists()
        fresh.close()
    finally:
        slots.close()


def test_a_standby_whose_child_died_is_replaced(tmp_path):
    slots = StandbySlots()
    env, guard = _env_guard(tmp_path)
    try:
        slots.refill(env, guard, "cpu")
        standby = slots.peek()
        os.killpg(standby.candidate.proc.pid, signal.SIGKILL)
        standby.candidate.proc.wait(timeout=10)
        slot = slots.take(env, guard, "cpu")
        assert slot is not standby and (slots.hits, slots.misses) == (0, 1)
        assert _gone(standby.reference.proc.pid)  # the dead slot's other child is killed too
        slot.close()
    finally:
        slots.close()


def test_only_an_untouched_slot_may_be_given_back(tmp_path):
    slots = StandbySlots()
    env, guard = _env_guard(tmp_path)
    try:
        unused = slots.take(env, guard, "cpu")
        slots.give_back(unused)
        assert slots.peek() is unused and unused.alive()
        assert slots.take(env, guard, "cpu") is unused

        unused.used = True  # a request reached its children
        slots.give_back(unused)
        assert slots.peek() is None and _gone(unused.candidate.proc.pid) and not unused.workdir.exists()

        written = slots.take(env, guard, "cpu")
        (written.workdir / "solution" / "model_new.py").write_text("x = 1\n")  # a solution was written into it
        slots.give_back(written)
        assert slots.peek() is None and not written.workdir.exists()
    finally:
        slots.close()


def test_pairs_kept_ahead_are_handed_out_oldest_first_and_trimmed_to_the_depth(tmp_path):
    slots = StandbySlots()
    env, guard = _env_guard(tmp_path)
    try:
        slots.refill(env, guard, "cpu", depth=2)
        assert slots.warming() == 2
        oldest = slots.peek()
        oldest.wait_ready(60)
        first = slots.take(env, guard, "cpu")
        assert first is oldest and slots.warming() == 1 and (slots.hits, slots.misses) == (1, 0)
        younger = slots.peek()
        slots.refill(env, guard, "cpu", depth=2)  # one more started behind the one warming
        assert slots.warming() == 2 and slots.peek() is younger
        newest = slots._queue[-1]
        pids = {p.proc.pid for s in (first, younger, newest) for p in (s.reference, s.candidate)}
        assert len(pids) == 6  # three pairs, no process shared

        slots.refill(env, guard, "cpu", depth=1)  # a smaller depth closes the youngest beyond it
        assert slots.warming() == 1 and slots.peek() is younger
        assert _gone(newest.candidate.proc.pid) and not newest.workdir.exists()

        slots.refill(env, guard, "cpu", depth=2)
        behind = slots._queue[-1]
        os.killpg(younger.candidate.proc.pid, signal.SIGKILL)  # the oldest standby dies: the next one is taken
        younger.candidate.proc.wait(timeout=10)
        assert slots.take(env, guard, "cpu") is behind and _gone(younger.reference.proc.pid)
        first.close()
        behind.close()
    finally:
        slots.close()
    assert slots.warming() == 0


def test_close_kills_the_whole_group_and_removes_the_folder(tmp_path):
    slots = StandbySlots()
    env, guard = _env_guard(tmp_path)
    slots.refill(env, guard, "cpu")
    standby = slots.peek()
    pids = [standby.reference.proc.pid, standby.candidate.proc.pid]
    slots.close()
    assert all(_gone(pid) for pid in pids)
    assert not standby.workdir.exists()


STATEFUL_PRELUDE = """
if getattr(torch, "_served_an_evaluation", False):
    raise RuntimeError("this process already served an evaluation")
torch._served_an_evaluation = True
"""


def test_warm_children_serve_one_evaluation_each(build_cache):
    """With children kept warm, back-to-back evaluations find their children started, and a
    candidate that marks its process finds no mark: no process serves two evaluations."""
    solution = workspace(model_new=model_new_with("return cuda_extension.axpy_forward(x, y, float(self.alpha))", prelude=STATEFUL_PRELUDE))
    settings = host(build_cache, static_checks=False)
    before = evaluation.standby_counters()
    with evaluation.children_kept_warm():
        first = evaluation.evaluate(AXPY_TASK, solution, settings)
        time.sleep(1.0)
        second = evaluation.evaluate(AXPY_TASK, solution, settings)
        third = evaluation.evaluate(AXPY_TASK, solution, settings)
        counters = evaluation.standby_counters()
    assert [r["status"] for r in (first, second, third)] == ["correct"] * 3, [r["message"] for r in (first, second, third)]
    assert counters["hits"] - before["hits"] >= 2  # the second and third found warm children
    assert second["children_warm_s"] >= 1.0  # started while the first evaluation ended, a second earlier
    assert evaluation._STANDBY.peek() is None  # leaving the block stops and removes the standby


def test_without_keep_warm_no_child_outlives_its_evaluation(build_cache):
    before = evaluation.standby_counters()
    record = evaluation.evaluate(AXPY_TASK, workspace(), host(build_cache))
    assert record["status"] == "correct"
    assert evaluation._STANDBY.peek() is None
    assert evaluation.standby_counters()["misses"] == before["misses"] + 1


def test_a_dead_parent_leaves_no_children_and_no_folder(tmp_path):
    """The evaluating process killed outright (a hung worker's child, say) while a slot warms:
    the children see their channels close, exit, and the slot's folder is removed."""
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys, time\n"
        "from evaluator_cuda.extension.torch_build import build_env\n"
        "from evaluator_cuda.isolation.sandbox import StandbySlots, child_guard\n"
        "from evaluator_cuda.settings import EvalSettings\n"
        f"settings = EvalSettings.for_backend('host', cache_dir={str(tmp_path / 'cache')!r})\n"
        "slots = StandbySlots()\n"
        "slots.refill(build_env(settings), child_guard(settings), 'cpu')\n"
        "s = slots.peek()\n"
        "print(s.workdir, s.reference.proc.pid, s.candidate.proc.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    repo = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")]))
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    try:
        workdir, ref_pid, cand_pid = parent.stdout.readline().split()
        assert Path(workdir).is_dir()
    finally:
        parent.kill()
        parent.wait(timeout=10)
    assert _gone(int(ref_pid), timeout=60) and _gone(int(cand_pid), timeout=60)
    deadline = time.monotonic() + 30
    while Path(workdir).exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(workdir).exists()


def test_a_standby_slot_matches_whatever_the_free_memory_did_since(tmp_path):
    """Both memory limits follow the machine's free memory, which drifts between evaluations: a
    slot started a moment earlier must still match the next evaluation's key."""
    from evaluator_cuda.isolation.sandbox import _slot_key

    env, guard = _env_guard(tmp_path)
    jail = {"enabled": True, "memory_bytes": 20 * 1024**3, "cgroup_memory_bytes": 20 * 1024**3, "processes": 256}
    later = {**jail, "memory_bytes": 19 * 1024**3, "cgroup_memory_bytes": 19 * 1024**3}
    assert _slot_key(env, {**guard, "jail": jail}) == _slot_key(env, {**guard, "jail": later})
    assert _slot_key(env, {**guard, "jail": jail}) != _slot_key(env, {**guard, "jail": {**jail, "processes": 64}})


def test_the_record_says_where_the_childrens_start_went(build_cache):
    """Each child's marks, in seconds from its pair's start: after it, in order, and its `ready` answer
    before the evaluation read it."""
    begin = time.monotonic()
    record = evaluation.evaluate(AXPY_TASK, workspace("+"), host(build_cache))
    assert record["status"] == "correct", record["message"]
    elapsed = time.monotonic() - begin
    for role in ("reference", "candidate"):
        marks = record["children_start_s"][role]
        assert list(marks) == ["serve", "warm", "ready"], marks  # the host: no CUDA context, no kernel trace
        assert 0 <= marks["serve"] <= marks["warm"] <= marks["ready"] <= elapsed, marks


def test_a_slot_says_when_its_start_is_done_and_a_dead_child_is_reported(tmp_path, monkeypatch):
    """wait_ready answers once both children have warmed, with each one's marks (idempotent); a child
    that died before its answer is a ChildFailed, and the standby holding it is dropped."""
    from evaluator_cuda.isolation.sandbox import Child, ChildFailed, EvaluationSlot

    env, guard = _env_guard(tmp_path)
    slot = EvaluationSlot(env, guard, "cpu")
    try:
        marks = slot.wait_ready(120)
        assert set(marks) == {"reference", "candidate"}
        assert all(slot.started_at <= m["serve"] <= m["warm"] <= m["ready"] <= time.monotonic() for m in marks.values())
        assert slot.wait_ready(0.1) is marks
    finally:
        slot.close()
    # The `ready` requests are held back until the reference child is dead: a child forked from a warm
    # server can answer within milliseconds, before any kill from here lands.
    held, real_submit = [], Child.submit
    monkeypatch.setattr(Child, "submit", lambda child, message: held.append((child, message))
                        if message == {"cmd": "ready"} else real_submit(child, message))
    slots = StandbySlots()
    try:
        slots.refill(env, guard, "cpu")
        monkeypatch.undo()
        standby = slots.peek()
        os.killpg(standby.reference.proc.pid, signal.SIGKILL)
        standby.reference.proc.wait(timeout=10)
        for child, message in held:
            child.submit(message)
        try:
            standby.wait_ready(60)
            raise AssertionError("a dead child answered ready")
        except ChildFailed as exc:
            assert exc.kind == "died"
        assert slots.wait_ready(60) is not None and slots.peek() is None and not standby.workdir.exists()
        assert slots.wait_ready(60) is None  # no standby: nothing to wait for
    finally:
        slots.close()


def _standby_when_the_calls_began(monkeypatch, build_cache, start: str) -> tuple[dict, dict]:
    """Two warm evaluations with next_children_start=`start`; for the second, what the standby looked
    like when its calls began (none, warming or warm)."""
    seen = {}
    real_run_calls = evaluation.run_calls

    def spying_run_calls(*args, **kwargs):
        standby = evaluation._STANDBY.peek()
        seen["standby"] = None if standby is None else ("warm" if standby.start_marks is not None else "warming")
        return real_run_calls(*args, **kwargs)

    monkeypatch.setattr(evaluation, "run_calls", spying_run_calls)
    settings = host(build_cache, profile=True, next_children_start=start)
    with evaluation.children_kept_warm():
        evaluation.evaluate(AXPY_TASK, workspace(), settings)
        record = evaluation.evaluate(AXPY_TASK, workspace(), settings)
    assert record["status"] == "correct", record["message"]
    return record, seen


def test_the_next_pair_starts_after_the_timed_calls_by_default(monkeypatch, build_cache):
    record, seen = _standby_when_the_calls_began(monkeypatch, build_cache, "after_timing")
    assert seen["standby"] is None  # nothing started while this evaluation's calls ran
    steps = record["verify_steps_s"]
    assert record["next_children_started_s"] >= steps["calls"] + steps["load"]
    assert "next_children_wait_s" not in record


def test_at_start_the_next_pair_warms_during_the_load_and_is_warm_before_any_timed_call(monkeypatch, build_cache):
    record, seen = _standby_when_the_calls_began(monkeypatch, build_cache, "at_start")
    assert seen["standby"] == "warm"  # started earlier and waited for: warm when the calls began
    assert record["next_children_started_s"] < record["verify_steps_s"]["load"] + record["verify_steps_s"]["calls"]
    assert record["next_children_wait_s"] is not None and record["next_children_wait_s"] >= 0


def test_overlapping_starts_the_next_pair_at_once_and_does_not_wait(monkeypatch, build_cache):
    record, seen = _standby_when_the_calls_began(monkeypatch, build_cache, "overlapping")
    assert seen["standby"] in ("warm", "warming")
    assert "next_children_wait_s" not in record
    assert record["next_children_started_s"] < record["verify_steps_s"]["load"] + record["verify_steps_s"]["calls"]


def test_an_unknown_next_children_start_is_refused():
    try:
        EvalSettings.for_backend("host", next_children_start="whenever")
        raise AssertionError("accepted")
    except ValueError as exc:
        assert "next_children_start must be one of after_timing, at_start, overlapping" in str(exc)


def test_standby_pairs_out_of_range_are_refused():
    for bad in (0, 5, True, "2", 1.5):
        try:
            EvalSettings.for_backend("host", standby_pairs=bad)
            raise AssertionError(f"accepted {bad!r}")
        except ValueError as exc:
            assert "standby_pairs must be an integer from 1 to 4" in str(exc)


def test_with_two_standby_pairs_each_evaluation_finds_warm_children_and_leaves_two_warming(build_cache):
    settings = host(build_cache, profile=False, standby_pairs=2, next_children_start="overlapping")
    before = evaluation.standby_counters()
    with evaluation.children_kept_warm():
        records = [evaluation.evaluate(AXPY_TASK, workspace(), settings) for _ in range(3)]
        assert evaluation._STANDBY.warming() == 2
        waiting = evaluation._STANDBY.peek()
    assert all(r["status"] == "correct" for r in records), [r["message"] for r in records]
    counters = evaluation.standby_counters()
    assert counters["hits"] - before["hits"] == 2 and counters["misses"] - before["misses"] == 1
    assert evaluation._STANDBY.warming() == 0 and not waiting.workdir.exists()  # leaving the block stops them
