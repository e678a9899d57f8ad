#!/usr/bin/env bash
# Regenerates tests/model/fixtures/gguf_quant/: the llama family fixture (tests/model/fixtures/families/llama/
# model.gguf, BF16, without its rope_freqs tensor: these fixtures test the weights, not RoPE scaling) quantized by
# llama.cpp's own llama-quantize to each 32-block type, IQ4_NL included (--pure: every matrix,
# token_embd and output included, in that type), and llama.cpp's logits for a fixed token sequence on each
# (llamacpp_logits.py), which tests/model/gguf_model_test.cpp compares lowbit's packed load against.
# Then tests/model/fixtures/gguf_quant/wide/: a random llama whose matrix rows are 256 wide (gguf_random_llama.py;
# K-quants and IQ types need super-blocks of 256) quantized by llama-quantize with its mixed recipes (not --pure)
# to Q4_K_M and Q2_K (no imatrix, as most published files of those recipes; Q2_K's mixes Q2_K, Q3_K, Q4_K and
# Q6_K matrices) and, with an importance matrix from llama-imatrix on a seeded random text, IQ1_S, IQ1_M, IQ2_XS,
# IQ3_XXS and IQ4_XS. Together they hold every IQ type (IQ2_XXS comes in IQ1_S's attn_output, IQ2_S and IQ3_S in
# IQ3_XXS's) and Q2_K, Q3_K, Q4_K, Q5_K, Q6_K; the IQ2_XXS, IQ2_S and IQ3_S recipes would add no type. With the SHA-256 of ggml's own dequantization of each tensor (ggml_dequant.json,
# ggml_dequantize.py), llama.cpp's logits on each file (llamacpp_logits.json) and on its f32 copy holding those
# dequantized values (llamacpp_logits_f32.json: the same weights without llama.cpp's 8-bit activation rounding).
# Last tests/model/fixtures/gguf_quant/moe/: the qwen3_moe family fixture with its merged gate/up expert tensors in
# Q4_1 (gguf_quantize_tensors.py, gguf-py's quantizer: llama-quantize's recipes keep a tiny model's experts wide).
#   Environment: LLAMACPP_BIN (a llama.cpp build with llama-quantize, llama-imatrix and shared libraries; default
#   /work/refs/llama.cpp-build/bin, built from the llama-cpp-python 0.3.36 sdist), LLAMACPP_SRC (that sdist's
#   root; default /work/refs/src/llama_cpp_python-0.3.36), PYTHON (one with numpy and diskcache, which llama_cpp
#   imports; default python3). The wide fixtures were made 2026-12-05 with a build by
#     cmake -S $LLAMACPP_SRC/vendor/llama.cpp -B /work/refs/llama.cpp-build -G Ninja -DCMAKE_BUILD_TYPE=Release \
#       -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF
#     ninja -C /work/refs/llama.cpp-build llama-quantize llama-imatrix llama-perplexity
#   (GGML_NATIVE, on an AVX-512 machine); Q2_K was added 2026-12-06 with a rebuild of the same sdist (GGML_NATIVE,
#   AVX-512), which reproduced the committed Q4_K_M file, digests and both logit sets exactly, so only Q2_K's file
#   and entries were written. The quantized files and digests do not depend on the CPU; llama.cpp's
#   logits do, a little: that build's Q4_1 logits of the 32-block fixtures differ from the committed ones by up to
#   0.07 (its other types' not at all): after regenerating with another build, re-check the tests' measured margins.
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

wide=$out/wide
wide_types="Q4_K_M Q2_K IQ1_S IQ1_M IQ2_XS IQ3_XXS IQ4_XS"
"$python" scripts/gguf_random_llama.py "$tmp/wide.gguf"
"$python" -c "
import random
r = random.Random(22)
words = [''.join(r.choice('abcdefghijklmnopqrstuvwxyz') for _ in range(r.randint(1, 7))) for _ in range(400)]
print(' '.join(r.choice(words) for _ in range(6000)))" >"$tmp/imatrix.txt"
# Run where the imatrix lies, named relatively: llama-quantize records the imatrix's and its text's paths in the
# file's metadata, and a temporary directory's name would make every regeneration differ.
repo=$(pwd)
(cd "$tmp" && "$bin/llama-imatrix" -m wide.gguf -f imatrix.txt -o imatrix.gguf -c 128 -t 1 >/dev/null 2>&1)
mkdir -p "$wide"
specs=()
for t in $wide_types; do
  imatrix=(--imatrix imatrix.gguf)
  case $t in Q4_K_M | Q2_K) imatrix=() ;; esac
  (cd "$tmp" && "$bin/llama-quantize" "${imatrix[@]}" wide.gguf "$repo/$wide/model.$t.gguf.part" "$t" 1 >/dev/null 2>&1)
  mv "$wide/model.$t.gguf.part" "$wide/model.$t.gguf"
  specs+=("$t=$wide/model.$t.gguf")
done
mkdir -p "$tmp/f32"
LLAMA_CPP_LIB_PATH=$bin "$python" scripts/ggml_dequantize.py "$wide/ggml_dequant.json.part" "$tmp/f32" "${specs[@]}"
mv "$wide/ggml_dequant.json.part" "$wide/ggml_dequant.json"
f32_specs=()
for t in $wide_types; do f32_specs+=("$t=$tmp/f32/$t.gguf"); done
LLAMA_CPP_LIB_PATH=$bin "$python" scripts/llamacpp_logits.py "$wide/llamacpp_logits.json.part" "$tokens" "${specs[@]}"
mv "$wide/llamacpp_logits.json.part" "$wide/llamacpp_logits.json"
LLAMA_CPP_LIB_PATH=$bin "$python" scripts/llamacpp_logits.py "$wide/llamacpp_logits_f32.json.part" "$tokens" "${f32_specs[@]}"
mv "$wide/llamacpp_logits_f32.json.part" "$wide/llamacpp_logits_f32.json"
ls -l "$wide"
moe=$out/moe
mkdir -p "$moe"
"$python" scripts/gguf_quantize_tensors.py tests/model/fixtures/families/qwen3_moe/model.gguf \
  "$moe/qwen3_moe.Q4_1_experts.gguf" Q4_1 'blk\.[0-9]+\.ffn_(gate|up)_exps\.weight'
