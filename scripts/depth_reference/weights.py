"""The `weights` import of seed 004, as a shim: load safetensors files of a model folder into one dict."""
import os

import mlx.core as mx

DEFAULT_DIR = "."


def load(files, path=DEFAULT_DIR):
    out = {}
    for f in files:
        out.update(mx.load(os.path.join(path, f)))
    return out
