// RMSNorm, reference. out = x / sqrt(mean(x^2) + eps) * w   (GGUF weights: +1 already folded).
#pragma once
#include <cstdint>

namespace alloy::ref {

// x, out: [rows, n] (out may alias x); w: [n] (nullptr = no weight).
void rms_norm(const float* x, const float* w, float* out, int64_t rows, int64_t n, float eps);
// The residual add and the RMSNorm after it: x += y, then out = rms_norm(x) (x: [rows, n]
// updated in place; out must not alias x or y).
void add_rms_norm(float* x, const float* y, const float* w, float* out, int64_t rows, int64_t n, float eps);

}  // namespace alloy::ref
