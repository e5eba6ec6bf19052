"""Stopping a run by signal: the stop is never swallowed by the code the signal happens to interrupt.

Each test sends the signal to this process (it is delivered before os.kill returns, and Python runs the
handler at the next line) inside a block that catches what library code typically catches.
"""

import os
import signal

import pytest

from ablations.stopping import StopSignals, Stopped
from task_synthesis.pipeline.stopping import StopRequests


def _signal_inside_code_that_catches_runtime_errors(signum: int) -> None:
    """What threading.Condition.notify does around a waiter's release."""
    try:
        os.kill(os.getpid(), signum)
        for _ in range(100_000):  # lines for the handler to run between (it runs at the first)
            pass
    except RuntimeError:
        pass


@pytest.mark.parametrize("signum, name", [(signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "Ctrl-C")])
def test_a_synthesis_stop_request_is_recorded_not_raised(signum, name):
    before = signal.getsignal(signum)
    with StopRequests() as stop:
        assert stop.requested is None
        _signal_inside_code_that_catches_runtime_errors(signum)
        assert stop.requested == name
        _signal_inside_code_that_catches_runtime_errors(signal.SIGTERM if name == "Ctrl-C" else signal.SIGINT)
        assert stop.requested == name  # the first request is the one reported
    assert signal.getsignal(signum) is before


def test_an_ablation_stop_passes_through_code_that_catches_exception():
    with pytest.raises(Stopped, match="SIGTERM"), StopSignals():
        try:
            _signal_inside_code_that_catches_runtime_errors(signal.SIGTERM)
        except Exception:
            pass


def test_an_ablation_stop_inside_held_waits_for_the_block_to_end():
    finished = False
    with pytest.raises(Stopped, match="Ctrl-C"), StopSignals() as signals:
        with signals.held():
            _signal_inside_code_that_catches_runtime_errors(signal.SIGINT)
            finished = True
    assert finished
