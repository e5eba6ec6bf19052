"""Metric records to JSON lines and TensorBoard event files; the event files read back with
TensorBoard's own reader (skipped where TensorBoard is not installed)."""

import json
import math

import pytest

from cuda_agent.metrics_sink import MetricsSink
from cuda_agent.tfevents import EventFileWriter, crc32c, masked_crc32c


def test_crc32c_matches_the_published_check_values():
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value (RFC 3720)
    assert crc32c(b"") == 0
    assert crc32c(bytes(32)) == 0x8A9136AA  # 32 zero bytes (RFC 3720, B.4)
    assert masked_crc32c(b"") == 0xA282EAD8


def _scalars(logdir):
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    reader = accumulator.EventAccumulator(str(logdir))
    reader.Reload()
    return {tag: [(e.step, e.value) for e in reader.Scalars(tag)] for tag in reader.Tags()["scalars"]}


def test_tensorboard_reads_the_scalars_back(tmp_path):
    with EventFileWriter(tmp_path) as writer:
        assert writer.scalars(1, {"loss": 0.5, "reward": -1, "flag": True, "nan": math.nan, "text": "x"}) == 2
        writer.scalars(2, {"loss": 0.25})
        writer.scalars(7_000_000_000, {"loss": 1e-3})  # steps past 32 bits
    scalars = _scalars(tmp_path)
    assert set(scalars) == {"loss", "reward"}
    assert scalars["loss"] == [(1, 0.5), (2, 0.25), (7_000_000_000, pytest.approx(1e-3))]
    assert scalars["reward"] == [(1, -1.0)]


def test_the_sink_keeps_every_record_as_a_line_and_only_step_records_as_scalars(tmp_path):
    lines, board = tmp_path / "metrics.jsonl", tmp_path / "tb"
    with MetricsSink(lines, board, step_key="step") as sink:
        sink.write({"stage": "ppo", "event": "start", "steps": 3})
        sink.write({"stage": "ppo", "step": 1, "actor/loss": 0.75, "note": "kept as text"})
        sink.write({"stage": "rft", "step": 2, "loss": 2.0})
    records = [json.loads(line) for line in lines.read_text().splitlines()]
    assert [r.get("event") for r in records] == ["start", None, None] and records[1]["actor/loss"] == 0.75
    assert _scalars(board) == {"ppo/actor/loss": [(1, 0.75)], "rft/loss": [(2, 2.0)]}


def test_the_sink_writes_numbers_json_cannot(tmp_path):
    numpy = pytest.importorskip("numpy")
    lines = tmp_path / "metrics.jsonl"
    with MetricsSink(lines) as sink:
        sink.write({"iteration": 0, "reward_mean": numpy.float32(0.5), "where": tmp_path})
    record = json.loads(lines.read_text())
    assert record["reward_mean"] == 0.5 and record["where"] == str(tmp_path)


def test_the_report_plots_every_stage_and_tabulates_from_the_lines_alone(tmp_path):
    from typer.testing import CliRunner

    from cuda_agent.cli import app

    lines = tmp_path / "m.jsonl"
    with MetricsSink(lines) as sink:
        sink.write({"stage": "rft", "event": "start"})
        for step in (1, 2, 3):
            sink.write({"stage": "rft", "step": step, "loss": 4.0 / step, "grad_norm": float(step)})
        sink.write({"iteration": 0, "rollout/reward_mean": -1.0, "train_s": 2.5, "done": True})
        sink.write({"iteration": 1, "rollout/reward_mean": 1.0, "train_s": 2.0})
    result = CliRunner().invoke(app, ["metrics-report", str(lines), "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    report = (tmp_path / "r" / "report.md").read_text()
    assert "| loss | 4 | 1.333 | 1.333 | 4 | 3 |" in report
    assert "| rollout/reward_mean | -1 | 1 | -1 | 1 | 2 |" in report and "done" not in report
    assert (tmp_path / "r" / "rft.png").stat().st_size > 0 and (tmp_path / "r" / "run.png").exists()


def test_the_report_refuses_a_file_without_steps_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from cuda_agent.cli import app

    lines = tmp_path / "m.jsonl"
    lines.write_text('{"event": "start"}\n')
    result = CliRunner().invoke(app, ["metrics-report", str(lines), "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and result.output.strip().splitlines()[-1].startswith("error: no record")
