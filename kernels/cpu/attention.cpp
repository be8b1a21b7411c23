#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace alloy::cpu {

void attention(const AttentionShape& s, const float* q, const float* k_cache,
               const float* v_cache, float* out, int64_t T, int64_t n_past) {
    const int group = s.n_head / s.n_head_kv;
    const int64_t kv_stride = int64_t(s.n_head_kv) * s.head_dim;
    const int hd = s.head_dim;
#pragma omp parallel
    {
        std::vector<float> score(static_cast<size_t>(n_past + T));
        std::vector<float> acc(static_cast<size_t>(hd));
#pragma omp for schedule(dynamic, 4)
        for (int64_t th = 0; th < T * s.n_head; ++th) {
            const int64_t t = th / s.n_head;
            const int h = int(th % s.n_head);
            const float* qh = q + th * hd;
            const float* kbase = k_cache + int64_t(h / group) * hd;
            const float* vbase = v_cache + int64_t(h / group) * hd;
            const int64_t n_keys = n_past + t + 1;
            float mx = -INFINITY;
            for (int64_t j = 0; j < n_keys; ++j) {
                const float* kj = kbase + j * kv_stride;
                float dot = 0;
                for (int d = 0; d < hd; ++d) dot += qh[d] * kj[d];
                score[size_t(j)] = dot * s.scale;
                mx = std::max(mx, score[size_t(j)]);
            }
            float sum = 0;
            std::fill(acc.begin(), acc.end(), 0.0f);
            for (int64_t j = 0; j < n_keys; ++j) {
                const float p = std::exp(score[size_t(j)] - mx);
                sum += p;
                const float* vj = vbase + j * kv_stride;
                for (int d = 0; d < hd; ++d) acc[size_t(d)] += p * vj[d];
            }
            float* oh = out + th * hd;
            const float inv = 1.0f / sum;
            for (int d = 0; d < hd; ++d) oh[d] = acc[size_t(d)] * inv;
        }
    }
}

}  // namespace alloy::cpu
