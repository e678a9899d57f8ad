# Prefill GEMM peers on the GPU machine, for bench_cuda's gemm rows (docs/PERFORMANCE.md "GPU prefill GEMM"):
# cuBLAS bf16 (x [m, K] @ W^T through torch) and torch's int4 weight-only kernel (_weight_int4pack_mm, group 128)
# at m = 16, 64, 128, 512 on the six Llama-shaped matrices. Timed with CUDA events around 5 back-to-back calls
# (so the launch latency hides behind the queue, as bench_cuda's graph replays do), median of 3, alternating two
# weight copies. Usage there: python3 scripts/gpu_gemm_baselines.py [--ms 16,64,128,512]  (prints JSON)
import argparse
import json

import torch

SHAPES = [(4096, 4096), (14336, 4096), (4096, 14336), (28672, 8192), (8192, 28672), (128256, 4096)]


def median_seconds(fn, reps=3, calls=5):
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / calls)
    times.sort()
    return times[len(times) // 2] / 1e3


def int4_weight(n, k, group, dev):
    codes = torch.randint(0, 16, (n, k), dtype=torch.int32, device=dev)
    packed = torch.ops.aten._convert_weight_to_int4pack(((codes[:, ::2] << 4) | codes[:, 1::2]).to(torch.uint8), 8)
    scales_zeros = torch.randn(k // group, n, 2, dtype=torch.bfloat16, device=dev)
    return packed, scales_zeros


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ms", default="16,64,128,512")
    ms = [int(v) for v in parser.parse_args().ms.split(",")]
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(0)
    out = {"gpu": props.name, "sms": props.multi_processor_count, "torch": torch.__version__, "rows": []}
    group = 128
    for n, k in SHAPES:
        weights = [torch.randn(n, k, dtype=torch.bfloat16, device=dev) for _ in range(2)]
        try:
            int4 = [int4_weight(n, k, group, dev) for _ in range(2)]
        except Exception as ex:  # an older or CPU-only torch build
            int4, int4_err = None, str(ex)[:200]
        for m in ms:
            x = torch.randn(m, k, dtype=torch.bfloat16, device=dev)
            flop = 2.0 * m * n * k
            turn = [0]

            def bf16():
                turn[0] ^= 1
                return x @ weights[turn[0]].t()

            t = median_seconds(bf16)
            row = {"N": n, "K": k, "m": m, "bf16_us": t * 1e6, "bf16_TFLOPs": flop / t / 1e12}
            if int4 is not None:
                def int4_mm():
                    turn[0] ^= 1
                    packed, sz = int4[turn[0]]
                    return torch.ops.aten._weight_int4pack_mm(x, packed, group, sz)

                t4 = median_seconds(int4_mm)
                row.update({"int4_us": t4 * 1e6, "int4_TFLOPs": flop / t4 / 1e12})
            else:
                row["int4_err"] = int4_err
            out["rows"].append(row)
            print(json.dumps(row), flush=True)
        del weights, int4
        torch.cuda.empty_cache()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
