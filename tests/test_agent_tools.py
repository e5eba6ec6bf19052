"""Agent tools, workspace confinement and the command sandbox (no evaluator needed)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from agent.config import AgentConfig, SandboxLimits, load_agent_config
from agent.prompts import system_prompt
from agent.sandbox import can_switch_uid, jail_has_view, sandbox_report
from agent.tool_calls import ToolCall, ToolCallError, format_tool_call, parse_tool_calls
from agent.toolbox import Toolbox
from agent.tools import default_tools
from agent.tools.base import ToolContext, ToolFailure, schema_errors, truncate_text
from agent.tools.notebook import NotebookEditTool
from agent.workspace import WorkspaceError, claim_sandbox_uid, create_workspace, release_sandbox_uid

TASK = "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n"


@pytest.fixture
def tmp_path():
    # Under /tmp directly, so that a sandbox uid can reach the workspace (pytest's dir is 0700).
    path = Path(tempfile.mkdtemp(prefix="agent-test-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def context(tmp_path):
    config = AgentConfig(
        bash_timeout_seconds=5,
        bash_timeout_max_seconds=10,
        tool_output_limit_bytes=1000,
        sandbox=SandboxLimits(cpu_seconds=30, memory_bytes=2 * 1024**3, max_processes=32, max_file_bytes=64 * 1024**2),
    )
    workspace = create_workspace(tmp_path / "ws", "double", TASK)
    ctx = ToolContext(workspace=workspace, config=config)
    # One event loop for the whole test: background commands outlive a single call.
    ctx.runner = asyncio.Runner()
    yield ctx
    for job in ctx.background.values():
        ctx.runner.run(job.kill())
    ctx.runner.close()
    workspace.release()


def call(ctx, name, **arguments):
    toolbox = Toolbox(default_tools())
    text = ctx.runner.run(toolbox.execute(ToolCall(name, arguments), ctx))
    return text, toolbox.stats


# --- tool-call parsing ---------------------------------------------------------------------

def test_parse_well_formed_calls_in_order():
    text = "thinking\n" + format_tool_call("Read", {"file_path": "a"}) + " and " + format_tool_call("Bash", {"command": "ls"})
    items, violations = parse_tool_calls(text)
    assert violations == 0
    assert items == [ToolCall("Read", {"file_path": "a"}), ToolCall("Bash", {"command": "ls"})]


@pytest.mark.parametrize(
    "body, fragment",
    [
        ('{"name": "Read", "arguments": {"file_path": "a"}', "not valid JSON"),
        ('["Read"]', "must be a JSON object"),
        ('{"arguments": {}}', 'needs a string "name"'),
        ('{"name": "Read", "arguments": "file_path=a"}', "must be a JSON object"),
        ('{"name": "Read", "arguments": {}, "id": 3}', "unexpected keys"),
    ],
)
def test_parse_malformed_calls_are_errors(body, fragment):
    items, violations = parse_tool_calls(f"<tool_call>{body}</tool_call>")
    assert violations == 1
    assert isinstance(items[0], ToolCallError) and fragment in items[0].message


def test_unclosed_call_is_an_error_and_no_call_is_nothing():
    items, violations = parse_tool_calls('ok <tool_call>{"name": "Read", "arguments": {}}')
    assert violations == 1 and "not closed" in items[0].message
    assert parse_tool_calls("just prose </tool_call>") == ([], 0)


def test_schema_errors_find_missing_wrong_and_unknown():
    schema = default_tools()[0].parameters  # Bash
    assert schema_errors(schema, {"command": "ls"}) == []
    assert any("missing required 'command'" in e for e in schema_errors(schema, {}))
    assert any("arguments.timeout must be of type number" in e for e in schema_errors(schema, {"command": "ls", "timeout": "5"}))
    assert any("unknown property 'cwd'" in e for e in schema_errors(schema, {"command": "ls", "cwd": "/"}))
    assert schema_errors({"type": "integer"}, True) == ["arguments must be of type integer"]


def test_toolbox_counts_schema_violations(context):
    toolbox = Toolbox(default_tools())
    bad = [ToolCallError("x", "tool call is not valid JSON"), ToolCall("Teleport", {}), ToolCall("Read", {"path": "model.py"})]
    texts = [context.runner.run(toolbox.execute(item, context)) for item in bad]
    assert all(text.startswith("Error:") for text in texts)
    assert "unknown tool 'Teleport'" in texts[1]
    assert "missing required 'file_path'" in texts[2]
    assert toolbox.stats.schema_violations == 3
    good = context.runner.run(toolbox.execute(ToolCall("Read", {"file_path": "model.py"}), context))
    assert "return x * 2" in good and toolbox.stats.schema_violations == 3


# --- truncation ----------------------------------------------------------------------------

def test_truncate_keeps_head_and_tail_and_counts_cut_bytes():
    data = b"A" * 600 + b"B" * 800 + b"C" * 600
    text = truncate_text(data, 1000)
    assert text.startswith("A" * 500) and text.endswith("C" * 500)
    assert "[... 1000 bytes cut ...]" in text
    assert truncate_text(b"short", 1000) == "short"


# --- workspace confinement -----------------------------------------------------------------

def test_workspace_layout(context):
    root = context.workspace.root
    assert (root / "model.py").read_text() == TASK
    assert (root / "kernels").is_dir()
    assert "class ModelNew(nn.Module)" in (root / "model_new.py").read_text()  # the evaluator's starter
    assert not (root / "utils").exists()
    assert (root / "binding_registry.h").is_file()
    assert not os.access(root / "model.py", os.W_OK) or os.geteuid() == 0
    assert (root / "model.py").stat().st_mode & 0o222 == 0


@pytest.mark.parametrize("path", ["../outside.txt", "kernels/../../outside.txt", "/etc/hostname_h7", "/tmp/x"])
def test_traversal_and_absolute_paths_refused(context, path):
    text, _ = call(context, "Write", file_path=path, content="x")
    assert text.startswith("Error:") and "outside the workspace" in text
    assert not (context.workspace.root.parent / "outside.txt").exists()


def test_absolute_path_inside_workspace_allowed(context):
    target = context.workspace.root.resolve() / "kernels" / "a.cpp"
    text, _ = call(context, "Write", file_path=str(target), content="int a;\n")
    assert not text.startswith("Error") and target.read_text() == "int a;\n"


def test_symlink_escapes_refused(context, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    root = context.workspace.root
    os.symlink(secret, root / "kernels" / "link.txt")
    os.symlink(tmp_path, root / "kernels" / "outdir")
    for name, args in [
        ("Read", {"file_path": "kernels/link.txt"}),
        ("Write", {"file_path": "kernels/link.txt", "content": "pwned"}),
        ("Write", {"file_path": "kernels/outdir/new.txt", "content": "pwned"}),
        ("Edit", {"file_path": "kernels/link.txt", "old_string": "top", "new_string": "bottom"}),
        ("Grep", {"pattern": "secret", "path": "kernels/outdir"}),
    ]:
        text, _ = call(context, name, **args)
        assert "outside the workspace" in text, (name, text)
    assert secret.read_text() == "top secret"
    assert not (tmp_path / "new.txt").exists()
    # Walking tools skip links out, and the links never reach the evaluator.
    text, _ = call(context, "Grep", pattern="top secret")
    assert text == "No matches."
    text, _ = call(context, "Glob", pattern="**/*.txt")
    assert text == "No files matched."
    context.workspace.write_text("model_new.py", "x = 1\n")
    assert sorted(context.workspace.solution_files()) == ["model_new.py"]


def test_harness_files_are_read_only_to_tools(context):
    for name in ("model.py", "binding.cpp", "binding_registry.h", "./model.py", "kernels/../model.py"):
        text, _ = call(context, "Write", file_path=name, content="x")
        assert "read-only" in text, text
    text, _ = call(context, "Edit", file_path="model.py", old_string="x * 2", new_string="x * 3")
    assert "read-only" in text
    assert (context.workspace.root / "model.py").read_text() == TASK


@pytest.mark.skipif(not can_switch_uid(), reason="needs root to run commands as their own uid")
def test_commands_cannot_touch_the_task_or_outside(context, tmp_path):
    assert context.workspace.sandbox_uid is not None
    text, _ = call(context, "Bash", command="echo hacked > model.py; rm -f model.py; mv model.py m.py; echo hi > ../escaped.txt; touch kernels/ok.cpp; echo done")
    assert "done" in text
    assert (context.workspace.root / "model.py").read_text() == TASK
    assert not (tmp_path / "escaped.txt").exists()
    assert (context.workspace.root / "kernels" / "ok.cpp").exists()


@pytest.mark.skipif(not sandbox_report()["no_network"], reason="this machine cannot drop the network (unshare)")
def test_commands_have_no_network(context):
    text, _ = call(context, "Bash", command="tail -n +3 /proc/self/net/dev | cut -d: -f1")
    assert [line.strip() for line in text.split("\n")[:-2] if line.strip()] == ["lo"]


@pytest.mark.skipif(not jail_has_view(), reason="this machine cannot build the jail's namespaces")
def test_commands_see_only_their_own_processes(context):
    """Finding 7: Bash could read every process's command line (secrets passed in argv leaked)."""
    secret = f"token-{os.getpid()}-{time.time_ns()}"
    host = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", secret])
    try:
        time.sleep(0.2)
        text, _ = call(context, "Bash", command=f"ps -e -o pid=,args=; echo; cat /proc/[0-9]*/cmdline | tr '\\0' ' '; echo; cat /proc/{host.pid}/cmdline; echo; ls /proc | grep -cE '^[0-9]+$'")
        assert secret not in text, text
        pids = [line.split()[0] for line in text.split("\n\n")[0].strip().splitlines()]
        assert "1" in pids and len(pids) <= 4, text  # the jail's init, bash, ps
        assert f"/proc/{host.pid}/cmdline: No such file" in text or int(host.pid) < 20
    finally:
        host.kill()
        host.wait()


@pytest.mark.skipif(not jail_has_view(), reason="this machine cannot build the jail's namespaces")
def test_commands_see_only_the_workspace_and_system_folders(context, tmp_path):
    outside = tmp_path / "outside-secret.txt"
    outside.write_text("top secret")
    outside.chmod(0o644)
    repo = Path(__file__).resolve().parent.parent
    text, _ = call(context, "Bash", command=f"cat {outside}; ls {repo}/agent; ls /root/.ssh /home; cat model.py | head -1; echo x > /usr/x; env | sort")
    assert "top secret" not in text and "No such file" in text
    assert "sandbox.py" not in text  # the harness source is not in the view
    assert "import torch" in text  # the workspace is
    assert "Read-only file system" in text
    variables = {line.split("=", 1)[0] for line in text.splitlines() if "=" in line and line.split("=", 1)[0].isupper()}
    assert variables <= {"PATH", "HOME", "LANG", "TMPDIR", "TERM", "PWD", "SHLVL", "CUDA_HOME", "CUDA_PATH", "TORCH_CUDA_ARCH_LIST"}, variables


@pytest.mark.skipif(not jail_has_view(), reason="this machine cannot build the jail's namespaces")
def test_background_command_children_die_with_it(context):
    marker = f"{51 + os.getpid() % 1000}.{time.time_ns() % 10**6}"
    text, _ = call(context, "Bash", command=f"setsid sleep {marker} >/dev/null 2>&1 </dev/null & echo started")
    assert "started" in text
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(marker.encode() in Path(f"/proc/{p}/cmdline").read_bytes() for p in os.listdir("/proc") if p.isdigit() and os.path.exists(f"/proc/{p}/cmdline")):
        time.sleep(0.05)
    survivors = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                survivors.append(entry)
        except OSError:
            pass
    assert survivors == []


# --- file tools ----------------------------------------------------------------------------

def test_read_write_edit_multiedit(context):
    call(context, "Write", file_path="kernels/op.cpp", content="int a = 1;\nint b = 1;\nint c = 3;\n")
    text, _ = call(context, "Read", file_path="kernels/op.cpp", offset=2, limit=1)
    assert text == "     2\tint b = 1;"
    text, _ = call(context, "Edit", file_path="kernels/op.cpp", old_string="= 1", new_string="= 2")
    assert "occurs 2 times" in text
    call(context, "Edit", file_path="kernels/op.cpp", old_string="= 1", new_string="= 2", replace_all=True)
    path = context.workspace.root / "kernels" / "op.cpp"
    assert path.read_text() == "int a = 2;\nint b = 2;\nint c = 3;\n"
    text, _ = call(
        context,
        "MultiEdit",
        file_path="kernels/op.cpp",
        edits=[{"old_string": "int c = 3;", "new_string": "int c = 4;"}, {"old_string": "missing", "new_string": "x"}],
    )
    assert "edit 2" in text and "no edit was applied" in text
    assert path.read_text() == "int a = 2;\nint b = 2;\nint c = 3;\n"
    call(context, "MultiEdit", file_path="kernels/op.cpp", edits=[{"old_string": "a = 2", "new_string": "a = 5"}, {"old_string": "c = 3", "new_string": "c = 6"}])
    assert path.read_text() == "int a = 5;\nint b = 2;\nint c = 6;\n"


def test_glob_and_grep(context):
    call(context, "Write", file_path="kernels/a.cu", content="__global__ void k() {}\n")
    call(context, "Write", file_path="kernels/sub/b.cu", content="// nothing\n__global__ void j() {}\n")
    call(context, "Write", file_path="kernels/a_binding.cpp", content="REGISTER_BINDING(a, a);\n")
    text, _ = call(context, "Glob", pattern="**/*.cu")
    assert text.split("\n") == ["kernels/a.cu", "kernels/sub/b.cu"]
    text, _ = call(context, "Glob", pattern="*.cu", path="kernels")
    assert text.split("\n") == ["kernels/a.cu"]
    text, _ = call(context, "Grep", pattern="__global__", glob="*.cu")
    assert text.split("\n") == ["kernels/a.cu:1:__global__ void k() {}", "kernels/sub/b.cu:2:__global__ void j() {}"]
    text, _ = call(context, "Grep", pattern="(unclosed")
    assert "invalid regular expression" in text


# --- Bash and the sandbox ------------------------------------------------------------------

def test_bash_output_and_exit_code(context):
    text, _ = call(context, "Bash", command="echo out; echo err 1>&2; exit 3")
    assert text == "out\nerr\n\n[exit code 3]"


def test_bash_truncation_note_counts_bytes(context):
    text, _ = call(context, "Bash", command="head -c 5000 /dev/zero | tr '\\0' a")
    assert "[... 4000 bytes cut ...]" in text
    assert text.count("a") == 1000


def test_runaway_sleep_killed_at_timeout(context):
    start = time.monotonic()
    text, _ = call(context, "Bash", command="sleep 100", timeout=1)
    assert time.monotonic() - start < 10  # killed at the 1 s timeout (about 1.1 s here), far from 100 s
    assert "[killed after the 1 s timeout]" in text


def test_fork_loop_killed_and_limited(context):
    start = time.monotonic()
    text, _ = call(context, "Bash", command="while true; do sleep 100 & done", timeout=2)
    assert time.monotonic() - start < 20  # killed at the 2 s timeout (2.2 to 3.2 s seen on a busy machine)
    assert "[killed after the 2 s timeout]" in text
    # Nothing of the loop survives: no `sleep 100` whose process group was the command's.
    time.sleep(0.2)
    survivors = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                cmdline = Path(entry.path, "cmdline").read_bytes()
                cwd = os.readlink(Path(entry.path, "cwd"))
            except OSError:
                continue
            if cmdline.startswith(b"sleep\x00100") and cwd == str(context.workspace.root.resolve()):
                survivors.append(entry.name)
    assert survivors == []


@pytest.mark.skipif(not can_switch_uid(), reason="the process limit is per uid; exact only with an own uid")
def test_process_limit_stops_fork_bomb(context):
    # 100 background sleeps against a limit of 32 processes: bash reports failed forks.
    text, _ = call(context, "Bash", command="for i in $(seq 100); do sleep 5 & done; echo started", timeout=8)
    assert "fork:" in text


def test_background_command_output_and_kill(context):
    text, _ = call(context, "Bash", command="for i in 1 2 3; do echo line$i; sleep 0.1; done; sleep 100", run_in_background=True)
    job_id = text.split("id ")[1].split(".")[0]
    time.sleep(0.1)
    deadline = time.monotonic() + 5
    seen = ""
    while "line3" not in seen and time.monotonic() < deadline:
        out, _ = call(context, "BashOutput", bash_id=job_id)
        seen += out
        time.sleep(0.1)
    assert "line1" in seen and "line3" in seen and "[running]" in seen
    text, _ = call(context, "KillBash", bash_id=job_id)
    assert text == f"Killed {job_id}."
    text, _ = call(context, "BashOutput", bash_id=job_id)
    assert "no background command" in text


def test_configs_hold_the_paper_values():
    training, evaluation, tiny = load_agent_config("agent"), load_agent_config("agent_eval"), load_agent_config("agent_tiny")
    assert training.max_turns == 150 and evaluation.max_turns == 200
    assert training.context_budget_tokens == 131072 == evaluation.context_budget_tokens
    assert tiny.backend == "host"
    with pytest.raises(FileNotFoundError):
        load_agent_config("no_such_config")


def test_sandbox_uid_claims_are_exclusive_and_dead_claims_reclaimed(tmp_path):
    claims = tmp_path / "claims"
    first = claim_sandbox_uid(500_000, claims, span=3)
    second = claim_sandbox_uid(500_000, claims, span=3)
    assert first != second and (claims / str(first)).read_text() == str(os.getpid())
    release_sandbox_uid(first, claims)
    assert not (claims / str(first)).exists()
    # A claim left by a dead process: taken over on the way.
    dead = subprocess.Popen(["true"])
    dead.wait()
    for uid in range(500_000, 500_003):
        if uid != second:
            (claims / str(uid)).write_text(str(dead.pid))
    third = claim_sandbox_uid(500_000, claims, span=3)
    assert third != second and (claims / str(third)).read_text() == str(os.getpid())
    fourth = claim_sandbox_uid(500_000, claims, span=3)
    assert fourth not in (second, third)
    with pytest.raises(WorkspaceError, match="no free sandbox uid"):
        claim_sandbox_uid(500_000, claims, span=3)  # every claim held by a live process


def test_directory_swapped_for_a_symlink_after_resolve_is_not_followed(context, tmp_path):
    # The race a background command could win: `resolve` saw a real directory, then it became a link out.
    root = context.workspace.root
    (root / "kernels" / "sub").mkdir()
    real = context.workspace.resolve("kernels/sub/op.cpp", for_write=True)
    (root / "kernels" / "sub").rmdir()
    os.symlink(tmp_path, root / "kernels" / "sub")
    with pytest.raises(OSError):
        context.workspace.open_beneath(real, os.O_WRONLY | os.O_CREAT)
    assert not (tmp_path / "op.cpp").exists()


@pytest.mark.skipif(not can_switch_uid(), reason="needs root to run commands as their own uid")
def test_files_written_by_tools_belong_to_the_sandbox_uid(context):
    call(context, "Write", file_path="kernels/deep/er/op.cpp", content="int x;\n")
    uid = context.workspace.sandbox_uid
    for relative in ("kernels/deep", "kernels/deep/er", "kernels/deep/er/op.cpp"):
        assert (context.workspace.root / relative).stat().st_uid == uid
    text, _ = call(context, "Bash", command="echo more >> kernels/deep/er/op.cpp && rm -r kernels/deep && echo removed")
    assert "removed" in text


def test_agent_process_stays_torch_free(tmp_path):
    """docs/architecture.md: the agent loop never imports torch (a TPU host has none)."""
    code = (
        "import sys, asyncio\n"
        "import agent.cli, agent.episode, agent.trajectory, agent.fleet, agent.policy, agent.batching\n"
        "from agent.workspace import create_workspace\n"
        f"create_workspace({str(tmp_path / 'ws')!r}, 't', 'x = 1\\n')\n"
        "print('torch' in sys.modules, 'jax' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


def test_commands_get_the_configured_limits(context):
    text, _ = call(context, "Bash", command="ulimit -t; ulimit -v; ulimit -f; ulimit -c")
    limits = context.config.sandbox
    assert text.split("\n")[:4] == [str(limits.cpu_seconds), str(limits.memory_bytes // 1024), str(limits.max_file_bytes // 1024), "0"]  # bash counts -v and -f in KiB
    text, _ = call(context, "Bash", command="head -c 70000000 /dev/zero > kernels/big.bin; echo rc=$?; stat -c %s kernels/big.bin")
    assert str(limits.max_file_bytes) in text and "rc=0" not in text  # writing past the file-size limit fails


# --- files that are not regular files, and huge files (finding 7) ---------------------------

def call_with_deadline(ctx, name, seconds=20.0, **arguments):
    """Run one tool call in a thread of its own: a call that blocks fails the test instead of
    hanging the suite. Returns (thread, text or None)."""
    result = {}

    def target():
        result["text"] = asyncio.run(Toolbox(default_tools()).execute(ToolCall(name, arguments), ctx))

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    return thread, result.get("text")


def release_fifo(path, thread):
    """Unblock a tool stuck opening `path` (a regression): an O_RDWR open is both ends."""
    if thread.is_alive():
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
        time.sleep(0.2)
        os.close(fd)
        thread.join(10)


@pytest.mark.parametrize(
    "tool, path, arguments",
    [
        ("Read", "kernels/pipe", {}),
        ("Read", "kernels/pipe", {"offset": 1, "limit": 1}),
        ("Write", "kernels/pipe", {"content": "x"}),
        ("Edit", "kernels/pipe", {"old_string": "a", "new_string": "b"}),
        ("MultiEdit", "kernels/pipe", {"edits": [{"old_string": "a", "new_string": "b"}]}),
        ("NotebookEdit", "kernels/pipe.ipynb", {"cell_id": "a", "new_source": "x"}),
    ],
)
def test_file_tools_refuse_a_fifo_at_once(context, tool, path, arguments):
    fifo = context.workspace.root / path
    os.mkfifo(fifo)
    start = time.monotonic()
    key = "notebook_path" if tool == "NotebookEdit" else "file_path"
    thread, text = call_with_deadline(context, tool, **{key: path}, **arguments)
    try:
        assert not thread.is_alive(), f"{tool} blocked on a FIFO"
        assert text.startswith("Error:") and "not a regular file (a FIFO)" in text, text
        assert time.monotonic() - start < 10
    finally:
        release_fifo(fifo, thread)


def test_file_tools_refuse_sockets_and_keep_walking_past_fifos(context):
    import socket as socket_module

    server = socket_module.socket(socket_module.AF_UNIX)
    server.bind(str(context.workspace.root / "kernels" / "sock"))
    os.mkfifo(context.workspace.root / "kernels" / "pipe")
    call(context, "Write", file_path="kernels/a.cu", content="__global__ void k() {}\n")
    try:
        text, _ = call(context, "Read", file_path="kernels/sock")
        assert text.startswith("Error:") and "not a regular file (a socket)" in text, text
        thread, text = call_with_deadline(context, "Grep", pattern="global", path="kernels")
        assert not thread.is_alive() and text == "kernels/a.cu:1:__global__ void k() {}"
        context.workspace.write_text("model_new.py", "x = 1\n")
        assert sorted(context.workspace.solution_files()) == ["kernels/a.cu", "model_new.py"]
    finally:
        server.close()
        release_fifo(context.workspace.root / "kernels" / "pipe", threading.Thread())


_BOUNDED_READ = """
import asyncio, json, resource, sys, time
from pathlib import Path
from agent.config import AgentConfig
from agent.tool_calls import ToolCall
from agent.toolbox import Toolbox
from agent.tools import default_tools
from agent.tools.base import ToolContext
from agent.workspace import Workspace

def rchar():
    return int(next(line for line in open("/proc/self/io") if line.startswith("rchar")).split()[1])

context = ToolContext(workspace=Workspace(root=Path(sys.argv[1]), task_name="t", task_source=""), config=AgentConfig(tool_output_limit_bytes=1000))
toolbox = Toolbox(default_tools())
rss_before, read_before, start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, rchar(), time.monotonic()
text = asyncio.run(toolbox.execute(ToolCall(sys.argv[2], json.loads(sys.argv[3])), context))
print(json.dumps({"read_bytes": rchar() - read_before, "rss_growth_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before,
                  "seconds": time.monotonic() - start, "length": len(text), "text": text}))
"""


def bounded_call(ctx, tool, arguments):
    done = subprocess.run([sys.executable, "-c", _BOUNDED_READ, str(ctx.workspace.root), tool, json.dumps(arguments)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_reading_one_line_of_a_huge_sparse_file_is_bounded(context):
    """Finding 7: one line of a 500 MB sparse file took the agent to 1.5 GB."""
    huge = context.workspace.root / "kernels" / "huge.bin"
    with open(huge, "wb") as handle:
        handle.truncate(500 * 1024 * 1024)
    result = bounded_call(context, "Read", {"file_path": "kernels/huge.bin", "limit": 1})
    # Reads at most the scan cap (16 MiB) plus the interpreter's own small reads; was 500 MiB.
    assert result["read_bytes"] < 24 * 1024 * 1024, result["read_bytes"]
    assert result["rss_growth_kib"] < 256 * 1024, result["rss_growth_kib"]  # wide margin: was ~1.5 GB
    assert result["length"] < 2000, result["length"]
    assert result["text"].endswith(f"[lines cut to their first 2000 bytes: 1 (more than {16 * 1024 * 1024} bytes)]\n[stopped reading at {16 * 1024 * 1024} of {500 * 1024 * 1024} bytes; use Bash (sed -n, tail, head -c) for the rest]"), result["text"][-300:]
    # Tools that need the whole file refuse it instead of loading it.
    result = bounded_call(context, "Edit", {"file_path": "kernels/huge.bin", "old_string": "a", "new_string": "b"})
    assert result["text"].startswith("Error:") and "too large" in result["text"] and result["read_bytes"] < 1024 * 1024


def test_read_reports_cut_lines_and_keeps_line_numbers(context):
    long_line = "x" * 5000
    call(context, "Write", file_path="kernels/long.txt", content=f"first\r\n{long_line}\nthird\n")
    text, _ = call(context, "Read", file_path="kernels/long.txt")  # output limited to 1000 bytes here
    assert text.startswith("     1\tfirst\n     2\txxx") and "bytes cut ...]\n" in text
    assert text.endswith("xxx\n     3\tthird\n[lines cut to their first 2000 bytes: 2 (5000 bytes)]")
    text, _ = call(context, "Read", file_path="kernels/long.txt", offset=3, limit=5)
    assert text == "     3\tthird"
    text, _ = call(context, "Read", file_path="kernels/long.txt", offset=9)
    assert text == "(no lines: the file has 3 lines)"


# --- NotebookEdit --------------------------------------------------------------------------

NOTEBOOK = {
    "cells": [
        {"cell_type": "markdown", "id": "intro", "metadata": {}, "source": ["# Timing\n", "Notes on the kernel."]},
        {
            "cell_type": "code",
            "id": "bench",
            "metadata": {"tags": ["timing"]},
            "execution_count": 7,
            "outputs": [{"output_type": "stream", "name": "stdout", "text": ["1.5 ms\n"]}],
            "source": ["print(bench())\n"],
        },
        {"cell_type": "code", "id": "plot", "metadata": {}, "execution_count": None, "outputs": [], "source": "plot()"},
    ],
    "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    "nbformat": 4,
    "nbformat_minor": 5,
}


def write_notebook(ctx, path="notes/analysis.ipynb", notebook=NOTEBOOK):
    ctx.workspace.write_text(path, json.dumps(notebook, indent=1))
    return ctx.workspace.root / path


def read_notebook(path):
    return json.loads(path.read_text())


def source_of(cell):
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def test_notebook_edit_is_offered_to_the_policy():
    tools = default_tools()
    names = [tool.name for tool in tools]
    assert names[:10] == ["Bash", "Read", "Write", "Edit", "MultiEdit", "Glob", "Grep", "BashOutput", "KillBash", "NotebookEdit"]
    schema = next(tool for tool in tools if tool.name == "NotebookEdit").schema()
    assert set(schema["function"]["parameters"]["properties"]) == {"notebook_path", "cell_id", "new_source", "cell_type", "edit_mode"}
    assert json.dumps(schema) in system_prompt(tools)


def test_notebook_replace_clears_code_outputs_and_keeps_the_rest(context):
    path = write_notebook(context)
    text, stats = call(context, "NotebookEdit", notebook_path="notes/analysis.ipynb", cell_id="bench", new_source="t = bench()\nprint(t)\n")
    assert not text.startswith("Error"), text
    assert stats.failures == 0 and stats.schema_violations == 0
    notebook = read_notebook(path)
    cells = notebook["cells"]
    assert [c["id"] for c in cells] == ["intro", "bench", "plot"]
    assert source_of(cells[1]) == "t = bench()\nprint(t)\n"
    assert cells[1]["source"] == ["t = bench()\n", "print(t)\n"]  # nbformat's list-of-lines form
    assert cells[1]["outputs"] == [] and cells[1]["execution_count"] is None
    assert cells[1]["cell_type"] == "code" and cells[1]["metadata"] == {"tags": ["timing"]}
    assert cells[0] == NOTEBOOK["cells"][0] and cells[2] == NOTEBOOK["cells"][2]
    assert notebook["metadata"] == NOTEBOOK["metadata"] and (notebook["nbformat"], notebook["nbformat_minor"]) == (4, 5)
    # edit_mode replace is the default; cell_type converts the cell.
    call(context, "NotebookEdit", notebook_path="notes/analysis.ipynb", cell_id="intro", new_source="## Results", edit_mode="replace")
    assert source_of(read_notebook(path)["cells"][0]) == "## Results"
    call(context, "NotebookEdit", notebook_path="notes/analysis.ipynb", cell_id="bench", new_source="Now prose.", cell_type="markdown")
    converted = read_notebook(path)["cells"][1]
    assert converted["cell_type"] == "markdown" and "outputs" not in converted and "execution_count" not in converted
    call(context, "NotebookEdit", notebook_path="notes/analysis.ipynb", cell_id="intro", new_source="x = 1", cell_type="code")
    converted = read_notebook(path)["cells"][0]
    assert converted["cell_type"] == "code" and converted["outputs"] == [] and converted["execution_count"] is None


def test_notebook_insert_places_a_new_cell_with_a_fresh_id(context):
    path = write_notebook(context)
    text, _ = call(context, "NotebookEdit", notebook_path="notes/analysis.ipynb", cell_id="intro", new_source="import torch", cell_type="code", edit_mode="insert")
    assert not text.startswith("Error"), text
    cells = read_notebook(path)["cells"]
    assert len(cells) == 4 and [cells[0]["id"], cells[2]["id"], cells[3]["id"]] == ["intro", "bench", "plot"]
    inserted = cells[1]
    assert inserted["cell_type"] == "code" and source_of(inserted) == "import torch"
    assert inserted["outputs"] == [] and inserted["execution_count"] is None
    assert isinstance(inserted["id"], str) and inserted["id"] not in ("intro", "bench", "plot")
    assert inserted["id"] in text  # the policy learns the new id
    # Without cell_id the cell goes first; every new cell has its own id.
    call(context, "NotebookEdit", notebook_path="notes/analysis.ipynb", new_source="# Title", cell_type="markdown", edit_mode="insert")
    cells = read_notebook(path)["cells"]
    assert len(cells) == 5 and cells[0]["cell_type"] == "markdown" and source_of(cells[0]) == "# Title"
    assert "outputs" not in cells[0] and "execution_count" not in cells[0]
    assert cells[1]["id"] == "intro" and len({c["id"] for c in cells}) == 5
    # After the last cell.
    call(context, "NotebookEdit", notebook_path="notes/analysis.ipynb", cell_id="plot", new_source="done", cell_type="markdown", edit_mode="insert")
    cells = read_notebook(path)["cells"]
    assert cells[-2]["id"] == "plot" and source_of(cells[-1]) == "done"


def test_notebook_delete_removes_only_that_cell(context):
    path = write_notebook(context)
    text, _ = call(context, "NotebookEdit", notebook_path="notes/analysis.ipynb", cell_id="bench", edit_mode="delete")
    assert not text.startswith("Error"), text
    cells = read_notebook(path)["cells"]
    assert cells == [NOTEBOOK["cells"][0], NOTEBOOK["cells"][2]]


def test_notebook_without_cell_ids_is_addressed_by_position_and_upgraded_on_insert(context):
    old = {
        "cells": [{k: v for k, v in cell.items() if k != "id"} for cell in NOTEBOOK["cells"]],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 4,
    }
    path = write_notebook(context, "old.ipynb", old)
    call(context, "NotebookEdit", notebook_path="old.ipynb", cell_id="cell-2", new_source="plot(t)")
    notebook = read_notebook(path)
    assert source_of(notebook["cells"][2]) == "plot(t)" and notebook["nbformat_minor"] == 4
    assert all("id" not in cell for cell in notebook["cells"])
    text, _ = call(context, "NotebookEdit", notebook_path="old.ipynb", cell_id="cell-0", new_source="x", cell_type="code", edit_mode="insert")
    notebook = read_notebook(path)
    assert notebook["nbformat_minor"] == 5 and "upgraded" in text
    ids = [cell.get("id") for cell in notebook["cells"]]
    assert len(ids) == 4 and all(isinstance(i, str) and i for i in ids) and len(set(ids)) == 4
    assert source_of(notebook["cells"][1]) == "x"


@pytest.mark.parametrize(
    "content, arguments, fragment",
    [
        (None, {"cell_id": "bench", "new_source": "x"}, "does not exist"),
        ("{not json", {"cell_id": "bench", "new_source": "x"}, "invalid JSON"),
        ("[1, 2]", {"cell_id": "bench", "new_source": "x"}, "not a Jupyter notebook"),
        ('{"nbformat": 3, "cells": []}', {"cell_id": "bench", "new_source": "x"}, "only nbformat 4"),
        (NOTEBOOK, {"cell_id": "nope", "new_source": "x"}, "cell id 'nope' was not found"),
        (NOTEBOOK, {"cell_id": "nope", "edit_mode": "delete"}, "its cell ids: intro, bench, plot"),
        (NOTEBOOK, {"cell_id": "cell-1", "new_source": "x"}, "cell id 'cell-1' was not found"),  # cells have ids
        (NOTEBOOK, {"cell_id": "intro", "new_source": "x", "edit_mode": "insert"}, "cell_type (code or markdown) is required to insert"),
        (NOTEBOOK, {"new_source": "x"}, "cell_id is required to replace"),
        (NOTEBOOK, {"cell_id": "bench"}, "new_source is required to replace"),
        (NOTEBOOK, {"cell_id": "ghost", "new_source": "x", "cell_type": "code", "edit_mode": "insert"}, "cell id 'ghost' was not found"),
    ],
)
def test_notebook_edit_errors_leave_the_file_unchanged(context, content, arguments, fragment):
    path = context.workspace.root / "nb.ipynb"
    if content is not None:
        context.workspace.write_text("nb.ipynb", content if isinstance(content, str) else json.dumps(content))
    before = path.read_bytes() if path.exists() else None
    text, stats = call(context, "NotebookEdit", notebook_path="nb.ipynb", **arguments)
    assert text.startswith("Error:") and fragment in text, text
    assert stats.failures == 1 and stats.schema_violations == 0
    assert (path.read_bytes() if path.exists() else None) == before


def test_notebook_edit_refuses_other_files_and_bad_modes(context):
    context.workspace.write_text("kernels/op.cpp", "int a;\n")
    text, _ = call(context, "NotebookEdit", notebook_path="kernels/op.cpp", cell_id="a", new_source="x")
    assert "is not a Jupyter notebook (a .ipynb file)" in text
    assert (context.workspace.root / "kernels" / "op.cpp").read_text() == "int a;\n"
    write_notebook(context)
    # Through the toolbox, an unknown edit_mode or cell_type is a schema violation ...
    for bad in ({"edit_mode": "append"}, {"cell_type": "raw"}):
        text, stats = call(context, "NotebookEdit", notebook_path="notes/analysis.ipynb", cell_id="bench", new_source="x", **bad)
        assert stats.schema_violations == 1 and "must be one of" in text, text
    # ... and the tool itself refuses it too when called directly.
    with pytest.raises(ToolFailure, match="edit_mode must be one of replace, insert, delete, not 'append'"):
        context.runner.run(NotebookEditTool().run(context, {"notebook_path": "notes/analysis.ipynb", "cell_id": "bench", "new_source": "x", "edit_mode": "append"}))
    assert read_notebook(context.workspace.root / "notes" / "analysis.ipynb") == NOTEBOOK


def test_notebook_edit_is_confined_to_the_workspace(context, tmp_path):
    outside = tmp_path / "outside.ipynb"
    outside.write_text(json.dumps(NOTEBOOK))
    before = outside.read_bytes()
    os.symlink(outside, context.workspace.root / "kernels" / "link.ipynb")
    os.symlink(tmp_path, context.workspace.root / "kernels" / "outdir")
    for path in ("../outside.ipynb", "kernels/../../outside.ipynb", str(outside), "kernels/link.ipynb", "kernels/outdir/outside.ipynb"):
        for arguments in ({"cell_id": "bench", "new_source": "pwned"}, {"cell_id": "bench", "edit_mode": "delete"},
                          {"new_source": "pwned", "cell_type": "code", "edit_mode": "insert"}):
            text, _ = call(context, "NotebookEdit", notebook_path=path, **arguments)
            assert text.startswith("Error:") and "outside the workspace" in text, (path, text)
    assert outside.read_bytes() == before
    # Harness files are refused the way Write and Edit refuse them.
    for path in ("model.py", "./SKILL.md", "kernels/../binding.cpp"):
        text, _ = call(context, "NotebookEdit", notebook_path=path, cell_id="a", new_source="x")
        assert "read-only" in text, text
    assert (context.workspace.root / "model.py").read_text() == TASK
