// Output gate of the gated attention block, reference: x *= sigmoid(g) (spec/MODEL.md
// section 4 step 6).
#pragma once
#include <cstdint>

namespace alloy::ref {

// x: [n] gated in place; g: [n] gate logits.
void sigmoid_gate_mul(float* x, const float* g, int64_t n);

}  // namespace alloy::ref
