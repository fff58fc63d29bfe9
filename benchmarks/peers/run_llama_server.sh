#!/usr/bin/env bash
# Serve a GGUF model with llama-cpp-python's OpenAI-compatible server, set up like swiftlm on
# this machine (2 threads, 4096-token context), in the foreground:
#
#   benchmarks/peers/run_llama_server.sh models/qwen3-0.6b-random-gguf/qwen3-0.6b-random-bf16.gguf [PORT]
#
# What this server is: llama-cpp-python's `python -m llama_cpp.server` (FastAPI around one
# llama_cpp.Llama), not llama.cpp's C++ `llama-server`. It has one context and a lock, so it runs
# ONE request at a time, first come first served; there is no --n_parallel / continuous batching.
# Under concurrency the others wait in the lock, and their TTFT and latency include that wait.
#
# Flags, and why (names as `python -m llama_cpp.server --help` prints them, llama-cpp-python 0.3.x):
#   --n_threads 2 --n_threads_batch 2   decode and prompt threads: the machine's 2 cores
#   --n_ctx 4096 --n_batch 512          context and prompt batch (swiftlm: --max-model-len 4096,
#                                       --max-num-batched-tokens 512)
#   --interrupt_requests false          the default (true) ENDS a streaming response early
#                                       ([DONE] after the current token) as soon as another
#                                       request waits: at concurrency > 1 outputs would be cut
#   --logits_all false                  the default (true) computes lm_head logits for every
#                                       prompt position, which only logprobs of the prompt need
#   --chat_template_kwargs '{"enable_thinking": false}'   for chat workloads, as swiftlm's default
#                                       and bench hf's (the completion workload ignores it)
#   --model_alias NAME                  the model id /v1/models lists (default: the file's stem)
# Request fields: it ignores unknown ones (ignore_eos, session_id). It has `min_tokens`, which
# bans only the GGUF's eos token (<|im_end|>), and `logit_bias`; in 0.3.x the two do not combine
# (passing logit_bias drops the min_tokens processor), so fixed lengths come from a logit_bias of
# -100 on every EOS id (run_peer_table.sh). Streamed chunks carry no usage, and a token that is
# an incomplete UTF-8 piece arrives merged into the next chunk: `bench serve` then counts chunks,
# which can under-count tokens (`bench peers` marks such columns with a dagger).
#
#
# AMX: on a CPU with amx_int8, llama.cpp puts quantized weights (Q8_0, Q4_0, ...) in its AMX
# buffers and the first decode segfaults (llama.cpp #20824; seen here with llama-cpp-python
# 0.3.36 on the real Qwen3-0.6B shape). BF16 is not affected. EXTRA_BUFTS=auto (the default)
# therefore starts quantized files through llama_server.py --no-extra-bufts on such CPUs, which
# also turns off llama.cpp's CPU repacking: those numbers understate a build without AMX (see
# benchmarks/peers/README.md for that build). EXTRA_BUFTS=on / off forces the choice.
#
# Environment: PEERS_PY (default /work/peers-venv/bin/python), EXTRA_BUFTS (auto), EXTRA_ARGS
# (appended flags).
set -euo pipefail

GGUF=${1:?usage: run_llama_server.sh MODEL.gguf [PORT]}
PORT=${2:-8012}
PEERS_PY=${PEERS_PY:-/work/peers-venv/bin/python}
ALIAS=$(basename "$GGUF" .gguf)

EXTRA_BUFTS=${EXTRA_BUFTS:-auto}
if [ "$EXTRA_BUFTS" = auto ]; then
  EXTRA_BUFTS=on
  case "$(basename "$GGUF")" in
    *-bf16.gguf|*-f16.gguf|*-f32.gguf) ;;
    *) grep -qw amx_int8 /proc/cpuinfo && EXTRA_BUFTS=off ;;
  esac
fi
LAUNCH=()
[ "$EXTRA_BUFTS" = off ] && LAUNCH=(--no-extra-bufts) && echo "llama.cpp extra buffer types off (AMX, repack)" >&2

# shellcheck disable=SC2086  # EXTRA_ARGS is a list of flags
exec "$PEERS_PY" "$(dirname "$0")/llama_server.py" "${LAUNCH[@]}" \
  --model "$GGUF" --model_alias "$ALIAS" \
  --host 127.0.0.1 --port "$PORT" \
  --n_threads 2 --n_threads_batch 2 \
  --n_ctx 4096 --n_batch 512 \
  --interrupt_requests false \
  --logits_all false \
  --chat_template_kwargs '{"enable_thinking": false}' \
  --verbose false \
  ${EXTRA_ARGS:-}
