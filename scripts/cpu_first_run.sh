#!/usr/bin/env bash
# A first run without a GPU: the scripted policy plays the example tasks (host evaluator), a tiny
# actor learns from those episodes by RFT, and then plays a task itself in the agent loop.
#   bash scripts/cpu_first_run.sh [OUT_DIR]        (default /tmp/cuda-agent-first-run; STEPS=60)
# Leaves in OUT_DIR: scripted.parquet, rft.jsonl (a line per step), checkpoints/, actor-hf/ (the
# trained actor as a Hugging Face checkpoint) and solve-row_softmax/transcript.md (its episode).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
OUT=${1:-/tmp/cuda-agent-first-run}
STEPS=${STEPS:-60}
if [ -d "$OUT" ] && [ -n "$(ls -A "$OUT")" ]; then
  echo "error: $OUT is not empty (give another folder)" >&2
  exit 2
fi
mkdir -p "$OUT"
cli() { "$PYTHON" -m cuda_agent.cli "$@"; }
stamp() { echo "== $(date +%T) $*"; }

stamp "1/4 the scripted policy plays examples/tasks (host evaluator)"
cli rollout examples/tasks --policy scripted --config configs/agent_first_run.yaml --tokenizer workspace \
  --out "$OUT/scripted.parquet" --episodes-dir "$OUT/scripted-episodes" --no-salt-per-episode
stamp "2/4 RFT of a tiny actor on the successful episodes ($STEPS steps)"
cli train --stage rft --config configs/tiny_first_run.yaml --data "$OUT/scripted.parquet" --steps "$STEPS" \
  --checkpoint-dir "$OUT/checkpoints" --log-file "$OUT/rft.jsonl"
stamp "3/4 the actor as a Hugging Face checkpoint"
cli export-hf --config configs/tiny_first_run.yaml --from "$OUT/checkpoints/rft/actor" --out "$OUT/actor-hf"
stamp "4/4 the trained actor plays row_softmax in the agent loop (greedy)"
cli solve examples/tasks/row_softmax.py --policy jax --model-dir "$OUT/actor-hf" --tokenizer workspace \
  --config configs/agent_first_run.yaml --run-config configs/tiny_first_run.yaml --out "$OUT/solve-row_softmax"
stamp "done: read $OUT/solve-row_softmax/transcript.md"
