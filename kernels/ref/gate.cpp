#include "kernels/ref/gate.h"

#include "kernels/ref/activations.h"

namespace alloy::ref {

void sigmoid_gate_mul(float* x, const float* g, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] *= sigmoid(g[i]);
}

}  // namespace alloy::ref
