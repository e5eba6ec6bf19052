"""Where the verdict process compares outputs (judge_device), moving nested outputs there
(on_device), and the record's split of the candidate's calls (summarize_split)."""

from __future__ import annotations

import pytest

from evaluator_cuda.evaluation import judge_device
from evaluator_cuda.settings import EvalSettings
from evaluator_cuda.timing.call_split import summarize_split
from evaluator_cuda.verdict.verify import compare_outputs, on_device

torch = pytest.importorskip("torch")


def test_the_judge_uses_the_gpu_only_for_cuda_evaluations_that_can_reach_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert judge_device(EvalSettings.for_backend("cuda")) == "cuda"
    assert judge_device(EvalSettings.for_backend("cuda", judge_on_device=False)) == "cpu"
    assert judge_device(EvalSettings.for_backend("host")) == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert judge_device(EvalSettings.for_backend("cuda")) == "cpu"


def test_on_device_moves_every_tensor_and_keeps_the_structure():
    value = {"a": [torch.ones(2), (torch.zeros(3), 4)], "b": "text"}
    moved = on_device(value, "meta")
    assert moved["b"] == "text" and moved["a"][1][1] == 4 and isinstance(moved["a"][1], tuple)
    assert moved["a"][0].device.type == "meta" and moved["a"][1][0].device.type == "meta"
    assert moved["a"][1][0].shape == (3,)


def test_a_moved_output_gets_the_same_verdict():
    expected = torch.linspace(-1, 1, 1000)
    wrong = expected.clone()
    wrong[17] += 0.5
    meta = [{"cls": "Tensor", "device": "cuda"}]
    here = compare_outputs(expected, wrong, meta, "cuda", 1e-2, 1e-2, norm_rtol=1e-2)
    moved = compare_outputs(on_device(expected, "cpu"), on_device(wrong, "cpu"), meta, "cuda", 1e-2, 1e-2, 1e-2)
    assert here is not None and here == moved
    assert compare_outputs(expected, on_device(expected.clone(), "cpu"), meta, "cuda", 1e-2, 1e-2, 1e-2) is None


def test_the_split_is_the_median_of_each_phase_and_the_channel_is_the_rest_of_the_round_trip():
    splits = [{"inputs": 10, "setup": 1, "call": 100, "checks": 5, "copy_out": 20, "digest": 4},
              {"inputs": 30, "setup": 3, "call": 300, "checks": 7, "copy_out": 40, "digest": 6},
              {"inputs": 20, "setup": 2, "call": 200, "checks": 6, "copy_out": 30, "digest": 5}]
    trips = [200.0, 500.0, 300.0]  # channel: 60, 114, 37
    summary = summarize_split(splits, trips)
    assert summary == {"inputs": 20, "setup": 2, "call": 200, "checks": 6, "copy_out": 30, "digest": 5,
                       "round_trip": 300.0, "channel": 60.0}


def test_the_split_skips_what_a_candidate_child_did_not_report_as_numbers():
    splits = [{"inputs": "fast", "call": float("nan")}, None, {"call": 7.0}]
    summary = summarize_split(splits, [10.0, 20.0, 30.0])
    assert summary == {"call": 7.0, "round_trip": 20.0}
    assert summarize_split([], []) is None


def test_a_receive_buffer_is_used_again_only_when_nothing_refers_to_it():
    from evaluator_cuda.isolation.wire import ReceiveBuffers

    pool = ReceiveBuffers(keep_bytes=64, min_bytes=16)
    first = pool.take(32)
    held = torch.frombuffer(first, dtype=torch.uint8)  # a decoded tensor keeps its buffer
    assert pool.take(32) is not first
    del held
    second = pool.take(32)
    assert second is not first  # `first` is still referenced here
    del first
    third = pool.take(32)  # the first buffer is free now: taken again; `second` is held
    assert third is not second and len(third) == 32 and len(pool.kept) == 2
    assert pool.take(8) not in pool.kept  # small blobs get buffers of their own
    big = pool.take(48)  # beyond the 64 kept bytes: the free one makes room only if unreferenced
    assert len(big) == 48 and sum(map(len, pool.kept)) <= 64 + 32


def test_messages_through_reused_buffers_arrive_intact():
    import socket
    import threading

    from evaluator_cuda.isolation import wire

    a, b = socket.socketpair()
    sent = [torch.arange(2**21, dtype=torch.float32) * k for k in range(4)]  # 8 MiB each: pooled

    def exchange(tensors: list, keep: bool) -> list:
        got, checked = [], []

        def receive():
            for tensor in tensors:
                value = wire.recv_message(b, timeout=30)["x"]
                checked.append(torch.equal(value, tensor))  # before the next message may reuse a buffer
                if keep:
                    got.append(value)  # kept: no buffer may be reused under it

        thread = threading.Thread(target=receive)
        thread.start()
        for tensor in tensors:
            wire.send_message(a, {"x": tensor})
        thread.join(timeout=60)
        return checked + [torch.equal(g, s) for g, s in zip(got, tensors)]

    assert all(exchange(sent, keep=True))
    assert all(exchange(list(reversed(sent)), keep=False))  # released each time: buffers reused, still whole
    a.close(), b.close()
