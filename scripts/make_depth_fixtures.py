#!/usr/bin/env python3
"""Fixtures for the depth decoder (src/model/depth_decoder.cpp): a small random-weight depth model, dense and
affine-quantized, run through seed 004's own code on MLX's CPU backend for 64 frames.

The model and the inputs are not committed: their values come from a counter-based generator (splitmix64 of a
per-tensor key plus the element index, scripts/counter_rng.py) that tests/model/counter_rng.h implements too, so the
C++ test writes the same depth.safetensors, quant.json and inputs byte for byte. What is committed, per variant, under
tests/model/fixtures/depth/<variant>/: expected.safetensors (codes [64, 32], feedback [64, hidden], and the logits
of frame 0) and expected.json (the SHA-256 of every frame's logits bytes, and how the variant was made).

The seed's code runs unchanged (scripts/depth_reference/, re-indented; checked against ../shared/seeds when
present) with its module constants D and HEAD shrunk to the test width. Its quant import is seed 002, with the
arithmetic of the quantized paths set to the rule the runtime implements (issue 24): a dequantized value is
s * q + b in fp32 rounded once to the scales' dtype, and a quantized matmul is a plain matmul over those values
(fp32 accumulation, one rounding). MLX's CPU quantized_matmul rounds to fp16 after every operation instead; how
many codes that changes is recorded as `seed002_quantized_matmul_codes_differing` in the quantized variant.

Usage: scripts/make_depth_fixtures.py [--out tests/model/fixtures/depth]   (needs `pip install "mlx[cpu]"`)
"""
import argparse
import hashlib
import json
import math
import os
import re
import sys
import tempfile

import mlx.core as mx
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import counter_rng  # noqa: E402
from depth_reference import depth as seed_depth  # noqa: E402
from depth_reference import quant as Q  # noqa: E402

SEED = 0x5EED0004
D, FFN, RANK, HIDDEN, FRAMES = 128, 256, 32, 128, 64

# quantized variant: name pattern -> (bits, group_size); depth tensors get f16 scales, the backbone table bf16
QUANT = [(r"in_proj\.weight", 4, 64), (r"code_lo\.weight", 8, 32), (r"code_up\.weight", 4, 32),
         (r"groups\.\d+\.\d+\.qkv\.weight", 4, 64), (r"groups\.\d+\.\d+\.o\.weight", 5, 32),
         (r"groups\.\d+\.\d+\.f1\.weight", 3, 64), (r"groups\.\d+\.\d+\.f2\.weight", 4, 128),
         (r"heads\.\d+\.weight", 8, 64), (r"cross\.\d+\.kv\.weight", 6, 32), (r"cross\.\d+\.o\.weight", 2, 32),
         (r"audio_in\.table", 4, 64)]

VARIANTS = {  # name: (dtype, quantized, speaker, force)
    "dense_f16": ("float16", False, False, False),
    "quant_f16": ("float16", True, True, True),
    "dense_bf16": ("bfloat16", False, True, False),
    "dense_f32": ("float32", False, False, True),
}


def stream(name, n):
    return counter_rng.stream(SEED, name, 0, n)


def unif(name, n):
    return counter_rng.unif(SEED, name, n)


def sym(name, n, amp):
    return counter_rng.sym(SEED, name, n, amp)


def ints(name, n, m):
    return (stream(name, n) % np.uint64(m)).astype(np.int32)


def mlx_dtype(name):
    return {"float16": mx.float16, "bfloat16": mx.bfloat16, "float32": mx.float32}[name]


def tensor_specs():
    """(name, shape, kind, amp) of every tensor of depth.safetensors; kind: w (weight), g (gain), b (bias)."""
    specs = [("in_proj.weight", (D, HIDDEN), "w", 0), ("level_emb.weight", (32, D), "w", 1.0),
             ("code_lo.weight", (31 * 2048, RANK), "w", 1.0), ("code_up.weight", (D, RANK), "w", 0),
             ("norm.weight", (D,), "g", 0), ("norm.bias", (D,), "b", 0), ("null_mem.weight", (1, D), "w", 1.0),
             ("audio_in.table", (65536, HIDDEN), "w", 1.0), ("audio_in.norm.weight", (HIDDEN,), "g", 0)]
    for g in range(11):
        for li in range(4):
            p = f"groups.{g}.{li}."
            specs += [(p + "n1.weight", (D,), "g", 0), (p + "n1.bias", (D,), "b", 0), (p + "n2.weight", (D,), "g", 0),
                      (p + "n2.bias", (D,), "b", 0), (p + "qkv.weight", (3 * D, D), "w", 0),
                      (p + "o.weight", (D, D), "w", 0), (p + "f1.weight", (FFN, D), "w", 0),
                      (p + "f2.weight", (D, FFN), "w", 0)]
    specs += [(f"heads.{i}.weight", (2048, D), "w", 3 * math.sqrt(3.0 / D)) for i in range(31)]
    for li in range(4):
        specs += [(f"cross.{li}.kv.weight", (2 * D, D), "w", 0), (f"cross.{li}.o.weight", (D, D), "w", 0)]
    return specs


def amp_of(shape, amp):
    return amp if amp else math.sqrt(3.0 / shape[-1])


def quant_rule(name):
    for pattern, bits, group in QUANT:
        if re.fullmatch(pattern, name):
            return bits, group
    return None


def write_model(path, quantized, dtype):
    """depth.safetensors (+ quant.json): bf16 values; quantized tensors as random codes with scales/biases in
    the depth dtype (the backbone table: bf16)."""
    arrays, recipe = {}, {}
    for name, shape, kind, amp in tensor_specs():
        n = int(np.prod(shape))
        rule = quant_rule(name) if quantized else None
        if rule:
            bits, group = rule
            rows, cols = shape
            sdt = mx.bfloat16 if name.startswith("audio_in.") else mlx_dtype(dtype)
            a = amp_of(shape, amp)
            words = (stream(name + ".q", rows * cols * bits // 32) >> np.uint64(32)).astype(np.uint32)
            ng = rows * cols // group
            scales = (np.float32(2 * a / ((1 << bits) - 1)) * (np.float32(0.5) + unif(name + ".scales", ng)))
            biases = np.float32(-a) * (np.float32(0.5) + unif(name + ".biases", ng))
            arrays[name + ".q"] = mx.array(words.reshape(rows, cols * bits // 32))
            arrays[name + ".scales"] = mx.array(scales.reshape(rows, cols // group)).astype(sdt)
            arrays[name + ".biases"] = mx.array(biases.reshape(rows, cols // group)).astype(sdt)
            recipe[name] = {"bits": bits, "group_size": group, "shape": list(shape)}
            continue
        if kind == "g":
            v = sym(name, n, 0.5) + np.float32(1)
        elif kind == "b":
            v = sym(name, n, 0.2)
        else:
            v = sym(name, n, amp_of(shape, amp))
        arrays[name] = mx.array(v.reshape(shape)).astype(mx.bfloat16)
    mx.save_safetensors(os.path.join(path, "depth.safetensors"), arrays, metadata={"format": "mlx"})
    if recipe:
        with open(os.path.join(path, "quant.json"), "w") as f:
            json.dump({"tensors": recipe}, f, indent=1, sort_keys=True)


def make_inputs(variant, speaker, force):
    p = f"{variant}."
    inputs = {"h": mx.array(sym(p + "h", FRAMES * HIDDEN, 1.0).reshape(FRAMES, HIDDEN)).astype(mx.bfloat16),
              "cb0": mx.array(ints(p + "cb0", FRAMES, 2048)),
              "uniform": mx.array(unif(p + "uniform", FRAMES * 31 * 2048).reshape(FRAMES, 31, 2048))}
    if force:
        inputs["force"] = mx.array(ints(p + "force", FRAMES * 32, 2048).reshape(FRAMES, 32))
    if speaker:
        inputs["speaker"] = mx.array(sym(p + "speaker", D, 1.0))
    return inputs


# The quantized paths as issue 24 states them: one rounding of s * q + b (fp32) to the scales' dtype; matmuls
# over those values.
def spec_dense(self, dtype=None):
    codes = mx.dequantize(self.q, mx.ones(self.scales.shape, mx.float32),
                          mx.zeros(self.biases.shape, mx.float32), group_size=self.group_size, bits=self.bits)
    s = mx.repeat(self.scales.astype(mx.float32), self.group_size, axis=-1)
    b = mx.repeat(self.biases.astype(mx.float32), self.group_size, axis=-1)
    w = (s * codes + b).astype(self.scales.dtype)
    return w if dtype is None else w.astype(dtype)


def spec_mm(x, w):
    return x @ (w.dense() if isinstance(w, Q.QW) else w).T


def spec_rows(w, idx):
    return w.dense()[idx] if isinstance(w, Q.QW) else w[idx]


def run_seed(path, dtype, inputs, seed002_verbatim=False):
    saved = (Q.QW.dense, Q.mm, Q.rows)
    if not seed002_verbatim:
        Q.QW.dense, Q.mm, Q.rows = spec_dense, spec_mm, spec_rows
    try:
        seed_depth.D, seed_depth.HEAD = D, D // seed_depth.H
        w = seed_depth.W.load(["depth.safetensors"], path)
        recipe = Q.load_recipe(path)
        audio_in = (Q.take(w, "audio_in.table", recipe), w["audio_in.norm.weight"])
        model = seed_depth.Depth(None, audio_in, dtype=mlx_dtype(dtype), path=path)
        model.set_speaker(inputs.get("speaker"))
        codes, feedback, logits = [], [], []
        force = np.array(inputs["force"]) if "force" in inputs else None
        for t in range(FRAMES):
            lg = []
            c, fb = model.frame(inputs["h"][t], inputs["cb0"][t], inputs["uniform"][t],
                                None if force is None else force[t], lg)
            mx.eval(c, fb, *lg)
            codes.append(c)
            feedback.append(fb)
            logits.append(mx.stack(lg))
        return mx.stack(codes), mx.stack(feedback), mx.stack(logits)
    finally:
        Q.QW.dense, Q.mm, Q.rows = saved


def check_seed_text():
    seeds = os.path.join(ROOT, "..", "shared", "seeds")
    if not os.path.isdir(seeds):
        print("../shared/seeds absent: the reference's text is not checked against the seeds")
        return
    for ours, prefix, strip in (("depth.py", "004_", r"\s"), ("quant.py", "002_", r"[\s|]")):
        seed = [f for f in os.listdir(seeds) if f.startswith(prefix)][0]
        a = re.sub(strip, "", open(os.path.join(seeds, seed)).read())
        b = re.sub(strip, "", open(os.path.join(ROOT, "scripts", "depth_reference", ours)).read())
        if a != b:
            sys.exit(f"scripts/depth_reference/{ours} differs from seed {seed} beyond whitespace")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "model", "fixtures", "depth"))
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS))
    ap.add_argument("--write-model", metavar="DIR",
                    help="only write the first variant's model directory and DIR/inputs.safetensors")
    ap.add_argument("--shape", metavar="D,FFN,RANK,HIDDEN,FRAMES",
                    help="with --write-model: other sizes (the seed's: 1024,4096,256,2048 for a speed test)")
    args = ap.parse_args()
    if args.shape:
        global D, FFN, RANK, HIDDEN, FRAMES
        D, FFN, RANK, HIDDEN, FRAMES = (int(v) for v in args.shape.split(","))
    if args.write_model:
        dtype, quantized, speaker, force = VARIANTS[args.variants[0]]
        os.makedirs(args.write_model, exist_ok=True)
        write_model(args.write_model, quantized, dtype)
        mx.save_safetensors(os.path.join(args.write_model, "inputs.safetensors"),
                            make_inputs(args.variants[0], speaker, force), metadata={"format": "mlx"})
        return
    check_seed_text()
    mx.set_default_device(mx.cpu)
    for variant in args.variants:
        dtype, quantized, speaker, force = VARIANTS[variant]
        with tempfile.TemporaryDirectory() as tmp:
            write_model(tmp, quantized, dtype)
            inputs = make_inputs(variant, speaker, force)
            codes, feedback, logits = run_seed(tmp, dtype, inputs)
            info = {"dtype": dtype, "quantized": quantized, "speaker": speaker, "force": force, "frames": FRAMES,
                    "mlx": mx.__version__,
                    "logits_sha256": [hashlib.sha256(np.array(logits[t].view(mx.uint16 if dtype != "float32"
                                                                             else mx.uint32)).tobytes()).hexdigest()
                                      for t in range(FRAMES)]}
            if quantized:
                verbatim, _, _ = run_seed(tmp, dtype, inputs, seed002_verbatim=True)
                info["seed002_quantized_matmul_codes_differing"] = int((verbatim != codes).sum())
        out = os.path.join(args.out, variant)
        os.makedirs(out, exist_ok=True)
        mx.save_safetensors(os.path.join(out, "expected.safetensors"),
                            {"codes": codes, "feedback": feedback, "logits0": logits[0]}, metadata={"format": "mlx"})
        with open(os.path.join(out, "expected.json"), "w") as f:
            json.dump(info, f, indent=1)
            f.write("\n")
        print(variant, "codes[0]", np.array(codes[0]).tolist()[:8], "...")


if __name__ == "__main__":
    main()
