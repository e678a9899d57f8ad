#!/usr/bin/env python3
"""Bits per weight of a GGUF file or a lowbit artifact, counted the same way for both (scripts/compare_llamacpp.sh).

    count_bpw.py FILE_OR_ARTIFACT [--lowbit BINARY]   ->  one line: "<whole-file bpw> <linears bpw>"

whole file: every byte on disk (a GGUF's metadata and vocabulary, an artifact's manifest and tokenizer files
included) over every weight of every tensor; linears: the stored bytes of the layers' 2-D projection weights
(attention q/k/v/o, MLP gate/up/down) over their weights, embeddings and the output head excluded. A GGUF is read
with llama.cpp's gguf-py (PYTHONPATH), an artifact with `lowbit inspect --json`.
"""
import argparse
import json
import os
import re
import subprocess
import sys

# GGUF and HF names of the layer linears.
LINEAR = re.compile(r"(attn_(q|k|v|qkv|output)|ffn_(gate|up|down)|self_attn\.(q|k|v|o|qkv)_proj|mlp\.(gate|up|down|gate_up)_proj)\.weight$")


def tensors_gguf(path):
    from gguf import GGUFReader  # llama.cpp's gguf-py

    reader = GGUFReader(path)
    return [(t.name, int(t.n_elements), int(t.n_bytes)) for t in reader.tensors], os.path.getsize(path)


def tensors_artifact(path, lowbit):
    info = json.loads(subprocess.run([lowbit, "inspect", path, "--json"], check=True, capture_output=True).stdout)
    rows = []
    for t in info["tensors"]:
        n = 1
        for d in t["shape"]:
            n *= d
        rows.append((t["name"], n, int(t["stored_bytes"])))
    size = sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(path) for f in files)
    return rows, size


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--lowbit", default="build/cuda/lowbit")
    a = ap.parse_args()
    rows, size = tensors_artifact(a.model, a.lowbit) if os.path.isdir(a.model) else tensors_gguf(a.model)
    weights = sum(n for _, n, _ in rows)
    lin = [(n, b) for name, n, b in rows if LINEAR.search(name)]
    if not lin:
        sys.exit(f"{a.model}: no layer linear tensors found")
    print(f"{8 * size / weights:.3f} {8 * sum(b for _, b in lin) / sum(n for n, _ in lin):.3f}")


if __name__ == "__main__":
    main()
