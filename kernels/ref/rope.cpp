#include "kernels/ref/rope.h"

#include <algorithm>
#include <cmath>

#include "kernels/ref/rms_norm.h"

namespace alloy::ref {

void rope_partial(float* x, const int32_t* pos, int64_t T, int n_heads, int head_dim, int n_rot,
                  float base) {
    const int half = n_rot / 2;
    for (int64_t t = 0; t < T; ++t) {
        for (int i = 0; i < half; ++i) {
            // inv_freq in fp32 as HF computes it; the angle product in fp32 too.
            const float inv_freq = 1.0f / std::pow(base, float(2 * i) / float(n_rot));
            const float theta = float(pos[t]) * inv_freq;
            const float c = std::cos(theta), s = std::sin(theta);
            for (int h = 0; h < n_heads; ++h) {
                float* xh = x + (t * n_heads + h) * head_dim;
                const float a = xh[i], b = xh[i + half];
                xh[i] = a * c - b * s;
                xh[i + half] = a * s + b * c;
            }
        }
    }
}

void rms_norm_rope(const float* x, int64_t x_head_stride, const float* w, float* out, const int32_t* pos, int64_t T,
                   int n_heads, int head_dim, int n_rot, float base, float eps) {
    const int64_t rows = T * n_heads;
    if (out != x)
        for (int64_t r = 0; r < rows; ++r) std::copy(x + r * x_head_stride, x + r * x_head_stride + head_dim, out + r * head_dim);
    rms_norm(out, w, out, rows, head_dim, eps);
    rope_partial(out, pos, T, n_heads, head_dim, n_rot, base);
}

}  // namespace alloy::ref
