#!/usr/bin/env bash
# Set up a virtual environment in .venv (CPU torch first) with the project and the extras named by the
# argument: `all,dev` (the default: everything, tests included) or fewer, such as `evaluator` for the
# kernel benchmark alone. A later call with more extras adds them to the same .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=${1:-all,dev}
case "$EXTRAS" in *[!a-z,-]*|"") echo "error: extras must be names like all,dev or evaluator, got '$EXTRAS'" >&2; exit 2;; esac
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# The CPU build of torch must come first: a plain 'torch' requirement could pull a multi-GB CUDA build.
python -c "import torch" 2>/dev/null || python -m pip install -q "torch==2.13.0" || python -m pip install -q torch --index-url https://download.pytorch.org/whl/cpu
python -m pip install -q -e ".[$EXTRAS]"
