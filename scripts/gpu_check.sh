#!/usr/bin/env bash
# The GPU check (scripts/gpu_check.py): correctness against transformers, then the 256-sequence
# throughput workload, TTFT / TPOT at concurrency 1 and 16-way decode on the Qwen3-0.6B shape.
# Runs from the source tree (PYTHONPATH=src, no pip install, no network); every stage writes its
# JSON under $OUT as it ends, and $OUT/summary.md holds the table.
#
#   OUT=/tmp/gpu_check scripts/gpu_check.sh                 # on a CUDA machine
#   OUT=/tmp/gpu_check scripts/gpu_check.sh --device cpu    # dry run on a CPU (tiny sizes)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu_check_out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"  # the device image's python (torch, triton, transformers, numpy)
LIMIT=290  # the whole check: under 5 minutes on one H200; a stage cut by the limit leaves the JSONs before it
if [ "${1:-}" = "--device" ] && [ "${2:-}" = "cpu" ]; then
    LIMIT=900  # the dry run: the Triton interpreter on 2 cores
    [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ] && PY=.venv/bin/python
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
timeout "${GPU_CHECK_TIMEOUT:-$LIMIT}" "$PY" scripts/gpu_check.py --out "$OUT" "$@" 2>&1 | tee "$OUT/log.txt"
exit "${PIPESTATUS[0]}"
