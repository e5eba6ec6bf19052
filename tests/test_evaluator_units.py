"""In-process units of the evaluator: the output comparison, the structured channel, compiler
diagnostics and the torch-compute guard."""

import socket
import threading

import pytest
import torch
import torch.nn.functional as F

from evaluator_cuda.isolation import wire
from evaluator_cuda.extension.diagnostics import parse_compiler_output
from evaluator_cuda.isolation.torch_guard import ForbiddenTorchCompute, refuse_torch_compute
from evaluator_cuda.verdict.verify import compare_outputs
from evaluator_helpers import FakeCudaEvent

CPU = {"cls": "Tensor", "device": "cpu"}


def test_compare_accepts_within_tolerance_and_rejects_beyond():
    expected = torch.tensor([1.0, 100.0])
    # assert_close: |a - e| <= atol + rtol * |e| = 0.01 + 0.01*|e|
    assert compare_outputs(expected, torch.tensor([1.019, 101.0]), [CPU], "cpu", 1e-2, 1e-2) is None
    problem = compare_outputs(expected, torch.tensor([1.03, 100.0]), [CPU], "cpu", 1e-2, 1e-2)
    assert problem.startswith("output: values differ")
    assert compare_outputs(torch.tensor([float("nan")]), torch.tensor([float("nan")]), [CPU], "cpu", 1e-2, 1e-2) is not None
    inf = torch.tensor([1.0, float("inf")])
    assert compare_outputs(inf, inf.clone(), [CPU], "cpu", 1e-2, 1e-2) is None  # equal infinities pass
    assert compare_outputs(inf, torch.tensor([1.0, 5.0]), [CPU], "cpu", 1e-2, 1e-2) is not None  # tol would be inf
    assert compare_outputs(torch.tensor([1, 2]), torch.tensor([1, 3]), [CPU], "cpu", 1e-2, 1e-2) is not None


def test_compare_checks_structure_dtype_shape_device_and_class():
    e = torch.zeros(2, 3)
    assert "expected a tuple of 2" in compare_outputs((e, e), (e,), [CPU], "cpu", 1e-2, 1e-2)
    assert "expected a tensor, got list" in compare_outputs(e, [e], [CPU], "cpu", 1e-2, 1e-2)
    assert "expected dtype float32, got float64" in compare_outputs(e, e.double(), [CPU], "cpu", 1e-2, 1e-2)
    assert "expected shape (2, 3), got (3, 2)" in compare_outputs(e, torch.zeros(3, 2), [CPU], "cpu", 1e-2, 1e-2)
    assert "expected device cuda, got cpu" in compare_outputs(e, e, [CPU], "cuda", 1e-2, 1e-2)
    assert "exactly torch.Tensor" in compare_outputs(e, e, [{"cls": "Parameter", "device": "cpu"}], "cpu", 1e-2, 1e-2)
    assert compare_outputs((e, 3), (e.clone(), 3), [CPU], "cpu", 1e-2, 1e-2) is None
    assert "output[1]" in compare_outputs((e, e), (e, e + 1), [CPU, CPU], "cpu", 1e-2, 1e-2)


def test_wire_round_trip_keeps_values_and_reports_metadata():
    a, b = socket.socketpair()
    value = {
        "x": torch.arange(6, dtype=torch.float32).reshape(2, 3),
        "pair": (torch.tensor([1.5, -2.0], dtype=torch.bfloat16), 7),
        "empty": torch.empty(0, 4),
        "list": [None, True, "s", 2.5, torch.int64],
        "blob": b"\x00\x01",
    }
    wire.send_message(a, value)
    meta: list = []
    got = wire.recv_message(b, timeout=5, tensor_meta=meta)
    assert torch.equal(got["x"], value["x"]) and got["x"].dtype == torch.float32
    assert isinstance(got["pair"], tuple) and torch.equal(got["pair"][0], value["pair"][0]) and got["pair"][1] == 7
    assert got["empty"].shape == (0, 4)
    assert got["list"] == [None, True, "s", 2.5, torch.int64] and got["blob"] == b"\x00\x01"
    assert [m["dtype"] for m in meta] == ["float32", "bfloat16", "float32"]
    assert all(m["cls"] == "Tensor" and m["device"] == "cpu" for m in meta)


def test_wire_rejects_a_forged_tensor_and_times_out():
    a, b = socket.socketpair()
    blobs: list = []
    body = wire.encode_value(torch.zeros(4), blobs)
    body["shape"] = [1000]  # claims more data than it sends
    import json
    import struct

    header = json.dumps({"body": body, "blobs": [len(x) for x in blobs]}).encode()
    a.sendall(struct.pack(">I", len(header)) + header + b"".join(blobs))
    with pytest.raises(wire.ProtocolError):
        wire.recv_message(b, timeout=5)
    with pytest.raises(wire.ChannelTimeout):
        wire.recv_message(b, timeout=0.2)
    a.close()
    with pytest.raises(wire.ChannelClosed):
        wire.recv_message(b, timeout=1)


def test_diagnostics_from_gcc_nvcc_and_the_linker():
    text = """[1/3] c++ -c /tmp/b/src/kernels/op.cpp
FAILED: op.o
/tmp/b/src/kernels/op.cpp:12:5: error: expected ';' before '}' token
/tmp/b/src/kernels/op.cu(40): error: identifier "blockIdxx" is undefined
/tmp/b/src/kernels/op.cu(41): catastrophic error: cannot open source file "nope.h"
/usr/bin/ld: op.o: undefined reference to `op_launcher'
ninja: build stopped: subcommand failed.
"""
    diags = parse_compiler_output(text, roots=["/tmp/b/src"])
    assert diags[:3] == [
        {"file": "kernels/op.cpp", "line": 12, "message": "expected ';' before '}' token"},
        {"file": "kernels/op.cu", "line": 40, "message": 'identifier "blockIdxx" is undefined'},
        {"file": "kernels/op.cu", "line": 41, "message": 'cannot open source file "nope.h"'},
    ]
    assert diags[3] == {"file": None, "line": None, "message": "undefined reference to `op_launcher'"}
    assert parse_compiler_output("something odd happened\n") == [{"file": None, "line": None, "message": "something odd happened"}]


def test_guard_allows_allocation_views_and_metadata():
    x = torch.randn(4, 6)
    with refuse_torch_compute():
        y = torch.empty_like(x)
        z = x.view(6, 4).t().contiguous()
        w = torch.zeros(3, dtype=torch.float32)
        assert x.shape == (4, 6) and x.size(1) == 6 and x.dtype == torch.float32 and x.is_contiguous()
        assert y.shape == x.shape and z.shape == (4, 6) and w.numel() == 3
        x.new_empty(2)
        x[1:3]


FUNCTIONAL_CALLS = [
    lambda x: F.relu(x),
    lambda x: F.gelu(x),
    lambda x: F.softmax(x, dim=-1),
    lambda x: F.linear(x, torch.ones(4, 4)),
    lambda x: F.conv2d(x.view(1, 1, 4, 4), torch.ones(1, 1, 3, 3)),
    lambda x: F.max_pool2d(x.view(1, 1, 4, 4), 2),
    lambda x: F.layer_norm(x, (4,)),
    lambda x: F.dropout(x, 0.5, training=True),
    lambda x: F.scaled_dot_product_attention(x.view(1, 4, 4), x.view(1, 4, 4), x.view(1, 4, 4)),
    lambda x: F.mse_loss(x, x),
    lambda x: F.pad(x, (1, 1)),
    lambda x: F.interpolate(x.view(1, 1, 4, 4), scale_factor=2.0),
]
OTHER_COMPUTE = [
    lambda x: torch.matmul(x, x),
    lambda x: x @ x,
    lambda x: x + 1,
    lambda x: x.sum(),
    lambda x: x.exp_(),
    lambda x: torch.ops.aten.relu.default(x),
    lambda x: torch.where(x > 0, x, 0.0),
    lambda x: x.copy_(x * 2),
]


@pytest.mark.parametrize("call", FUNCTIONAL_CALLS + OTHER_COMPUTE)
def test_guard_refuses_compute(call):
    x = torch.randn(4, 4)
    before = x.clone()
    with refuse_torch_compute(), pytest.raises(ForbiddenTorchCompute, match="is not allowed while the candidate runs"):
        call(x)
    assert torch.equal(x, before)


PLANTED_DYNAMO = """
import sys
import types

import torch

from evaluator_cuda.isolation.torch_guard import ForbiddenTorchCompute, prime_guard, refuse_torch_compute

assert "torch._dynamo" not in sys.modules, "torch imported torch._dynamo by itself"
if sys.argv[1] == "primed":
    prime_guard()  # what the candidate child does when it starts
fake = types.ModuleType("torch._dynamo")  # planted by candidate code before its first call
fake.disable = lambda fn, *a, **k: (lambda mode, func, types, args=(), kwargs=None: func(*args, **(kwargs or {})))
sys.modules["torch._dynamo"] = fake
torch._dynamo = fake
x = torch.ones(4)
try:
    with refuse_torch_compute(), torch._C.DisableTorchFunction():  # only the ATen layer sees the add
        x + x
except ForbiddenTorchCompute:
    print("refused")
else:
    print("computed")
print("dynamo imported" if sys.modules["torch._dynamo"] is not fake else "dynamo not imported")
"""


def test_a_planted_torch_dynamo_cannot_switch_the_aten_guard_off(tmp_path):
    """torch wraps a dispatch mode's handler in one that imports torch._dynamo at its first use and runs
    what that module hands back. The guard's ATen mode is not wrapped: a module planted before the first
    guarded call (primed at load or not) changes nothing, and torch._dynamo is never imported (a second
    and more of each candidate child's CPU). Fails with the handler wrapped: unprimed, ATen computes."""
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "planted.py"
    script.write_text(PLANTED_DYNAMO)
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[1]), "PATH": "/usr/bin:/bin"}
    for mode in ("primed", "unprimed"):
        said = subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True, env=env,
                              timeout=300)
        assert said.stdout.split() == ["refused", "dynamo", "not", "imported"], (mode, said.stdout, said.stderr[-2000:])


def test_guard_off_is_a_no_op():
    x = torch.randn(3)
    with refuse_torch_compute(enabled=False):
        assert torch.allclose(F.relu(x), x.clamp(min=0))


def test_cuda_timing_functions_are_bound_before_candidate_code_and_patching_them_changes_nothing(monkeypatch):
    """bind_cuda_timing() (run by the candidate child before it imports candidate code) keeps the
    event/synchronize functions it found; a candidate that later rebinds torch.cuda's does not
    change the harness's times (docs/cheats.md #7). Fakes stand in for CUDA here."""
    import time

    from evaluator_cuda.timing import profile

    synced = []
    monkeypatch.setattr(torch.cuda, "Event", FakeCudaEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: synced.append(1))
    slept = []
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: slept.append(cycles))
    monkeypatch.setattr(profile, "_cuda_timing", None)
    monkeypatch.setattr(profile, "_reset_persisting_l2", None)
    profile.bind_cuda_timing()
    # the candidate's patches, after the binding
    monkeypatch.setattr(FakeCudaEvent, "elapsed_time", lambda self, end: 1e-6)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: None)
    output, time_us, wall_us = profile.time_one_call(lambda: time.sleep(0.02) or "out", "cuda")
    assert output == "out" and synced == [1]
    assert slept == [profile.LAUNCH_PAD_CYCLES]  # the launch pad went ahead of the start event
    assert 15_000 < time_us <= wall_us  # the bound elapsed_time measured the 20 ms sleep, not the patched 1 ns


def test_persisting_l2_reset_reports_what_the_driver_did(monkeypatch):
    from evaluator_cuda.timing import profile

    monkeypatch.setattr(profile, "_reset_persisting_l2", None)
    assert profile.reset_persisting_l2() is False  # no driver (this machine)
    monkeypatch.setattr(profile, "_reset_persisting_l2", lambda: 0)
    assert profile.reset_persisting_l2() is True  # CUDA_SUCCESS
    monkeypatch.setattr(profile, "_reset_persisting_l2", lambda: 801)
    assert profile.reset_persisting_l2() is False  # CUDA_ERROR_NOT_SUPPORTED


def test_the_reference_child_binds_the_persisting_l2_reset_at_a_cuda_load(monkeypatch):
    """Its baseline calls demote persisting L2 lines as the candidate's calls do (CandidateLikeCalls
    calls reset_persisting_l2): unbound, the reset was a no-op there and only the candidate paid for it."""
    from evaluator_cuda.roles import reference
    from evaluator_cuda.timing import profile

    resets = []
    monkeypatch.setattr(profile, "_reset_persisting_l2", None)
    monkeypatch.setattr(profile, "_cuda_timing", None)
    monkeypatch.setattr(profile, "_driver_persisting_l2_reset", lambda: lambda: resets.append(1) or 0)
    monkeypatch.setattr(torch.nn.Module, "to", lambda self, *args, **kwargs: self)  # no GPU here
    monkeypatch.setattr(reference, "device_name", lambda device: "a test GPU")
    source = "import torch\ndef get_inputs():\n    return [torch.randn(4)]\ndef get_init_inputs():\n    return []\n" \
             "class Model(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n"
    role = reference.ReferenceRole()
    host = role.do_load({"task_name": "t", "task_source": source, "device": "cpu", "init_seed": 1})
    assert host["persisting_l2_reset"] is None and profile.reset_persisting_l2() is False
    loaded = role.do_load({"task_name": "t", "task_source": source, "device": "cuda", "init_seed": 1})
    assert loaded["persisting_l2_reset"] is True
    assert profile.reset_persisting_l2() is True and resets == [1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine where torch.device('cuda') cannot make tensors")
def test_reference_inputs_fall_back_to_the_host_when_the_device_cannot_make_them():
    """On a GPU the reference child runs get_inputs() under torch.device('cuda'); when that fails
    (here: no GPU at all) it makes the sets on the host, as the task wrote them, from the same seed."""
    from evaluator_cuda.roles.reference import ReferenceRole
    from evaluator_cuda.tasks import exec_task

    source = "import torch\ndef get_inputs():\n    return [torch.randn(64), 3]\ndef get_init_inputs():\n    return []\nclass Model(torch.nn.Module):\n    def forward(self, x, k):\n        return x * k\n"
    role = ReferenceRole()
    role.task_name, role.device, role.namespace = "t", "cuda", exec_task("t", source)
    first = role._inputs_from_seed(123)
    assert role.generate_on_device is False  # the device attempt failed once: host from now on
    torch.manual_seed(123)
    expected = torch.randn(64)
    assert torch.equal(first[0], expected) and first[1] == 3
    assert torch.equal(role._inputs_from_seed(123)[0], expected)


def test_describe_tensors_follows_the_encoding_order_and_reports_the_tensors_own_device():
    value = {"a": torch.zeros(2, device="meta"), "b": (torch.ones(1), [torch.nn.Parameter(torch.ones(1))]), "c": 3}
    described = wire.describe_tensors(value)
    assert described == [{"cls": "Tensor", "device": "meta"}, CPU, {"cls": "Parameter", "device": "cpu"}]


def test_candidate_call_describes_its_output_before_the_host_copy(monkeypatch):
    """The regression behind every honest CUDA kernel judged `incorrect`: the output was copied to
    the host and then described, so a CUDA output was reported as a CPU one. Here the host copy is
    made to land on another device (meta); the description must still be the forward's own."""
    from evaluator_cuda.roles import candidate
    from evaluator_cuda.verdict.verify import compare_outputs

    class Double(torch.nn.Module):
        def forward(self, x):
            return x * 2

    candidate.take_refusals()  # refusals other tests in this process left on record
    role = candidate.CandidateRole()
    role.model, role.device, role.block_torch = Double(), "cpu", False
    role.threads_at_start = {t.ident for t in threading.enumerate()}
    role.precision_at_start = candidate.precision_settings()  # what do_load records
    monkeypatch.setattr(candidate, "_copy_out", lambda v: v.to("meta"))
    reply = role.do_call({"inputs": [torch.arange(4.0)], "poison": 0})
    assert reply["output"].device.type == "meta"
    assert reply["output_meta"] == [CPU]
    monkeypatch.undo()
    reply = role.do_call({"inputs": [torch.arange(4.0)], "poison": 1})
    assert compare_outputs(torch.arange(4.0) * 2, reply["output"], reply["output_meta"], "cpu", 1e-2, 1e-2) is None



@pytest.mark.parametrize("available_gib, backend, setting_gib, address_gib, cgroup_gib", [
    (100.0, "host", None, 32, 32),   # the host default bounds both
    (100.0, "cuda", None, 0, 32),    # no address-space limit on CUDA; the cgroup takes the CUDA default
    (10.5, "host", None, 10, 10),    # never more than is available, in whole GiB
    (10.5, "cuda", None, 0, 10),
    (100.0, "cuda", 6, 6, 6),        # a setting bounds both
    (0.4, "host", None, 1, 1),       # at least one GiB
])
def test_child_memory_limits_follow_the_setting_and_the_memory_available(
        monkeypatch, available_gib, backend, setting_gib, address_gib, cgroup_gib):
    from evaluator_cuda.isolation import sandbox
    from evaluator_cuda.settings import EvalSettings

    gib = 1024**3
    monkeypatch.setattr(sandbox, "available_memory_bytes", lambda: int(available_gib * gib))
    settings = EvalSettings.for_backend(backend, child_memory_bytes=setting_gib and setting_gib * gib)
    assert sandbox.child_memory_limit(settings) == address_gib * gib
    assert sandbox.cgroup_memory_limit(settings) == cgroup_gib * gib
