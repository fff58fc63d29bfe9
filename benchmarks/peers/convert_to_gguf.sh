#!/usr/bin/env bash
# Convert a Hugging Face checkpoint to GGUF for llama.cpp: BF16, Q8_0 and Q4_0 by default.
#
#   benchmarks/peers/convert_to_gguf.sh [MODEL_DIR] [OUT_DIR] [TYPE ...]
#   benchmarks/peers/convert_to_gguf.sh models/qwen3-0.6b-random models/qwen3-0.6b-random-gguf bf16 q8_0 q4_0
#
# Writes OUT_DIR/<name>-<type>.gguf (name = MODEL_DIR's folder name).
#
# Tools, and why:
# - convert_hf_to_gguf.py comes from llama-cpp-python's *source distribution* (vendor/llama.cpp/),
#   the same llama.cpp that the llama-cpp-python build runs, so the GGUF matches the reader.
#   It is fetched once with `pip download --no-binary :all: --no-deps llama-cpp-python==VERSION`
#   and unpacked under $WORK.
# - The converter imports torch, transformers, numpy, safetensors and pyyaml: the project venv
#   has them (CONVERT_PY). It uses the gguf-py copy next to it (no `gguf` package needed). It also
#   imports sentencepiece before it notices that Qwen3 has no tokenizer.model, so sentencepiece
#   is installed into $WORK/convert-deps (pip --target) and put on PYTHONPATH: the project venv
#   itself is not changed.
# - The converter writes f32, f16, bf16, q8_0, tq1_0 and tq2_0 itself (--outtype). Other types
#   (q4_0, q4_k_m, ...) are quantized from the BF16 file with llama.cpp's llama_model_quantize,
#   through llama-cpp-python (PEERS_PY, see quantize_gguf.py).
#
# Environment (defaults):
#   LLAMA_CPP_VERSION  the llama-cpp-python in $PEERS_PY, else 0.3.36
#   PEERS_PY           /work/peers-venv/bin/python   (llama-cpp-python installed)
#   CONVERT_PY         .venv/bin/python              (torch + transformers)
#   WORK               models/peers-tools     (sdist and sentencepiece)
set -euo pipefail
cd "$(dirname "$0")/../.."

MODEL=${1:-models/qwen3-0.6b-random}
OUT=${2:-${MODEL%/}-gguf}
shift $(( $# < 2 ? $# : 2 ))
TYPES=("$@")
[ ${#TYPES[@]} -gt 0 ] || TYPES=(bf16 q8_0 q4_0)

PEERS_PY=${PEERS_PY:-/work/peers-venv/bin/python}
CONVERT_PY=${CONVERT_PY:-.venv/bin/python}
WORK=${WORK:-models/peers-tools}
if [ -z "${LLAMA_CPP_VERSION:-}" ]; then
  LLAMA_CPP_VERSION=$("$PEERS_PY" -c 'import llama_cpp; print(llama_cpp.__version__)' 2>/dev/null || echo 0.3.36)
fi
NAME=$(basename "${MODEL%/}")
mkdir -p "$WORK" "$OUT"

SRC="$WORK/llama_cpp_python-$LLAMA_CPP_VERSION"
if [ ! -f "$SRC/vendor/llama.cpp/convert_hf_to_gguf.py" ]; then
  echo "fetching the llama-cpp-python $LLAMA_CPP_VERSION sdist for its convert_hf_to_gguf.py"
  "$CONVERT_PY" -m pip download --quiet --no-binary :all: --no-deps \
    "llama-cpp-python==$LLAMA_CPP_VERSION" -d "$WORK"
  tar -xzf "$WORK"/llama_cpp_python-"$LLAMA_CPP_VERSION".tar.gz -C "$WORK"
fi
CONVERT="$SRC/vendor/llama.cpp/convert_hf_to_gguf.py"
if ! PYTHONPATH="$WORK/convert-deps" "$CONVERT_PY" -c 'import sentencepiece' 2>/dev/null; then
  "$CONVERT_PY" -m pip install --quiet --target "$WORK/convert-deps" sentencepiece
fi

convert() {  # $1: an --outtype of convert_hf_to_gguf.py
  PYTHONPATH="$WORK/convert-deps" "$CONVERT_PY" "$CONVERT" "$MODEL" --outtype "$1" \
    --outfile "$OUT/$NAME-$1.gguf"
}

for type in "${TYPES[@]}"; do
  dst="$OUT/$NAME-$type.gguf"
  if [ -f "$dst" ]; then echo "exists: $dst"; continue; fi
  case "$type" in
    f32|f16|bf16|q8_0|tq1_0|tq2_0) convert "$type" ;;
    *)
      [ -f "$OUT/$NAME-bf16.gguf" ] || convert bf16
      "$PEERS_PY" benchmarks/peers/quantize_gguf.py "$OUT/$NAME-bf16.gguf" "$dst" "$type" --threads 2 ;;
  esac
  echo "wrote $dst ($(du -h "$dst" | cut -f1))"
done
