#!/usr/bin/env python3
"""Logits of every position of a fixed token sequence from llama.cpp, for the packed-GGUF tests.

Same ctypes API as llamacpp_greedy.py (PYTHONPATH at the llama-cpp-python source tree, LLAMA_CPP_LIB_PATH at a
llama.cpp build). The ids are decoded one at a time, as lowbit's test decodes them, and the logits after each
are recorded, for each model given. Output: JSON {"tokens": [...], "models": {NAME: [[logit...] per position]}}.

usage: llamacpp_logits.py OUT.json TOKENS(comma-separated) NAME=MODEL.gguf...
"""
import json
import sys

import numpy as np
import llama_cpp.llama_cpp as L


def logits_of(path: str, tokens: list[int]) -> list[list[float]]:
    model = L.llama_model_load_from_file(path.encode(), L.llama_model_default_params())
    if not model:
        raise RuntimeError(f"cannot load {path}")
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    cparams = L.llama_context_default_params()
    cparams.n_ctx = len(tokens)
    cparams.n_threads = cparams.n_threads_batch = 1
    ctx = L.llama_init_from_model(model, cparams)
    rows = []
    for t in tokens:
        arr = (L.llama_token * 1)(t)
        if L.llama_decode(ctx, L.llama_batch_get_one(arr, 1)) != 0:
            raise RuntimeError("llama_decode failed")
        ptr = L.llama_get_logits_ith(ctx, -1)
        rows.append([float(f"{x:.7g}") for x in np.ctypeslib.as_array(ptr, shape=(n_vocab,))])
    L.llama_free(ctx)
    L.llama_model_free(model)
    return rows


def main() -> int:
    out, token_arg, *models = sys.argv[1:]
    tokens = [int(t) for t in token_arg.split(",")]
    L.llama_backend_init()
    result = {"tokens": tokens, "models": {}}
    for spec in models:
        name, path = spec.split("=", 1)
        result["models"][name] = logits_of(path, tokens)
    with open(out, "w") as f:
        json.dump(result, f)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
