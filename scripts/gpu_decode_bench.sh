#!/usr/bin/env bash
# Whole-model GPU decode check and benchmark, for one device call: the GPU runtime's tests (tests/cuda
# CudaModelTest.* and ModelOpsTest.*, stories260K included when LOWBIT_SHARED_DIR points at a copy of ../shared),
# compute-sanitizer memcheck on them, then `lowbit bench --synthetic llama3-8b`: batch-1 decode at bf16 and trellis3, batches
# 1/2/4/8/16 at affine4 and trellis2 (each codec's weights generated and uploaded once). Logs and JSON go to $OUT (default BUILD/gpu-decode).
# Usage: scripts/gpu_decode_bench.sh [BUILD_DIR]   (BUILD_DIR holds test_cuda and lowbit; env: LOWBIT_DECODE_STEPS)
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/cuda}
out=${OUT:-$build/gpu-decode}
mkdir -p "$out"
steps=${LOWBIT_DECODE_STEPS:-128}
status=0
step() {  # step NAME COMMAND...: runs, logs to $out/NAME.log, records failure
  local name=$1; shift
  echo "== $name" >&2
  if "$@" >"$out/$name.log" 2>&1; then echo "   ok" >&2; else echo "   FAILED (rc $?)" >&2; tail -30 "$out/$name.log" >&2; status=1; fi
}
step model-tests "$build/test_cuda" --gtest_filter='CudaModelTest.*:ModelOpsTest.*'
grep -E "^\[  (PASSED|FAILED|SKIPPED) |OK \]|FAILED \]" "$out/model-tests.log" >&2
if command -v compute-sanitizer >/dev/null; then
  step model-memcheck compute-sanitizer --tool memcheck --error-exitcode 9 "$build/test_cuda" \
    --gtest_filter='CudaModelTest.*:ModelOpsTest.*:-*Stories*'
  grep -hE "ERROR SUMMARY" "$out/model-memcheck.log" >&2
fi
step decode-batch1 "$build/lowbit" bench --synthetic llama3-8b --device cuda --codec bf16,trellis3 \
  --batch 1 --prompt 128 -n "$steps" --json
step decode-batches "$build/lowbit" bench --synthetic llama3-8b --device cuda --codec affine4,trellis2 \
  --batch 1,2,4,8,16 --prompt 128 -n "$steps" --json
python3 - "$out/decode-batch1.log" "$out/decode-batches.log" <<'PY'
import json, sys
rows = []
for path in sys.argv[1:]:
    text = open(path).read()
    try:
        j = json.loads(text[text.index("{"):])
    except ValueError:
        continue
    device = j["device"]
    rows += j["rows"]
print(f"\nLlama-3-8B-shaped decode (random weights), {device}")
print("ms/step: whole step (graph replay); matmul ms: the same steps launching only the matmuls")
print(f"{'codec':>9} {'batch':>5} {'decode tok/s':>13} {'x batch1':>8} {'ms/step':>8} {'matmul ms':>9} {'weights GB':>10} "
      f"{'GB/s':>6} {'prefill tok/s':>13}")
one = {r["codec"]: r["decode_tokens_per_s"] for r in rows if r["batch"] == 1}
for r in rows:
    gb = r["weight_bytes"] / 1e9
    print(f"{r['codec']:>9} {r['batch']:>5} {r['decode_tokens_per_s']:>13.1f} {r['decode_tokens_per_s'] / one[r['codec']]:>8.2f} "
          f"{r['ms_per_step']:>8.3f} {r.get('matmul_ms_per_step', 0):>9.3f} {gb:>10.2f} "
          f"{gb / (r['ms_per_step'] / 1e3):>6.0f} {r['prefill_tokens_per_s']:>13.1f}")
print("ms per step: whole step; matmuls alone; what each other part adds (step minus step without it)")
for r in rows:
    if r.get("matmul_ms_per_step"):
        print(f"  {r['codec']:>9} b{r['batch']:<2}: {r['ms_per_step']:.3f} = matmuls {r['matmul_ms_per_step']:.3f} + rest; norm+embed "
              f"{r['norm_ms']:.3f}, rope+kv {r['rope_ms']:.3f}, attention {r['attention_ms']:.3f}, swiglu {r['swiglu_ms']:.3f}")
PY
exit $status
