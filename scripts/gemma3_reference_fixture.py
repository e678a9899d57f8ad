#!/usr/bin/env python3
"""Writes tests/model/fixtures/gemma3_270m_llama_cpp.json, llama.cpp's results on Gemma-3-270M Q4_K_M that
tests/model/gemma3_gguf_test.cpp and tests/eval/gemma3_ppl_test.cpp hold lowbit to, from the outputs of
scripts/llamacpp_refs.sh (llama.cpp of the PyPI sdist llama-cpp-python 0.3.36, CPU):
    scripts/llamacpp_refs.sh CACHE_DIR OUT_DIR && python3 scripts/gemma3_reference_fixture.py OUT_DIR
Kept: each prompt's ids, the top-5 logits after it and 64 greedy ids (greedy.json), the 64 greedy ids of llama.cpp
computing in float32 (but for its fp16 GELU table) on the same weights (greedy_f32.json), WikiText-2 test's token count
and first ids, and llama-perplexity's estimate after its first two windows of 512 tokens ("[2]" in perplexity.log),
which lowbit's test scores from the file's first PREFIX_BYTES bytes (2 whole windows; llama-perplexity gives the
same 14.8531 on that prefix itself). scripts/gemma3_f64_reference.py then adds the float64 reference.
"""
import json
import pathlib
import re
import sys

PREFIX_BYTES = 5400
WINDOWS = 2
ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tests/model/fixtures/gemma3_270m_llama_cpp.json"


def main():
    refs = pathlib.Path(sys.argv[1])
    greedy = json.loads((refs / "greedy.json").read_text())
    greedy_f32 = {r["prompt"]: r for r in json.loads((refs / "greedy_f32.json").read_text())["runs"]}
    running = [float(v) for v in re.findall(r"\[\d+\]([0-9.]+),", (refs / "perplexity.log").read_text())]
    fixture = {
        "about": "llama.cpp's results on Gemma-3-270M Q4_K_M (scripts/gemma3_model.sh), written by "
                 "scripts/gemma3_reference_fixture.py from scripts/llamacpp_refs.sh's outputs (llama.cpp of the PyPI "
                 "sdist llama-cpp-python 0.3.36, CPU, n_ctx 512).",
        "prompts": [{"prompt": r["prompt"], "prompt_ids": r["prompt_ids"],
                     "top5": [{"id": t["id"], "logit": round(t["logit"], 4)} for t in r["top5_after_prompt"]],
                     "greedy_ids": r["generated_ids"], "greedy_text": r["generated_text"],
                     "greedy_f32_ids": greedy_f32[r["prompt"]]["generated_ids"]} for r in greedy["runs"]],
        "wikitext": {"file": "data/wikitext-2-raw/wiki.test.raw", "tokens": greedy["tokenize_file"]["n_tokens_total"],
                     "first_ids": greedy["tokenize_file"]["first_ids"]},
        "perplexity": {"file": "data/wikitext-2-raw/wiki.test.raw", "ctx": 512, "prefix_bytes": PREFIX_BYTES,
                       "windows": WINDOWS, "llama_perplexity": running[WINDOWS - 1]},
    }
    text = json.dumps(fixture, indent=1, ensure_ascii=False)
    text = re.sub(r"\[\s*([-0-9.,\s]+?)\s*\]",
                  lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]", text)
    OUT.write_text(text + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
