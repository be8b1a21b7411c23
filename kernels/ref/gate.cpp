#include "kernels/ref/gate.h"

#include "kernels/ref/activations.h"

namespace alloy::ref {

void sigmoid_gate_mul(float* x, const float* g, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] *= sigmoid(g[i]);
}

void sigmoid_gate_mul(float* x, const float* g, int64_t rows, int64_t n, int64_t g_stride) {
    for (int64_t r = 0; r < rows; ++r) sigmoid_gate_mul(x + r * n, g + r * g_stride, n);
}

}  // namespace alloy::ref
