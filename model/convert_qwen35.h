// Hugging Face Qwen3.5 text checkpoint (safetensors + config.json) -> GGUF, with exactly the
// tensor names, layouts and transforms of llama.cpp's converter (spec/GGUF.md section 6):
// +1 on zero-centred norms, ssm_a = -exp(A_log), conv taps squeezed, value heads reordered
// grouped -> tiled, MTP block appended as blk.L.nextn.*. Accepts the text-only layout
// (model.*) and the multimodal wrapper (config.text_config, model.language_model.*; the
// vision tower model.visual.* is skipped).
#pragma once
#include <string>

#include "format/ggml_types.h"

namespace alloy {

struct ConvertOptions {
    std::string hf_dir;
    std::string out_path;
    GgmlType dtype = GgmlType::BF16;  // matrices; 1-D tensors, norms and conv taps stay F32
    std::string tokenizer_json;       // default: <hf_dir>/tokenizer.json when present
    bool keep_mtp = true;             // llama.cpp's default: the MTP block is kept
};

// Returns a one-line summary; throws alloy::Error naming the file/tensor/field that was wrong.
std::string convert_hf_qwen35(const ConvertOptions& opt);

}  // namespace alloy
