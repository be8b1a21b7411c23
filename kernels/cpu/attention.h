// Causal GQA attention on the CPU, same contract as ref::attention (kernels/ref/attention.h);
// fp32 accumulation, parallel over (token, head). Within 1e-5 relative of the reference.
#pragma once
#include "kernels/ref/attention.h"

namespace alloy::cpu {

using ref::AttentionShape;
void attention(const AttentionShape& s, const float* q, const float* k_cache,
               const float* v_cache, float* out, int64_t T, int64_t n_past);

}  // namespace alloy::cpu
