#!/usr/bin/env python3
"""Generates the tokenizer test vectors from Hugging Face `tokenizers` (the reference).

Reads tests/tokenizer/data/corpus.json (a list of strings) and the Qwen3 tokenizer.json from
shared/testdata, writes tests/tokenizer/data/qwen3_vectors.json with, per corpus entry:
  ids          HF encode(text, add_special_tokens=False).ids   (= our encode(text, parse_special=true))
  ids_plain    the same tokenizer with its added tokens removed (= our encode(text, parse_special=false))
  ids_qwen35   Qwen3 vocab with the Qwen3.5 split regex and no normalizer (the Qwen3.5 pipeline;
               its low ids agree with the spec's Qwen3.5 test vectors)
  pieces_qwen2 / pieces_qwen35
               pre_tokenizers.Split(Regex(r), behavior="isolated") on the raw text
Usage: python3 scripts/make_tokenizer_vectors.py [--tokenizer PATH]
"""
import argparse
import json
import os

import tokenizers
from tokenizers import Regex, Tokenizer, pre_tokenizers
from vectors_json import write_vectors

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "tokenizer", "data")
DEFAULT_TOKENIZER = os.path.join(ROOT, "testdata", "qwen3-tokenizer", "tokenizer.json")

QWEN35_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def splitter(regex):
    return pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", default=DEFAULT_TOKENIZER)
    args = ap.parse_args()

    with open(args.tokenizer, encoding="utf-8") as f:
        spec = json.load(f)
    qwen2_regex = spec["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]

    full = Tokenizer.from_str(json.dumps(spec))
    plain_spec = dict(spec, added_tokens=[])
    plain = Tokenizer.from_str(json.dumps(plain_spec))
    q35_spec = json.loads(json.dumps(spec))
    q35_spec["normalizer"] = None
    q35_spec["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = QWEN35_REGEX
    q35 = Tokenizer.from_str(json.dumps(q35_spec))
    split2, split35 = splitter(qwen2_regex), splitter(QWEN35_REGEX)

    with open(os.path.join(DATA, "corpus.json"), encoding="utf-8") as f:
        corpus = json.load(f)
    cases = []
    for text in corpus:
        cases.append({
            "text": text,
            "ids": full.encode(text, add_special_tokens=False).ids,
            "ids_plain": plain.encode(text, add_special_tokens=False).ids,
            "ids_qwen35": q35.encode(text, add_special_tokens=False).ids,
            "pieces_qwen2": [p for p, _ in split2.pre_tokenize_str(text)],
            "pieces_qwen35": [p for p, _ in split35.pre_tokenize_str(text)],
        })
    out = {"generator": "scripts/make_tokenizer_vectors.py",
           "tokenizers_version": tokenizers.__version__,
           "tokenizer": "shared/testdata/qwen3-tokenizer/tokenizer.json",
           "cases": cases}
    path = os.path.join(DATA, "qwen3_vectors.json")
    write_vectors(path, {k: v for k, v in out.items() if k != "cases"}, cases)
    print(f"wrote {len(cases)} cases to {path}")


if __name__ == "__main__":
    main()
