// `alloy quantize`: rewrites a GGUF model with its weights in another type, choosing each
// tensor's type as llama-quantize does (llama.cpp src/llama-quant.cpp, llama_tensor_get_type:
// the "mixes" that give attn_v / attn_qkv / ffn_down / the output more bits in some layers),
// and quantizing with ggml's reference quantizers (format/quant.h). Without an importance
// matrix llama-quantize's output is a pure function of the input, so ours is byte-identical
// to it (tests/model/test_quantize.cpp holds llama-quantize's hashes).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "format/ggml_types.h"

namespace alloy {

namespace gguf {
class File;
}

// llama.cpp's llama_ftype numbers (what general.file_type holds); the ones alloy can write.
enum class FileType : uint32_t {
    F32 = 0, F16 = 1, Q4_0 = 2, Q8_0 = 7, Q4_K_S = 14, Q4_K_M = 15, Q5_K_S = 16, Q5_K_M = 17, Q6_K = 18,
    IQ4_NL = 25, IQ4_XS = 30, BF16 = 32, MXFP4_MOE = 38,
};

// "Q4_K_M", "q8_0", ... (case-insensitive); throws alloy::Error listing the valid names.
FileType parse_file_type(const std::string& name);
const char* file_type_name(FileType t);
std::vector<std::string> file_type_names();

struct QuantizeOptions {
    FileType type = FileType::Q8_0;
    int threads = 0;                     // 0: all hardware threads
    bool allow_requantize = false;       // accept already-quantized inputs (llama-quantize's flag)
    bool pure = false;                   // no mixes: every quantizable tensor gets the base type
    std::optional<GgmlType> output_type;      // --output-tensor-type
    std::optional<GgmlType> token_embd_type;  // --token-embedding-type
};

struct TensorQuantPlan {
    std::string name;
    GgmlType from = GgmlType::F32;
    GgmlType to = GgmlType::F32;
    std::vector<int64_t> ne;
    bool fell_back = false;  // the chosen type did not fit ne[0]; `to` is llama-quantize's fallback
};

// Every tensor of `file` in llama-quantize's output order (layer number, then name) with
// the type it gets. Throws alloy::Error naming the tensor when a type alloy cannot write
// would be needed (e.g. a Q5_0 fallback).
std::vector<TensorQuantPlan> plan_quantization(const gguf::File& file, const QuantizeOptions& opt);

struct QuantizeReport {
    std::vector<TensorQuantPlan> tensors;
    uint64_t bytes_in = 0;   // tensor bytes read
    uint64_t bytes_out = 0;  // tensor bytes written
    uint64_t n_elements = 0;
};

// Reads `in`, writes `out` (via "<out>.tmp", renamed when complete). Errors name the file and
// tensor.
QuantizeReport quantize_file(const std::string& in, const std::string& out, const QuantizeOptions& opt);

}  // namespace alloy
