"""Outputs committed by digest (evaluator_cuda/isolation/commitment.py): the digest is the same at both
ends of the wire and changes with any byte, dtype, shape or container; an evaluation whose candidate
answers with digests gives the honest verdict; a candidate that computes its output only when it is
fetched, or fetches nothing, is caught. Host backend, every output committed (`commit_output_bytes=0`)."""

import hashlib
import json
import socket
import threading

import pytest

torch = pytest.importorskip("torch")

from evaluator_cuda.evaluation import evaluate  # noqa: E402
from evaluator_cuda.isolation import commitment, wire  # noqa: E402
from evaluator_helpers import AXPY_TASK, build_cache, example, host, model_new_with, workspace  # noqa: E402,F401


def _across_the_wire(value):
    left, right = socket.socketpair()
    with left, right:
        sender = threading.Thread(target=wire.send_message, args=(left, {"output": value}))
        sender.start()  # a large value fills the socket's buffer before the other end reads
        received = wire.recv_message(right, timeout=10)["output"]
        sender.join()
        return received


def test_the_digest_of_what_was_sent_equals_the_digest_of_what_arrived():
    big = torch.randn(3, 1 << 19)  # 6 MiB: two chunks, hashed on the pool
    commitment.start_workers(2)
    for value in (torch.arange(10.0), (big, [torch.ones(2, dtype=torch.int64), 3.5]), {"a": big[0]}):
        assert commitment.value_digest(_across_the_wire(value)) == commitment.value_digest(value)


def test_the_digest_follows_the_scheme_its_module_describes():
    """A tensor under one chunk, by hand: SHA-256 over the JSON skeleton, then the blob's digest (its
    length, then its chunks' digests)."""
    value = torch.arange(6, dtype=torch.float32)
    data = value.numpy().tobytes()
    skeleton = {"__tensor__": 0, "dtype": "float32", "shape": [6]}
    blob = hashlib.sha256(len(data).to_bytes(8, "big") + hashlib.sha256(data).digest()).digest()
    by_hand = hashlib.sha256(json.dumps(skeleton, sort_keys=True, separators=(",", ":")).encode() + blob)
    assert commitment.value_digest(value) == by_hand.hexdigest()


def test_any_change_of_byte_dtype_shape_or_container_changes_the_digest():
    base = torch.randn(4, 1 << 18)  # 4 MiB: exactly one chunk
    one_bit = base.clone()
    one_bit.view(torch.int32)[3, -1] ^= 1
    digests = {commitment.value_digest(v) for v in (
        base, one_bit, base.view(torch.int32), base.reshape(-1), base.reshape(1 << 18, 4), [base], (base,),
        {"x": base}, torch.cat([base, base[:1]]))}
    assert len(digests) == 9


# --- evaluations ---------------------------------------------------------------------------------------

HONEST = "return cuda_extension.axpy_forward(x, y, float(self.alpha))"


def _committed(cache: str, **overrides):
    overrides.setdefault("timing_rounds_budget_s", 0.0)  # the schedule's calls alone
    return host(cache, commit_output_bytes=0, profile=True, repeats=5, timed_checks=4, **overrides)


def test_an_evaluation_with_every_output_committed_gives_the_verdict_of_one_without(build_cache):
    solution = workspace(model_new=model_new_with(HONEST))
    committed = evaluate(AXPY_TASK, solution, _committed(build_cache))
    sent = evaluate(AXPY_TASK, solution, host(build_cache, profile=True, repeats=5, timed_checks=4,
                                              timing_rounds_budget_s=0.0))
    for record in (committed, sent):
        assert record["status"] == "correct", record["message"]
        assert record["checked_calls"] == {"checks": 5, "timed": 4, "calls": 12}
    assert committed["calls_split_us"]["digest"] > 0  # the child hashed every output


LAZY = """
import sys
_role = sys.modules["evaluator_cuda.roles.candidate"].CandidateRole
_last = {}

def _output_when_asked(self, req):
    x, y, alpha = _last["call"]
    return {"output": alpha * x + y}  # the true output, computed only for a fetched call

_role.do_output = _output_when_asked
"""
LAZY_FORWARD = """
_last["call"] = (x, y, float(self.alpha))
return cuda_extension.axpy_forward(x, y, 0.0)  # the cheap, wrong answer the call commits to
"""


def test_an_output_computed_only_when_fetched_is_rejected_by_its_digest(build_cache):
    solution = workspace(model_new=model_new_with(LAZY_FORWARD, prelude=LAZY))
    record = evaluate(AXPY_TASK, solution, _committed(build_cache, static_checks=False))
    assert record["status"] == "incorrect" and record["rejected"] == "output_changed", record["message"]
    # the same candidate with its outputs sent is judged on the wrong answer it gave at the call
    sent = evaluate(AXPY_TASK, solution, host(build_cache, static_checks=False))
    assert sent["status"] == "incorrect" and "values differ" in sent["message"], sent["message"]


@pytest.mark.parametrize("change, status, message", [
    ("_role.do_output = lambda self, req: {}", "incorrect", "rejected: output_changed"),
    ("_role.do_output = lambda self, req: _raise(RuntimeError('gone'))", "runtime_error", "gone"),
    ("_role._output_or_digest = lambda self, *args: {}", "runtime_error", "neither its output nor a digest"),
])
def test_a_candidate_that_withholds_its_output_is_caught(build_cache, change, status, message):
    prelude = (f"import sys\n_role = sys.modules['evaluator_cuda.roles.candidate'].CandidateRole\n"
               f"def _raise(exc):\n    raise exc\n{change}\n")
    solution = workspace(model_new=model_new_with(HONEST, prelude=prelude))
    record = evaluate(AXPY_TASK, solution, _committed(build_cache, static_checks=False))
    assert record["status"] == status and message in record["message"], record["message"]


# --- on the GPU (scripts/gpu_check.sh runs these before the setting's default may change) ---------------

@pytest.mark.cuda
@pytest.mark.parametrize("name, status", [("layernorm", "correct"), ("gemm_bias_gelu__wrong", "incorrect")])
def test_cuda_examples_with_their_outputs_committed_keep_their_verdicts(name, status):
    """The 64 MiB layernorm output committed by digest on every call, profiled; the wrong GEMM still
    caught on its fetched check outputs."""
    from evaluator_cuda.settings import COMMIT_OUTPUT_BYTES, EvalSettings

    task, solution = example(name)
    settings = EvalSettings.for_backend("cuda", commit_output_bytes=COMMIT_OUTPUT_BYTES, profile=status == "correct")
    record = evaluate(task, solution, settings)
    assert record["status"] == status, record["message"]
    assert record["reward"] >= 1 if status == "correct" else record["reward"] == -1
    if status == "correct":
        assert record["checked_calls"]["timed"] == settings.timed_checks
        assert record["calls_split_us"]["digest"] > 0


def test_outputs_are_committed_by_default_on_cuda_and_sent_on_the_host():
    from evaluator_cuda.settings import COMMIT_OUTPUT_BYTES, EvalSettings

    assert EvalSettings.for_backend("cuda").commit_output_bytes == COMMIT_OUTPUT_BYTES
    assert EvalSettings.for_backend("host").commit_output_bytes is None
    assert EvalSettings.for_backend("cuda", commit_output_bytes=None).commit_output_bytes is None
    roundtrip = EvalSettings.from_dict(EvalSettings.for_backend("cuda", commit_output_bytes=None).to_dict())
    assert roundtrip.commit_output_bytes is None  # an explicit None survives the settings' journey to a worker
