// Causal softmax attention with grouped KV heads, reference. Query head h reads KV head
// h / (n_head / n_head_kv) (standard repeat_kv). Token t of the batch sits at absolute position
// n_past + t and attends to cache positions [0, n_past + t].
#pragma once
#include <cstdint>

namespace alloy::ref {

struct AttentionShape {
    int n_head = 0, n_head_kv = 0, head_dim = 0;
    float scale = 0;  // usually 1/sqrt(head_dim)
};

// q: [T, n_head, head_dim]; k_cache, v_cache: [n_ctx, n_head_kv, head_dim] with rows
// [0, n_past + T) filled; out: [T, n_head, head_dim].
void attention(const AttentionShape& s, const float* q, const float* k_cache,
               const float* v_cache, float* out, int64_t T, int64_t n_past);

}  // namespace alloy::ref
