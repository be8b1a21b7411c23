// Matrix product with a GGUF weight, reference: y[t][o] = sum_i W[o][i] * x[t][i].
// Dequantizes each weight row and accumulates in double: slow, obviously correct.
#pragma once
#include "kernels/ref/weight.h"

namespace alloy::ref {

// x: [T, W.n_in]; y: [T, W.n_out].
void matmul(const WeightView& W, const float* x, float* y, int64_t T);

}  // namespace alloy::ref
