#!/usr/bin/env bash
# The evaluator's GPU check, about five minutes on a bare CUDA machine (the steps and what they
# expect: scripts/gpu_check.py). Last line: GPU CHECK PASS or GPU CHECK FAIL: <what>.
# Logs and gpu_check.json go to $OUT (default /tmp/gpu_check_out). After a pass, record it:
#   echo "PASS $(git rev-parse HEAD:evaluator_cuda) $(date +%F)" > docs/gpu-check.txt
set -u
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" scripts/gpu_check.py "$@"
