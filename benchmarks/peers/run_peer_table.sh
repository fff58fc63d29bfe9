#!/usr/bin/env bash
# The peer table: swiftlm vs llama.cpp's server (llama-cpp-python) vs Hugging Face transformers
# (in-process), on the same random Qwen3-0.6B-shape checkpoint, the same seeded workload and the
# same concurrency levels, one engine at a time on an otherwise idle machine:
#
#   benchmarks/peers/run_peer_table.sh                       # ~15-25 min on the 2-core CPU
#   GGUF_TYPES="bf16 q8_0 q4_0" SWIFTLM_QUANT="none int8 int4" benchmarks/peers/run_peer_table.sh
#
# Before: `python scripts/make_random_model.py models/qwen3-0.6b-random` (bf16) and
# `benchmarks/peers/convert_to_gguf.sh models/qwen3-0.6b-random` (GGUFs); llama-cpp-python[server]
# installed for PEERS_PY.
#
# Workload: `random` (completions: raw text, so no chat template differs between engines),
# IN prompt tokens, OUT output tokens, NUM requests per level, seed 0, greedy (temperature 0) on
# all three. Fixed output lengths: swiftlm and bench hf get ignore_eos from the workload;
# llama-cpp-python ignores ignore_eos, so it gets a logit_bias of -100 on every EOS id of
# generation_config.json (see run_llama_server.sh for why not min_tokens). The table's
# "output tokens / request" row shows whether the lengths came out equal.
#
# Output: OUTDIR/<label>/results.{json,md} per engine, OUTDIR/<label>.log per server,
# OUTDIR/peers.md (the side-by-side table), OUTDIR/machine.txt (load average before each run).
#
# Environment (defaults): MODEL (models/qwen3-0.6b-random), GGUF_DIR (MODEL-gguf),
# GGUF_TYPES (bf16), SWIFTLM_QUANT (none), LEVELS (1,4,16), NUM (32), IN (128), OUT (64),
# WARMUP (2), OUTDIR (bench-out/peers-<time>), PY (.venv/bin/python),
# PEERS_PY (/work/peers-venv/bin/python), SKIP (space-separated: swiftlm llama hf).
set -euo pipefail
cd "$(dirname "$0")/../.."

MODEL=${MODEL:-models/qwen3-0.6b-random}
GGUF_DIR=${GGUF_DIR:-${MODEL%/}-gguf}
GGUF_TYPES=${GGUF_TYPES:-bf16}
SWIFTLM_QUANT=${SWIFTLM_QUANT:-none}
LEVELS=${LEVELS:-1,4,16}
NUM=${NUM:-32}
IN=${IN:-128}
OUT=${OUT:-64}
WARMUP=${WARMUP:-2}
OUTDIR=${OUTDIR:-bench-out/peers-$(date +%Y%m%d-%H%M%S)}
PY=${PY:-.venv/bin/python}
PEERS_PY=${PEERS_PY:-/work/peers-venv/bin/python}
SKIP=${SKIP:-}
SWIFTLM_PORT=${SWIFTLM_PORT:-8011}
LLAMA_PORT=${LLAMA_PORT:-8012}
NAME=$(basename "${MODEL%/}")
mkdir -p "$OUTDIR"

WORKLOAD=(--workload random --input-len "$IN" --output-len "$OUT" --num-requests "$NUM" --seed 0
  --warmup "$WARMUP" --tokenizer "$MODEL" --concurrency "$LEVELS" --no-progress --no-plots)
GREEDY='{"temperature": 0}'
LLAMA_BODY=$("$PY" - "$MODEL" <<'PYEOF'
import json, sys
eos = json.load(open(f"{sys.argv[1]}/generation_config.json"))["eos_token_id"]
eos = eos if isinstance(eos, list) else [eos]
print(json.dumps({"temperature": 0, "repeat_penalty": 1.0, "logit_bias": {str(t): -100 for t in eos}}))
PYEOF
)

RESULTS=()
LABELS=()
SERVER_PID=""
stop_server() {
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill "$SERVER_PID"
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  SERVER_PID=""
}
trap stop_server EXIT

wait_ready() {  # $1: a URL that answers 200 once the model is loaded
  for _ in $(seq 1 600); do
    curl -sf "$1" >/dev/null 2>&1 && return 0
    kill -0 "$SERVER_PID" 2>/dev/null || { echo "server exited; see its log" >&2; return 1; }
    sleep 1
  done
  echo "server not ready after 600 s" >&2
  return 1
}

note_load() {  # $1: label
  echo "$1: $(date +%T) load average $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUTDIR/machine.txt"
  awk '{ if ($1 > 0.5) print "warning: load average " $1 " > 0.5: the machine is not idle" }' /proc/loadavg >&2
}

skipped() { [[ " $SKIP " == *" $1 "* ]]; }

if ! skipped swiftlm; then
  for quant in $SWIFTLM_QUANT; do
    label="swiftlm"; [ "$quant" = none ] || label="swiftlm-$quant"
    .venv/bin/swiftlm serve "$MODEL" --host 127.0.0.1 --port "$SWIFTLM_PORT" --quantization "$quant" \
      --max-model-len 4096 --max-num-batched-tokens 512 --max-num-seqs 16 >"$OUTDIR/$label.log" 2>&1 &
    SERVER_PID=$!
    wait_ready "http://127.0.0.1:$SWIFTLM_PORT/health"  # /v1/models answers before the model loads
    note_load "$label"
    "$PY" -m swiftlm.bench.cli serve --base-url "http://127.0.0.1:$SWIFTLM_PORT" "${WORKLOAD[@]}" \
      --extra-body "$GREEDY" --output-dir "$OUTDIR/$label"
    stop_server
    RESULTS+=("$OUTDIR/$label/results.json"); LABELS+=("$label")
  done
fi

if ! skipped llama; then
  for type in $GGUF_TYPES; do
    label="llama.cpp-$type"
    gguf="$GGUF_DIR/$NAME-$type.gguf"
    [ -f "$gguf" ] || { echo "missing $gguf: run benchmarks/peers/convert_to_gguf.sh $MODEL $GGUF_DIR $type" >&2; exit 1; }
    PEERS_PY="$PEERS_PY" benchmarks/peers/run_llama_server.sh "$gguf" "$LLAMA_PORT" >"$OUTDIR/$label.log" 2>&1 &
    SERVER_PID=$!
    wait_ready "http://127.0.0.1:$LLAMA_PORT/v1/models"  # it loads the model before it listens
    if grep -q "extra buffer types off" "$OUTDIR/$label.log"; then label="$label-norepack"; fi
    note_load "$label"
    "$PY" -m swiftlm.bench.cli serve --base-url "http://127.0.0.1:$LLAMA_PORT" "${WORKLOAD[@]}" \
      --extra-body "$LLAMA_BODY" --output-dir "$OUTDIR/$label"
    stop_server
    RESULTS+=("$OUTDIR/$label/results.json"); LABELS+=("$label")
  done
fi

if ! skipped hf; then
  note_load transformers
  "$PY" -m swiftlm.bench.cli hf --model "$MODEL" --dtype auto --threads 2 "${WORKLOAD[@]}" \
    --extra-body "$GREEDY" --output-dir "$OUTDIR/transformers"
  RESULTS+=("$OUTDIR/transformers/results.json"); LABELS+=("transformers")
fi

"$PY" -m swiftlm.bench.cli peers --results "${RESULTS[@]}" --labels "${LABELS[@]}" \
  --title "Peers: $NAME, random $IN in / $OUT out, $NUM requests per level" --output "$OUTDIR/peers.md"
