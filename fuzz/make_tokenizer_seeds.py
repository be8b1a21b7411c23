#!/usr/bin/env python3
"""Writes the seed inputs of fuzz_tokenizer (fuzz/corpus/fuzz_tokenizer): a small byte-level
BPE vocabulary (the 256 byte tokens, a few merges, one special token) as a tokenizer.json
(mode byte 0) and as a GGUF with tokenizer.ggml.* keys (mode byte 1), and a text (mode 2).
The split regex is the one of testdata/qwen3-tokenizer/tokenizer.json."""
import json
import os
import struct

here = os.path.dirname(os.path.abspath(__file__))
out = os.path.join(here, "corpus", "fuzz_tokenizer")


def bytes_to_unicode():  # GPT-2's byte -> printable character table
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


b2u = bytes_to_unicode()
tokens = [b2u[b] for b in range(256)]
merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("l", "l"), ("o", "r")]
for a, b in merges:
    tokens.append(a + b)
special = "<|im_start|>"
with open(os.path.join(here, "..", "testdata", "qwen3-tokenizer", "tokenizer.json"), encoding="utf-8") as f:
    regex = next(s for s in json.load(f)["pre_tokenizer"]["pretokenizers"] if s["type"] == "Split")["pattern"]["Regex"]

tj = {
    "model": {"type": "BPE", "vocab": {t: i for i, t in enumerate(tokens)}, "merges": [[a, b] for a, b in merges]},
    "added_tokens": [{"id": len(tokens), "content": special, "special": True}],
    "normalizer": None,
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
}
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "vocab.json.seed"), "wb") as f:
    f.write(b"\x00" + json.dumps(tj, ensure_ascii=False).encode("utf-8"))


def gguf_str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def kv_str(k, v):
    return gguf_str(k) + struct.pack("<I", 8) + gguf_str(v)


def kv_str_array(k, vs):
    return gguf_str(k) + struct.pack("<IIQ", 9, 8, len(vs)) + b"".join(gguf_str(v) for v in vs)


def kv_i32_array(k, vs):
    return gguf_str(k) + struct.pack("<IIQ", 9, 5, len(vs)) + b"".join(struct.pack("<i", v) for v in vs)


all_tokens = tokens + [special]
types = [1] * len(tokens) + [3]
kvs = [kv_str("general.architecture", "qwen35"), kv_str("tokenizer.ggml.model", "gpt2"),
       kv_str("tokenizer.ggml.pre", "qwen35"), kv_str_array("tokenizer.ggml.tokens", all_tokens),
       kv_i32_array("tokenizer.ggml.token_type", types),
       kv_str_array("tokenizer.ggml.merges", [a + " " + b for a, b in merges])]
gguf = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs)
with open(os.path.join(out, "vocab.gguf.seed"), "wb") as f:
    f.write(b"\x01" + gguf)
with open(os.path.join(out, "text.seed"), "wb") as f:
    f.write(b"\x02" + "the other thing: Hello, world! 12345 \u4f60\u597d caf\u00e9 <|im_start|>user\n".encode("utf-8") + b"\xff\xc3")
# A tiktoken ranks file (qwen35_vocab_from_tiktoken_text): the 256 single bytes, then merged
# tokens of the small vocabulary above, each "base64(bytes) rank".
import base64
from itertools import count
ranked = [bytes([b]) for b in range(256)] + [b"he", b"the", b"ll", b"hello", b" w", b" wor", b" world"]
with open(os.path.join(out, "ranks.tiktoken.seed"), "wb") as f:
    f.write(b"\x03" + b"".join(base64.b64encode(t) + b" " + str(r).encode() + b"\n" for t, r in zip(ranked, count())))
