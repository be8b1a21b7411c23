// KV cache element storage, reference. A cache holds K or V rows as F32, F16 (IEEE half,
// round to nearest even, as llama.cpp's default type_k = type_v = f16 and F16C's
// vcvtps2ph with _MM_FROUND_TO_NEAREST_INT) or BF16 (round to nearest even, as llama.cpp's
// -ctk bf16 and vLLM's default cache for bf16 models); attention reads them back exactly
// (f16 -> f32 and bf16 -> f32 are exact), so the attention math is defined on the rounded
// values.
#pragma once
#include <cstddef>
#include <cstdint>

#include "format/ggml_types.h"

namespace alloy::ref {

// F32, F16 or BF16; every other type is refused by the cache and the attention kernels.
inline bool kv_type_supported(GgmlType t) {
    return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16;
}
inline size_t kv_elem_bytes(GgmlType t) { return t == GgmlType::F32 ? 4 : 2; }

// dst[0..n) = src[0..n) stored as `type` (F32: copied; F16: alloy::fp32_to_fp16; BF16:
// alloy::fp32_to_bf16).
void kv_store(const float* src, void* dst, GgmlType type, int64_t n);

// Element i of a cache of `type`, as fp32.
float kv_load(const void* src, GgmlType type, int64_t i);

}  // namespace alloy::ref
