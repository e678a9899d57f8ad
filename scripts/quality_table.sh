#!/usr/bin/env bash
# Regenerates docs/QUALITY.md: every preset's bits per weight, perplexity, KL divergence against the unquantized
# model and top-1 agreement, for stories260K (TinyStories excerpt) and, when the demo's GGUF is cached, SmolLM2-135M
# (WikiText-2 test, ctx 512). Calibration uses the default text (the Debian reference), never the evaluation text.
#   scripts/quality_table.sh [PRESET ...]        (default: every preset)
#   QUALITY_SMOL_BYTES=N  bytes of WikiText-2 scored for SmolLM2 (default 60000; 0 = the whole file)
#   QUALITY_SKIP_SMOL=1   stories260K only
set -euo pipefail
cd "$(dirname "$0")/.."
lowbit=${LOWBIT:-build/release/lowbit}
shared=${LOWBIT_SHARED_DIR:-../shared}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
presets=("$@")
[ ${#presets[@]} -gt 0 ] || presets=(affine4 affine3 q4 q3 fivestate trellis4 trellis3 trellis2)
out=docs/QUALITY.md

# row MODEL_NAME SOURCE TEXT CTX PRESET [--tokenizer FILE]: one table row; the preset "none" is the source itself.
row() {
  local name=$1 src=$2 text=$3 ctx=$4 preset=$5
  shift 5
  local art="$work/$name-$preset" q bpw lbpw method
  if [ "$preset" = none ]; then
    art=$src
    bpw="source"; lbpw="source"; method="-"
  else
    local extra=()
    [ "$preset" = rtn-affine3 ] && extra=(--preset affine3 --no-calib) || extra=(--preset "$preset")
    q=$("$lowbit" quantize "$src" "$art" "${extra[@]}" "$@" --json 2>"$work/q.err")
    bpw=$(jq -r '.bits_per_weight | . * 1000 | round / 1000' <<<"$q")
    lbpw=$(jq -r '.linear_bits_per_weight | . * 1000 | round / 1000' <<<"$q")
    method=$(jq -r '[.tensors[] | select(.method != "dense") | .method] | group_by(.) | map("\(.[0]) \(length)") | join(", ")' <<<"$q")
  fi
  local k
  k=$("$lowbit" eval kld "$src" "$art" --text "$text" --ctx "$ctx" --json "$@" 2>/dev/null)
  printf '| %s | %s | %s | %s | %s | %.4f | %.5f ± %.5f | %.4f | %.2f%% |\n' "$name" "$preset" "$bpw" "$lbpw" "$method" \
    "$(jq -r .ppl_other <<<"$k")" "$(jq -r .kld_mean <<<"$k")" "$(jq -r .kld_stderr <<<"$k")" \
    "$(jq -r .kld_p99 <<<"$k")" "$(jq -r '.top1_agreement * 100' <<<"$k")"
  echo "[quality] $name $preset done" >&2
}

table() {
  echo "| model | preset | bits/weight (all) | bits/weight (linears) | rounding (tensors) | PPL | KLD mean | KLD p99 | top-1 |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
  local s=$shared/models/stories260K
  if [ -f "$s/stories260K.bin" ]; then
    local t=$shared/data/tinystories-valid-excerpt.txt
    row stories260K "$s/stories260K.bin" "$t" 256 none --tokenizer "$s/tok512.bin"
    row stories260K "$s/stories260K.bin" "$t" 256 rtn-affine3 --tokenizer "$s/tok512.bin"
    for p in "${presets[@]}"; do row stories260K "$s/stories260K.bin" "$t" 256 "$p" --tokenizer "$s/tok512.bin"; done
  fi
  local g=.cache/lowbit/SmolLM2-135M-Instruct.Q4_1.gguf
  if [ -f "$g" ] && [ -z "${QUALITY_SKIP_SMOL:-}" ]; then
    local wiki=$shared/data/wikitext-2-raw/wiki.test.raw bytes=${QUALITY_SMOL_BYTES:-60000}
    if [ "$bytes" != 0 ]; then head -c "$bytes" "$wiki" > "$work/wiki.txt"; wiki=$work/wiki.txt; fi
    row SmolLM2-135M "$g" "$wiki" 512 rtn-affine3
    for p in "${presets[@]}"; do row SmolLM2-135M "$g" "$wiki" 512 "$p"; done
  fi
}

command -v jq >/dev/null || { echo "quality_table.sh needs jq (apt-get install jq)" >&2; exit 2; }
rows=$(table)
{
  cat <<HEAD
# Quality

Measured by \`scripts/quality_table.sh\` ($(date -u +%Y-%m-%d), $(lscpu | sed -n 's/^Model name: *//p' | head -1),
lowbit $("$lowbit" --version | awk '{print $2}')). KL divergence, perplexity and top-1 agreement follow llama.cpp's method
(\`lowbit eval kld\`: non-overlapping windows, BOS first, second half of each window scored) against the unquantized
source. Calibration (GPTQ for affine / offset-scale, BlockLDLQ for trellis) uses ../shared's Debian reference text,
never the evaluation text; \`rtn-affine3\` is affine3 with plain rounding (\`--no-calib\`), for comparison.

- stories260K: ../shared/data/tinystories-valid-excerpt.txt, ctx 256.
- SmolLM2-135M-Instruct: the demo's Q4_1 GGUF (dequantized) is the source, so quality is bounded by it; WikiText-2
  test, ctx 512, the first ${QUALITY_SMOL_BYTES:-60000} bytes (0 = all).

$rows
HEAD
} > "$out"
echo "wrote $out" >&2
