#!/usr/bin/env python3
"""Synthetic Hugging Face checkpoints of real model shapes, for memory and speed measurements (issue 22).

Random bf16 weights (normal, std 0.02; norm gains 1.0), a real config.json, sharded safetensors with
model.safetensors.index.json, and tokenizer files copied from ../shared/tokenizers (--shared). Nothing is downloaded.
Tensors are written one at a time in row blocks, so memory stays bounded (a few hundred MB) whatever the shape.
The values depend only on --seed and the tensor's name: the same command writes the same bytes.

    python3 scripts/make_synthetic_checkpoint.py qwen3-8b /work/synth/qwen3-8b
    python3 scripts/make_synthetic_checkpoint.py qwen3-30b-a3b /work/synth/moe4 --layers 4
    python3 scripts/make_synthetic_checkpoint.py tiny-llama /tmp/tiny --shard-mb 1   # tests

Shapes (bf16 sizes): llama3-8b (16.1 GB), qwen3-8b (16.4 GB), dense-20b (qwen3 layer, dim 6144, 48 layers, 41 GB:
bigger than a 24 GiB machine), qwen3-30b-a3b (61 GB at 48 layers; --layers cuts it), tiny-llama and tiny-qwen3
(a few MB, for tests). --layers overrides any shape's layer count.
"""

import argparse
import hashlib
import json
import os
import shutil
import statistics
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

QWEN3_TOKENS = {"bos_token_id": 151643, "eos_token_id": 151645}
LLAMA2_TOKENS = {"bos_token_id": 1, "eos_token_id": 2}


def llama_config(dim, layers, heads, kv_heads, hidden, vocab, theta, tokens, **extra):
    c = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": dim, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "intermediate_size": hidden,
        "vocab_size": vocab, "rms_norm_eps": 1e-5, "rope_theta": theta, "max_position_embeddings": 8192,
        "tie_word_embeddings": False, "hidden_act": "silu", "torch_dtype": "bfloat16", **tokens,
    }
    c.update(extra)
    return c


def qwen3_config(dim, layers, heads, kv_heads, hidden, vocab, **extra):
    c = llama_config(dim, layers, heads, kv_heads, hidden, vocab, 1000000.0, QWEN3_TOKENS,
                     architectures=["Qwen3ForCausalLM"], model_type="qwen3", head_dim=128, rms_norm_eps=1e-6,
                     max_position_embeddings=40960, attention_bias=False)
    c.update(extra)
    return c


SHAPES = {
    "llama3-8b": (llama_config(4096, 32, 32, 8, 14336, 128256, 500000.0, LLAMA2_TOKENS), "llama2"),
    "qwen3-8b": (qwen3_config(4096, 36, 32, 8, 12288, 151936), "qwen3"),
    "dense-20b": (qwen3_config(6144, 48, 48, 8, 16384, 151936), "qwen3"),
    "qwen3-30b-a3b": (qwen3_config(2048, 48, 32, 4, 6144, 151936, architectures=["Qwen3MoeForCausalLM"],
                                   model_type="qwen3_moe", num_experts=128, num_experts_per_tok=8,
                                   moe_intermediate_size=768, norm_topk_prob=True, decoder_sparse_step=1,
                                   mlp_only_layers=[]), "qwen3"),
    "tiny-llama": (llama_config(64, 4, 4, 2, 192, 32000, 10000.0, LLAMA2_TOKENS), "llama2"),
    "tiny-qwen3": (qwen3_config(64, 4, 4, 2, 192, 151936, head_dim=16), "qwen3"),
}


def tensors(c):
    """(name, shape) of every weight, in the order HF checkpoints list them."""
    dim, hd = c["hidden_size"], c.get("head_dim", c["hidden_size"] // c["num_attention_heads"])
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    out = [("model.embed_tokens.weight", (c["vocab_size"], dim))]
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        out += [(p + "input_layernorm.weight", (dim,)), (p + "post_attention_layernorm.weight", (dim,)),
                (p + "self_attn.q_proj.weight", (q, dim)), (p + "self_attn.k_proj.weight", (kv, dim)),
                (p + "self_attn.v_proj.weight", (kv, dim)), (p + "self_attn.o_proj.weight", (dim, q))]
        if c["model_type"].startswith("qwen3"):
            out += [(p + "self_attn.q_norm.weight", (hd,)), (p + "self_attn.k_norm.weight", (hd,))]
        if "num_experts" in c:
            e_hidden = c["moe_intermediate_size"]
            out.append((p + "mlp.gate.weight", (c["num_experts"], dim)))
            for e in range(c["num_experts"]):
                out += [(p + f"mlp.experts.{e}.gate_proj.weight", (e_hidden, dim)),
                        (p + f"mlp.experts.{e}.up_proj.weight", (e_hidden, dim)),
                        (p + f"mlp.experts.{e}.down_proj.weight", (dim, e_hidden))]
        else:
            h = c["intermediate_size"]
            out += [(p + "mlp.gate_proj.weight", (h, dim)), (p + "mlp.up_proj.weight", (h, dim)),
                    (p + "mlp.down_proj.weight", (dim, h))]
    out += [("model.norm.weight", (dim,)), ("lm_head.weight", (c["vocab_size"], dim))]
    return out


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def shard_plan(specs, shard_bytes):
    """Consecutive tensors grouped into shards of at most shard_bytes (a larger tensor gets a shard of its own)."""
    shards, current, size = [], [], 0
    for name, shape in specs:
        b = 2 * numel(shape)
        if current and size + b > shard_bytes:
            shards.append(current)
            current, size = [], 0
        current.append((name, shape))
        size += b
    if current:
        shards.append(current)
    return shards


def header_bytes(shard):
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in shard:
        b = 2 * numel(shape)
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + b]}
        offset += b
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text


def normal_table():
    """bf16 bit patterns of normal(0, 0.02) at the 65536 quantiles (i + 0.5) / 65536: indexed by a random uint16,
    a normal sample at a tenth of the cost of drawing one (bf16 has fewer levels than the table anyway)."""
    inv = statistics.NormalDist(0.0, 0.02).inv_cdf
    v = np.array([inv((i + 0.5) / 65536) for i in range(65536)], dtype=np.float32)
    bits = v.view(np.uint32)
    bits += 0x7FFF + ((bits >> 16) & 1)  # round to nearest even (finite values only)
    return (bits >> 16).astype(np.uint16)


def write_tensor(f, name, shape, seed, table, block_elems):
    """Writes one tensor's bf16 values in row blocks: norm gains are 1.0, everything else normal(0, 0.02)."""
    if name.endswith("norm.weight"):
        f.write(np.full(numel(shape), 0x3F80, dtype=np.uint16).tobytes())
        return
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    rng = np.random.Generator(np.random.PCG64(int.from_bytes(digest[:8], "little")))
    left = numel(shape)
    while left:
        n = min(left, block_elems)
        f.write(table[rng.integers(0, 1 << 16, n, dtype=np.uint16)].tobytes())
        left -= n


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, help="override the shape's layer count")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shard-mb", type=float, default=4000, help="shard size in MB (default 4000)")
    ap.add_argument("--force", action="store_true", help="replace an existing output directory")
    ap.add_argument("--shared", default=os.path.join(ROOT, "..", "shared"), help="where tokenizers/ lies")
    args = ap.parse_args()

    config, tokenizer = SHAPES[args.shape]
    config = dict(config)
    if args.layers:
        config["num_hidden_layers"] = args.layers
    if os.path.exists(args.out):
        if not args.force:
            sys.exit(f"{args.out}: already exists (--force replaces it)")
        shutil.rmtree(args.out)
    tmp = args.out.rstrip("/") + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)

    specs = tensors(config)
    shards = shard_plan(specs, int(args.shard_mb * 1e6))
    total = sum(2 * numel(s) for _, s in specs)
    weight_map, written, table = {}, 0, normal_table()
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        with open(os.path.join(tmp, file), "wb") as f:
            f.write(header_bytes(shard))
            for name, shape in shard:
                write_tensor(f, name, shape, args.seed, table, 1 << 24)
                weight_map[name] = file
                written += 2 * numel(shape)
        print(f"{file}: {len(shard)} tensors, {written / 1e9:.2f} of {total / 1e9:.2f} GB", file=sys.stderr)
    with open(os.path.join(tmp, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    src = os.path.join(args.shared, "tokenizers", tokenizer)
    if os.path.isdir(src):
        for name in sorted(os.listdir(src)):
            shutil.copy(os.path.join(src, name), tmp)
    else:
        print(f"warning: {src} is absent; the checkpoint has no tokenizer", file=sys.stderr)
    os.rename(tmp, args.out)
    print(f"{args.out}: {args.shape}, {config['num_hidden_layers']} layers, {len(specs)} tensors, "
          f"{total / 1e9:.2f} GB in {len(shards)} shards", file=sys.stderr)


if __name__ == "__main__":
    main()
