"""The LLM composer against a real local chat-completions server whose replies each test scripts:
a good task is kept through the real filter, every bad reply is a recorded rejection with its
reason, endpoint failures are retried or end in one clear line; the screen, the reply parser and
the worker's time limit on their own."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cuda_agent.cli import app
from task_synthesis.catalogue import store
from task_synthesis.compose.chat_client import ChatClient, EndpointError
from task_synthesis.compose.composer import compose
from task_synthesis.compose.llm_reply import extract_code
from task_synthesis.compose.render import render
from task_synthesis.config import SynthesisConfig
from task_synthesis.filter.execution import Rejected
from task_synthesis.filter.screen import screen
from task_synthesis.pipeline.outputs import write_parquet, write_report
from task_synthesis.pipeline.run import RunOptions, Synthesis, candidate_seed

from synthesis_helpers import checks_in_this_process, chat_server, chat_settings  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "tasks"
OPERATORS = store.load()["operators"]
SEED = 7


def _plan(index: int):
    return compose("2", OPERATORS, candidate_seed(SEED, "2", index), "small")


def _fenced(source: str) -> str:
    return f"Here is the fused task.\n\n```python\n{source}```\n\nIt keeps the shapes you asked for."


def _broken(source: str) -> str:
    return source.replace("def forward(self, x):", "def forward(self, x)")


def _wrong_shape(source: str) -> str:
    return source.replace("        return x\n", "        return torch.cat([x, x], dim=0)\n")


def _escaping(source: str) -> str:
    return source.replace("def get_inputs():\n", "def get_inputs():\n    open('/etc/hostname').read()\n")


def test_a_run_keeps_the_good_task_and_records_every_bad_reply_with_its_reason(tmp_path, chat_server, monkeypatch):
    import pyarrow.parquet as pq

    monkeypatch.setenv("SYNTH_TEST_KEY", "sekrit")
    plans = [_plan(i) for i in range(5)]
    sources = [render(p) for p in plans]
    script = ["I would rather not write code today.", _fenced(_broken(sources[1])), _fenced(_wrong_shape(sources[2])),
              _fenced(_escaping(sources[3])), (500, '{"error": "overloaded"}'), _fenced(sources[4])]
    server = chat_server(script)
    out = tmp_path / "tasks.parquet"
    options = RunOptions(out=out, count=1, config=SynthesisConfig(compile=False), seed=SEED, workers=1,
                         backend="host", eval_dir=EXAMPLES, cache_dir=str(tmp_path / "cache"),
                         llm=chat_settings(server.url))
    run = Synthesis(options, progress=lambda line: None)
    ran_here = []  # the model's code runs only in the jailed worker processes (they do not see this patch)
    monkeypatch.setattr("evaluator_cuda.tasks.exec_task", lambda *args, **kwargs: ran_here.append(args))
    run.run()
    assert not ran_here
    entries = run.journal.entries
    assert [(e["status"], e["stage"]) for e in entries] == [
        ("rejected", "reply"), ("rejected", "syntax"), ("rejected", "output"), ("rejected", "screen"),
        ("kept", None)]
    assert "no code" in entries[0]["reason"] and entries[0]["reply"].startswith("I would rather")
    assert "line" in entries[1]["reason"] and "open (file access)" in entries[3]["reason"]
    asked = list(plans[2].output_shape)
    assert f"said {asked}, the forward gave {[2 * asked[0], *asked[1:]]}" in entries[2]["reason"]
    assert entries[4]["source"] == sources[4] and entries[4]["evaluator_wall_s"] > 0  # the evaluator's children ran
    assert all(e["composer"] == "llm" for e in entries)
    requests = server.requests
    assert len(requests) == 6 and all(r["path"] == "/v1/chat/completions" for r in requests)
    for request, plan in zip(requests, [*plans[:4], plans[4], plans[4]]):  # the fifth was retried after HTTP 500
        assert request["body"]["model"] == "test-model" and request["headers"]["Authorization"] == "Bearer sekrit"
        prompt = request["body"]["messages"][-1]["content"]
        assert all(f"`{name}`" in prompt for name in plan.ops)
        assert str(tuple(plan.input_shape)) in prompt and str(tuple(plan.output_shape)) in prompt
    assert write_parquet(entries, out, "host") == 1
    table = pq.read_table(out).to_pylist()
    assert table[0]["code"] == sources[4] and table[0]["data_source"] == "task_synthesis/llm"
    assert table[0]["ops"] == plans[4].ops
    report = write_report(entries, run.quotas, options.config.composition, (1.0, 0), tmp_path / "r.md", None,
                          run.journal_settings()).read_text()
    assert "LLM composer (test-model)" in report and "| reply |" in report and "| screen |" in report


@pytest.mark.parametrize("script, retries, expected", [
    ([(500, "busy"), "fine"], 1, "fine"),
    ([(500, "busy"), (503, "busy")], 1, "HTTP 503: busy (after 2 attempts)"),
    ([(401, "no key"), "fine"], 3, "HTTP 401: no key"),
    ([(200, "<html>not json</html>")], 0, "not JSON"),
    ([(200, '{"choices": []}')], 0, ""),
])
def test_the_client_retries_what_may_pass_and_names_what_does_not(chat_server, script, retries, expected):
    server = chat_server(script)
    client = ChatClient(chat_settings(server.url, retries=retries))
    if expected in ("fine", ""):
        assert client.complete([{"role": "user", "content": "hi"}]) == expected
        return
    with pytest.raises(EndpointError) as caught:
        client.complete([{"role": "user", "content": "hi"}])
    assert expected in str(caught.value) and "\n" not in str(caught.value)
    assert len(server.requests) == (1 if "401" in expected else retries + 1)


def _closed_port_url(chat_server) -> str:
    server = chat_server([])
    server.close()
    return server.url


def test_an_unreachable_server_is_one_error_line_and_exit_3(tmp_path, chat_server):
    url = _closed_port_url(chat_server)
    with pytest.raises(EndpointError, match="unreachable.*after 2 attempts"):
        ChatClient(chat_settings(url, retries=1)).complete([{"role": "user", "content": "hi"}])
    args = ["data", "synthesize", "--out", str(tmp_path / "t.parquet"), "--count", "2", "--backend", "host",
            "--composer", "llm", "--base-url", url, "--model", "m", "--retries", "0"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 3, result.output
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: endpoint ") and "unreachable" in errors[0]


@pytest.mark.parametrize("args, message", [
    (["--composer", "llm", "--model", "m"], "--composer llm needs --base-url"),
    (["--composer", "llm", "--base-url", "http://127.0.0.1:9/v1"], "and --model"),
    (["--composer", "llm", "--base-url", "127.0.0.1:9", "--model", "m"], "must start with http://"),
    (["--base-url", "http://127.0.0.1:9/v1"], "are for --composer llm"),
    (["--composer", "poet"], "unknown composer"),
])
def test_bad_composer_options_are_one_error_line_and_exit_2(tmp_path, args, message):
    result = CliRunner().invoke(app, ["data", "synthesize", "--out", str(tmp_path / "t.parquet"), "--count", "2",
                                      *args])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: ") and message in errors[0]


TASK = render(_plan(4))


@pytest.mark.parametrize("reply, found", [
    (f"```python\n{TASK}```", True),
    (f"Sure.\n```\n{TASK}```\nDone.", True),
    (f"<think>maybe ```python\nclass Model: pass\n```</think>\n```py\n{TASK}```", True),
    (f"```python\nimport torch\n```\nand the task:\n```python\n{TASK}```", True),
    (f"```python\n{TASK}", True),  # a fence the token limit cut
    (TASK, True),  # bare code
    (f"Here it is:\n{TASK}", True),
    ("```python\nprint('no model here')\n```", False),
    ("No code, sorry.", False),
    ("", False),
])
def test_the_code_comes_out_of_a_fenced_or_bare_reply(reply, found):
    code = extract_code(reply)
    assert (code == TASK) if found else code is None


@pytest.mark.parametrize("line, reason", [
    ("import os", "import of os"),
    ("from subprocess import run", "import from subprocess"),
    ("x = open('/etc/passwd').read()", "open (file access)"),
    ("w = torch.load('/tmp/w.pt')", ".load (file access)"),
    ("t = torch\nw = t.hub.list('x')", ".hub (network)"),
    ("y = torch.ones(2).numpy().tofile('/tmp/out')", ".numpy (leaves torch)"),
    ("y = torch.ones(2)\ny.tofile('/tmp/out')", ".tofile (file access)"),
    ("g = (i for i in [])\nb = g.gi_frame.f_globals", ".gi_frame (introspection)"),
    ("b = ().__class__.__bases__", ".__class__ (a dunder attribute)"),
    ("m = __import__('os')", "__import__ (imports)"),
    ("f = getattr(torch, 'lo' + 'ad')", "getattr"),
    ("torch.relu = torch.tanh", "assigns to an attribute of torch"),
    ("torch.set_default_dtype(torch.float64)", "set_default_dtype (sets torch's global state)"),
    ("c = torch._C", "._C (a private attribute)"),
    ("from torch import _C", "_C (a private name)"),
    ("while True:\n    pass", "while loop"),
    ("try:\n    pass\nexcept Exception:\n    pass", "try/except"),
    ("a = torch.ops.aten.add", ".ops (compiled code)"),
])
def test_the_screen_refuses_what_a_task_does_not_need(line, reason):
    with pytest.raises(Rejected) as caught:
        screen(f"import torch\nimport torch.nn as nn\n{line}\n")
    assert caught.value.stage == "screen" and reason in caught.value.reason


def test_the_screen_passes_every_programmatic_task_and_names_a_syntax_error():
    for category in ("1", "2", "3", "4", "5", "transformers"):
        for seed in range(40):
            screen(render(compose(category, OPERATORS, seed, "small")))
    screen("from typing import Optional\nimport torch\n\nif __name__ == '__main__':\n    print(torch.ones(1))\n")
    with pytest.raises(Rejected) as caught:
        screen(_broken(TASK))
    assert caught.value.stage == "syntax" and caught.value.reason.startswith("line ")


def test_the_worker_ends_a_task_that_runs_too_long_and_checks_the_input_it_was_asked_for(checks_in_this_process):
    from task_synthesis.filter.worker import filter_candidate

    job = {"key": "2:0", "name": "slow", "expected_shape": None, "shapes": None, "window_ms": (0.0, 1e6),
           "memory_bytes": 2**30, "evaluator": None}
    slow = TASK.replace("def get_inputs():\n", "def get_inputs():\n    for _ in range(10**12):\n        pass\n")
    verdict = filter_candidate({**job, "source": slow, "time_limit_s": 0.5})
    assert (verdict["stage"], verdict["reason"]) == ("timeout", "the in-process checks ran past 0.5 s")
    verdict = filter_candidate({**job, "source": TASK, "input_shapes": [[4, 4, 17]]})
    assert verdict["stage"] == "inputs" and "[[4, 4, 16]]" in verdict["reason"]
    assert filter_candidate({**job, "source": TASK, "input_shapes": [[4, 4, 16]]})["status"] == "kept"
