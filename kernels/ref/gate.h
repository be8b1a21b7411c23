// Output gate of the gated attention block, reference: x *= sigmoid(g) (spec/MODEL.md
// section 4 step 6).
#pragma once
#include <cstdint>

namespace alloy::ref {

// x: [n] gated in place; g: [n] gate logits.
void sigmoid_gate_mul(float* x, const float* g, int64_t n);

// The same over rows of n with the gate rows g_stride apart: the q projection of the gated
// attention block holds, per (token, head), the query and then its gate (g = qg + hd,
// g_stride = 2 hd).
void sigmoid_gate_mul(float* x, const float* g, int64_t rows, int64_t n, int64_t g_stride);

}  // namespace alloy::ref
