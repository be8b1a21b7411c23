// Synthetic Qwen3.5 models: random weights with sane scales under the exact tensor names,
// shapes, types and metadata that llama.cpp's converter writes, so the same file runs in
// llama.cpp and here. Scales follow shared/anchors/cpu-peer.md (matrices N(0, 0.02), norms
// 1 + N(0, 0.02), conv U(+-1/2), ssm_a = -U(1, 16), dt bias = softplus^-1(logU(1e-3, 1e-1))).
#pragma once
#include <cstdint>
#include <string>

#include "format/ggml_types.h"

namespace alloy {

struct SynthOptions {
    std::string preset = "tiny";      // tiny | 0.8b | 2b | 4b | 9b | 27b | moe-tiny | 35b-a3b
    GgmlType dtype = GgmlType::Q8_0;  // matrices; 1-D tensors, norms and conv taps stay F32
    std::string tokenizer_json;       // vocabulary to embed: tokenizer.json, .gguf or .tiktoken; empty: built in
    std::string out_path;
    uint64_t seed = 42;
    int n_layer = 0;                  // 0: the preset's; else this many (every 4th is attention)
    bool mtp = false;                 // also an MTP block (blk.{n_layer}, nextn_predict_layers 1)
};

std::string synth_qwen35(const SynthOptions& opt);  // returns a one-line summary

// "f32" | "f16" | "bf16" | "q8_0" -> the matrix type of synth and convert; throws naming `what`.
GgmlType matrix_dtype(const std::string& name, const std::string& what);

}  // namespace alloy
