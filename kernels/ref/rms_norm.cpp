#include "kernels/ref/rms_norm.h"

#include <cmath>

#include "kernels/ref/add.h"

namespace alloy::ref {

void rms_norm(const float* x, const float* w, float* out, int64_t rows, int64_t n, float eps) {
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * n;
        float* yr = out + r * n;
        double ss = 0.0;  // double: the reference should not be the thing that drifts
        for (int64_t i = 0; i < n; ++i) ss += double(xr[i]) * xr[i];
        const float scale = float(1.0 / std::sqrt(ss / double(n) + double(eps)));
        for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * scale * (w ? w[i] : 1.0f);
    }
}

void add_rms_norm(float* x, const float* y, const float* w, float* out, int64_t rows, int64_t n, float eps) {
    add(x, y, rows * n);
    rms_norm(x, w, out, rows, n, eps);
}

}  // namespace alloy::ref
