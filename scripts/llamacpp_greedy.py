#!/usr/bin/env python3
"""Greedy reference continuations, token ids and last-position top-k logits from llama.cpp.

Uses only the low-level ctypes API of the llama-cpp-python source tree (put its root on PYTHONPATH and point
LLAMA_CPP_LIB_PATH at a llama.cpp build with shared libraries), so the numbers come from the same libllama as
the llama.cpp command-line tools. It follows llama-simple: the prompt is tokenized with the model's special
tokens (BOS for Gemma), decoded as one batch, then one token at a time, taking the argmax of the logits.
Each step also records the chosen token's lead over the runner-up (top2 = [[id, logit], [id, logit]]), so a
departure from another implementation can be told apart as a near tie or not.

--kv-type and --flash-attn set the context's KV cache type and flash attention (llama.cpp's defaults: f16,
auto); f32 with flash attention off, on an all-F32 GGUF, keeps the CPU forward in float32 but for GELU, which
ggml's CPU backend always looks up in an fp16 table (GGML_GELU_FP16).

usage: llamacpp_greedy.py MODEL.gguf OUT.json N_PREDICT PROMPT... [--tokenize-file TEXT --tokenize-count N]
       [--kv-type f16|f32] [--flash-attn auto|on|off]
"""
import argparse
import ctypes
import json
import sys

import numpy as np
import llama_cpp.llama_cpp as L


def tokenize(vocab, text: bytes, add_special: bool) -> list[int]:
    capacity = len(text) + 8
    buf = (L.llama_token * capacity)()
    n = L.llama_tokenize(vocab, text, len(text), buf, capacity, add_special, False)
    if n < 0:
        raise RuntimeError(f"llama_tokenize needs {-n} tokens, had room for {capacity}")
    return list(buf[:n])


def piece(vocab, token: int) -> bytes:
    buf = ctypes.create_string_buffer(256)
    n = L.llama_token_to_piece(vocab, token, buf, len(buf), 0, True)
    if n < 0:
        raise RuntimeError(f"token {token}: piece longer than {len(buf)} bytes")
    return buf.raw[:n]


def decode(ctx, tokens: list[int]) -> None:
    arr = (L.llama_token * len(tokens))(*tokens)
    if L.llama_decode(ctx, L.llama_batch_get_one(arr, len(tokens))) != 0:
        raise RuntimeError("llama_decode failed")


def last_logits(ctx, n_vocab: int) -> np.ndarray:
    ptr = L.llama_get_logits_ith(ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(n_vocab,)).copy()


def top_k(vocab, logits: np.ndarray, k: int) -> list[dict]:
    ids = np.argsort(-logits, kind="stable")[:k]
    return [{"id": int(i), "logit": float(logits[i]), "piece": piece(vocab, int(i)).decode("utf-8", "replace")}
            for i in ids]


KV_TYPES = {"f16": L.GGML_TYPE_F16, "f32": L.GGML_TYPE_F32}
FLASH_ATTN = {"auto": L.LLAMA_FLASH_ATTN_TYPE_AUTO, "on": L.LLAMA_FLASH_ATTN_TYPE_ENABLED,
              "off": L.LLAMA_FLASH_ATTN_TYPE_DISABLED}


def top2(logits: np.ndarray) -> list[list]:
    first, second = np.argsort(-logits, kind="stable")[:2]
    return [[int(first), float(logits[first])], [int(second), float(logits[second])]]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("n_predict", type=int)
    ap.add_argument("prompts", nargs="+")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokenize-file", help="also record the first ids of this file, tokenized as llama-perplexity does")
    ap.add_argument("--tokenize-count", type=int, default=64)
    ap.add_argument("--kv-type", choices=KV_TYPES, default="f16")
    ap.add_argument("--flash-attn", choices=FLASH_ATTN, default="auto")
    args = ap.parse_args()
    file_text = None
    if args.tokenize_file:  # read first: a missing file should fail before minutes of generation
        with open(args.tokenize_file, "rb") as f:
            file_text = f.read()

    L.llama_backend_init()
    mparams = L.llama_model_default_params()
    model = L.llama_model_load_from_file(args.model.encode(), mparams)
    if not model:
        raise RuntimeError(f"cannot load {args.model}")
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)

    cparams = L.llama_context_default_params()
    cparams.n_ctx = 512
    cparams.n_batch = 512
    cparams.n_threads = args.threads
    cparams.n_threads_batch = args.threads
    cparams.type_k = cparams.type_v = KV_TYPES[args.kv_type]
    cparams.flash_attn_type = FLASH_ATTN[args.flash_attn]
    ctx = L.llama_init_from_model(model, cparams)

    result = {"model": args.model, "n_predict": args.n_predict, "n_vocab": n_vocab, "kv_type": args.kv_type,
              "flash_attn": args.flash_attn, "runs": []}
    for prompt in args.prompts:
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        prompt_ids = tokenize(vocab, prompt.encode(), add_special=True)
        decode(ctx, prompt_ids)
        logits = last_logits(ctx, n_vocab)
        run = {"prompt": prompt, "prompt_ids": prompt_ids, "top5_after_prompt": top_k(vocab, logits, 5)}
        generated, steps, text = [], [], b""
        for _ in range(args.n_predict):
            token = int(np.argmax(logits))
            steps.append(top2(logits))
            if L.llama_vocab_is_eog(vocab, token):
                run["stopped_at_eog"] = token
                break
            generated.append(token)
            text += piece(vocab, token)
            decode(ctx, [token])
            logits = last_logits(ctx, n_vocab)
        run["generated_ids"] = generated
        run["generated_text"] = text.decode("utf-8", "replace")
        run["top2"] = steps
        result["runs"].append(run)

    if file_text is not None:
        ids = tokenize(vocab, file_text, add_special=True)
        result["tokenize_file"] = {"path": args.tokenize_file, "n_tokens_total": len(ids),
                                   "first_ids": ids[:args.tokenize_count]}

    L.llama_free(ctx)
    L.llama_model_free(model)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1, ensure_ascii=False)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
