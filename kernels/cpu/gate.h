// Output gate of the gated attention block on the CPU: x *= sigmoid(g), same contract as
// ref::sigmoid_gate_mul (kernels/ref/gate.h); within 1e-6 relative of the reference. And the
// split of the q projection into query and gate.
#pragma once
#include <cstdint>

#include "kernels/cpu/cpu_features.h"

namespace alloy::cpu {

// x: [n] gated in place; g: [n] gate logits. Large n runs on the pool.
void sigmoid_gate_mul(float* x, const float* g, int64_t n);
// Same on an explicit ISA path (tests).
void sigmoid_gate_mul(float* x, const float* g, int64_t n, Isa isa);

// qg [rows, 2 * hd] -> q [rows, hd], gate [rows, hd], as ref::split_q_gate (exact copies).
// Large inputs run on the pool (a 512-token prefill piece copies 8 MiB).
void split_q_gate(const float* qg, int64_t rows, int hd, float* q, float* gate);

}  // namespace alloy::cpu
