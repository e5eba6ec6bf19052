"""On a CUDA machine: the hardened evaluator on the example CUDA solutions (verdicts, times,
precision and speed-of-light flags, sandbox) and the CUDA-only planted cheats, in one go.

    python scripts/check_hardening_gpu.py            # table on stdout
    python scripts/check_hardening_gpu.py --cheats-only   # the CUDA cheat forms alone (gpu_check.sh)
    OUT=/some/dir python scripts/check_hardening_gpu.py   # also $OUT/hardening_gpu.json

Expected: every example `correct` except `*__wrong` (`incorrect`); `sol_violation` false;
`downgrade_suspected` false; `persisting_l2_reset` true on every evaluation that reached its calls; the side-stream and L2-window cheats `incorrect` with their
`rejected` reason; the illegal-address kernel `runtime_error` with needs_recycle true; with the static
checks off, ATen compute hidden from the runtime guard rejected by the kernel trace (`foreign_kernels`)
and work moved off the timed window `correct` with its speed-up withheld (reward 1 at most).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# The evaluator's children run `python -m evaluator_cuda.roles.child`: they need the checkout on PYTHONPATH too.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
sys.path.insert(0, str(ROOT / "tests"))

CRASH_KERNEL = """#include <cuda_runtime.h>
#include <cstdint>
__global__ void bad(float* out) { out[1ll << 40] = 1.0f; }
extern "C" void axpy_launcher(const float* x, const float* y, float* out, float a, int64_t n, int config, void* stream) {
  (void)x; (void)y; (void)a; (void)n; (void)config;
  bad<<<1, 1, 0, (cudaStream_t)stream>>>(out);
}
"""


def main() -> int:
    from evaluator_cuda.evaluation import evaluate
    from evaluator_cuda.settings import EvalSettings
    from evaluator_cuda.solutions import Solution, discover_solutions, read_solution
    from evaluator_cuda.tasks import load_tasks
    from evaluator_helpers import (ATEN_BEHIND_THE_GUARD, AXPY_TASK, HIDDEN_STREAM_KERNEL, L2_KERNEL, STREAM_KERNEL,
                                   TOKEN_KERNEL, workspace)

    cache = os.environ.get("CUDA_AGENT_CACHE") or tempfile.mkdtemp(prefix="hardening-gpu-")
    settings = EvalSettings.for_backend("cuda", cache_dir=cache)
    rows = []

    def run(label: str, task, solution, expect: str, case_settings=None, rejected=None, withheld=False) -> None:
        begin = time.perf_counter()
        record = evaluate(task, solution, case_settings or settings)
        times = record["times_us"].get("candidate") or {}
        ok = record["status"] == expect and (rejected is None or record.get("rejected") == rejected)
        if withheld:  # right output, times that cannot be believed: no speed-up reward
            ok = ok and bool(record.get("speedup_withheld")) and (record.get("reward") or 0) <= 1
        rows.append({
            "case": label, "expect": expect, "status": record["status"], "ok": ok,
            "rejected": record.get("rejected"), "reward": record.get("reward"),
            "withheld": (record.get("speedup_withheld") or [None])[0],
            "kernels": {k: (record.get("kernels") or {}).get(k) for k in ("own_us", "data_us", "own_kernels")}, "median_us": times.get("median_us"), "wall_median_us": times.get("wall_median_us"),
            "speedup_eager": record["speedup"]["eager"], "sol_violation": record.get("sol_violation"),
            "downgrade": (record.get("precision") or {}).get("downgrade_suspected"), "needs_recycle": record.get("needs_recycle", False),
            "persisting_l2_reset": record.get("persisting_l2_reset"),
            "network": (record.get("sandbox") or {}).get("network"), "wall_s": round(time.perf_counter() - begin, 2), "message": record["message"][:160],
        })
        print(json.dumps(rows[-1]), flush=True)

    tasks = {t.stem: t for t in load_tasks(ROOT / "examples" / "tasks").tasks}
    for stem, paths in ({} if "--cheats-only" in sys.argv[1:] else discover_solutions(ROOT / "examples" / "solutions", "cuda")).items():
        for path in paths:
            run(path.name, tasks[stem], read_solution(path), "incorrect" if "__wrong" in path.name else "correct")
    for label, kernel, expect in (("cheat_side_stream", STREAM_KERNEL, "incorrect"), ("cheat_l2_window", L2_KERNEL, "incorrect"), ("illegal_address", CRASH_KERNEL, "runtime_error")):
        files = dict(workspace().files)
        files.pop("kernels/axpy.cpp")
        files["kernels/axpy.cu"] = kernel.encode()
        run(label, AXPY_TASK, Solution("workspace", files, "model_new.py", "axpy"), expect)
    # Past the static checks (off here), what only the GPU's own record shows: ATen compute hidden from
    # the runtime guard (rejected), and the work moved off the timed window (no speed-up reward).
    unchecked = EvalSettings.for_backend("cuda", cache_dir=cache, static_checks=False)
    for label, kernel, body, expect, why in (
            ("cheat_aten_hidden_from_guard", TOKEN_KERNEL, ATEN_BEHIND_THE_GUARD, "incorrect", "foreign_kernels"),
            ("cheat_work_off_the_window", HIDDEN_STREAM_KERNEL, "", "correct", None)):
        files = dict(workspace(binding_body=body).files)
        files.pop("kernels/axpy.cpp")
        files["kernels/axpy.cu"] = kernel.encode()
        run(label, AXPY_TASK, Solution("workspace", files, "model_new.py", "axpy"), expect, unchecked, why,
            withheld=why is None)

    print(f"\n{'case':28} {'expect':14} {'status':14} {'rejected':14} {'median_us':>10} {'wall_us':>10} {'x eager':>8} {'sol!':>5} {'bf16?':>5} {'recyc':>5} {'wall_s':>6}")
    for r in rows:
        fmt = lambda v, spec: format(v, spec) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)  # noqa: E731
        print(f"{r['case']:28} {r['expect']:14} {r['status']:14} {str(r['rejected']):14} {fmt(r['median_us'], '10.1f'):>10} {fmt(r['wall_median_us'], '10.1f'):>10} {fmt(r['speedup_eager'], '8.2f'):>8} {str(r['sol_violation']):>5} {str(r['downgrade']):>5} {str(r['needs_recycle']):>5} {r['wall_s']:6.1f}")
    failed = [r["case"] for r in rows if not r["ok"]]
    print(f"\n{len(rows) - len(failed)}/{len(rows)} as expected" + (f"; unexpected: {', '.join(failed)}" if failed else ""))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"]).mkdir(parents=True, exist_ok=True)
        (Path(os.environ["OUT"]) / "hardening_gpu.json").write_text(json.dumps(rows, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
