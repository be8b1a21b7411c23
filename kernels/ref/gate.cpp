#include "kernels/ref/gate.h"

#include "kernels/ref/activations.h"

namespace alloy::ref {

void sigmoid_gate_mul(float* x, const float* g, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] *= sigmoid(g[i]);
}

void split_q_gate(const float* qg, int64_t rows, int hd, float* q, float* gate) {
    for (int64_t r = 0; r < rows; ++r)
        for (int d = 0; d < hd; ++d) {
            q[r * hd + d] = qg[r * 2 * hd + d];
            gate[r * hd + d] = qg[r * 2 * hd + hd + d];
        }
}

}  // namespace alloy::ref
