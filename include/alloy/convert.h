// Public API: convert a Hugging Face Qwen3.5 / Qwen3.6 checkpoint (config.json + safetensors)
// to GGUF as llama.cpp's converter writes it (model/convert_qwen35.h has the facts).
#pragma once
#include <string>

namespace alloy {

struct ConvertRequest {
    std::string hf_dir;
    std::string out_path;
    std::string dtype = "bf16";   // matrices: f32 | f16 | bf16 | q8_0
    std::string tokenizer_json;   // default: <hf_dir>/tokenizer.json when present
    bool keep_mtp = true;         // llama.cpp's default: the MTP block is kept
};

// Returns a one-line summary; throws alloy::Error naming the file, tensor, field or dtype that
// is wrong.
std::string convert_model(const ConvertRequest& request);

}  // namespace alloy
