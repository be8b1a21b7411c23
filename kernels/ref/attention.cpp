#include "kernels/ref/attention.h"

#include <cmath>
#include <limits>
#include <vector>

namespace alloy::ref {

void attention(const AttentionShape& s, const float* q, const float* k_cache,
               const float* v_cache, float* out, int64_t T, int64_t n_past) {
    const int group = s.n_head / s.n_head_kv;
    const int64_t kv_stride = int64_t(s.n_head_kv) * s.head_dim;
    std::vector<double> score(size_t(n_past + T));
    for (int64_t t = 0; t < T; ++t) {
        const int64_t n_keys = n_past + t + 1;
        for (int h = 0; h < s.n_head; ++h) {
            const float* qh = q + (t * s.n_head + h) * s.head_dim;
            const int kvh = h / group;
            double mx = -std::numeric_limits<double>::infinity();
            for (int64_t j = 0; j < n_keys; ++j) {
                const float* kj = k_cache + j * kv_stride + int64_t(kvh) * s.head_dim;
                double dot = 0;
                for (int d = 0; d < s.head_dim; ++d) dot += double(qh[d]) * kj[d];
                score[size_t(j)] = dot * s.scale;
                mx = std::max(mx, score[size_t(j)]);
            }
            double sum = 0;
            for (int64_t j = 0; j < n_keys; ++j) sum += (score[size_t(j)] = std::exp(score[size_t(j)] - mx));
            float* oh = out + (t * s.n_head + h) * s.head_dim;
            for (int d = 0; d < s.head_dim; ++d) {
                double acc = 0;
                for (int64_t j = 0; j < n_keys; ++j)
                    acc += score[size_t(j)] * v_cache[j * kv_stride + int64_t(kvh) * s.head_dim + d];
                oh[d] = float(acc / sum);
            }
        }
    }
}

}  // namespace alloy::ref
