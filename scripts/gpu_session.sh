#!/usr/bin/env bash
# The GPU figures of the project on an H200, grouped into runs of at most ~9 minutes each.
# Each step has its own time limit, prints as it goes and tees its log to $OUT/<step>.log, so a
# cut step still leaves its lines; a failing step does not stop the next.
#
#   bash scripts/gpu_session.sh evaluator   # the hardened CUDA path, do_bench side by side
#   bash scripts/gpu_session.sh speed       # evaluation speed, both builds
#   bash scripts/gpu_session.sh policy      # sampler / FP32 log-probs, critic and remat steps
#   bash scripts/gpu_session.sh loop        # bridge share of a real evaluation, agent episodes/hour
#   bash scripts/gpu_session.sh synthesis   # task synthesis at the paper's scale, resumable: datasets/ops-h200/
#   bash scripts/gpu_session.sh selfcheck   # the KernelBench-layout tasks against themselves: eager/ours within 3 %
#                                           # (first, in one process: the GPU idle before a call, and the
#                                           # baseline's and the candidate's ways of a call)
#   bash scripts/gpu_session.sh diagnose    # the idle probe, then baselines per request and a 4x launch pad A/B
#   bash scripts/gpu_session.sh open        # what the open measurements wait for: two pairs kept ahead (the
#                                           # cuda default) against one back to back, cold builds of one
#                                           # workspace, and the reductions' self-check jailed and unjailed
#
# On a GPU machine without pyzmq, first install its wheel (fetched elsewhere with pip download):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site:$PWD
set -u
OUT="${OUT:-/tmp/gpu_session_out}"
mkdir -p "$OUT"
export OUT PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
export PYTHONPATH="${PYTHONPATH:-}:$PWD"
PY="${PYTHON:-python3}"

step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2
  shift 2
  echo "=== $name (limit ${limit}s) $(date +%T)"
  timeout --signal=TERM --kill-after=10 "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
  echo "=== $name: exit ${PIPESTATUS[0]} $(date +%T)"
}

case "${1:-}" in
  evaluator)
    step check_hardening 200 "$PY" scripts/check_hardening_gpu.py
    step bench_evaluator_examples 320 "$PY" scripts/bench_evaluator.py examples --fast-build --budget-s 300
    ;;
  speed)
    step bench_evaluator_speed 540 "$PY" scripts/bench_evaluator.py speed --budget-s 500
    ;;
  policy)
    step policy_inference 300 "$PY" scripts/bench_policy_inference.py
    step policy_train 240 "$PY" scripts/bench_policy_train.py --budget-s 220
    ;;
  loop)
    step bench_bridge 170 "$PY" scripts/bench_bridge.py --skip-noop --skip-requeue \
      --real-task examples/tasks/row_softmax.py --real-solution examples/solutions/cuda/row_softmax --backend cuda
    step bench_agent 360 "$PY" scripts/bench_agent.py --backend cuda --concurrency 6 --compile-workers 6
    ;;
  synthesis)  # SYNTH_SECONDS (default 500), SYNTH_WORKERS (12); running again resumes the versioned journal
    dir="${SYNTH_DIR:-datasets/ops-h200}"  # its journal is kept in git: a checkout does not outlive a session
    mkdir -p "$dir"
    "$PY" scripts/machine_load.py --every 20 > "$OUT/machine_load.log" 2>&1 &
    monitor=$!
    step synthesize "${SYNTH_SECONDS:-500}" "$PY" -m cuda_agent.cli data synthesize --out "$dir/tasks.parquet" \
      --count 1000 --eval-dir examples/tasks --backend cuda --scale paper --workers "${SYNTH_WORKERS:-12}"
    kill "$monitor"
    cp "$dir"/tasks.* "$OUT"/
    ;;
  selfcheck)  # each task's own Model as the candidate (no solutions), a fresh cache: baselines measured anew
    step idle 120 "$PY" scripts/bench_evaluator.py idle --budget-s 100
    step placement_paths 120 "$PY" scripts/bench_evaluator.py placement --paths --budget-s 100
    step selfcheck_bench 420 "$PY" -m cuda_agent.cli bench examples/kernelbench_level1 --backend cuda \
      --cache-dir /tmp/selfcheck-cache --out "$OUT/selfcheck"
    step selfcheck_band 30 "$PY" scripts/selfcheck_band.py "$OUT/selfcheck/report.json" --band 0.03
    ;;
  diagnose)  # the self-check's gap: GPU idle before a call (one process), then two settings A/B in the children
    step idle 100 "$PY" scripts/bench_evaluator.py idle --budget-s 80
    step ab_per_request 200 "$PY" scripts/selfcheck_ab.py baselines_per_request=false baselines_per_request=true --rounds 1
    step ab_pad 200 "$PY" scripts/selfcheck_ab.py launch_pad_cycles=null launch_pad_cycles=16000000 --rounds 1
    ;;
  open)
    step split_pairs 270 "$PY" scripts/bench_evaluator.py split --vary pairs --rounds 3 --budget-s 250
    step cold_builds 80 "$PY" scripts/bench_evaluator.py examples --fast-build --warm-first --builds-only \
      --budget-s 60
    step ab_jail_made_sets 200 "$PY" scripts/selfcheck_ab.py jail_children=true jail_children=false \
      --tasks 9_Sum_reduction_over_a_dimension 10_Max_reduction_over_a_dimension --rounds 1 --backend cuda
    ;;
  *)
    echo "usage: bash scripts/gpu_session.sh evaluator|speed|policy|loop|synthesis|selfcheck|diagnose|open" >&2
    exit 2
    ;;
esac
