#!/usr/bin/env bash
# The on-policy loop on two GPUs of one host: evaluator workers on GPU 1 behind a broker on TCP, the
# policy (JAX) on GPU 0. Five steps, each printing when it starts and keeping its log in OUT_DIR:
#   1. a broker on tcp://127.0.0.1:$PORT (journal in OUT_DIR) and its workers: WORKERS evaluate
#      workers on GPU 1, two compile workers on the CPU;
#   2. the scripted policy plays the example tasks through that broker (scripted.parquet);
#   3. RFT of the actor (RUN_CONFIG, the Qwen2-0.5B shape) on those episodes on GPU 0, exported as a
#      Hugging Face checkpoint (actor-rft-hf/);
#   4. ITERATIONS on-policy PPO iterations from that actor (train-loop), evaluations through the broker,
#      metrics in loop.jsonl and tensorboard/;
#   5. the loop's curves and table (report/report.md).
# A step whose output exists is skipped, so running again on the same OUT_DIR continues.
#
#   bash scripts/two_gpu_demo.sh [OUT_DIR]             (default /tmp/cuda-agent-two-gpu)
#   TINY=1 bash scripts/two_gpu_demo.sh OUT_DIR        the same on a CPU: tiny model, host-backend workers
# Settings (environment): ITERATIONS (3), RFT_STEPS (the run config's), WORKERS (4), PORT (5655),
# TASKS (examples/tasks), RUN_CONFIG, AGENT_CONFIG, STEP_LIMIT_S (per step, 900), PYTHON (.venv's or
# python3; on a machine without pyzmq, put its wheel's install on PYTHONPATH first).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
  PYTHON=python3
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; fi
fi
OUT=${1:-/tmp/cuda-agent-two-gpu}
ITERATIONS=${ITERATIONS:-3}
WORKERS=${WORKERS:-4}
PORT=${PORT:-5655}
TASKS=${TASKS:-examples/tasks}
STEP_LIMIT_S=${STEP_LIMIT_S:-900}
if [ -n "${TINY:-}" ]; then
  RUN_CONFIG=${RUN_CONFIG:-configs/tiny_two_gpu.yaml}
  AGENT_CONFIG=${AGENT_CONFIG:-configs/agent_first_run.yaml}
  POLICY_GPU=""; EVAL_WORKER=(--count "$WORKERS")
else
  RUN_CONFIG=${RUN_CONFIG:-configs/h200_loop.yaml}
  AGENT_CONFIG=${AGENT_CONFIG:-configs/agent_two_gpu.yaml}
  POLICY_GPU=0; EVAL_WORKER=(--gpus 1)
fi
ENDPOINT="tcp://127.0.0.1:$PORT"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
cli() { "$PYTHON" -m cuda_agent.cli "$@"; }
stamp() { echo "== $(date +%T) $*"; }
step() {  # step LOG ARGS...: `cuda-agent ARGS` under the step's time limit, its output also in OUT/LOG
  local log=$1
  shift
  set +e
  timeout --signal=TERM --kill-after=15 "$STEP_LIMIT_S" "$PYTHON" -m cuda_agent.cli "$@" 2>&1 | tee "$OUT/$log"
  local code=${PIPESTATUS[0]}
  set -e
  if [ "$code" != 0 ]; then
    echo "error: step failed with exit $code (log: $OUT/$log)" >&2
    exit "$code"
  fi
}

FLEET=()  # the broker's and the worker supervisors' own pids (started directly, not through a function)
stop_fleet() {
  for pid in "${FLEET[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap stop_fleet EXIT

where=$([ -n "${TINY:-}" ] && echo "on the CPU" || echo "on GPU 1")
stamp "1/5 broker on $ENDPOINT and its workers: $WORKERS evaluate workers $where, 2 compile workers on the CPU"
"$PYTHON" -m cuda_agent.cli broker --bind "$ENDPOINT" --journal "$OUT/journal.db" > "$OUT/broker.log" 2>&1 &
FLEET+=($!)
if [ -n "${TINY:-}" ]; then
  CUDA_VISIBLE_DEVICES="" "$PYTHON" -m cuda_agent.cli worker --service evaluate "${EVAL_WORKER[@]}" --connect "$ENDPOINT" \
    > "$OUT/worker-evaluate.log" 2>&1 &
  FLEET+=($!)
else
  for i in $(seq 1 "$WORKERS"); do  # several supervisors on GPU 1: evaluations run side by side there
    "$PYTHON" -m cuda_agent.cli worker --service evaluate "${EVAL_WORKER[@]}" --connect "$ENDPOINT" > "$OUT/worker-evaluate-$i.log" 2>&1 &
    FLEET+=($!)
  done
fi
CUDA_VISIBLE_DEVICES="" "$PYTHON" -m cuda_agent.cli worker --service compile --count 2 --connect "$ENDPOINT" > "$OUT/worker-compile.log" 2>&1 &
FLEET+=($!)
offered() {  # whether the broker lists a worker for both services
  cli bridge-status --endpoint "$ENDPOINT" --timeout 2 --json 2>/dev/null | "$PYTHON" -c '
import json, sys
workers = json.load(sys.stdin)["workers"]
sys.exit(0 if {"evaluate", "compile"} <= {s for w in workers for s in w["services"]} else 1)'
}
ready=""
for _ in $(seq 1 90); do
  if offered; then ready=1; break; fi
  sleep 2
done
cli bridge-status --endpoint "$ENDPOINT" --timeout 5 || true
if [ -z "$ready" ]; then
  echo "error: no evaluate and compile workers registered within 180 s (logs: $OUT/broker.log, $OUT/worker-*.log)" >&2
  exit 1
fi

export CUDA_VISIBLE_DEVICES=$POLICY_GPU  # the policy's steps see GPU 0 only (TINY: none)
if [ -s "$OUT/scripted.parquet" ]; then
  stamp "2/5 skipped: $OUT/scripted.parquet exists"
else
  stamp "2/5 the scripted policy plays $TASKS through the broker"
  step rollout.log rollout "$TASKS" --policy scripted --config "$AGENT_CONFIG" --tokenizer workspace \
    --bridge "$ENDPOINT" --out "$OUT/scripted.parquet" --episodes-dir "$OUT/scripted-episodes" \
    --no-salt-per-episode
fi
if [ -f "$OUT/actor-rft-hf/config.json" ]; then
  stamp "3/5 skipped: $OUT/actor-rft-hf exists"
else
  stamp "3/5 RFT of the actor ($RUN_CONFIG) on the scripted episodes"
  step rft.log train --stage rft --config "$RUN_CONFIG" --data "$OUT/scripted.parquet" \
    ${RFT_STEPS:+--steps "$RFT_STEPS"} --checkpoint-dir "$OUT/checkpoints" --log-file "$OUT/rft.jsonl"
  step export.log export-hf --config "$RUN_CONFIG" --from "$OUT/checkpoints/rft/actor" --out "$OUT/actor-rft-hf"
fi
if [ -f "$OUT/actor-ppo-hf/config.json" ]; then
  stamp "4/5 skipped: $OUT/actor-ppo-hf exists"
else
  stamp "4/5 $ITERATIONS on-policy PPO iterations from the RFT actor, evaluations through the broker"
  rm -f "$OUT/loop.jsonl"
  step loop.log train-loop "$TASKS" --config "$RUN_CONFIG" --agent-config "$AGENT_CONFIG" --tokenizer workspace \
    --init-from "$OUT/actor-rft-hf" --bridge "$ENDPOINT" --iterations "$ITERATIONS" \
    --episodes-dir "$OUT/loop-episodes" --log-file "$OUT/loop.jsonl" --tensorboard-dir "$OUT/tensorboard" \
    --export-to "$OUT/actor-ppo-hf"
fi
stamp "5/5 the loop's curves and table"
step report.log metrics-report "$OUT/loop.jsonl" --out "$OUT/report"
stamp "done: $OUT/report/report.md; the fleet's logs: $OUT/broker.log, $OUT/worker-*.log"
