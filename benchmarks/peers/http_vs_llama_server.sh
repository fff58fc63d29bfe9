#!/usr/bin/env bash
# swiftlm serve against llama.cpp's own C++ llama-server (16 slots, continuous batching) over HTTP, on the
# same random Qwen3-0.6B-shape checkpoint (bf16 / its BF16 GGUF), the same seeded workload, streamed,
# concurrency 1, 4 and 16; the two servers in turn, ROUNDS times, the order reversed every round.
#
#   LLAMA_SERVER=/path/to/llama-server benchmarks/peers/http_vs_llama_server.sh [ROUNDS] [OUT]
#
# llama-server: built from the llama.cpp that llama-cpp-python 0.3.36 vendors (its sdist, unpacked by
# benchmarks/peers/convert_to_gguf.sh under models/peers-tools/):
#   cmake -S models/peers-tools/llama_cpp_python-0.3.36/vendor/llama.cpp -B /work/llama-build \
#     -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release && \
#   cmake --build /work/llama-build --target llama-server -j2           # ~10 min on 2 cores
# Then `swiftlm bench peers` over the results.json files makes the table (OUT/peers-N.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${1:-2}
OUT=${2:-bench-out/http-vs-llama-server}
LLAMA_SERVER=${LLAMA_SERVER:-/work/llama-build/bin/llama-server}
MODEL=${MODEL:-models/qwen3-0.6b-random}
GGUF=${GGUF:-models/qwen3-0.6b-random-gguf/qwen3-0.6b-random-bf16.gguf}
SWIFTLM_ARGS=${SWIFTLM_ARGS:-}
W="--workload random --input-len 128 --output-len 64 --num-requests 32 --seed 0 --warmup 2 \
   --tokenizer $MODEL --concurrency 1,4,16 --no-progress --no-plots"
mkdir -p "$OUT"

wait_for() { for _ in $(seq 600); do curl -sf "$1" >/dev/null 2>&1 && return 0; sleep 0.5; done; echo "no answer from $1" >&2; return 1; }

run_swiftlm() {
  .venv/bin/swiftlm serve "$MODEL" --port 8011 --max-model-len 4096 --max-num-batched-tokens 512 \
    --max-num-seqs 16 $SWIFTLM_ARGS > "$OUT/swiftlm-$1.log" 2>&1 &
  local pid=$!
  wait_for http://127.0.0.1:8011/health
  .venv/bin/swiftlm bench serve --base-url http://127.0.0.1:8011 $W --extra-body '{"temperature": 0}' \
    --output-dir "$OUT/swiftlm-$1"
  kill "$pid"; wait "$pid" 2>/dev/null || true
}

run_llama() {
  "$LLAMA_SERVER" -m "$GGUF" --port 8012 -t 2 -tb 2 -np 16 -c 65536 -b 512 -ub 512 -fa on --no-webui \
    > "$OUT/llama-$1.log" 2>&1 &
  local pid=$!
  wait_for http://127.0.0.1:8012/health
  .venv/bin/swiftlm bench serve --base-url http://127.0.0.1:8012 $W --model qwen3 \
    --extra-body '{"temperature": 0, "repeat_penalty": 1.0, "ignore_eos": true}' --output-dir "$OUT/llama-$1"
  kill "$pid"; wait "$pid" 2>/dev/null || true
}

for r in $(seq "$ROUNDS"); do
  if [ $((r % 2)) -eq 1 ]; then run_swiftlm "$r"; run_llama "$r"; else run_llama "$r"; run_swiftlm "$r"; fi
  .venv/bin/swiftlm bench peers --results "$OUT/swiftlm-$r/results.json" "$OUT/llama-$r/results.json" \
    --labels swiftlm llama-server --output "$OUT/peers-$r.md"
  cat "$OUT/peers-$r.md"
done
