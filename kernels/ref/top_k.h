// The k most likely tokens of logits rows, reference: what a sampler with top-k needs, so a GPU
// can hand the host k (value, id) pairs a row instead of the whole row (cuda::top_k gives the
// same pairs in the same order).
#pragma once
#include <cstdint>
#include <vector>

namespace alloy::ref {

// The order of the pairs: larger value first, the lower id on ties; -0 equals +0, and every NaN
// (any sign or payload) ranks above +inf and equal to the other NaNs (greedy_token's rule, so
// top-1 is the greedy token). As an unsigned key: larger key = earlier.
inline uint32_t top_k_value_key(float v) {
    uint32_t u;
    __builtin_memcpy(&u, &v, 4);
    if (v == 0.0f) u = 0;
    if (v != v) return 0xffffffffu;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// logits [rows, n]; values, ids [rows, k] (k <= n): row r's k first pairs in the order above.
// scratch: n keys' memory kept by a caller that calls per token (nullptr: allocated here).
void top_k(const float* logits, int64_t rows, int64_t n, int k, float* values, int32_t* ids,
           std::vector<uint64_t>* scratch = nullptr);

}  // namespace alloy::ref
