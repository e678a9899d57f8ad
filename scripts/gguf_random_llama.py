#!/usr/bin/env python3
"""Writes a tiny random llama GGUF (F32) whose matrix rows are 256 wide, for the K- and IQ-quant fixtures.

llama.cpp's K-quants and IQ types quantize rows in super-blocks of 256, so the family fixtures (width 64) cannot
carry them: llama-quantize falls back to other types for narrower rows. This model is hidden 256, 4 heads of 64,
1 KV head (k/v 256 -> 64), intermediate 256, one layer, vocabulary 128, untied output: every matrix's ggml row
(ne[0]: hidden, heads x head_dim, or intermediate) is 256 wide, and the whole stays small once quantized.

The vocabulary is a stub SentencePiece ("llama") one that llama.cpp can tokenize plain lowercase text with (for
llama-imatrix): <unk>, <s>, </s>, then "▁", the letters a-z and "▁a".."▁z", then two-letter pieces "ab".. up to 128
pieces, scores favouring longer pieces. Weights are seeded normals scaled by 1/sqrt(fan-in) (norm gains around 1,
embeddings unit variance), so activations stay of order one through the layer and the logits are not degenerate.

usage: gguf_random_llama.py OUT.gguf [--seed N]   (PYTHONPATH must reach llama.cpp's gguf-py)
"""
import argparse
import string

import numpy as np
import gguf

DIM, HEADS, KV_HEADS, HEAD_DIM, FFN, LAYERS, VOCAB = 256, 4, 1, 64, 256, 1, 128


def vocabulary() -> list[str]:
    pieces = ["<unk>", "<s>", "</s>", "\u2581"] + list(string.ascii_lowercase)
    pieces += ["\u2581" + c for c in string.ascii_lowercase]
    for a in string.ascii_lowercase:
        for b in string.ascii_lowercase:
            if len(pieces) == VOCAB:
                return pieces
            pieces.append(a + b)
    return pieces


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=256)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)

    def matrix(rows: int, cols: int) -> np.ndarray:  # numpy [rows, cols] is ggml ne = [cols, rows]
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def gain(n: int) -> np.ndarray:
        return (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = gguf.GGUFWriter(args.out, "llama")
    w.add_name("Llama Wide Fixture")
    w.add_block_count(LAYERS)
    w.add_context_length(128)
    w.add_embedding_length(DIM)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(VOCAB)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    pieces = vocabulary()
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list([p.encode() for p in pieces])
    w.add_token_scores([0.0 if i < 3 else float(len(p)) for i, p in enumerate(pieces)])
    w.add_token_types([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
                      + [gguf.TokenType.NORMAL] * (VOCAB - 3))
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    w.add_tensor("token_embd.weight", rng.standard_normal((VOCAB, DIM)).astype(np.float32))
    for layer in range(LAYERS):
        blk = f"blk.{layer}."
        w.add_tensor(blk + "attn_norm.weight", gain(DIM))
        w.add_tensor(blk + "attn_q.weight", matrix(HEADS * HEAD_DIM, DIM))
        w.add_tensor(blk + "attn_k.weight", matrix(KV_HEADS * HEAD_DIM, DIM))
        w.add_tensor(blk + "attn_v.weight", matrix(KV_HEADS * HEAD_DIM, DIM))
        w.add_tensor(blk + "attn_output.weight", matrix(DIM, HEADS * HEAD_DIM))
        w.add_tensor(blk + "ffn_norm.weight", gain(DIM))
        w.add_tensor(blk + "ffn_gate.weight", matrix(FFN, DIM))
        w.add_tensor(blk + "ffn_up.weight", matrix(FFN, DIM))
        w.add_tensor(blk + "ffn_down.weight", matrix(DIM, FFN))
    w.add_tensor("output_norm.weight", gain(DIM))
    w.add_tensor("output.weight", 4 * matrix(VOCAB, DIM))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
