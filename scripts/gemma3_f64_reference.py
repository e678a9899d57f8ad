#!/usr/bin/env python3
"""Adds a float64 reference to tests/model/fixtures/gemma3_270m_llama_cpp.json: Gemma-3-270M's forward pass written
out in numpy from Hugging Face's Gemma3ForCausalLM (modeling_gemma3.py), in float64, on the GGUF's weights as
llama.cpp's own gguf-py dequantizes them. It gives what the model computes without llama.cpp's shortcuts (8-bit
activations in every quantized matmul, f16 KV cache, fp16 GELU table), which lowbit's f32 CPU path must match
closely, while llama.cpp's numbers differ by its rounding.
    llama-tokenize -m GGUF -f PREFIX --ids --no-parse-special > ids.json   # PREFIX: the text's first prefix_bytes
    PYTHONPATH=<llama-cpp-python 0.3.36 sdist>/vendor/llama.cpp/gguf-py \
        python3 scripts/gemma3_f64_reference.py --tokens ids.json
Writes "float64": the logits of each prompt's last position for llama.cpp's top-5 ids, and the perplexity of the
test's WikiText-2 windows (ctx 512, second halves scored, BOS first, as llama-perplexity does). A few minutes.
"""
import argparse
import json
import pathlib
import re

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests/model/fixtures/gemma3_270m_llama_cpp.json"
ABOUT = ("Gemma-3-270M's forward pass in numpy float64 on the GGUF's dequantized weights "
         "(scripts/gemma3_f64_reference.py): what the model computes without llama.cpp's rounding")


class Gemma3:
    def __init__(self, path):
        r = GGUFReader(path)
        self.t = {t.name: t for t in r.tensors}
        meta = lambda k: r.fields[k].contents()  # noqa: E731
        self.dim, self.layers = meta("gemma3.embedding_length"), meta("gemma3.block_count")
        self.heads, self.kv_heads = meta("gemma3.attention.head_count"), meta("gemma3.attention.head_count_kv")
        self.hd, self.eps = meta("gemma3.attention.key_length"), meta("gemma3.attention.layer_norm_rms_epsilon")
        self.window, self.theta = meta("gemma3.attention.sliding_window"), meta("gemma3.rope.freq_base")
        self.embed = self.w("token_embd.weight")
        self.cache = {}

    def w(self, name):
        t = self.t[name]
        a = dequantize(t.data, t.tensor_type).astype(np.float64)
        return a.reshape([int(x) for x in reversed(t.shape)])

    def lw(self, name):
        if name not in self.cache:
            self.cache[name] = self.w(name)
        return self.cache[name]

    def rms(self, x, gain):  # GGUF gains are 1 + w already (llama.cpp's converter), HF multiplies by (1 + w)
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * gain

    def rope(self, x, pos, base):
        inv = 1.0 / base ** (np.arange(0, self.hd, 2) / self.hd)
        ang = pos[:, None] * inv[None, :]
        c, s = np.cos(ang)[:, None], np.sin(ang)[:, None]
        a, b = x[..., : self.hd // 2], x[..., self.hd // 2:]
        return np.concatenate([a * c - b * s, a * s + b * c], -1)

    def hidden(self, ids):
        n, group = len(ids), self.heads // self.kv_heads
        pos = np.arange(n, dtype=np.float64)
        x = self.embed[ids] * np.sqrt(float(self.dim))
        for l in range(self.layers):
            p = f"blk.{l}."
            sliding = l % 6 < 5  # llama.cpp's and HF's default pattern: every 6th layer full
            h = self.rms(x, self.lw(p + "attn_norm.weight"))
            q = (h @ self.lw(p + "attn_q.weight").T).reshape(n, self.heads, self.hd)
            k = (h @ self.lw(p + "attn_k.weight").T).reshape(n, self.kv_heads, self.hd)
            v = (h @ self.lw(p + "attn_v.weight").T).reshape(n, self.kv_heads, self.hd)
            q, k = self.rms(q, self.lw(p + "attn_q_norm.weight")), self.rms(k, self.lw(p + "attn_k_norm.weight"))
            base = 1e4 if sliding else self.theta
            q, k = self.rope(q, pos, base), self.rope(k, pos, base)
            k, v = np.repeat(k, group, 1), np.repeat(v, group, 1)
            s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(float(self.hd))  # query_pre_attn_scalar = head_dim
            dist = pos[:, None] - pos[None, :]
            s = np.where((dist < 0) | (sliding & (dist >= self.window)), -np.inf, s)
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            o = np.einsum("hqk,khd->qhd", s, v).reshape(n, -1) @ self.lw(p + "attn_output.weight").T
            x = x + self.rms(o, self.lw(p + "post_attention_norm.weight"))
            h = self.rms(x, self.lw(p + "ffn_norm.weight"))
            g, u = h @ self.lw(p + "ffn_gate.weight").T, h @ self.lw(p + "ffn_up.weight").T
            gelu = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3)))
            x = x + self.rms((gelu * u) @ self.lw(p + "ffn_down.weight").T, self.lw(p + "post_ffw_norm.weight"))
        return self.rms(x, self.lw("output_norm.weight"))

    def window_nll(self, ids, bos):
        ids = [bos] + list(ids[1:])
        n, first = len(ids), len(ids) // 2
        logits = self.hidden(ids)[first: n - 1] @ self.embed.T
        logits -= logits.max(-1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        return -logp[np.arange(n - 1 - first), ids[first + 1:]]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=str(ROOT / ".cache/lowbit/gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--tokens", type=pathlib.Path, required=True,
                    help="JSON list of the ids of the perplexity text's prefix (llama-tokenize --ids, BOS first)")
    a = ap.parse_args()
    m = Gemma3(a.model)
    fixture = json.loads(FIXTURE.read_text())
    prompts = []
    for p in fixture["prompts"]:
        last = m.hidden(p["prompt_ids"])[-1] @ m.embed.T
        prompts.append({str(t["id"]): float(last[t["id"]]) for t in p["top5"]})
    ppl = fixture["perplexity"]
    ids, ctx = json.loads(a.tokens.read_text()), ppl["ctx"]
    nll = np.concatenate([m.window_nll(ids[w * ctx:(w + 1) * ctx], ids[0]) for w in range(ppl["windows"])])
    fixture["float64"] = {"about": ABOUT, "top5_logits": prompts,
                          "perplexity": float(np.exp(nll.mean()))}
    text = json.dumps(fixture, indent=1, ensure_ascii=False)
    text = re.sub(r"\[\s*([-0-9.,\s]+?)\s*\]",
                  lambda mm: "[" + ", ".join(x.strip() for x in mm.group(1).split(",")) + "]", text)
    FIXTURE.write_text(text + "\n")
    print(f"wrote {FIXTURE}: {fixture['float64']}")


if __name__ == "__main__":
    main()
