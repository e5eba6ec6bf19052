"""Shared by the task-synthesis tests: a scripted chat-completions server on 127.0.0.1 and its settings, and
candidates for filter workers (a composed task, one with planted code, a job)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from task_synthesis.catalogue import store
from task_synthesis.compose.chat_client import ChatSettings
from task_synthesis.compose.composer import compose
from task_synthesis.compose.render import render
from task_synthesis.pipeline.run import candidate_seed

SEED = 7


class ChatServer:
    """A chat-completions endpoint on 127.0.0.1 answering from a script: each item is a reply text (HTTP 200)
    or (status, body). Every request is recorded (path, headers, JSON body)."""

    def __init__(self, script: list):
        self.script, self.requests = list(script), []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                status, text = server._next(body)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(text.encode())

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def _next(self, body: dict) -> tuple[int, str]:
        if not self.script:
            return 404, "the script is over"
        item = self.script.pop(0)
        if isinstance(item, tuple):
            return item
        message = {"role": "assistant", "content": item}
        return 200, json.dumps({"model": body["model"], "choices": [{"message": message, "finish_reason": "stop"}]})

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def chat_server():
    servers = []

    def start(script):
        servers.append(ChatServer(script))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def chat_settings(url: str, **overrides) -> ChatSettings:
    values = {"base_url": url, "model": "test-model", "api_key_env": "SYNTH_TEST_KEY", "retries": 2,
              "backoff_s": 0.01, "timeout_s": 30.0, **overrides}
    return ChatSettings(**values)


def composed_source(index: int) -> str:
    """The `index`-th two-operator task of seed SEED, as the programmatic composer writes it."""
    return render(compose("2", store.load()["operators"], candidate_seed(SEED, "2", index), "small"))


def planted(source: str, name: str, code: str) -> str:
    """`code` run first thing in get_init_inputs(), marked with `name`."""
    body = "".join(f"    {line}\n" for line in code.strip().splitlines())
    return f"# plant: {name}\n" + source.replace("def get_init_inputs():\n", "def get_init_inputs():\n" + body)


def filter_job(key: str, source: str, **extra) -> dict:
    """A filter worker's job for `source` without the evaluator's stage, in a wide window."""
    return {"key": key, "name": f"synth_{key.replace(':', '_')}", "source": source, "expected_shape": None,
            "shapes": None, "window_ms": [0.0, 1e6], "memory_bytes": 2**30, "evaluator": None, **extra}


class SameProcess:
    """The zygote's interface (`outcome`), running a candidate's checks in this process: for tests of the
    worker's logic that patch what the checks call (the zygote itself: test_task_synthesis_zygote.py)."""

    def outcome(self, job: dict, limit_s: float) -> dict:
        from task_synthesis.filter.zygote import _checks

        return _checks(job, limit_s)


@pytest.fixture
def checks_in_this_process(monkeypatch):
    import task_synthesis.filter.worker as worker

    monkeypatch.setattr(worker, "_zygote", SameProcess())
