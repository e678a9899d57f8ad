"""Regenerates the small seed corpus of the fuzz targets (fuzz/corpus/<target>/), a few tiny valid or nearly valid
inputs each, so that every CI run starts past the magic numbers. The SentencePiece seed is the test fixture
tests/model/fixtures/spm_charsmap.model; the artifact reader's seed is the manifest its own fixture writes
(fuzz_artifact_reader writes it on start; copy /tmp/lowbit-fuzz-<pid>/artifact.seed.json to
fuzz/corpus/fuzz_artifact_reader/two_tensors.json).
Run: python3 fuzz/corpus/make_seeds.py"""
import json
import os
import struct

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(os.path.dirname(here))


def put(target, name, data):
    d = os.path.join(here, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


# GGUF v3: header, metadata, tensor infos, aligned data.
def gguf_string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf(kv, tensors):
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv))
    for key, (vtype, payload) in kv:
        out += gguf_string(key) + struct.pack("<I", vtype) + payload
    data = b""
    for name, ne, ggml_type, raw in tensors:
        out += gguf_string(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
        out += struct.pack("<IQ", ggml_type, len(data))
        data += raw + b"\0" * (-len(raw) % 32)
    out += b"\0" * (-len(out) % 32)
    return out + data


def kv_u32(v): return (4, struct.pack("<I", v))
def kv_f32(v): return (6, struct.pack("<f", v))
def kv_str(s): return (8, gguf_string(s))
def kv_strs(items): return (9, struct.pack("<IQ", 8, len(items)) + b"".join(gguf_string(s) for s in items))
def kv_f32s(items): return (9, struct.pack("<IQ", 6, len(items)) + b"".join(struct.pack("<f", v) for v in items))
def kv_i32s(items): return (9, struct.pack("<IQ", 5, len(items)) + b"".join(struct.pack("<i", v) for v in items))


dim, hidden, vocab = 8, 16, 8
tokens = ["<unk>", "<s>", "</s>", "\u2581a", "\u2581b", "a", "b", "\u2581"]
f32 = lambda n: struct.pack("<%df" % n, *[(i % 5 - 2) * 0.25 for i in range(n)])
llama_kv = [("general.architecture", kv_str("llama")), ("llama.embedding_length", kv_u32(dim)),
            ("llama.block_count", kv_u32(1)), ("llama.feed_forward_length", kv_u32(hidden)),
            ("llama.attention.head_count", kv_u32(2)), ("llama.context_length", kv_u32(64)),
            ("llama.attention.layer_norm_rms_epsilon", kv_f32(1e-5)),
            ("tokenizer.ggml.model", kv_str("llama")), ("tokenizer.ggml.tokens", kv_strs(tokens)),
            ("tokenizer.ggml.scores", kv_f32s([0.0] * vocab)),
            ("tokenizer.ggml.token_type", kv_i32s([2, 3, 3, 1, 1, 1, 1, 1])),
            ("tokenizer.ggml.bos_token_id", kv_u32(1)), ("tokenizer.ggml.eos_token_id", kv_u32(2))]
layer = [("blk.0.attn_norm.weight", [dim]), ("blk.0.ffn_norm.weight", [dim]), ("blk.0.attn_q.weight", [dim, dim]),
         ("blk.0.attn_k.weight", [dim, dim]), ("blk.0.attn_v.weight", [dim, dim]),
         ("blk.0.attn_output.weight", [dim, dim]), ("blk.0.ffn_gate.weight", [dim, hidden]),
         ("blk.0.ffn_up.weight", [dim, hidden]), ("blk.0.ffn_down.weight", [hidden, dim])]
tensors = [("token_embd.weight", [dim, vocab], 0, f32(dim * vocab)), ("output_norm.weight", [dim], 0, f32(dim))]
tensors += [(n, ne, 0, f32(eval("*".join(map(str, ne))))) for n, ne in layer]
put("fuzz_gguf", "tiny_llama.gguf", gguf(llama_kv, tensors))
bpe_tokens = ["a", "b", "ab", "\u0120", "\u0120ab", "<|endoftext|>"]
put("fuzz_gguf", "gpt2_vocab.gguf", gguf([("tokenizer.ggml.model", kv_str("gpt2")),
                                          ("tokenizer.ggml.tokens", kv_strs(bpe_tokens)),
                                          ("tokenizer.ggml.token_type", kv_i32s([1, 1, 1, 1, 1, 3])),
                                          ("tokenizer.ggml.merges", kv_strs(["a b", "\u0120 ab"]))], []))
# Q8_0 (type 8): 32 elements = f16 scale + 32 int8.
put("fuzz_gguf", "q8_tensor.gguf", gguf([("general.architecture", kv_str("llama"))],
                                        [("t", [32], 8, struct.pack("<e", 0.5) + bytes(range(32)))]))

# One 2 x 256 matrix of each super-block type (K-quants and IQ types: ggml type id, bytes per block of 256), filled
# with a fixed byte pattern whose f16 fields read as small finite numbers, so the fuzzer starts inside every
# dequantizer's grid and scale decoding and the packed (affine) re-expression of Q2_K .. Q6_K.
super_blocks = {10: 84, 11: 110, 12: 144, 13: 176, 14: 210, 16: 66, 17: 74, 18: 98, 19: 50, 21: 110, 22: 82, 23: 136,
                29: 56}
put("fuzz_gguf", "super_blocks.gguf", gguf([("general.architecture", kv_str("llama"))],
                                           [("t%d" % t, [256, 2], t, bytes((i * 37 + t) % 60 for i in range(2 * n)))
                                            for t, n in super_blocks.items()]))


def safetensors(entries, metadata=None):
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in entries:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


put("fuzz_safetensors_file", "two.safetensors", safetensors([("w", "F32", [2, 2], f32(4)),
                                                             ("b", "BF16", [3], b"\x80\x3f" * 3)], {"format": "pt"}))
put("fuzz_safetensors_file", "empty.safetensors", safetensors([]))
with open(os.path.join(root, "tests/io/fixtures/reference.safetensors"), "rb") as f:
    put("fuzz_safetensors_file", "reference.safetensors", f.read())

llama = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 32,
         "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
         "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 128}}
put("fuzz_hf_config", "llama.json", json.dumps(llama))
put("fuzz_hf_config", "qwen3.json", json.dumps({**llama, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
                                                "head_dim": 32, "rope_scaling": None}))
mlx = {"model_type": "llama", "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
       "intermediate_size": 64, "vocab_size": 2, "quantization": {"group_size": 64, "bits": 4}}
put("fuzz_mlx_config", "llama_q4.json", json.dumps(mlx))
put("fuzz_mlx_config", "per_module.json", json.dumps({**mlx, "quantization": {
    "group_size": 64, "bits": 4, "model.layers.0.mlp.up_proj": {"group_size": 32, "bits": 8}}}))

byte_chars = {}
n = 0
for b in range(256):
    if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255:
        byte_chars[b] = chr(b)
    else:
        byte_chars[b] = chr(256 + n)
        n += 1
bpe_vocab = {byte_chars[b]: b for b in range(256)}
bpe_vocab.update({"ab": 256, "\u0120ab": 257})
tok = {"added_tokens": [{"id": 258, "content": "<s>", "special": True}],
       "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFC"}]},
       "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
           {"type": "Split", "pattern": {"Regex": "\\p{N}"}, "behavior": "Isolated"},
           {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}]},
       "decoder": {"type": "ByteLevel"},
       "model": {"type": "BPE", "vocab": bpe_vocab, "merges": ["a b", "\u0120 ab"]}}
put("fuzz_tokenizer_json", "bytelevel_bpe.json", json.dumps(tok))
put("fuzz_tokenizer_json", "pairs.json", json.dumps({**tok, "normalizer": None, "pre_tokenizer": {
    "type": "ByteLevel", "add_prefix_space": True, "use_regex": True},
    "model": {**tok["model"], "merges": [["a", "b"], ["\u0120", "ab"]], "ignore_merges": True}}))

with open(os.path.join(root, "tests/model/fixtures/spm_charsmap.model"), "rb") as f:
    put("fuzz_sentencepiece", "spm_charsmap.model", f.read())

# llama2.c: Config{dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size (negative: unshared head), seq_len}.
cdim, chid, cvocab, cseq = 8, 16, 8, 16
sizes = [cvocab * cdim, cdim, cdim * cdim * 4, cdim, chid * cdim * 3, cdim, cseq * (cdim // 2) // 2 * 2]
put("fuzz_llama2c", "tiny.bin", struct.pack("<7i", cdim, chid, 1, 2, 2, cvocab, cseq) + f32(sum(sizes)))
put("fuzz_llama2c", "header_only.bin", struct.pack("<7i", cdim, chid, 1, 2, 2, -cvocab, cseq))
pieces = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)] + [" ", "a", "b", " a", "ab", " ab"]
put("fuzz_llama2c_tokenizer", "tiny.bin", struct.pack("<i", 3) + b"".join(
    struct.pack("<fi", float(-i), len(p.encode())) + p.encode() for i, p in enumerate(pieces)))

audio8 = {"format": "audio8-mixed-bundle-v2", "group_size": 64, "tie_word_embeddings": True,
          "weights_file": "weights.bin", "weights_bytes": 4096, "source_revision": "seed", "profile": "seed",
          "tensors": [{"name": "model.embed_tokens.weight", "precision": "original", "dtype": "BF16",
                       "shape": [16, 64], "offset": 0, "bytes": 2048},
                      {"name": "model.norm.weight", "precision": "original", "dtype": "F32", "shape": [64],
                       "offset": 2048, "bytes": 256},
                      {"name": "model.layers.0.mlp.up_proj.weight", "precision": "q4", "shape": [8, 64],
                       "offset": 2304, "bytes": 1792, "codes_bytes": 256, "scales_offset": 2560}],
          "aliases": {"lm_head.weight": "model.embed_tokens.weight"}}
put("fuzz_audio8_manifest", "v2.json", json.dumps(audio8))
put("fuzz_audio8_manifest", "v1.json", json.dumps({**audio8, "format": "audio8-mixed-bundle-v1"}))

phonon = {"status": "PASS", "group_size": 128, "bits": 2,
          "modules": [{"name": "thinker.model.layers.0.mlp.up_proj", "in_features": 64, "out_features": 128}],
          "decoder_metadata": {"format": "broadcast-scales-v1"},
          "embedding": {"name": "model.embed_tokens", "num_embeddings": 64, "dims": 64, "group_size": 64, "bits": 4,
                        "mode": "affine"}}
put("fuzz_phonon_manifest", "packed.json", json.dumps(phonon))
print("seeds written under", here)
