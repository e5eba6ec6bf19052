"""The compilers and flags of the fast build path, found once per process.

The fast path compiles with the same flags as the torch build the CUDA-Agent harness uses
(docs/paper.md §3: host `-O3`, nvcc `-O3 --use_fast_math`, torch's own nvcc defines, the C++
standard of the installed torch, the arch list from TORCH_CUDA_ARCH_LIST), so a kernel that
compiles one way compiles the other. Nothing here imports torch: a cached build must stay a
hash lookup (≤ 0.3 s).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

from ...settings import DEFAULT_ARCH_LIST  # always explicit (no GPU needed to compile)

# torch.utils.cpp_extension.COMMON_NVCC_FLAGS (unchanged since torch 1.x): kept identical so a kernel
# relying on, say, __half operators fails here exactly as it fails in the torch build.
TORCH_NVCC_DEFINES = (
    "-D__CUDA_NO_HALF_OPERATORS__",
    "-D__CUDA_NO_HALF_CONVERSIONS__",
    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-D__CUDA_NO_HALF2_OPERATORS__",
    "--expt-relaxed-constexpr",
)
EXTENSION_DEFINES = ("-DTORCH_EXTENSION_NAME=cuda_extension",)
TORCH_CXX20_FROM = (2, 10)  # torch's extension builder switched from -std=c++17 to -std=c++20 here


class ToolchainMissing(RuntimeError):
    """A compiler the requested backend needs is not installed."""


@dataclasses.dataclass(frozen=True)
class Toolchain:
    cxx: str
    cxx_standard: str  # "c++17" | "c++20"
    nvcc: str | None = None
    cuda_home: str | None = None

    def identity(self) -> str:
        """A string that changes whenever a compiled object could change (compiler binaries by path, size, mtime).

        Stat-based so that a cached build costs no `--version` subprocess.
        """
        return "|".join([binary_fingerprint(self.cxx), self.cxx_standard, binary_fingerprint(self.nvcc or "")])

    def versions(self) -> dict[str, str]:
        """Human-readable compiler versions (runs the compilers; for reports only)."""
        out = {"cxx": compiler_version(self.cxx), "cxx_standard": self.cxx_standard}
        if self.nvcc:
            out["nvcc"] = compiler_version(self.nvcc)
        return out

    def cuda_include(self) -> str:
        return str(Path(self.cuda_home) / "include")

    def cuda_lib(self) -> str:
        home = Path(self.cuda_home)
        for name in ("lib64", "lib", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib"):
            if (home / name / "libcudart.so").exists():
                return str(home / name)
        return str(home / "lib64")


def torch_version() -> tuple[int, int]:
    """(major, minor) of the installed torch, read from its metadata (no import)."""
    try:
        from importlib.metadata import version

        text = version("torch")
    except Exception:
        return (0, 0)
    match = re.match(r"(\d+)\.(\d+)", text)
    return (int(match[1]), int(match[2])) if match else (0, 0)


def cxx_standard_for(torch_major_minor: tuple[int, int]) -> str:
    """The -std torch's own extension builder would use."""
    return "c++20" if torch_major_minor >= TORCH_CXX20_FROM else "c++17"


@functools.lru_cache(maxsize=None)
def compiler_version(exe: str) -> str:
    """The compiler's own version line(s)."""
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
    lines = [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
    return " / ".join(lines[-2:]) if "nvcc" in Path(exe).name else (lines[0] if lines else "")


def binary_fingerprint(exe: str) -> str:
    """path:size:mtime of the file behind `exe` (empty for none)."""
    if not exe:
        return ""
    real = os.path.realpath(shutil.which(exe) or exe)
    try:
        st = os.stat(real)
    except OSError:
        return real
    return f"{real}:{st.st_size}:{st.st_mtime_ns}"


def find_cuda_home() -> str | None:
    """CUDA_HOME / CUDA_PATH, else the folder above a real nvcc, else /usr/local/cuda; always the real
    folder, which a jailed compiler is shown (it cannot follow links through folders outside its view)."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        value = os.environ.get(var)
        if value and Path(value, "include", "cuda_runtime_api.h").exists():
            return os.path.realpath(value)
    nvcc = shutil.which("nvcc")
    candidates = []
    if nvcc:
        candidates.append(Path(os.path.realpath(nvcc)).parent.parent)
    candidates += [Path("/usr/local/cuda")]
    for home in candidates:
        if (home / "include" / "cuda_runtime_api.h").exists() and (home / "bin" / "nvcc").exists():
            return os.path.realpath(home)
    return None


@functools.lru_cache(maxsize=None)
def find_toolchain(backend: str) -> Toolchain:
    """The compilers for `backend` ("cuda" or "host"); raises ToolchainMissing with one clear line."""
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        raise ToolchainMissing("no C++ compiler found (g++ / $CXX)")
    standard = cxx_standard_for(torch_version())
    if backend == "host":
        return Toolchain(cxx, standard)
    if backend != "cuda":
        raise ValueError(f"unknown backend {backend!r} (expected cuda or host)")
    home = find_cuda_home()
    if not home:
        raise ToolchainMissing("no CUDA toolkit found (set CUDA_HOME; nvcc and include/cuda_runtime_api.h needed)")
    nvcc = str(Path(home) / "bin" / "nvcc")
    return Toolchain(cxx, standard, nvcc, home)


def arch_flags(arch_list: str) -> list[str]:
    """nvcc -gencode flags for a TORCH_CUDA_ARCH_LIST value ("9.0", "8.0;9.0", "9.0+PTX", "9.0a").

    >>> arch_flags("8.0;9.0+PTX")  # doctest: +NORMALIZE_WHITESPACE
    ['-gencode=arch=compute_80,code=sm_80', '-gencode=arch=compute_90,code=sm_90',
     '-gencode=arch=compute_90,code=compute_90']
    """
    flags: list[str] = []
    for item in re.split(r"[;\s,]+", arch_list.strip()):
        if not item:
            continue
        ptx = item.endswith("+PTX")
        item = item[: -len("+PTX")] if ptx else item
        match = re.fullmatch(r"(\d+)\.(\d+)([a-z]?)", item)
        if not match:
            raise ValueError(f"bad TORCH_CUDA_ARCH_LIST entry {item!r} (expected e.g. 9.0, 8.6+PTX, 9.0a)")
        number = f"{match[1]}{match[2]}{match[3]}"
        flags.append(f"-gencode=arch=compute_{number},code=sm_{number}")
        if ptx:
            flags.append(f"-gencode=arch=compute_{number},code=compute_{number}")
    if not flags:
        raise ValueError("empty TORCH_CUDA_ARCH_LIST")
    return flags


def resolve_arch_list(arch_list: str | None) -> str:
    """The explicit arch list: the argument, else $TORCH_CUDA_ARCH_LIST, else the Hopper default."""
    return arch_list or os.environ.get("TORCH_CUDA_ARCH_LIST") or DEFAULT_ARCH_LIST


def digest_of(*parts: bytes | str) -> str:
    """Short sha256 of the parts, separated so that ("ab", "c") != ("a", "bc")."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()[:32]
