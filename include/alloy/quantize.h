// Public API: rewrite a GGUF model in another quantization type, as llama.cpp's llama-quantize
// does (the same per-tensor mixes and bytes; no importance matrix). Types are named as
// llama-quantize names them, so callers need no internal type.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace alloy {

struct QuantizeRequest {
    std::string input, output;
    std::string type;                  // "Q4_K_M", "q8_0", ... (quantize_type_names())
    int threads = 0;                   // 0: all hardware threads
    bool allow_requantize = false;     // accept already-quantized tensors
    bool pure = false;                 // no mixes: every quantizable tensor gets the base type
    bool dry_run = false;              // plan and size only, write nothing
    std::string output_tensor_type;    // e.g. "q8_0" for output.weight; empty: the mix's choice
    std::string token_embedding_type;  // likewise for token_embd.weight
};

struct QuantizedTensor {
    std::string name;
    std::vector<int64_t> shape;
    std::string from, to;  // ggml type names
    bool fell_back = false;  // the mix's type did not fit the row length; `to` is the fallback
};

struct QuantizeResult {
    std::vector<QuantizedTensor> tensors;  // in the output file's order
    uint64_t bytes_in = 0, bytes_out = 0, n_elements = 0;
};

std::vector<std::string> quantize_type_names();
// Throws alloy::Error naming the file, tensor, type or option that is wrong.
QuantizeResult quantize_model(const QuantizeRequest& request);

}  // namespace alloy
