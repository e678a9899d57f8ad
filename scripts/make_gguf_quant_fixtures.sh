#!/usr/bin/env bash
# Regenerates tests/model/fixtures/gguf_quant/: the llama family fixture (tests/model/fixtures/families/llama/
# model.gguf, BF16, without its rope_freqs tensor: these fixtures test the weights, not RoPE scaling) quantized by
# llama.cpp's own llama-quantize to each 32-block type, IQ4_NL included (--pure: every matrix,
# token_embd and output included, in that type), and llama.cpp's logits for a fixed token sequence on each
# (llamacpp_logits.py), which tests/model/gguf_model_test.cpp compares lowbit's packed load against.
#   Environment: LLAMACPP_BIN (a llama.cpp build with llama-quantize and shared libraries; default
#   /work/refs/llama.cpp-build/bin, built from the llama-cpp-python 0.3.36 sdist), LLAMACPP_SRC (that sdist's
#   root; default /work/refs/src/llama_cpp_python-0.3.36), PYTHON (one with numpy; default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${LLAMACPP_BIN:-/work/refs/llama.cpp-build/bin}
src=${LLAMACPP_SRC:-/work/refs/src/llama_cpp_python-0.3.36}
python=${PYTHON:-python3}
in=tests/model/fixtures/families/llama/model.gguf
out=tests/model/fixtures/gguf_quant
types="Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 IQ4_NL"
tokens="1,17,42,99,3,64,7,120"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export PYTHONPATH=$src:$src/vendor/llama.cpp/gguf-py
"$python" scripts/gguf_drop_tensor.py "$in" "$tmp/source.gguf" rope_freqs.weight
mkdir -p "$out"
specs=()
for t in $types; do
  "$bin/llama-quantize" --pure "$tmp/source.gguf" "$out/model.$t.gguf.part" "$t" 1 >/dev/null 2>&1
  mv "$out/model.$t.gguf.part" "$out/model.$t.gguf"
  specs+=("$t=$out/model.$t.gguf")
done
LLAMA_CPP_LIB_PATH=$bin "$python" scripts/llamacpp_logits.py "$out/llamacpp_logits.json.part" "$tokens" "${specs[@]}"
mv "$out/llamacpp_logits.json.part" "$out/llamacpp_logits.json"
ls -l "$out"
