"""The bridge's wire format and journal, checked without processes."""

from __future__ import annotations

import hashlib
import pickle
import sqlite3

import msgpack
import pytest

from bridge import protocol
from bridge.journal import Journal
from bridge.protocol import Kind, ProtocolError

JOB = {
    "task": {"name": "relu", "source": "class Model: ..."},
    "solution": {"format": "workspace", "files": {"model_new.py": b"x = 1\n", "kernels/relu.cu": b"\x00\x01"}},
    "settings": {"backend": "cuda", "seed": 7},
}


def test_job_id_is_sha256_of_domain_service_salt_and_canonical_body():
    body = protocol.pack_body(JOB)
    expected = hashlib.sha256(b"cuda-agent-job/1\0" + b"evaluate\0" + b"\0" + body).hexdigest()
    assert protocol.job_id("evaluate", body) == expected


def test_job_id_ignores_key_order_but_sees_every_byte_of_content():
    reordered = {"settings": {"seed": 7, "backend": "cuda"}, "solution": dict(reversed(list(JOB["solution"].items()))),
                 "task": JOB["task"]}
    base = protocol.job_id("evaluate", protocol.pack_body(JOB))
    assert protocol.job_id("evaluate", protocol.pack_body(reordered)) == base
    changed = {**JOB, "solution": {**JOB["solution"], "files": {**JOB["solution"]["files"], "kernels/relu.cu": b"\x00\x02"}}}
    assert protocol.job_id("evaluate", protocol.pack_body(changed)) != base
    assert protocol.job_id("compile", protocol.pack_body(JOB)) != base
    assert protocol.job_id("evaluate", protocol.pack_body(JOB), salt="rep1") != base


def test_body_round_trip_keeps_bytes_and_strings_apart():
    assert protocol.unpack_body(protocol.pack_body(JOB)) == JOB


def test_body_with_unencodable_value_is_a_protocol_error():
    with pytest.raises(ProtocolError):
        protocol.pack_body({"x": object()})


def test_small_bodies_ride_inline_and_large_ones_get_their_own_frame():
    small, large = b"s" * 10, b"L" * (protocol.INLINE_PAYLOAD_BYTES + 1)
    payloads = []
    items = [protocol.attach({"id": "a"}, small, payloads), protocol.attach({"id": "b"}, large, payloads)]
    frames = protocol.encode(Kind.RESULTS, {"items": items}, payloads)
    assert len(frames) == 2 and frames[1] == large  # header + one frame for the large body
    message = protocol.decode(frames, 1 << 20)
    assert [protocol.payload_of(message, item) for item in message.fields["items"]] == [small, large]


@pytest.mark.parametrize(
    "frames, fragment",
    [
        ([], "empty"),
        ([b"\xc1garbage"], "not valid msgpack"),
        ([msgpack.packb([1, 2])], "not a msgpack map"),
        ([msgpack.packb({"v": 99, "kind": "submit"})], "version 99"),
        ([msgpack.packb({"kind": "submit"})], "version None"),
        ([msgpack.packb({"v": protocol.PROTOCOL_VERSION})], "no message kind"),
        ([pickle.dumps({"v": 1, "kind": "submit"})], "not valid msgpack"),
        ([msgpack.packb({"v": 1, "kind": "x"}), b"y" * 2000], "exceeds the limit of 1000 bytes"),
    ],
)
def test_decode_refuses_bad_messages_with_one_line(frames, fragment):
    with pytest.raises(ProtocolError) as err:
        protocol.decode(frames, 1000)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_items_and_payload_references_are_checked():
    message = protocol.decode(protocol.encode(Kind.DONE, {"items": [{"id": "a", "frame": 3}, {"id": "b"},
                                                                    {"id": "c", "body": "text"}]}, [b"r"]), 1 << 20)
    items = protocol.items_of(message, ("id",))
    with pytest.raises(ProtocolError, match="missing payload frame 3"):
        protocol.payload_of(message, items[0])
    with pytest.raises(ProtocolError, match="missing payload frame None"):
        protocol.payload_of(message, items[1])
    with pytest.raises(ProtocolError, match="body must be bytes"):
        protocol.payload_of(message, items[2])
    bad = protocol.decode(protocol.encode(Kind.DONE, {"items": [{"frame": 0}]}, [b"r"]), 1 << 20)
    with pytest.raises(ProtocolError, match="map with id"):
        protocol.items_of(bad, ("id",))


def test_journal_keeps_unfinished_jobs_and_owed_results_across_reopen(tmp_path):
    path = tmp_path / "journal.db"
    journal = Journal(path)
    journal.accept("j1", "evaluate", b"body1", 5.0, b"client-a")
    journal.accept("j2", "compile", b"body2", None, b"client-a")
    journal.add_waiter("j2", b"client-b")
    journal.record_failure("j2", 1, ["worker died"])
    journal.finish("j1", b"result1")
    journal.commit()
    journal.close()

    reopened = Journal(path)
    pending = reopened.pending_jobs()
    assert [(p.id, p.service, p.body, p.attempts, p.failures, p.waiters) for p in pending] == [
        ("j2", "compile", b"body2", 1, ["worker died"], {b"client-a", b"client-b"})
    ]
    assert reopened.undelivered_results() == [(b"client-a", "j1", b"result1")]
    assert reopened.result_of("j1") == b"result1" and reopened.result_of("j2") is None
    reopened.finish("j2", b"result2")
    assert reopened.results_of(["j1", "j2", "nope"]) == {"j1": b"result1", "j2": b"result2"}  # before commit too
    reopened.delivered([("j1", b"client-a")])
    reopened.commit()
    assert sorted(reopened.undelivered_results()) == [(b"client-a", "j2", b"result2"), (b"client-b", "j2", b"result2")]
    # Independent look at the file: WAL mode, the finished job's body dropped.
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert raw.execute("SELECT body FROM jobs WHERE id='j1'").fetchone()[0] is None


def test_journal_prune_drops_only_results_older_than_the_ttl(tmp_path):
    journal = Journal(tmp_path / "j.db")
    journal.accept("owed", "s", b"b", None, b"c")
    journal.accept("acked", "s", b"b", None, b"c")
    journal.accept("running", "s", b"b", None, b"c")
    journal.finish("owed", b"r")
    journal.finish("acked", b"r")
    journal.delivered([("acked", b"c")])
    journal.commit()
    assert journal.prune(ttl_s=3600.0) == 0 and journal.result_of("owed") == b"r"
    assert journal.prune(ttl_s=-1.0) == 2
    assert journal.result_of("owed") is None and journal.result_of("acked") is None
    assert journal.undelivered_results() == []
    assert [p.id for p in journal.pending_jobs()] == ["running"]  # unfinished jobs are never pruned


def test_bridge_modules_import_neither_torch_nor_jax():
    import subprocess
    import sys

    code = ("import sys, bridge.broker, bridge.client, bridge.worker, bridge.fleet, bridge.cli, bridge.security, "
            "bridge.status, bridge.evaluation_child; "
            "print(sorted(m for m in ('torch', 'jax', 'pickle') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "torch" not in out.stdout and "jax" not in out.stdout
