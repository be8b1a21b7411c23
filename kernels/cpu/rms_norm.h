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
// Same on an explicit ISA path (tests).
void rms_norm(const float* x, const float* w, float* out, int64_t rows, int64_t n, float eps, Isa isa);

// One row of rms_norm on a path, for ops that normalize rows inside their own loops
// (rms_norm_rope): no pool check, no per-call dispatch.
using RmsNormRow = void (*)(const float* x, const float* w, float* out, int64_t n, float eps);
RmsNormRow rms_norm_row(Isa isa);

// The residual add and the RMSNorm after it, as ref::add_rms_norm: x += y, then out =
// rms_norm(x), row by row while the row is in L1 (one pass over the residual stream instead
// of two). Same bits as cpu::add then cpu::rms_norm.
void add_rms_norm(float* x, const float* y, const float* w, float* out, int64_t rows, int64_t n, float eps);
void add_rms_norm(float* x, const float* y, const float* w, float* out, int64_t rows, int64_t n, float eps, Isa isa);

}  // namespace alloy::cpu
