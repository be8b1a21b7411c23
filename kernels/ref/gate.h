// Output gate of the gated attention block, reference: x *= sigmoid(g) (spec/MODEL.md
// section 4 step 6).
#pragma once
#include <cstdint>

namespace alloy::ref {

// x: [n] gated in place; g: [n] gate logits.
void sigmoid_gate_mul(float* x, const float* g, int64_t n);

// The q projection of the gated attention block holds, per (token, head) row, the query and
// then its gate: qg [rows, 2 * hd] -> q [rows, hd] and gate [rows, hd].
void split_q_gate(const float* qg, int64_t rows, int hd, float* q, float* gate);

}  // namespace alloy::ref
