"""The jail on this machine: what it gives (protections), what starting a command in it costs,
and, with --gpu, that CUDA works inside it (device nodes, driver libraries, torch), in the memory
cgroup the evaluator gives a jailed CUDA child where this machine can make one.

    python scripts/check_jail.py [--repeats 20] [--gpu]

Timing: median wall time of `python -c pass` started with subprocess.run, jailed and not,
interleaved (a jailed start is the stage's own Python start, the namespaces, ~25 mounts, the
privilege drop and the seccomp filter, then the command's start). Last line: JAIL CHECK PASS
or JAIL CHECK FAIL: <what>.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cuda_agent.jail import Bind, JailSpec, gpu_devices, jail_command, nvidia_library_binds, probe, python_binds  # noqa: E402

GPU_CODE = """
import time
start = time.perf_counter()
import torch
x = torch.randn(2048, 2048, device="cuda")
y = (x @ x).sum().item()
torch.cuda.synchronize()
print("cuda ok", torch.cuda.get_device_name(0), torch.version.cuda, round(time.perf_counter() - start, 2))
"""

NVCC_CODE = r"""
#include <cstdio>
__global__ void add(float* x) { x[threadIdx.x] += 1.0f; }
int main() {
    float* d; float h[32] = {0};
    cudaMalloc(&d, sizeof h); cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice);
    add<<<1, 32>>>(d); cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    printf("nvcc ok %g\n", h[31]);
    return h[31] == 1.0f ? 0 : 1;
}
"""


def progress(what: str) -> None:
    """A line before each slow step, so that a run cut at a time limit shows where it was."""
    print(f"... {what} ({time.strftime('%H:%M:%S')})", flush=True)


def _memory_cgroup():
    """The cgroup the evaluator gives a jailed CUDA child, or None (said why) where none can be made."""
    from cuda_agent.jail.cgroup import CgroupUnavailable, create_cgroup
    from evaluator_cuda.isolation.sandbox import CUDA_CHILD_MEMORY_BYTES

    try:
        return create_cgroup(CUDA_CHILD_MEMORY_BYTES, 256)
    except CgroupUnavailable as exc:
        print("memory cgroup: unavailable:", exc)
        return None


def timed(argv: list[str], env: dict | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--gpu", action="store_true")
    args = parser.parse_args()
    machine = probe()
    print("probe:", json.dumps(machine))
    if not machine["namespaces"]:
        print(f"JAIL CHECK FAIL: no namespaces: {machine['reason']}")
        raise SystemExit(1)
    devices = gpu_devices() if args.gpu else ()
    extra = nvidia_library_binds() if args.gpu else ()
    workdir = Path(os.environ.get("OUT", "/tmp")) / "jail-check"
    workdir.mkdir(parents=True, exist_ok=True)
    os.chown(workdir, 3_200_000, 3_200_000) if os.geteuid() == 0 else None
    cuda = [Bind(p) for p in ("/usr/local/cuda",) if os.path.exists(p)]
    spec = JailSpec(binds=(Bind(str(workdir), writable=True), *python_binds(), *extra, *cuda), uid=3_200_000, devices=devices,
                    path=f"{os.path.dirname(sys.executable)}:/usr/local/cuda/bin:/usr/bin:/bin")
    command = jail_command(spec, [sys.executable, "-c", "pass"])
    print("protections:", json.dumps(command.protections))
    progress(f"timing {args.repeats} starts of `python -c pass`, plain and jailed")
    plain, jailed = [], []
    for _ in range(args.repeats):
        plain.append(timed([sys.executable, "-c", "pass"]))
        jailed.append(timed(command.argv, command.env))
    row = {"python -c pass": {"plain_ms": round(1000 * statistics.median(plain), 1), "jailed_ms": round(1000 * statistics.median(jailed), 1)}}
    row["python -c pass"]["overhead_ms"] = round(row["python -c pass"]["jailed_ms"] - row["python -c pass"]["plain_ms"], 1)
    print("start-up (median of", args.repeats, "):", json.dumps(row))
    failures = []
    if args.gpu:
        if not devices:
            failures.append("no /dev/nvidia* on this machine")
        progress("torch on CUDA outside the jail")
        plain_gpu = subprocess.run([sys.executable, "-c", GPU_CODE], capture_output=True, text=True, timeout=300)
        group = _memory_cgroup()
        in_group = dataclasses.replace(spec, cgroup_procs=group.procs_files) if group else spec
        gpu = jail_command(in_group, [sys.executable, "-c", GPU_CODE])
        progress("torch on CUDA in the jail" + (" and in its memory cgroup" if group else ""))
        start = time.perf_counter()
        try:
            done = subprocess.run(gpu.argv, env=gpu.env, capture_output=True, text=True, timeout=300)
        finally:
            if group:
                print("memory cgroup:", json.dumps({**group.describe(), "oom_kills": group.oom_kills()}))
                group.remove()
        print("torch outside:", plain_gpu.stdout.strip() or plain_gpu.stderr[-500:])
        print(f"torch in the jail ({time.perf_counter() - start:.2f} s):", done.stdout.strip() or done.stderr[-2000:])
        if "cuda ok" not in done.stdout:
            failures.append("torch.cuda in the jail")
        (workdir / "add.cu").write_text(NVCC_CODE)
        nvcc = jail_command(spec, ["sh", "-c", "nvcc -o add add.cu && ./add"])
        progress("nvcc build and run in the jail")
        done = subprocess.run(nvcc.argv, env=nvcc.env, capture_output=True, text=True, timeout=300)
        print("nvcc in the jail:", done.stdout.strip() or done.stderr[-2000:])
        if "nvcc ok 1" not in done.stdout:
            failures.append("nvcc build and run in the jail")
    print("JAIL CHECK PASS" if not failures else "JAIL CHECK FAIL: " + "; ".join(failures))
    raise SystemExit(1 if failures else 0)


if __name__ == "__main__":
    main()
