// SwiGLU combine, reference: out = silu(gate) * up (spec/MODEL.md section 6).
#pragma once
#include <cstdint>

namespace alloy::ref {

// gate, up, out: [n]; out may alias gate or up.
void swiglu(const float* gate, const float* up, float* out, int64_t n);

}  // namespace alloy::ref
