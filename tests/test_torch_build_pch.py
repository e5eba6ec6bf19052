"""The torch build's precompiled header: made from the flags of a build that succeeded, without the
build's own include folder (which once made every build.ninja look unsafe, so no header was ever
precompiled), and never with a flag that could run or read something the harness did not choose."""

import subprocess
from pathlib import Path

import pytest

pytest.importorskip("torch")

from evaluator_cuda.extension import pch  # noqa: E402
from evaluator_cuda.settings import EvalSettings  # noqa: E402

TORCH_INCLUDE = "/opt/torch/include"


def _ninja(work: Path, cflags: str, cxx: str = "/usr/bin/g++") -> Path:
    """A build.ninja as torch's build writes it, in `work`/build."""
    (work / "build").mkdir(parents=True)
    ninja = work / "build" / "build.ninja"
    ninja.write_text(f"ninja_required_version = 1.3\ncxx = {cxx}\n\ncflags = {cflags}\npost_cflags = \n\n"
                     "rule compile\n  command = $cxx -MMD -MF $out.d $cflags -c $in -o $out $post_cflags\n")
    return ninja


@pytest.fixture
def compiler_calls(monkeypatch):
    """The commands make_pch runs; each 'compiles' by writing its output file."""
    calls = []

    def fake_run(command, **kwargs):
        calls.append(command)
        Path(command[command.index("-o") + 1]).write_bytes(b"gch")
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(subprocess, "run", fake_run)
    return calls


def _settings(tmp_path: Path) -> EvalSettings:
    return EvalSettings.for_backend("host", cache_dir=str(tmp_path / "cache"))


def test_the_header_is_made_without_the_builds_own_include_folder(tmp_path, compiler_calls):
    settings = _settings(tmp_path)
    work = settings.cache_path() / "build" / "tmp-key-x"
    flags = f"-DTORCH_EXTENSION_NAME=cuda_extension -I{work}/src -isystem {TORCH_INCLUDE} -fPIC -std=c++20 -O3"
    assert pch.ready_pch(settings) is None
    assert pch.make_pch(_ninja(work, flags), settings)
    [command] = compiler_calls
    assert command[0] == "/usr/bin/g++" and not any(str(work) in part for part in command)
    assert ["-isystem", TORCH_INCLUDE] == command[command.index("-isystem"):command.index("-isystem") + 2]
    assert "-DTORCH_EXTENSION_NAME=cuda_extension" in command and "-O3" in command
    assert pch.ready_pch(settings) == pch.pch_folder(settings) / "binding_registry.h"
    assert not pch.make_pch(_ninja(tmp_path / "second", flags.replace(str(work), str(tmp_path / "second"))), settings)
    assert len(compiler_calls) == 1  # made once


@pytest.mark.parametrize("flags, cxx", [
    ("-I{cache}/other/src -isystem /opt/torch/include", "/usr/bin/g++"),  # another folder of the cache
    ("-isystem {work}/src", "/usr/bin/g++"),
    ("-fplugin=/tmp/evil.so -isystem /opt/torch/include", "/usr/bin/g++"),
    ("-isystem /opt/torch/include @{work}/response", "/usr/bin/g++"),
    ("-isystem /opt/torch/include", "/tmp/wrapper"),
    ("-isystem /opt/torch/include", "ccache g++"),
])
def test_unsafe_flags_or_compilers_make_no_header(tmp_path, compiler_calls, flags, cxx):
    settings = _settings(tmp_path)
    work = settings.cache_path() / "build" / "tmp-key-x"
    ninja = _ninja(work, f"-I{work}/src " + flags.format(cache=settings.cache_path(), work=work), cxx=cxx)
    assert not pch.make_pch(ninja, settings)
    assert compiler_calls == [] and pch.ready_pch(settings) is None
