// Public API: write a synthetic (random-weight) Qwen3.5 GGUF of a named size, with the exact
// tensor names, shapes and metadata llama.cpp's converter writes (model/synth.h has the facts).
#pragma once
#include <cstdint>
#include <string>

namespace alloy {

struct SynthRequest {
    std::string preset = "tiny";   // tiny | tiny-mqa | 0.8b | 2b | 4b | 9b | 27b | moe-tiny | 35b-a3b
    std::string dtype = "q8_0";    // matrices: f32 | f16 | bf16 | q8_0
    // The vocabulary to embed: a tokenizer.json, a .gguf or a .tiktoken ranks file (Qwen3.5's);
    // empty: the Qwen3.5 / 3.6 vocabulary compiled into the binary.
    std::string tokenizer_json;
    std::string out_path;
    uint64_t seed = 42;
    int n_layer = 0;               // 0: the preset's; else this many (every 4th is attention)
    bool mtp = false;              // also an MTP block (blk.{n_layer}, nextn_predict_layers 1)
};

// Returns a one-line summary; throws alloy::Error naming the bad preset, dtype or path.
std::string synth_model(const SynthRequest& request);

}  // namespace alloy
