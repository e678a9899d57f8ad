#!/usr/bin/env python3
"""Writes the tokenizer conformance fixtures of tests/model/fixtures/ from the reference libraries.

The ids come from the `tokenizers` (Hugging Face) and `sentencepiece` packages of PyPI:
    python3 -m pip install tokenizers sentencepiece
    python3 scripts/make_tokenizer_fixtures.py [--shared ../shared]
tests/model/tokenizer_*_test.cpp compare lowbit's ids with these.
"""
import argparse
import json
import pathlib

import sentencepiece
import tokenizers

CASES = {
    "multilingual": (
        "Hello, world! It's 2024-06-01; I'LL pay $1,234.56 (or 7890 ¥).\n"
        "  Leading spaces,\ttabs\t\tand     runs of spaces.   \n\n\r\n"
        "Ünïcödé: café naïve résumé — “quotes” … ½ ² ⅷ\n"
        "中文测试：你好，世界！日本語のテキスト、カタカナ。한국어 텍스트.\n"
        "Emoji: 😀👍🏽 🇩🇪 👨‍👩‍👧‍👦 ❤️\n"
        "Русский текст и ελληνικά, עברית, العربية, हिन्दी.\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|endoftext|>"
        "code: def f(x):\n    return x**2  # comment\n"
    ),
    # Decomposed accents (NFD) that NFC composes before tokenization.
    "nfd": "cafe\u0301 nai\u0308ve A\u030a e\u0301te\u0301",
    "specials_only": "<|im_start|><|im_end|><|endoftext|>",
    "whitespace": "   \n\n\n    \t \u00a0 \u3000x  y\n",
}


def qwen3(path: pathlib.Path) -> dict:
    tok = tokenizers.Tokenizer.from_file(str(path))
    out = {}
    for name, text in CASES.items():
        ids = tok.encode(text, add_special_tokens=False).ids
        tok.encode_special_tokens = True
        ids_plain = tok.encode(text, add_special_tokens=False).ids
        tok.encode_special_tokens = False
        out[name] = {"ids": ids, "ids_no_special": ids_plain,
                     "decoded": tok.decode(ids, skip_special_tokens=False)}
    return out


def llama2(path: pathlib.Path) -> dict:
    sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
    return {name: {"ids": sp.encode(text), "decoded": sp.decode(sp.encode(text))} for name, text in CASES.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    root = pathlib.Path(__file__).resolve().parent.parent
    parser.add_argument("--shared", type=pathlib.Path, default=root.parent / "shared")
    parser.add_argument("--out", type=pathlib.Path, default=root / "tests/model/fixtures")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    fixtures = {
        "qwen3": ("tokenizers/qwen3/tokenizer.json", qwen3, f"tokenizers {tokenizers.__version__}"),
        "llama2": ("tokenizers/llama2/tokenizer.model", llama2, f"sentencepiece {sentencepiece.__version__}"),
    }
    for name, (rel, make, library) in fixtures.items():
        doc = {"tokenizer": rel, "library": library, "texts": CASES, "expected": make(args.shared / rel)}
        path = args.out / f"tokenizer_{name}.json"
        path.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
