#!/usr/bin/env python3
"""A llama2.c checkpoint of random f32 weights (N(0, 0.02), norm gains 1) of a chosen shape, for measuring the CPU
decode step on a model whose weights do not fit in cache (stories260K's 1 MB do). Its output is noise; it is not
for quality. Needs numpy.

  scripts/random_llama2c.py OUT.bin [--dim 768] [--hidden 2048] [--layers 8] [--heads 12] [--vocab 512] [--seq 512]

--vocab 512 lets stories260K's tok512.bin tokenize for it (lowbit serve, scripts/serve_bench.py).
"""
import argparse
import struct

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    dim, n_layers, head_dim = a.dim, a.layers, a.dim // a.heads
    rng = np.random.default_rng(a.seed)
    with open(a.out, "wb") as f:
        # run.c's Config: dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size (> 0: tied classifier), seq_len
        f.write(struct.pack("7i", dim, a.hidden, n_layers, a.heads, a.heads, a.vocab, a.seq))

        def weights(*shape):
            (rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)).tofile(f)

        def gains(*shape):
            np.ones(shape, dtype=np.float32).tofile(f)

        # run.c's TransformerWeights order
        weights(a.vocab, dim)
        gains(n_layers, dim)
        for _ in range(4):  # wq, wk, wv, wo
            weights(n_layers, dim, dim)
        gains(n_layers, dim)
        weights(n_layers, a.hidden, dim)  # w1 (gate)
        weights(n_layers, dim, a.hidden)  # w2 (down)
        weights(n_layers, a.hidden, dim)  # w3 (up)
        gains(dim)
        np.zeros((2, a.seq, head_dim // 2), dtype=np.float32).tofile(f)  # freq_cis_real, freq_cis_imag: unused


if __name__ == "__main__":
    main()
