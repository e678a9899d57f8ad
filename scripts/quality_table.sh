#!/usr/bin/env bash
# Regenerates docs/QUALITY.md: every preset's bits per weight, perplexity, KL divergence against the unquantized
# model, top-1 agreement, and the quantize command's wall time, CPU time and peak RSS, for stories260K
# (TinyStories excerpt) and, when the demo's GGUF is cached, SmolLM2-135M (WikiText-2 test, ctx 512).
# Calibration uses the default text (the Debian reference), never the evaluation text. Each affine width also
# gets a row with plain rounding (`rtn-affineN`, --no-calib) to compare GPTQ with.
#   scripts/quality_table.sh [PRESET ...]        (default: every preset, plus affine2)
#   QUALITY_SMOL_BYTES=N  bytes of WikiText-2 scored for SmolLM2 (default 12000; 0 = the whole file)
#   QUALITY_SMOL_PRESETS="P ..."  SmolLM2's presets when they differ from stories260K's
#   QUALITY_SKIP_SMOL=1   stories260K only;  QUALITY_SKIP_STORIES=1  SmolLM2 only
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
lowbit=${LOWBIT:-build/release/lowbit}
shared=${LOWBIT_SHARED_DIR:-../shared}
smol_bytes=${QUALITY_SMOL_BYTES:-12000}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
presets=("$@")
[ ${#presets[@]} -gt 0 ] || presets=(affine4 affine3 affine2 q4 q3 fivestate trellis4 trellis3 trellis2)
out=docs/QUALITY.md

# affine2 is no built-in preset: affine3's recipe with 2-bit linears.
cat > "$work/affine2.json" <<'JSON'
{"name": "affine2",
 "rules": [{"match": "*embed_tokens.weight", "codec": "affine", "params": {"bits": 4, "group_size": 64, "scale_dtype": "bf16"}},
           {"match": "lm_head.weight", "codec": "affine", "params": {"bits": 4, "group_size": 64, "scale_dtype": "bf16"}}],
 "default": {"codec": "affine", "params": {"bits": 2, "group_size": 64, "scale_dtype": "bf16"}}}
JSON

# row MODEL_NAME SOURCE TEXT CTX PRESET [--tokenizer FILE]: one table row. `rtn-P` is P with plain rounding.
# Leaves the source's perplexity in $work/ppl-MODEL_NAME for the reference row.
row() {
  local name=$1 src=$2 text=$3 ctx=$4 preset=$5
  shift 5
  local art="$work/$name-$preset" base=${preset#rtn-} extra=()
  [ "$base" = affine2 ] && extra=(--recipe "$work/affine2.json") || extra=(--preset "$base")
  [ "$preset" != "$base" ] && extra+=(--no-calib)
  local q
  q=$(/usr/bin/time -f '%e %U %S %M' -o "$work/time" "$lowbit" quantize "$src" "$art" "${extra[@]}" "$@" --json \
      2>"$work/q.err") || { cat "$work/q.err" >&2; return 1; }
  local wall cpu rss
  read -r wall cpu rss < <(awk '{printf "%.1f %.1f %.0f\n", $1, $2 + $3, $4 / 1024}' "$work/time")
  local bpw lbpw method
  bpw=$(jq -r '.bits_per_weight | . * 1000 | round / 1000' <<<"$q")
  lbpw=$(jq -r '.linear_bits_per_weight | . * 1000 | round / 1000' <<<"$q")
  method=$(jq -r '[.tensors[] | select(.method != "dense") | .method] | group_by(.) | map("\(.[0]) \(length)") | join(", ")' <<<"$q")
  local k
  k=$("$lowbit" eval kld "$src" "$art" --text "$text" --ctx "$ctx" --json "$@" 2>/dev/null)
  jq -r .ppl_base <<<"$k" > "$work/ppl-$name"
  printf '| %s | %s | %s | %s | %s | %.4f | %.5f ± %.5f | %.4f | %.2f%% | %s | %s | %s |\n' "$name" "$preset" "$bpw" \
    "$lbpw" "$method" "$(jq -r .ppl_other <<<"$k")" "$(jq -r .kld_mean <<<"$k")" "$(jq -r .kld_stderr <<<"$k")" \
    "$(jq -r .kld_p99 <<<"$k")" "$(jq -r '.top1_agreement * 100' <<<"$k")" "$wall" "$cpu" "$rss"
  echo "[quality] $name $preset done (${wall} s wall, ${cpu} s CPU, ${rss} MiB)" >&2
  rm -rf "$art"
}

# model_rows MODEL_NAME SOURCE TEXT CTX [--tokenizer FILE]: the source's row, then plain rounding next to GPTQ
# for each affine width asked for, then the other presets.
model_rows() {
  local name=$1 src=$2 text=$3 ctx=$4
  shift 4
  local body="" p
  for p in "${presets[@]}"; do
    case $p in affine*) body+=$(row "$name" "$src" "$text" "$ctx" "rtn-$p" "$@")$'\n' ;; esac
    body+=$(row "$name" "$src" "$text" "$ctx" "$p" "$@")$'\n'
  done
  printf '| %s | none (source) | source | source | - | %.4f | 0 | 0 | 100.00%% | - | - | - |\n' "$name" \
    "$(cat "$work/ppl-$name")"
  printf '%s' "$body"
}

table() {
  echo "| model | preset | bits/weight (all) | bits/weight (linears) | rounding (tensors) | PPL | KLD mean | KLD p99 | top-1 | quantize wall s | quantize CPU s | peak RSS MiB |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
  local s=$shared/models/stories260K
  if [ -f "$s/stories260K.bin" ] && [ -z "${QUALITY_SKIP_STORIES:-}" ]; then
    model_rows stories260K "$s/stories260K.bin" "$shared/data/tinystories-valid-excerpt.txt" 256 \
      --tokenizer "$s/tok512.bin"
  fi
  local g=.cache/lowbit/SmolLM2-135M-Instruct.Q4_1.gguf
  if [ -f "$g" ] && [ -z "${QUALITY_SKIP_SMOL:-}" ]; then
    local wiki=$shared/data/wikitext-2-raw/wiki.test.raw
    if [ "$smol_bytes" != 0 ]; then head -c "$smol_bytes" "$wiki" > "$work/wiki.txt"; wiki=$work/wiki.txt; fi
    [ -z "${QUALITY_SMOL_PRESETS:-}" ] || read -r -a presets <<<"$QUALITY_SMOL_PRESETS"
    model_rows SmolLM2-135M "$g" "$wiki" 512
  fi
}

command -v jq >/dev/null || { echo "quality_table.sh needs jq (apt-get install jq)" >&2; exit 2; }
[ -x /usr/bin/time ] || { echo "quality_table.sh needs /usr/bin/time (apt-get install time)" >&2; exit 2; }
rows=$(table)
{
  cat <<HEAD
# Quality

Measured by \`scripts/quality_table.sh\` ($(date -u +%Y-%m-%d), $(lscpu | sed -n 's/^Model name: *//p' | head -1),
$(nproc) cores, lowbit $("$lowbit" --version | awk '{print $2}')). KL divergence, perplexity and top-1 agreement follow
llama.cpp's method (\`lowbit eval kld\`: non-overlapping windows, BOS first, second half of each window scored)
against the unquantized source. Calibration (GPTQ for affine / offset-scale / two-plane, BlockLDLQ for trellis)
uses ../shared's Debian reference text, never the evaluation text; \`rtn-P\` is preset P with plain rounding
(\`--no-calib\`), for comparison. \`affine2\` is affine3's recipe with 2-bit linears (no built-in preset). Quantize
times are the whole command (load, calibration, rounding, write): wall seconds, user + system CPU seconds, and
peak RSS (\`/usr/bin/time\`).

- stories260K: ../shared/data/tinystories-valid-excerpt.txt, ctx 256.
- SmolLM2-135M-Instruct: no full-precision SmolLM2 is available here, so the source is the demo's Q4_1 GGUF
  (\`scripts/demo_model.sh\`, SHA-pinned), and the reference for KLD is that GGUF dequantized: quality is bounded
  by it. WikiText-2 test (raw), ctx 512, the first ${smol_bytes} bytes (0 = all).

$rows
HEAD
} > "$out"
echo "wrote $out" >&2
