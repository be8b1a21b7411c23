// Options of the commands that reach below include/alloy on purpose: the benchmarks (bench,
// batched-bench and profile time the model's forward and its kernels themselves, as DESIGN.md
// allows bench to). Everything else goes through include/alloy.
#pragma once
#include <string>

#include "cli/common.h"
#include "format/ggml_types.h"
#include "format/gguf.h"
#include "model/qwen35.h"

namespace alloy::cli {

// Validates every option (ModelOptions::validate) and sets the thread count.
ForwardOptions forward_options(const ModelOptions& o);
KvCacheTypes kv_types(const ModelOptions& o);  // throws naming -ctk/-ctv and the bad value
inline gguf::TensorData tensor_data(const ModelOptions& o) {
    return o.mmap ? gguf::TensorData::Mapped : gguf::TensorData::Resident;
}
// KV cache type of flag `flag`: f32 | f16 | bf16; throws naming both.
GgmlType parse_cache_type(const std::string& s, const char* flag);

}  // namespace alloy::cli
