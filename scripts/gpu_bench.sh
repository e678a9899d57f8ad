#!/usr/bin/env bash
# The GPU check and benchmark in one go, for one device call: builds the cuda preset if its binaries are missing,
# runs the GPU tests, compute-sanitizer memcheck and racecheck on the kernel tests, bench_cuda and the peers'
# baselines (gpu_baselines.py: copy bandwidth, cuBLAS bf16 and PyTorch int4 through PyTorch), and prints a
# short table last. Logs and JSON go to $OUT (default BUILD/gpu-bench).
# Usage: scripts/gpu_bench.sh [BUILD_DIR]   (env: LOWBIT_GPU_BASELINES = path of gpu_baselines.py,
#                                            LOWBIT_BENCH_ARGS = extra bench_cuda arguments, e.g. --quick
#                                            or --filter affine4, LOWBIT_BENCH_TIMEOUT = its limit in s)
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/cuda}
out=${OUT:-$build/gpu-bench}
mkdir -p "$out"
baselines=${LOWBIT_GPU_BASELINES:-../shared/tools/gpu_baselines.py}
[ -f "$baselines" ] || baselines=device/gpu_baselines.py

if [ ! -x "$build/test_cuda" ] || [ ! -x "$build/bench_cuda" ]; then
  cmake --preset cuda >/dev/null && cmake --build --preset cuda --target test_cuda bench_cuda || exit 1
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$out/gpu.txt"

status=0
step() {  # step NAME SECONDS COMMAND...: runs with a time limit, logs to $out/NAME.log, records failure
  local name=$1 limit=$2; shift 2
  echo "== $name" >&2
  if timeout "$limit" "$@" >"$out/$name.log" 2>&1; then echo "   ok" >&2; else echo "   FAILED (rc $?)" >&2; tail -30 "$out/$name.log" >&2; status=1; fi
}
# Limits (at most 10 minutes in all) leave a device call its table; LOWBIT_BENCH_TIMEOUT overrides the bench's.
step tests 90 "$build/test_cuda"
# the Qwen3-ASR fixture tests (reference ids, Phonon variants, quantized artifact, CLI) with every model on the GPU
step speech 120 env LOWBIT_TEST_DEVICE=cuda "$build/tests/test_model" --gtest_filter='Qwen3Asr*'
grep -E "PASSED|FAILED|SKIPPED" "$out/tests.log" >&2
if command -v compute-sanitizer >/dev/null; then
  # Small shapes only: the sanitizer slows kernels by orders of magnitude.
  step memcheck 120 compute-sanitizer --tool memcheck --error-exitcode 9 "$build/test_cuda" --gtest_filter='*MatchesDecodeRows*:*Rejects*'
  step racecheck 120 compute-sanitizer --tool racecheck --error-exitcode 9 "$build/test_cuda" --gtest_filter='*Trellis*MatchesDecodeRows*:*AffineMma*'
  grep -hE "ERROR SUMMARY|RACECHECK SUMMARY" "$out/memcheck.log" "$out/racecheck.log" >&2
fi
step bench "${LOWBIT_BENCH_TIMEOUT:-180}" "$build/bench_cuda" --json "$out/bench.json" ${LOWBIT_BENCH_ARGS:-}
step baselines 90 env PYTHONUNBUFFERED=1 python3 "$baselines"
python3 - "$out/bench.json" "$out/baselines.log" <<'PY'
import json, sys
bench = json.load(open(sys.argv[1]))["rows"]  # written after every row, so a cut-off run still has its rows
text = open(sys.argv[2]).read()
try:
    base = json.loads(text[text.index("{"):])
except ValueError:
    base = {"gpu": "baselines missing", "copy_GBps": 0, "gemv": [{"N": n, "K": k, "bf16_GBps": 0} for n, k in
            dict.fromkeys((r["N"], r["K"]) for r in bench if r["m"] == 1)]}
print(f"\n{base['gpu']}: copy {base['copy_GBps']:.0f} GB/s (read+write)")
peers = {(r["N"], r["K"]): r for r in base["gemv"]}
codecs = [c for c in dict.fromkeys(r["codec"] for r in bench) if c != "cublas_bf16"]
m1 = {(r["codec"], r["N"], r["K"]): r for r in bench if r["m"] == 1}
print("GB/s effective at batch 1 (stored bytes / time); torch_* from gpu_baselines.py (per-call events)")
print(f"{'shape':>16} {'torch_bf16':>10} {'torch_int4':>10} {'cublas':>7} " + " ".join(f"{c:>13}" for c in codecs))
for (n, k), p in peers.items():
    cells = [f"{m1[(c, n, k)]['GBps']:>13.0f}" if (c, n, k) in m1 else f"{'-':>13}" for c in codecs]
    cub = m1.get(("cublas_bf16", n, k))
    print(f"{f'{n}x{k}':>16} {p['bf16_GBps']:>10.0f} {p.get('int4_tinygemm_GBps', 0):>10.0f} "
          f"{cub['GBps'] if cub else 0:>7.0f} " + " ".join(cells))
print("\nbatch m: microseconds per call (x batch-1 time)")
for r in bench:
    if r["m"] > 1:
        one = m1.get((r["codec"], r["N"], r["K"]))
        print(f"  {r['codec']:>14} {r['N']}x{r['K']} m={r['m']:<2} {r['us']:8.2f} us ({r['us'] / one['us']:.2f}x)" if one else "")
PY
exit $status
