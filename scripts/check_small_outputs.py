"""Small outputs are scored at their own scale, on either backend: a plain softmax over wide rows
(every value far below atol) gets the honest example kernel `correct` on every seed, and zeros, a
constant, permuted rows and a 0.5x output `incorrect`; a reference that ignores its inputs is a
`task_error`.

    python scripts/check_small_outputs.py --backend cuda     # gpu_check.sh runs this
    python scripts/check_small_outputs.py --backend host --wide-cols 65536

One line per case as it ends, a table last; exit 1 when any verdict is not the expected one.
"""

from __future__ import annotations

import argparse
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("host", "cuda"), default="cuda")
    parser.add_argument("--wide-cols", type=int, default=262_144, help="columns of the wide softmax (64 rows)")
    parser.add_argument("--honest-runs", type=int, default=2, help="evaluations of the honest kernel per shape (5 seeds each)")
    parser.add_argument("--profile", action="store_true", help="also time the candidate and the baselines")
    args = parser.parse_args()

    from evaluator_cuda.evaluation import children_kept_warm, evaluate
    from evaluator_cuda.settings import EvalSettings
    from evaluator_helpers import small_output_cases

    cache = os.environ.get("CUDA_AGENT_CACHE") or tempfile.mkdtemp(prefix="small-outputs-")
    settings = EvalSettings.for_backend(args.backend, cache_dir=cache, profile=args.profile)
    rows = []
    cases = small_output_cases(args.backend, args.wide_cols, args.honest_runs)
    with children_kept_warm(True):
        for label, task, solution, expected in cases:
            begin = time.perf_counter()
            record = evaluate(task, solution, settings)
            tolerance = record.get("tolerance") or {}
            rows.append({
                "case": label, "expected": expected, "status": record["status"], "ok": record["status"] == expected,
                "criterion": record.get("failed_criterion"), "tensor_atol": (tolerance.get("tensor_atol") or [None])[0],
                "relative_error": (record.get("precision") or {}).get("relative_error"), "median_us": (record["times_us"].get("candidate") or {}).get("median_us"),
                "eager_us": (record["times_us"].get("eager") or {}).get("median_us"), "compile_us": (record["times_us"].get("compile") or {}).get("median_us"),
                "wall_s": round(time.perf_counter() - begin, 2), "message": record["message"][:140],
            })
            print(json.dumps(rows[-1]), flush=True)
    print(f"\n{'case':36} {'expected':10} {'status':10} {'criterion':20} {'atol used':>10} {'rel err':>9} {'ours us':>9} {'wall_s':>6}")
    for r in rows:
        atol = f"{r['tensor_atol']:.2e}" if isinstance(r["tensor_atol"], float) else "-"
        err = f"{r['relative_error']:.1e}" if isinstance(r["relative_error"], float) else "-"
        ours = f"{r['median_us']:.1f}" if isinstance(r["median_us"], float) else "-"
        print(f"{r['case']:36} {r['expected']:10} {r['status']:10} {str(r['criterion']):20} {atol:>10} {err:>9} {ours:>9} {r['wall_s']:6.1f}")
    failed = [r["case"] for r in rows if not r["ok"]]
    print(f"\n{len(rows) - len(failed)}/{len(rows)} as expected" + (f"; unexpected: {', '.join(failed)}" if failed else ""))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"]).mkdir(parents=True, exist_ok=True)
        (Path(os.environ["OUT"]) / f"small_outputs_{args.backend}.json").write_text(json.dumps(rows, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
