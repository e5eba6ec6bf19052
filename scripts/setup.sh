#!/usr/bin/env bash
# Set up a virtual environment in .venv (CPU torch first) with the project and the extras named by the
# argument: `all,dev` (the default: everything, tests included) or fewer, such as `evaluator` for the
# kernel benchmark alone. A later call with more extras adds them to the same .venv.
# With the evaluator among the extras, the evaluator's one-time builds (the binding runtime, the fast
# build's shared headers) are made while pip installs the rest: in the tests' cache when the test tools
# are asked for, else in the user's.
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

WARM_UP_PID=
case ",$EXTRAS," in
  *,all,*|*,evaluator,*)
    # What the warm-up imports (the project's own requirements, read from pyproject.toml, and ninja), not the
    # project itself: its one editable install comes with the extras below, while the warm-up runs from here.
    python -m pip install -q ninja $(python -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))')
    case ",$EXTRAS," in
      *,dev,*) CACHE=${CUDA_AGENT_TEST_CACHE:-$HOME/.cache/cuda-agent-tests} ;;
      *) CACHE=${CUDA_AGENT_CACHE:-$HOME/.cache/cuda-agent} ;;
    esac
    mkdir -p "$CACHE"
    echo "setup: building the evaluator's binding runtime in $CACHE while the extras install"
    CUDA_AGENT_CACHE="$CACHE" PYTHONPATH="$PWD" python -m cuda_agent.cli fast-build --warm-up > "$CACHE/warm-up.log" 2>&1 &
    WARM_UP_PID=$!
    ;;
esac
python -m pip install -q -e ".[$EXTRAS]"
if [ -n "$WARM_UP_PID" ]; then
  if wait "$WARM_UP_PID"; then
    echo "setup: the binding runtime is built"
  else
    echo "setup: warning: the warm-up failed (the first evaluation builds it instead): $(tail -1 "$CACHE/warm-up.log")" >&2
  fi
fi
