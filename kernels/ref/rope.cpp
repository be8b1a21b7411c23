#include "kernels/ref/rope.h"

#include <cmath>

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

}  // namespace alloy::ref
