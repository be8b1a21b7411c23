#include "kernels/ref/swiglu.h"

#include "kernels/ref/activations.h"

namespace alloy::ref {

void swiglu(const float* gate, const float* up, float* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = silu(gate[i]) * up[i];
}

}  // namespace alloy::ref
