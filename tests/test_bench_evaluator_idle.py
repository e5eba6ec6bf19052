"""The idle probe (scripts/evaluator_bench/idle.py), dry on the CPU: every way timed, the waits made, the
launch pad restored."""

import time

import pytest
import torch

pytestmark = pytest.mark.usefixtures("scripts_on_path")


def test_each_way_gives_a_median_and_its_ratio_to_back_to_back(capsys):
    from evaluator_bench import idle
    from evaluator_bench.report import Clock

    rows = idle.idle_rows(Clock(), "3_ReLU", rounds=2, device="cpu", wait_scale=0.01)
    assert [row["way"] for row in rows] == list(idle.WAYS)
    assert all(row["n"] == 20 and row["median_us"] > 0 for row in rows) and rows[0]["ratio"] == 1.0
    idle.print_rows(rows)
    assert "busy 4 ms" in capsys.readouterr().out


def test_a_waiting_way_waits_before_each_preparation_and_the_pad_is_restored():
    from evaluator_bench import idle
    from evaluator_cuda.timing import profile

    prepared = []

    class Calls:
        inputs = [torch.ones(3), 2.0]

        def prepare(self, position):
            prepared.append((position, time.perf_counter(), list(self.inputs)))

    calls = Calls()
    way = idle._Waiting(calls, wait_ms=20.0, busy=False, device="cpu", sent=True)
    begin = time.perf_counter()
    way.prepare(3)
    position, when, inputs = prepared[0]
    assert position == 3 and when - begin >= 0.02
    assert inputs[0] is not Calls.inputs[0] and torch.equal(inputs[0], torch.ones(3)) and inputs[1] == 2.0
    before = profile.LAUNCH_PAD_CYCLES
    with pytest.raises(RuntimeError):
        with idle._pad(4):
            assert profile.LAUNCH_PAD_CYCLES == 4 * before
            raise RuntimeError("a failing case")
    assert profile.LAUNCH_PAD_CYCLES == before
