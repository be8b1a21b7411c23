// SwiGLU combine on the CPU: out = silu(gate) * up, same contract as ref::swiglu
// (kernels/ref/swiglu.h); within 1e-6 relative of the reference (vector exp, ~2 ulp).
#pragma once
#include <cstdint>

#include "kernels/cpu/cpu_features.h"

namespace alloy::cpu {

// gate, up, out: [n]; out may alias gate or up. Large n runs on the pool.
void swiglu(const float* gate, const float* up, float* out, int64_t n);
// Same on an explicit ISA path (tests).
void swiglu(const float* gate, const float* up, float* out, int64_t n, Isa isa);

}  // namespace alloy::cpu
