#!/usr/bin/env bash
# Regenerates docs/QUALITY.md: every preset's bits per weight, perplexity, KL divergence against the unquantized
# model, top-1 agreement, and the quantize command's wall time, CPU time and peak RSS, for stories260K
# (TinyStories excerpt) and, when the demo's GGUF is cached, SmolLM2-135M (WikiText-2 test, ctx 512), and when
# scripts/gemma3_model.sh's GGUF is cached, Gemma-3-270M (the same text).
# Calibration uses the default text (the Debian reference), never the evaluation text. Affine and offset-scale
# presets (and fivestate) also get a row with plain rounding (`rtn-P`, --no-calib) to compare GPTQ with.
#
# Every row is cached as one JSON file, RESULTS/MODEL/PRESET/KEY.json, where KEY hashes what fixes the numbers:
# the lowbit binary (SHA-256), affine2's recipe, the source model file, the evaluation text and the context. A row whose key is
# already there is not computed again, so rows can be computed separately (different presets, different people,
# different binaries) and the table is assembled from every cached row whose evaluation settings match: per model
# and preset the newest one, with the commit and load average it was measured at.
#   scripts/quality_table.sh [PRESET ...]   compute the missing rows for these presets (default: all), then write
#                                          the table from every cached row
#   QUALITY_ASSEMBLE_ONLY=1   compute nothing, only write the table from the cached rows
#   QUALITY_FORCE=1           recompute rows even when this key has them
#   QUALITY_RESULTS=DIR       the row cache (default .cache/lowbit/quality)
#   QUALITY_OUT=FILE          where the table goes (default docs/QUALITY.md; "-" = no table, only the rows)
#   QUALITY_COMMIT=C          the commit LOWBIT was built from, for the rows' labels (default: HEAD)
#   QUALITY_SMOL_BYTES=N      bytes of WikiText-2 scored for SmolLM2 (default 12000; 0 = the whole file)
#   QUALITY_SMOL_PRESETS="P ..."  SmolLM2's presets when they differ from stories260K's
#   QUALITY_GEMMA_PRESETS="P ..." Gemma-3-270M's presets (default: affine4 trellis3)
#   QUALITY_SKIP_SMOL=1   no SmolLM2;  QUALITY_SKIP_STORIES=1  no stories260K;  QUALITY_SKIP_GEMMA=1  no Gemma
# The text after the table in docs/QUALITY.md (from the line "## Notes" on) is kept.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
lowbit=${LOWBIT:-build/release/lowbit}
shared=${LOWBIT_SHARED_DIR:-../shared}
smol_bytes=${QUALITY_SMOL_BYTES:-12000}
results=${QUALITY_RESULTS:-.cache/lowbit/quality}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
all_presets=(affine4 affine3 affine2 q4 q3 fivestate trellis4 trellis3 trellis2)
presets=("$@")
[ ${#presets[@]} -gt 0 ] || presets=("${all_presets[@]}")
out=${QUALITY_OUT:-docs/QUALITY.md}

# affine2 is no built-in preset: affine3's recipe with 2-bit linears.
cat > "$work/affine2.json" <<'JSON'
{"name": "affine2",
 "rules": [{"match": "*embed_tokens.weight", "codec": "affine", "params": {"bits": 4, "group_size": 64, "scale_dtype": "bf16"}},
           {"match": "lm_head.weight", "codec": "affine", "params": {"bits": 4, "group_size": 64, "scale_dtype": "bf16"}}],
 "default": {"codec": "affine", "params": {"bits": 2, "group_size": 64, "scale_dtype": "bf16"}}}
JSON

# Presets whose GPTQ row gets a plain-rounding row beside it.
has_rtn_row() { case $1 in affine* | q* | fivestate) return 0 ;; esac; return 1; }

sha() { sha256sum "$1" | cut -c1-64; }

# What the rows of one model share: name, source, evaluation text and context, the extra arguments
# (--tokenizer FILE), and the evaluation identity that cached rows must match.
declare -A model_src model_text model_ctx model_args model_eval
add_model() {
  local name=$1 src=$2 text=$3 ctx=$4
  shift 4
  model_src[$name]=$src model_text[$name]=$text model_ctx[$name]=$ctx model_args[$name]="$*"
  model_eval[$name]=$(jq -cn --arg src "$(sha "$src")" --arg text "$(sha "$text")" --argjson bytes "$(stat -c %s "$text")" \
    --argjson ctx "$ctx" '{source_sha256: $src, text_sha256: $text, text_bytes: $bytes, ctx: $ctx}')
}

# compute_row MODEL PRESET: quantizes and evaluates one row and stores its JSON in the cache (atomically), unless
# the cache already holds this key. `rtn-P` is P with plain rounding.
compute_row() {
  local name=$1 preset=$2 src=${model_src[$1]} text=${model_text[$1]} ctx=${model_ctx[$1]}
  local -a margs
  read -r -a margs <<<"${model_args[$1]}"
  local key
  key=$(printf '%s %s %s\n' "$binary_sha" "$(sha "$work/affine2.json")" "${model_eval[$name]}" | sha256sum | cut -c1-16)
  local dest=$results/$name/$preset/$key.json
  if [ -f "$dest" ] && [ -z "${QUALITY_FORCE:-}" ]; then
    echo "[quality] $name $preset: cached ($dest)" >&2
    return
  fi
  local art="$work/$name-$preset" base=${preset#rtn-} extra=()
  [ "$base" = affine2 ] && extra=(--recipe "$work/affine2.json") || extra=(--preset "$base")
  [ "$preset" != "$base" ] && extra+=(--no-calib)
  # SmolLM2's only PyPI build is a Q4_1 GGUF, which quantize refuses without the flag.
  [[ "$src" != *.gguf ]] || extra+=(--allow-requantize)
  local load_start started k
  load_start=$(cut -d' ' -f1 /proc/loadavg)
  started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  # The report goes through a file: with an allocation it is larger than one command-line argument may be.
  /usr/bin/time -f '%e %U %S %M' -o "$work/time" nice -n 10 "$lowbit" quantize "$src" "$art" "${extra[@]}" \
    "${margs[@]}" --json >"$work/q.json" 2>"$work/q.err" || { cat "$work/q.err" >&2; return 1; }
  k=$(nice -n 10 "$lowbit" eval kld "$src" "$art" --text "$text" --ctx "$ctx" --json "${margs[@]}" 2>"$work/k.err") ||
    { cat "$work/k.err" >&2; return 1; }
  mkdir -p "$(dirname "$dest")"
  jq -n --arg model "$name" --arg preset "$preset" --arg key "$key" --arg binary "$lowbit" \
    --arg binary_sha256 "$binary_sha" --arg commit "$commit" --arg started "$started" \
    --arg finished "$(date -u +%Y-%m-%dT%H:%M:%SZ)" --arg load_start "$load_start" \
    --arg load_end "$(cut -d' ' -f1 /proc/loadavg)" --argjson eval "${model_eval[$name]}" \
    --arg quantize_args "${extra[*]} ${margs[*]}" --slurpfile qs "$work/q.json" --argjson k "$k" \
    --rawfile time "$work/time" '
    ($time | split(" ") | map(tonumber)) as $t | $qs[0] as $q |
    {model: $model, preset: $preset, key: $key, binary: $binary, binary_sha256: $binary_sha256, commit: $commit,
     started: $started, finished: $finished, load_average: [($load_start | tonumber), ($load_end | tonumber)],
     eval: $eval, quantize_args: $quantize_args,
     quantize: {wall_seconds: $t[0], cpu_seconds: ($t[1] + $t[2]), peak_rss_mib: ($t[3] / 1024),
                bits_per_weight: $q.bits_per_weight, linear_bits_per_weight: $q.linear_bits_per_weight,
                artifact_bytes: $q.artifact_bytes,
                methods: ([$q.tensors[] | select(.method != "dense") | .method] | group_by(.)
                          | map("\(.[0]) \(length)") | join(", ")),
                guard_trips: ([$q.tensors[] | select(.guard_tripped)] | length)},
     kld: $k}' > "$dest.part"
  mv "$dest.part" "$dest"
  echo "[quality] $name $preset done: $(jq -r '"KLD \(.kld.kld_mean), \(.quantize.wall_seconds) s wall, \(.quantize.cpu_seconds) s CPU"' "$dest")" >&2
  rm -rf "$art"
}

# The row order of the table: each preset of the default list (and any other asked for), its rtn row first.
row_order() {
  local p seen=" "
  for p in "${all_presets[@]}" "$@"; do
    case $seen in *" $p "*) continue ;; esac
    seen+="$p "
    has_rtn_row "$p" && echo "rtn-$p"
    echo "$p"
  done
}

# model_table MODEL: the source's row, then per preset the newest cached row whose evaluation settings match.
model_table() {
  local name=$1 p f newest ppl_base=""
  local -a files=()
  while read -r p; do
    newest=""
    for f in "$results/$name/$p"/*.json; do
      [ -f "$f" ] || continue
      jq -e --argjson eval "${model_eval[$name]}" '.eval == $eval' "$f" >/dev/null || continue
      if [ -z "$newest" ] || [[ $(jq -r .finished "$f") > $(jq -r .finished "$newest") ]]; then newest=$f; fi
    done
    [ -n "$newest" ] || continue
    files+=("$newest")
    ppl_base=$(jq -r .kld.ppl_base "$newest")
  done < <(row_order "${presets[@]}")
  [ ${#files[@]} -gt 0 ] || return 0
  printf '| %s | none (source) | source | source | - | %.4f | 0 | 0 | 100.00%% | - | - | - | - |\n' "$name" "$ppl_base"
  for f in "${files[@]}"; do
    jq -r '"| \(.model) | \(.preset) | \(.quantize.bits_per_weight * 1000 | round / 1000) | " +
      "\(.quantize.linear_bits_per_weight * 1000 | round / 1000) | \(.quantize.methods) | " +
      "\(.kld.ppl_other * 10000 | round / 10000) | \(.kld.kld_mean * 100000 | round / 100000) ± " +
      "\(.kld.kld_stderr * 100000 | round / 100000) | \(.kld.kld_p99 * 10000 | round / 10000) | " +
      "\(.kld.top1_agreement * 10000 | round / 100)% | \(.quantize.wall_seconds) | " +
      "\(.quantize.cpu_seconds * 10 | round / 10) | \(.quantize.peak_rss_mib | round) | " +
      "\(.started[0:16] | sub("T"; " ")) \(.commit), load \(.load_average[0])-\(.load_average[1]) |"' "$f"
  done
}

command -v jq >/dev/null || { echo "quality_table.sh needs jq (apt-get install jq)" >&2; exit 2; }
[ -x /usr/bin/time ] || { echo "quality_table.sh needs /usr/bin/time (apt-get install time)" >&2; exit 2; }
[ -x "$lowbit" ] || { echo "quality_table.sh: no lowbit binary at $lowbit (set LOWBIT)" >&2; exit 2; }
binary_sha=$(sha "$lowbit")
# The commit the binary was built from: QUALITY_COMMIT when given (a binary copied aside while the tree moves on),
# else HEAD, "+" when src/, include/ or the build files have local changes.
commit=${QUALITY_COMMIT:-$(git rev-parse --short HEAD)}
[ -n "${QUALITY_COMMIT:-}" ] || [ -z "$(git status --porcelain -- src include CMakeLists.txt cmake)" ] || commit+="+"

s=$shared/models/stories260K
models=()
if [ -f "$s/stories260K.bin" ] && [ -z "${QUALITY_SKIP_STORIES:-}" ]; then
  add_model stories260K "$s/stories260K.bin" "$shared/data/tinystories-valid-excerpt.txt" 256 --tokenizer "$s/tok512.bin"
  models+=(stories260K)
fi
wiki=$shared/data/wikitext-2-raw/wiki.test.raw
if [ "$smol_bytes" != 0 ] && [ -f "$wiki" ]; then head -c "$smol_bytes" "$wiki" > "$work/wiki.txt"; wiki=$work/wiki.txt; fi
g=.cache/lowbit/SmolLM2-135M-Instruct.Q4_1.gguf
if [ -f "$g" ] && [ -z "${QUALITY_SKIP_SMOL:-}" ]; then
  add_model SmolLM2-135M "$g" "$wiki" 512
  models+=(SmolLM2-135M)
fi
g=.cache/lowbit/gemma-3-270m-q4_k_m.gguf
if [ -f "$g" ] && [ -z "${QUALITY_SKIP_GEMMA:-}" ]; then
  add_model Gemma-3-270M "$g" "$wiki" 512
  models+=(Gemma-3-270M)
fi

if [ -z "${QUALITY_ASSEMBLE_ONLY:-}" ]; then
  for m in "${models[@]}"; do
    model_presets=("${presets[@]}")
    [ "$m" != SmolLM2-135M ] || [ -z "${QUALITY_SMOL_PRESETS:-}" ] || read -r -a model_presets <<<"$QUALITY_SMOL_PRESETS"
    [ "$m" != Gemma-3-270M ] || read -r -a model_presets <<<"${QUALITY_GEMMA_PRESETS:-affine4 trellis3}"
    for p in "${model_presets[@]}"; do
      has_rtn_row "$p" && compute_row "$m" "rtn-$p"
      compute_row "$m" "$p"
    done
  done
fi

[ "$out" != - ] || exit 0
table_rows=""
for m in "${models[@]}"; do
  r=$(model_table "$m")
  [ -z "$r" ] || table_rows+=$r$'\n'
done
notes=""
[ ! -f "$out" ] || notes=$(sed -n '/^## Notes/,$p' "$out")
{
  cat <<HEAD
# Quality

Written by \`scripts/quality_table.sh\` ($(date -u +%Y-%m-%d), $(lscpu | sed -n 's/^Model name: *//p' | head -1),
$(nproc) cores) from its cached rows: each row's last column says when, at which commit (\`+\`: with local
changes) and at which load average (1-minute, at the start and end of the row) it was measured. KL divergence,
perplexity and top-1 agreement follow llama.cpp's method (\`lowbit eval kld\`: non-overlapping windows, BOS first,
second half of each window scored) against the unquantized source, and do not depend on the load. Calibration
(GPTQ for affine / offset-scale / two-plane, BlockLDLQ for trellis) uses quantize's default text, Debian's reference
manual (debian-reference-en; the same bytes as ../shared's copy the older rows used), never
the evaluation text; \`rtn-P\` is preset P with plain rounding (\`--no-calib\`), for comparison. \`affine2\` is
affine3's recipe with 2-bit linears (no built-in preset). Quantize times are the whole command (load,
calibration, rounding, write): wall seconds, user + system CPU seconds, and peak RSS (\`/usr/bin/time\`); on the
shared 2-core machine they are inflated by the load.

- stories260K: ../shared/data/tinystories-valid-excerpt.txt, ctx 256.
- SmolLM2-135M-Instruct: no full-precision SmolLM2 is available here, so the source is the demo's Q4_1 GGUF
  (\`scripts/demo_model.sh\`, SHA-pinned), and the reference for KLD is that GGUF dequantized: quality is bounded
  by it. WikiText-2 test (raw), ctx 512, the first ${smol_bytes} bytes (0 = all).
- Gemma-3-270M: likewise the public Q4_K_M GGUF (\`scripts/gemma3_model.sh\`, SHA-pinned) is the source and the
  KLD reference; the same WikiText-2 text and ctx.

| model | preset | bits/weight (all) | bits/weight (linears) | rounding (tensors) | PPL | KLD mean | KLD p99 | top-1 | quantize wall s | quantize CPU s | peak RSS MiB | measured |
| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |
$table_rows
HEAD
  [ -z "$notes" ] || printf '%s\n' "$notes"
} > "$out"
echo "wrote $out" >&2
