#include "kernels/ref/add.h"

namespace alloy::ref {

void add(float* x, const float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

}  // namespace alloy::ref
