// Causal softmax attention with grouped KV heads, reference. Query head h reads KV head
// h / (n_head / n_head_kv) (standard repeat_kv). Token t of the batch sits at absolute position
// n_past + t and attends to cache positions [0, n_past + t].
//
// The K and V caches hold F32, F16 or BF16 elements (type_k, type_v; kernels/ref/kv_store.h).
// A 16-bit cache is read by exact conversion to fp32: the math is defined on the rounded
// values, so every implementation is compared with this one on the same cache bytes.
#pragma once
#include <cstdint>

#include "format/ggml_types.h"

namespace alloy::ref {

struct AttentionShape {
    int n_head = 0, n_head_kv = 0, head_dim = 0;
    float scale = 0;  // usually 1/sqrt(head_dim)
    GgmlType type_k = GgmlType::F32, type_v = GgmlType::F32;  // cache element types: F32, F16, BF16
};

// q: [T, n_head, head_dim] fp32; k_cache, v_cache: [n_ctx, n_head_kv, head_dim] of type_k /
// type_v with rows [0, n_past + T) filled (rows past that are never read); out:
// [T, n_head, head_dim] fp32. Throws alloy::Error for a cache type other than F32/F16/BF16.
void attention(const AttentionShape& s, const float* q, const void* k_cache,
               const void* v_cache, float* out, int64_t T, int64_t n_past);

}  // namespace alloy::ref
