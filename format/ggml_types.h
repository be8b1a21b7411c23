// ggml tensor element types as GGUF stores them, and the per-type block layout facts
// (spec/GGUF.md section 2). One place for block sizes so every reader agrees.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace alloy {

enum class GgmlType : uint32_t {
    F32 = 0, F16 = 1, Q4_0 = 2, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14, IQ4_NL = 20, IQ4_XS = 23, BF16 = 30, MXFP4 = 39,
};

struct TypeTraits {
    const char* name;
    int64_t block_elems;  // elements per block (1 for plain floats)
    size_t block_bytes;   // bytes per block
};

// Throws alloy::Error naming `what` (e.g. the tensor) if the id is not supported.
const TypeTraits& type_traits(GgmlType t);
bool type_supported(uint32_t raw_type_id);
std::string type_name(uint32_t raw_type_id);  // "q8_0", or "type#41" for unknown ids

// bytes of one row of n elements; n must be a multiple of the block size (checked by caller).
inline size_t row_bytes(GgmlType t, int64_t n) {
    const TypeTraits& tr = type_traits(t);
    return static_cast<size_t>(n / tr.block_elems) * tr.block_bytes;
}

}  // namespace alloy
