// Matrix product with a GGUF weight on the CPU: y[t][o] = sum_i W[o][i] * x[t][i].
// Contract: within 1e-5 relative of ref::matmul (fp32 accumulation in a different order).
#pragma once
#include "kernels/ref/weight.h"

namespace alloy::cpu {

// x: [T, W.n_in]; y: [T, W.n_out]. Threads: OpenMP over blocks of output rows.
void matmul(const WeightView& W, const float* x, float* y, int64_t T);

}  // namespace alloy::cpu
