"""The OpenAI-compatible chat backend against a real local HTTP server speaking that API."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agent.chat import IM_END, TokenizerAdapter
from agent.config import AgentConfig
from agent.demo_tokenizer import demo_tokenizer
from agent.episode import Task, run_episode
from agent.policy import OpenAIChatPolicy, PolicyError
from agent.tool_calls import format_tool_call


class ChatServer:
    """Serves /v1/chat/completions from a list of (status, reply) and records the requests."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.requests = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
                status, reply = server.replies.pop(0)
                data = json.dumps(reply).encode() if not isinstance(reply, bytes) else reply
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def choice(text, finish="stop", logprobs=None):
    item = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
    if logprobs is not None:
        item["logprobs"] = {"content": [{"token": "?", "logprob": lp} for lp in logprobs]}
    return {"choices": [item]}


@pytest.fixture
def tokenizer():
    return TokenizerAdapter(demo_tokenizer())


@pytest.fixture
def episodes_dir():
    path = Path(tempfile.mkdtemp(prefix="agent-openai-test-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_episode_through_a_chat_endpoint(tokenizer, episodes_dir):
    first = "Reading.\n" + format_tool_call("Read", {"file_path": "model.py"}) + format_tool_call("Bash", {"command": "echo hi"})
    n_first = len(tokenizer.encode(first))
    server = ChatServer([(200, choice(first, logprobs=[-0.25] * n_first)), (200, choice("Finished."))])
    try:
        policy = OpenAIChatPolicy(server.url, "remote-model", tokenizer, api_key="secret-key", temperature=0.5)
        result = asyncio.run(run_episode(Task("t", "x = 1\n"), policy, tokenizer, AgentConfig(max_turns=5), None, episodes_dir / "ws"))
    finally:
        server.close()
    assert result.turns == 2 and result.end_reason == "agent_finished"
    first_request, second_request = server.requests
    assert first_request["path"] == "/v1/chat/completions" and first_request["auth"] == "Bearer secret-key"
    assert first_request["body"]["model"] == "remote-model" and first_request["body"]["temperature"] == 0.5
    assert [m["role"] for m in first_request["body"]["messages"]] == ["system", "user"]
    # Tool outputs go back as one user turn of <tool_response> blocks, like the local template.
    sent = second_request["body"]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]
    assert sent[2]["content"] == first
    assert sent[3]["content"].startswith("<tool_response>\n     1\tx = 1\n</tool_response>\n<tool_response>\nhi\n")
    # The endpoint's log-probs are kept (one per local token) and the stop token gets 0.
    spans = [(s, e) for s, e, agent in result.trajectory.segments if agent]
    s, e = spans[0]
    assert result.trajectory.tokens[s:e] == tokenizer.encode(first) + [tokenizer.token_id(IM_END)]
    assert result.trajectory.rollout_logprobs[s:e] == [-0.25] * n_first + [0.0]
    s, e = spans[1]
    assert result.trajectory.rollout_logprobs[s:e] == [0.0] * (e - s)  # none returned: zeros


def test_length_cut_is_not_a_stop(tokenizer):
    server = ChatServer([(200, choice("partial answer", finish="length"))])
    try:
        policy = OpenAIChatPolicy(server.url, "m", tokenizer)
        generation = asyncio.run(policy.generate([1, 2], 100, [2], messages=[{"role": "user", "content": "hi"}]))
    finally:
        server.close()
    assert not generation.stopped and generation.token_ids == tokenizer.encode("partial answer")


def test_endpoint_failure_ends_the_episode_with_one_line(tokenizer, episodes_dir):
    server = ChatServer([(500, b'{"error": "overloaded"}')])
    try:
        policy = OpenAIChatPolicy(server.url, "m", tokenizer)
        result = asyncio.run(run_episode(Task("t", "x = 1\n"), policy, tokenizer, AgentConfig(max_turns=5), None, episodes_dir / "ws"))
    finally:
        server.close()
    assert result.end_reason == "policy_error" and result.turns == 0
    assert result.final_status == "policy_error" and result.reward is None  # never scored as the agent's failure
    assert "HTTP 500" in result.error and "overloaded" in result.error and "\n" not in result.error
    with pytest.raises(PolicyError, match="unreachable"):
        asyncio.run(OpenAIChatPolicy("http://127.0.0.1:9/v1", "m", tokenizer, request_timeout=2).generate([1], 5, [2], messages=[]))
