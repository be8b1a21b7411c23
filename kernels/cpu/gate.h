// Output gate of the gated attention block on the CPU: x *= sigmoid(g), same contract as
// ref::sigmoid_gate_mul (kernels/ref/gate.h); within 1e-6 relative of the reference.
#pragma once
#include <cstdint>

#include "kernels/cpu/cpu_features.h"

namespace alloy::cpu {

// x: [n] gated in place; g: [n] gate logits. Large n runs on the pool.
void sigmoid_gate_mul(float* x, const float* g, int64_t n);
// Same on an explicit ISA path (tests); Avx2 runs the portable path.
void sigmoid_gate_mul(float* x, const float* g, int64_t n, Isa isa);

}  // namespace alloy::cpu
