// Residual add, reference: x += y.
#pragma once
#include <cstdint>

namespace alloy::ref {

// x: [n] updated in place; y: [n].
void add(float* x, const float* y, int64_t n);

}  // namespace alloy::ref
