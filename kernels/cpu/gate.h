// Output gate of the gated attention block on the CPU: x *= sigmoid(g), same contract as
// ref::sigmoid_gate_mul (kernels/ref/gate.h); within 1e-6 relative of the reference.
#pragma once
#include <cstdint>

#include "kernels/cpu/cpu_features.h"

namespace alloy::cpu {

// x: [n] gated in place; g: [n] gate logits. Large n runs on the pool.
void sigmoid_gate_mul(float* x, const float* g, int64_t n);
// Same on an explicit ISA path (tests).
void sigmoid_gate_mul(float* x, const float* g, int64_t n, Isa isa);

// Rows of n with the gate rows g_stride apart, as the ref overload: the model reads each
// head's gate in place in the interleaved q/gate projection (g = qg + hd, g_stride = 2 hd)
// instead of copying it out first.
void sigmoid_gate_mul(float* x, const float* g, int64_t rows, int64_t n, int64_t g_stride);
void sigmoid_gate_mul(float* x, const float* g, int64_t rows, int64_t n, int64_t g_stride, Isa isa);

}  // namespace alloy::cpu
