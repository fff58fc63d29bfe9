#!/usr/bin/env bash
# Every bench workload at concurrency 1 and 8 against one `swiftlm serve` (JSON, Markdown, PNG each),
# then the reference deployment's A/B on `qa` (thinking on + streaming vs thinking off +
# non-streaming + max_tokens 128), interleaved by `bench ab`.
#   benchmarks/server/run_workload_matrix.sh [MODEL_DIR] [OUT_DIR] [REQUESTS]
set -euo pipefail
MODEL=${1:-models/qwen3-0.6b-random}
OUT=${2:-bench-out/workloads-$(date +%Y%m%d-%H%M)}
N=${3:-8}
PORT=${PORT:-8021}
PY=${PY:-.venv/bin/python}
mkdir -p "$OUT"
$PY -m swiftlm.cli serve "$MODEL" --port "$PORT" --max-model-len 4096 --max-num-seqs 16 \
  --log-level warning >"$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; do sleep 1; done
for W in qa summary code chat shared-prefix random; do
  EXTRA=()
  [ "$W" = random ] && EXTRA=(--input-len 256 --output-len 64)
  $PY -m swiftlm.cli bench serve --base-url "http://127.0.0.1:$PORT" --workload "$W" --concurrency 1,8 \
    --num-requests "$N" --seed 0 --tokenizer "$MODEL" --no-progress "${EXTRA[@]}" --output-dir "$OUT/$W"
done
# The reference deployment's A/B on `qa`, against the same server, interleaved A, B, A, B:
# A = its default (thinking on, streaming, temperature 0.5, no length cap: capped here at A_MAX
# tokens, because random weights never stop on their own), B = its tuned settings (thinking off,
# non-streaming, temperature 0.3, max_tokens 128).
A_MAX=${A_MAX:-256}
$PY -m swiftlm.cli bench ab --a "http://127.0.0.1:$PORT" --b "http://127.0.0.1:$PORT" --workload qa \
  --num-requests "${AB_N:-4}" --rounds "${AB_ROUNDS:-2}" --concurrency 1 --seed 0 --tokenizer "$MODEL" --no-progress \
  --a-extra-body "{\"enable_thinking\": true, \"temperature\": 0.5, \"max_tokens\": $A_MAX}" --a-stream on \
  --b-extra-body '{"enable_thinking": false, "temperature": 0.3, "max_tokens": 128}' --b-stream off \
  --output-dir "$OUT/ab-thinking"
kill $SERVER; wait $SERVER 2>/dev/null || true
trap - EXIT
