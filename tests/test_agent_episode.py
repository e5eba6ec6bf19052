"""Token-exact trajectories, the episode loop's limits and the final-solution rule (no evaluator fleet)."""

from __future__ import annotations

import asyncio
import math
import shutil
import tempfile
from pathlib import Path

import jinja2
import pytest

from agent.chat import IM_END, TokenizerAdapter
from agent.config import AgentConfig, SandboxLimits
from agent.demo_tokenizer import demo_tokenizer
from agent.episode import Task, best_correct_evaluation, run_episode
from agent.policy import Generation, ScriptedPolicy
from agent.tool_calls import format_tool_call
from agent.tools.base import EvaluationRecord
from agent.trajectory import read_trajectories, write_trajectories

TASK = Task("double", "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n")

# A ChatML template in the Qwen2 style, written for this test (the independent renderer):
# consecutive tool messages share one user turn, each wrapped in <tool_response> tags.
CHATML_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{ '<|im_start|>user' }}{%- endif -%}"
    "{{ '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{ '<|im_end|>\\n' }}{%- endif -%}"
    "{%- else -%}"
    "{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
)


def render_reference(messages):
    return jinja2.Environment().from_string(CHATML_TEMPLATE).render(messages=messages)


@pytest.fixture(scope="module")
def tokenizer():
    return TokenizerAdapter(demo_tokenizer())


@pytest.fixture
def episodes_dir():
    path = Path(tempfile.mkdtemp(prefix="agent-episode-test-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def config(**changes):
    base = AgentConfig(
        max_turns=10,
        context_budget_tokens=60_000,
        bash_timeout_seconds=5,
        tool_output_limit_bytes=2000,
        backend="host",
        sandbox=SandboxLimits(cpu_seconds=30, memory_bytes=2 * 1024**3, max_processes=32, max_file_bytes=64 * 1024**2),
    )
    return base.with_overrides(**changes)


def episode(policy, tokenizer, episodes_dir, evaluator=None, name="ep", **changes):
    return asyncio.run(run_episode(TASK, policy, tokenizer, config(**changes), evaluator, episodes_dir / name))


MULTI_TURN = [
    "First the reference.\n" + format_tool_call("Read", {"file_path": "model.py"}) + "\n" + format_tool_call("Bash", {"command": "echo héllo; ls"}),
    "Now a kernel.\n<tool_call>{\"name\": \"Write\", \"arguments\": {\"file_path\": \"kernels/x.cpp\"</tool_call>\n"
    + format_tool_call("Write", {"file_path": "kernels/op.cpp", "content": "int f(int x) { return 2 * x; }\n"}),
    format_tool_call("Glob", {"pattern": "kernels/*"}),
]


def test_multi_turn_tokens_masks_and_logprobs_line_up(tokenizer, episodes_dir):
    policy = ScriptedPolicy(MULTI_TURN, tokenizer, final_text="All done.")
    result = episode(policy, tokenizer, episodes_dir)
    traj = result.trajectory
    assert result.turns == 4 and result.end_reason == "agent_finished"
    assert len(traj.tokens) == len(traj.loss_mask) == len(traj.rollout_logprobs)

    # The conversation rendered independently (jinja ChatML) is exactly the decoded tokens.
    messages = traj.messages
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "tool", "assistant", "tool", "tool", "assistant", "tool", "assistant"]
    reference_text = render_reference(messages)
    assert tokenizer.decode(traj.tokens) + "\n" == reference_text

    # Rebuild the expected ids: environment pieces tokenised alone, agent pieces = sampled ids.
    expected_ids, expected_mask, expected_lp = [], [], []
    cursor = 0
    for generation, message in zip(policy.generated, [m for m in messages if m["role"] == "assistant"]):
        agent_text = message["content"] + IM_END
        at = reference_text.index(agent_text, cursor)
        env_ids = tokenizer.encode(reference_text[cursor:at])
        expected_ids += env_ids + generation.token_ids
        expected_mask += [0] * len(env_ids) + [1] * len(generation.token_ids)
        expected_lp += [0.0] * len(env_ids) + generation.logprobs
        cursor = at + len(agent_text)
    assert traj.tokens == expected_ids
    assert traj.loss_mask == expected_mask
    assert traj.rollout_logprobs == pytest.approx(expected_lp)
    # Agent log-probs are the scripted -(k+1)/1000 for the k-th sampled token, in order.
    agent_lp = [lp for lp, m in zip(traj.rollout_logprobs, traj.loss_mask) if m]
    assert agent_lp == pytest.approx([-(k + 1) / 1000 for k in range(len(agent_lp))])
    # Every agent span ends with <|im_end|> and decodes to the assistant message.
    for start, end, is_agent in traj.segments:
        if is_agent:
            assert traj.tokens[end - 1] == tokenizer.token_id(IM_END)

    # Tool outputs really came from the workspace.
    assert "return x * 2" in messages[3]["content"] and "héllo" in messages[4]["content"]
    assert "kernels/op.cpp" in messages[9]["content"]


def test_malformed_call_is_answered_and_counted(tokenizer, episodes_dir):
    policy = ScriptedPolicy(MULTI_TURN, tokenizer)
    result = episode(policy, tokenizer, episodes_dir)
    responses = [m["content"] for m in result.trajectory.messages if m["role"] == "tool"]
    assert responses[2].startswith("Error: tool call is not valid JSON")
    assert result.schema_violations == 1
    assert (result.workspace / "kernels" / "op.cpp").is_file()  # the valid call of that turn still ran
    assert result.tool_calls == 4 and result.tool_counts == {"Read": 1, "Bash": 1, "Write": 1, "Glob": 1}


class ByteWisePolicy:
    """Samples every character as its own byte-level token: ids a tokenizer would never produce."""

    def __init__(self, tokenizer, texts):
        self.tokenizer, self.texts, self.generated = tokenizer, list(texts), []

    async def generate(self, prompt_token_ids, max_new_tokens, stop_token_ids, messages=None):
        text = self.texts.pop(0) if self.texts else "bye"
        ids = [self.tokenizer.encode(ch)[0] for ch in text] + [self.tokenizer.token_id(IM_END)]
        generation = Generation(ids, [-0.5] * len(ids), text, True)
        self.generated.append(generation)
        return generation


def test_sampled_ids_are_kept_not_retokenised(tokenizer, episodes_dir):
    text = "import torch and get_inputs " + format_tool_call("Bash", {"command": "echo import torch"})
    policy = ByteWisePolicy(tokenizer, [text])
    result = episode(policy, tokenizer, episodes_dir)
    spans = [result.trajectory.tokens[s:e] for s, e, agent in result.trajectory.segments if agent]
    assert spans[0] == policy.generated[0].token_ids
    assert spans[0][:-1] != tokenizer.encode(text)  # re-tokenising would have changed the ids
    assert tokenizer.decode(spans[0][:-1]) == text
    assert result.tool_counts == {"Bash": 1}


def test_turn_limit(tokenizer, episodes_dir):
    turns = [format_tool_call("Bash", {"command": f"echo {i}"}) for i in range(20)]
    result = episode(ScriptedPolicy(turns, tokenizer), tokenizer, episodes_dir, max_turns=3)
    assert result.turns == 3 and result.end_reason == "turn_limit"
    assert sum(1 for m in result.trajectory.messages if m["role"] == "assistant") == 3


def test_context_budget(tokenizer, episodes_dir):
    turns = [format_tool_call("Bash", {"command": "head -c 1500 /dev/zero | tr '\\\\0' z"})] * 20
    prompt_only = episode(ScriptedPolicy([], tokenizer), tokenizer, episodes_dir, name="a")
    budget = len(prompt_only.trajectory) - 2 + 1200  # prompt + room for about two turns
    result = episode(ScriptedPolicy(turns, tokenizer), tokenizer, episodes_dir, name="b", context_budget_tokens=budget)
    assert result.end_reason == "context_budget"
    assert len(result.trajectory) <= budget
    assert 1 <= result.turns < 20


def test_cut_turn_is_closed_and_counted(tokenizer, episodes_dir):
    long_call = format_tool_call("Write", {"file_path": "kernels/a.cpp", "content": "x" * 400})
    result = episode(ScriptedPolicy([long_call], tokenizer), tokenizer, episodes_dir, max_new_tokens_per_turn=50)
    traj = result.trajectory
    # The policy was cut at 50 tokens inside the call: the environment closes the turn (mask 0),
    # answers the unclosed call with an error and the next turn follows.
    first_agent = [seg for seg in traj.segments if seg[2]][0]
    assert first_agent[1] - first_agent[0] == 50
    assert traj.tokens[first_agent[1]] == tokenizer.token_id(IM_END) and traj.loss_mask[first_agent[1]] == 0
    assert result.schema_violations == 1
    assert render_reference(traj.messages) == tokenizer.decode(traj.tokens) + "\n"


def test_redundant_loop_flag(tokenizer, episodes_dir):
    same = format_tool_call("Bash", {"command": "ls"})
    looping = episode(ScriptedPolicy([same] * 3, tokenizer), tokenizer, episodes_dir, name="a")
    varied = episode(ScriptedPolicy([same, format_tool_call("Bash", {"command": "pwd"}), same], tokenizer), tokenizer, episodes_dir, name="b")
    assert looping.redundant_loop and not varied.redundant_loop


# --- the final-solution rule, against planted evaluator records -----------------------------

class PlantedEvaluator:
    """Test double of the evaluator service: the verdict is written in model_new.py itself.

    model_new.py containing `# verdict: correct 1.30 2.00` means correct with speed-ups 1.30 vs
    compile and 2.00 vs eager; `# verdict: incorrect`; `# verdict: infra`. The real fleet is
    exercised by tests/test_agent_e2e.py.
    """

    def __init__(self):
        self.jobs = []

    async def submit(self, service, job, timeout=None):
        self.jobs.append((service, job))
        source = job["solution"]["files"]["model_new.py"].decode()
        if "# verdict: " not in source:  # the workspace's starter file, no kernels
            return {"status": "compile_error", "diagnostics": [{"message": "no kernels"}], "reward": -1}
        verdict = source.split("# verdict: ")[1].split()
        if verdict[0] == "infra":
            raise ConnectionError("broker gone")
        if service == "compile":
            return {"status": "built", "diagnostics": [], "artifact": b"so", "build_seconds": 0.1, "cache_hit": False}
        if verdict[0] == "incorrect":
            return {"status": "incorrect", "diagnostics": [{"message": "mismatch"}], "reward": -1}
        if not job["settings"]["profile"]:
            return {"status": "correct", "diagnostics": [], "reward": 1, "speedup": {"eager": None, "compile": None}}
        to_compile, to_eager = float(verdict[1]), float(verdict[2])
        reward = 3 if to_compile > 1.05 and to_eager > 1.05 else 2 if to_eager > 1.05 else 1
        return {"status": "correct", "diagnostics": [], "speedup": {"compile": to_compile, "eager": to_eager}, "reward": reward}


def write(verdict):
    return format_tool_call("Write", {"file_path": "model_new.py", "content": f"# verdict: {verdict}\n"})


def test_best_speedup_among_correct_is_the_final_solution(tokenizer, episodes_dir):
    turns = [
        write("correct 1.30 2.00"), format_tool_call("profile", {}),
        write("correct 1.80 0.90"), format_tool_call("profile", {}),  # faster than compile, slower than eager
        write("correct 0.70 1.50"), format_tool_call("profile", {}),
        write("incorrect"), format_tool_call("verify", {}),
    ]
    evaluator = PlantedEvaluator()
    result = episode(ScriptedPolicy(turns, tokenizer), tokenizer, episodes_dir, evaluator=evaluator)
    assert result.best_speedup_vs_compile == pytest.approx(1.80)
    assert result.reward == 1  # that solution's own milestone (not faster than eager)
    assert result.final_solution["model_new.py"] == b"# verdict: correct 1.80 0.90\n"
    assert [s for s, _ in evaluator.jobs] == ["evaluate"] * 4  # no final re-evaluation needed
    assert evaluator.jobs[0][1]["task"] == {"name": "double", "source": TASK.source}
    assert "profile: correct" in result.trajectory.messages[5]["content"]


def test_unprofiled_episode_is_graded_at_the_end(tokenizer, episodes_dir):
    # Verified correct, then broken: the final (incorrect) state and the verified one are profiled.
    turns = [write("correct 1.20 1.40"), format_tool_call("verify", {}), write("incorrect")]
    evaluator = PlantedEvaluator()
    result = episode(ScriptedPolicy(turns, tokenizer), tokenizer, episodes_dir, evaluator=evaluator)
    assert result.reward == 3 and result.final_status == "correct"
    profiled = [job["solution"]["files"]["model_new.py"] for s, job in evaluator.jobs if job["settings"]["profile"]]
    assert profiled == [b"# verdict: incorrect\n", b"# verdict: correct 1.20 1.40\n"]


def test_incorrect_and_missing_solutions_get_minus_one_infra_gets_none(tokenizer, episodes_dir):
    wrong = episode(ScriptedPolicy([write("incorrect")], tokenizer), tokenizer, episodes_dir, evaluator=PlantedEvaluator(), name="a")
    assert wrong.reward == -1 and wrong.final_status == "incorrect"
    untouched = episode(ScriptedPolicy([], tokenizer), tokenizer, episodes_dir, evaluator=PlantedEvaluator(), name="b")
    assert untouched.reward == -1 and untouched.final_status == "compile_error"  # the starter model_new.py
    removed = episode(ScriptedPolicy([format_tool_call("Bash", {"command": "rm model_new.py"})], tokenizer), tokenizer, episodes_dir, evaluator=PlantedEvaluator(), name="d")
    assert removed.reward == -1 and removed.final_status == "no_solution"
    infra = episode(ScriptedPolicy([write("infra"), format_tool_call("verify", {})], tokenizer), tokenizer, episodes_dir, evaluator=PlantedEvaluator(), name="c")
    assert infra.reward is None and infra.final_status == "infra_error"
    assert "infrastructure error" in infra.trajectory.messages[-2]["content"]


def test_compile_artifact_is_reused_by_verify(tokenizer, episodes_dir):
    turns = [write("correct 1.1 1.1"), format_tool_call("compile", {}), format_tool_call("verify", {})]
    evaluator = PlantedEvaluator()
    episode(ScriptedPolicy(turns, tokenizer), tokenizer, episodes_dir, evaluator=evaluator)
    assert "artifact" not in evaluator.jobs[0][1] and evaluator.jobs[1][1]["artifact"] == b"so"


def test_best_correct_evaluation_rule():
    def rec(status, speedup):
        return EvaluationRecord("profile", {}, {"status": status, "speedup": {"compile": speedup}}, 0.0)

    items = [rec("correct", 1.1), rec("incorrect", 9.0), rec("correct", 1.5), rec("correct", 1.5), rec("correct", None)]
    assert best_correct_evaluation(items) is items[2]
    assert best_correct_evaluation([rec("incorrect", 2.0)]) is None


def test_trajectory_parquet_round_trip(tokenizer, episodes_dir):
    results = [
        episode(ScriptedPolicy(MULTI_TURN, tokenizer), tokenizer, episodes_dir, evaluator=PlantedEvaluator(), name="a"),
        episode(ScriptedPolicy([write("correct 1.3 1.3"), format_tool_call("profile", {})], tokenizer), tokenizer, episodes_dir, evaluator=PlantedEvaluator(), name="b"),
    ]
    path = write_trajectories(results, episodes_dir / "out" / "traj.parquet")
    rows = read_trajectories(path)
    assert len(rows) == 2
    for row, result in zip(rows, results):
        assert row["tokens"] == result.trajectory.tokens
        assert row["loss_mask"] == result.trajectory.loss_mask
        assert row["rollout_logprobs"] == pytest.approx(result.trajectory.rollout_logprobs, abs=1e-6)
        assert row["turns"] == result.turns and row["task"] == "double"
    assert rows[0]["reward"] == -1 and rows[0]["final_status"] == "compile_error" and rows[0]["schema_violations"] == 1
    assert math.isnan(rows[0]["best_speedup_vs_compile"])
    assert rows[1]["reward"] == 3 and rows[1]["best_speedup_vs_compile"] == pytest.approx(1.3)
    import pyarrow.parquet as pq

    schema = pq.read_schema(path)
    assert str(schema.field("tokens").type) == "list<element: int32>"
    assert str(schema.field("loss_mask").type) == "list<element: int8>"
    assert str(schema.field("rollout_logprobs").type) == "list<element: float>"
