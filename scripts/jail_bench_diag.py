"""The evaluator's jail on a GPU: `cuda-agent bench` of two example tasks (gemm_bias_gelu with its wrong
variant, row_l2_norm), jailed then unjailed, each in a fresh cache, printing per record the wall-time
split (build, verify, baselines, profile), the build path and why a fast build handed over; a sampler
writes the evaluation's child processes (name, state, CPU ticks, threads, uid) every second.

    DIAG_OUT=$OUT/diag DIAG_LIMIT_S=150 python3 scripts/jail_bench_diag.py    # on the GPU machine

DIAG_BACKEND=host runs it here (the report's device line needs CUDA: it stops there)."""
import json, os, sys, threading, time, tempfile, shutil
from pathlib import Path
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ["PYTHONPATH"] = str(ROOT)
OUT = Path(os.environ.get("DIAG_OUT", "/tmp/o/diag")); OUT.mkdir(parents=True, exist_ok=True)
DEADLINE = time.monotonic() + float(os.environ.get("DIAG_LIMIT_S", "150"))
T0 = time.monotonic()
def log(*a): print(f"[{time.monotonic()-T0:6.1f}]", *a, flush=True)
stop = threading.Event()
def sampler():
    me = os.getpid()
    with open(OUT / "sampler.log", "w") as f:
        while not stop.is_set():
            procs = {}
            for d in os.listdir("/proc"):
                if d.isdigit():
                    try:
                        st = open(f"/proc/{d}/stat").read(); comm = st[st.index("(")+1:st.rindex(")")]
                        r = st[st.rindex(")")+2:].split()
                        uid = os.stat(f"/proc/{d}").st_uid
                        procs[int(d)] = (int(r[1]), comm, r[0], int(r[11]) + int(r[12]), int(r[17]), uid)
                    except Exception: pass
            desc, fr = set(), {me}
            while fr:
                nx = {p for p, v in procs.items() if v[0] in fr and p not in desc}; desc |= nx; fr = nx
            rows = [f"{p}:{procs[p][1]}:{procs[p][2]}:c{procs[p][3]}:t{procs[p][4]}:u{procs[p][5]}" for p in sorted(desc)]
            f.write(f"{time.monotonic()-T0:6.1f} " + " | ".join(rows) + "\n")
            f.flush()
            stop.wait(1.0)
threading.Thread(target=sampler, daemon=True).start()
from evaluator_cuda.bench.run import run_bench
from evaluator_cuda.settings import EvalSettings
tasks = Path(tempfile.mkdtemp()); 
for t in ("gemm_bias_gelu.py", "row_l2_norm.py"): shutil.copy(ROOT / "examples/tasks" / t, tasks / t)
for jail in (True, False):
    if time.monotonic() > DEADLINE: log("deadline"); break
    settings = EvalSettings.for_backend(os.environ.get("DIAG_BACKEND", "cuda"), jail_children=jail,
                                        cache_dir=tempfile.mkdtemp(prefix=f"diag-{jail}-"))
    log(f"=== bench jail={jail}")
    res = run_bench(tasks, ROOT / "examples/solutions", settings, OUT / f"bench_{jail}")
    for r in res.records:
        row = {"jail": jail, "cand": r.get("candidate"), "status": r["status"], "wall_s": r.get("wall_s"),
               "warm": r.get("children_warm_s"), "build": r.get("build")}
        log(json.dumps(row))
stop.set(); log("diag done")
