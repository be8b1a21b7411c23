// RMSNorm on the CPU, same contract as ref::rms_norm (kernels/ref/rms_norm.h):
// out = x / sqrt(mean(x^2) + eps) * w. The sum of squares is accumulated in double as in the
// reference, so the results agree to an ulp or two.
#pragma once
#include <cstdint>

#include "kernels/cpu/cpu_features.h"

namespace alloy::cpu {

// x, out: [rows, n] (out may alias x); w: [n] (nullptr = no weight). Rows run on the pool
// only when rows * n is large.
void rms_norm(const float* x, const float* w, float* out, int64_t rows, int64_t n, float eps);
// Same on an explicit ISA path (tests); Avx2 runs the portable path.
void rms_norm(const float* x, const float* w, float* out, int64_t rows, int64_t n, float eps, Isa isa);

}  // namespace alloy::cpu
